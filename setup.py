"""imagerecords: image folders -> shuffled, split TFRecord shards (Beam) + a tf.data reader."""

import setuptools

# The Beam job (beam_pipeline) needs these and *not* TensorFlow: Dataflow workers
# stay light.  The reader (reader/) imports only TensorFlow, which is deliberately
# not listed: a training job brings its own flavour (tensorflow, tensorflow-cpu,
# a TPU or CUDA build) and it must win.
INSTALL_REQUIRES = [
    # A range, so the package installs beside a user's own Beam: any 2.x from
    # 2.60 converts (`make beam-range BEAM=2.60.0` checks one). The local speed
    # tricks and the Dask translation were read against one Beam
    # (beam_internals/beam_private.BEAM_VERSION, which deploy/Dockerfile and
    # constraints/test.txt pin): with another they fall back, or refuse, with
    # one line.
    "apache-beam[gcp]>=2.60,<3",
    "pillow>=10.0",
    # libjpeg-turbo with stop-on-warning: sees corrupt JPEG data (beam_pipeline/core/jpeg.py).
    "simplejpeg>=1.8",
    "google-cloud-storage>=2.10",
    "google-crc32c>=1.5",
    "protobuf>=4.21",
    # Progress of a long local run: a live line on a terminal (beam_pipeline/engines/progress.py).
    "tqdm>=4.66",
    # --group_by's search with a time bound per ID, which re cannot stop (core/groups.py).
    # Beam requires it too.
    "regex>=2022.1",
]

TEST_REQUIRES = [
    "pytest>=8",
    "pytest-xdist>=3.5",
    # A test that hangs (a fork deadlock under load, say) fails with every
    # thread's stack after `timeout` seconds instead of stalling the whole run.
    "pytest-timeout>=2.3",
    "tensorflow-cpu>=2.16",
    "gcp-storage-emulator>=2024.8",
    "cryptography>=42",
    "scikit-image>=0.22",  # real photos for the demo and benchmarks
    "ruff>=0.6",
    "psutil>=5.9",  # tests: no child process of the CLI outlives it
]

# Beam's DaskRunner (beam_pipeline/beam_internals/dask_runner.py); Beam 2.77's own "dask" extra
# asks for the same lower bound. The client and every worker need it.
DASK_REQUIRES = ["dask[distributed]>=2024.4.2"]

# Other trainers' doors to the same shards (docs/trainers.md): Grain over
# imagerecords.RecordSource, and TFDS's builder_from_directory. Neither the
# converter nor the tf.data reader needs them. TFDS, like the reader, uses the
# training job's own TensorFlow. Not torch: PyPI's Linux wheel pulls several GB
# of CUDA libraries; the source serves PyTorch's map-style protocol without it.
# imagerecords.transforms resizes with OpenCV's SIMD bilinear: a fifth of Pillow's
# CPU per image, and the reader's arithmetic (docs/trainers.md, imagerecords.transforms).
TRAINERS_REQUIRES = [
    "grain>=0.2.18",
    "tensorflow-datasets>=4.9.10",
    "opencv-python-headless>=4.8",
]

# imagerecords.torch: the DataLoader, and torchvision's batched JPEG decoder for
# decoding on the GPU. `make test-torch` installs it in a venv of its own.
TORCH_REQUIRES = ["torch>=2.4", "torchvision>=0.19"]

BENCH_REQUIRES = [
    "matplotlib>=3.8",
    "scikit-image>=0.22",
    "py-spy>=0.3",
    # The codec study (bench/convert/codecs.py); each wheel bundles its own libraries.
    "pyvips>=2.2",
    "pyvips-binary>=8.15",
    "simplejpeg>=1.7",
    "opencv-python-headless>=4.8",
]

setuptools.setup(
    name="imagerecords",
    version="0.1.0",
    description="Convert image folders to shuffled, split TFRecord shards with Apache Beam, "
    "and read them fast with tf.data.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=setuptools.find_packages(
        include=["beam_pipeline", "beam_pipeline.*", "reader", "reader.*", "imagerecords"]
    ),
    # The reader's native op ships as source and is compiled on first use
    # against the user's TensorFlow (reader/native.py).
    package_data={"reader": ["native/*.cc"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={
        "test": TEST_REQUIRES + BENCH_REQUIRES + DASK_REQUIRES + TRAINERS_REQUIRES,
        "dask": DASK_REQUIRES,
        "trainers": TRAINERS_REQUIRES,
        "torch": TORCH_REQUIRES,
        "bench": BENCH_REQUIRES + ["tensorflow-cpu>=2.16"],
    },
    entry_points={
        "console_scripts": [
            "imagerecords=beam_pipeline.__main__:main",
            "imagerecords-inspect=reader.inspect:main",
        ]
    },
)
