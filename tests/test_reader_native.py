"""reader.native: the compiled flip + resize op, its build cache, and the fallback to stock ops.

The op is compiled here for real (``c++`` and TensorFlow's headers, as on a
user's machine); each test that must not reuse the shared build points
``IMAGERECORDS_CACHE_DIR`` at its own folder and runs in a subprocess, since a
process loads the op once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import reader
from reader import native
from tests.shard_fixtures import write_dataset

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def op():
    # The one thing a machine may legitimately lack (users then get the stock-ops
    # fallback, tested below); any other failure to build fails here.
    if shutil.which(os.environ.get("CXX") or "c++") is None:
        pytest.skip("no C++ compiler on PATH: the reader uses stock ops here")
    module = native.ops()
    assert module is not None, native.unavailable_reason()
    return module


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("native") / "ds", per_class=24, max_side=120)


def _crops(rng, count, max_side):
    return [
        rng.integers(
            0, 256, (rng.integers(1, max_side), rng.integers(1, max_side), 3), dtype=np.uint8
        )
        for _ in range(count)
    ]


def _run_op(op, crops, flips, size):
    flat = np.concatenate([c.reshape(-1) for c in crops])
    shapes = np.array([c.shape[:2] for c in crops], np.int32)
    return op.imagerecords_resize_crops(flat, shapes, np.asarray(flips), size=list(size)).numpy()


@pytest.mark.parametrize(
    "size, max_side",
    [((224, 224), 400), ((7, 300), 60), ((1, 1), 9), ((33, 17), 33)],
    ids=["down-and-up", "wide-out", "one-pixel", "odd"],
)
def test_op_equals_tf_image_resize_bit_for_bit(op, size, max_side):
    rng = np.random.default_rng(sum(size))
    crops = _crops(rng, 12, max_side) + [np.full((1, 1, 3), 200, np.uint8)]
    flips = rng.integers(0, 2, len(crops)).astype(bool)
    got = _run_op(op, crops, flips, size)
    assert got.shape == (len(crops), *size, 3) and got.dtype == np.float32
    for image, crop, flip in zip(got, crops, flips, strict=True):
        # Mirrored first, as the stock path does (mirroring after the resize
        # would round differently in the last bits).
        source = crop[:, ::-1] if flip else crop
        want = tf.image.resize(tf.cast(source, tf.float32), size, method="bilinear").numpy()
        np.testing.assert_array_equal(image, want)


@pytest.mark.parametrize("dtype", [tf.float32, tf.uint8])
def test_every_horizontal_path_equals_tf_image_resize(op, dtype):
    """Crop widths either side of where the op changes its horizontal pass.

    On AVX2 machines the pass fetches 8 output values' samples with byte
    shuffles of a 16-byte window when they fit in one (crops from 6 pixels wide
    to about 1.3x the output width: here every width up to 299, and some wider,
    e.g. 302 and 336), else of a 32-byte window (from 11 pixels wide to about
    3.3x: here up to 747); narrower and wider crops take the per-pixel path.
    The last crop of the batch ends the input tensor, so its windows must stop
    at its row's end.
    """
    rng = np.random.default_rng(11)
    # 16-byte window: 6-299 (and 302, 336); 32-byte: up to 747; per pixel: 5, 748, 900.
    widths = [5, 6, 7, 10, 11, 31, 100, 224, 225, 259, 299, 300, 302, 336, 449, 600, 747]
    widths += [748, 900, 8]
    crops = [rng.integers(0, 256, (int(rng.integers(2, 300)), w, 3), np.uint8) for w in widths]
    for flips in (np.zeros(len(crops), bool), np.ones(len(crops), bool)):
        flat = np.concatenate([c.reshape(-1) for c in crops])
        shapes = np.array([c.shape[:2] for c in crops], np.int32)
        got = op.imagerecords_resize_crops(flat, shapes, flips, size=[224, 224], T=dtype).numpy()
        for image, crop, flip in zip(got, crops, flips, strict=True):
            source = crop[:, ::-1] if flip else crop
            want = tf.image.resize(tf.cast(source, tf.float32), [224, 224], method="bilinear")
            if dtype == tf.uint8:
                want = tf.saturate_cast(tf.round(want), tf.uint8)
            np.testing.assert_array_equal(image, want.numpy(), err_msg=f"width {crop.shape[1]}")


@pytest.mark.parametrize("size, max_side", [((224, 224), 400), ((33, 17), 33)], ids=["224", "odd"])
def test_uint8_op_is_the_rounded_float_op(op, size, max_side):
    """T=uint8: tf.saturate_cast(tf.round(float result)), half to even included."""
    rng = np.random.default_rng(5 + sum(size))
    crops = _crops(rng, 10, max_side)
    flips = rng.integers(0, 2, len(crops)).astype(bool)
    flat = np.concatenate([c.reshape(-1) for c in crops])
    shapes = np.array([c.shape[:2] for c in crops], np.int32)
    got = op.imagerecords_resize_crops(flat, shapes, flips, size=list(size), T=tf.uint8).numpy()
    floats = _run_op(op, crops, flips, size)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, tf.saturate_cast(tf.round(floats), tf.uint8).numpy())
    # Exact halves: a 1x2 crop widened to 3 columns samples its middle at lerp 0.5.
    halves = np.array([10, 10, 10, 11, 11, 11, 11, 11, 11, 12, 12, 12], np.uint8)
    args = (halves, [[1, 2], [1, 2]], [False, False])
    middle_f = op.imagerecords_resize_crops(*args, size=[1, 3]).numpy()[:, 0, 1, 0]
    middle_u = op.imagerecords_resize_crops(*args, size=[1, 3], T=tf.uint8).numpy()[:, 0, 1, 0]
    np.testing.assert_array_equal(middle_u, np.round(middle_f))  # numpy rounds half to even too
    if middle_f[0] == 10.5:
        assert list(middle_u) == [10, 12]


def test_op_reads_one_row_per_crop_as_packed(op):
    """2-D pixels (a padded batch: crop i at the start of row i) give the packed result."""
    rng = np.random.default_rng(7)
    crops = _crops(rng, 6, 50)
    flips = rng.integers(0, 2, len(crops)).astype(bool)
    longest = max(c.size for c in crops)
    rows = np.full((len(crops), longest + 5), 77, np.uint8)  # padding must not be read
    for row, crop in zip(rows, crops, strict=True):
        row[: crop.size] = crop.reshape(-1)
    shapes = np.array([c.shape[:2] for c in crops], np.int32)
    got = op.imagerecords_resize_crops(rows, shapes, flips, size=[19, 23]).numpy()
    np.testing.assert_array_equal(got, _run_op(op, crops, flips, (19, 23)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="sum"):
        op.imagerecords_resize_crops(rows[:, :-6], shapes, flips, size=[4, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one row per crop"):
        op.imagerecords_resize_crops(rows[:-1], shapes, flips, size=[4, 4])


@pytest.mark.parametrize("shape", [(5, 6), (224, 224), (3, 37)])
def test_op_same_size_is_an_exact_cast(op, shape):
    """A crop of the output size (the evaluation centre crop) is cast, mirrored if drawn so."""
    crop = np.random.default_rng(1).integers(0, 256, (*shape, 3), dtype=np.uint8)
    got = _run_op(op, [crop, crop], [False, True], shape)
    np.testing.assert_array_equal(got[0], crop.astype(np.float32))
    np.testing.assert_array_equal(got[1], crop[:, ::-1].astype(np.float32))
    flat = np.concatenate([crop.reshape(-1)] * 2)
    raw = op.imagerecords_resize_crops(
        flat, [shape, shape], [False, True], size=list(shape), T=tf.uint8
    ).numpy()
    np.testing.assert_array_equal(raw[0], crop)
    np.testing.assert_array_equal(raw[1], crop[:, ::-1])
    # Next to resized crops in one batch (the same-size path is per crop).
    other = np.random.default_rng(2).integers(0, 256, (7, 9, 3), dtype=np.uint8)
    mixed = _run_op(op, [other, crop, other], [True, True, False], shape)
    np.testing.assert_array_equal(mixed[1], crop[:, ::-1].astype(np.float32))
    np.testing.assert_array_equal(mixed[0], _run_op(op, [other], [True], shape)[0])


def _list_op(op, crops, flips, size, dtype=tf.float32):
    """The TensorList variant, fed as the reader feeds it: a TensorArray's flow in a tf.function."""

    @tf.function
    def run(flat_crops, shapes, flips):
        array = tf.TensorArray(tf.uint8, size=len(flat_crops), infer_shape=False)
        for i, crop in enumerate(flat_crops):
            array = array.write(i, crop)
        assert array.flow.dtype == tf.variant
        return op.imagerecords_resize_crop_list(array.flow, shapes, flips, size=list(size), T=dtype)

    shapes = np.array([c.shape[:2] for c in crops], np.int32).reshape(-1, 2)
    return run([c.reshape(-1) for c in crops], shapes, np.asarray(flips, bool)).numpy()


def test_list_op_equals_the_packed_op(op):
    """Reading the decode loop's TensorList in place gives the packed op's bytes."""
    rng = np.random.default_rng(11)
    crops = _crops(rng, 9, 80) + [np.full((7, 9, 3), 3, np.uint8)]
    flips = rng.integers(0, 2, len(crops)).astype(bool)
    for dtype in (tf.float32, tf.uint8):
        flat = np.concatenate([c.reshape(-1) for c in crops])
        shapes = np.array([c.shape[:2] for c in crops], np.int32)
        want = op.imagerecords_resize_crops(flat, shapes, flips, size=[7, 9], T=dtype).numpy()
        np.testing.assert_array_equal(_list_op(op, crops, flips, (7, 9), dtype), want)
    assert _list_op(op, [], [], (4, 4)).shape == (0, 4, 4, 3)


def test_list_op_rejects_inconsistent_inputs(op):
    crop = np.zeros(12, np.uint8)  # a 2 x 2 x 3 crop

    @tf.function
    def run(count, shapes):
        array = tf.TensorArray(tf.uint8, size=count, infer_shape=False)
        for i in range(count):
            array = array.write(i, crop)
        flips = tf.zeros([len(shapes)], tf.bool)
        return op.imagerecords_resize_crop_list(array.flow, shapes, flips, size=[4, 4])

    assert run(1, [[2, 2]]).shape == (1, 4, 4, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="height \\* width \\* 3"):
        run(1, [[2, 3]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one tensor per crop"):
        run(1, [[2, 2], [2, 2]])


def test_op_rejects_inconsistent_inputs(op):
    flat = np.zeros(10, np.uint8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sum"):
        op.imagerecords_resize_crops(flat, [[2, 2]], [False], size=[4, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least 1x1"):
        op.imagerecords_resize_crops(np.zeros(0, np.uint8), [[0, 5]], [False], size=[4, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="flips"):
        op.imagerecords_resize_crops(np.zeros(12, np.uint8), [[2, 2]], [False, True], size=[4, 4])


def test_op_on_an_empty_batch(op):
    got = op.imagerecords_resize_crops(
        np.zeros(0, np.uint8), np.zeros((0, 2), np.int32), np.zeros(0, bool), size=[8, 8]
    )
    assert got.shape == (0, 8, 8, 3)


def test_flip_draws_are_flip_draw_per_seed(op):
    """The batch-wide flip op draws what decode.flip_draw draws for each seed."""
    from reader import decode

    rng = np.random.default_rng(5)
    seeds = rng.integers(-(2**63), 2**63 - 1, size=(600, 2), dtype=np.int64)
    seeds[:6] = [[0, 0], [1, 2], [-1, -1], [-(2**63), 0], [2**63 - 1, 2**63 - 1], [7, -7]]
    got = native.flip_draws(tf.constant(seeds)).numpy()
    want = np.array([bool(decode.flip_draw(tf.constant(s))) for s in seeds])
    np.testing.assert_array_equal(got, want)
    assert 0.4 < want.mean() < 0.6
    assert native.flip_draws(tf.zeros([0, 2], tf.int64)).shape == (0,)


def _read(fixture, training, **kwargs):
    ds = reader.make_dataset(
        fixture.path,
        "train" if training else "val",
        batch_size=8,
        image_size=(40, 32),
        training=training,
        seed=11,
        deterministic=True,
        return_dict=True,
        repeat=False,
        **kwargs,
    )
    batches = list(ds.as_numpy_iterator())
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def test_training_pipeline_is_bit_identical_to_stock_ops(op, fixture):
    """Same records, crops, flips and pixels as the stock path, so a seed means the same."""
    stock = _read(fixture, True, native_ops=False)
    fused = _read(fixture, True, native_ops=True)
    assert list(fused["filename"]) == list(stock["filename"])
    np.testing.assert_array_equal(fused["label"], stock["label"])
    np.testing.assert_array_equal(fused["image"], stock["image"])


def test_training_flips_are_drawn_and_applied(op, fixture):
    """Against the same run without flips (same crops): some images mirrored, the rest equal."""
    flipped = _read(fixture, True, native_ops=True)
    plain = _read(fixture, True, native_ops=True, horizontal_flip=False)
    assert list(flipped["filename"]) == list(plain["filename"])
    same = [np.array_equal(a, b) for a, b in zip(flipped["image"], plain["image"], strict=True)]
    mirrored = [
        np.allclose(a, b[:, ::-1], atol=1e-3)
        for a, b in zip(flipped["image"], plain["image"], strict=True)
    ]
    assert all(s or m for s, m in zip(same, mirrored, strict=True))
    assert 0.2 < sum(mirrored) / len(mirrored) < 0.8, sum(mirrored)


def test_evaluation_pipeline_is_bit_identical_to_stock_ops(op, fixture):
    stock = _read(fixture, False, native_ops=False)
    fused = _read(fixture, False, native_ops=True)
    assert list(fused["filename"]) == list(stock["filename"])
    np.testing.assert_array_equal(fused["image"], stock["image"])


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_decoded_cache_pipeline_is_bit_identical_to_stock_ops(op, fixture, training):
    """cache="decoded": the op resizes ragged batches of cached windows, same pixels."""
    stock = _read(fixture, training, cache="decoded", native_ops=False)
    fused = _read(fixture, training, cache="decoded", native_ops=True)
    assert list(fused["filename"]) == list(stock["filename"])
    np.testing.assert_array_equal(fused["label"], stock["label"])
    np.testing.assert_array_equal(fused["image"], stock["image"])


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("cache", [None, "decoded"], ids=["records", "decoded"])
def test_uint8_batches_are_the_rounded_float32_batches(op, fixture, training, cache):
    """dtype=tf.uint8: native and stock agree, and both are the float32 batch rounded."""
    floats = _read(fixture, training, cache=cache, native_ops=True)
    native_u8 = _read(fixture, training, cache=cache, native_ops=True, dtype=tf.uint8)
    stock_u8 = _read(fixture, training, cache=cache, native_ops=False, dtype=tf.uint8)
    assert native_u8["image"].dtype == np.uint8 and stock_u8["image"].dtype == np.uint8
    assert list(native_u8["filename"]) == list(floats["filename"])
    want = tf.saturate_cast(tf.round(floats["image"]), tf.uint8).numpy()
    np.testing.assert_array_equal(native_u8["image"], want)
    np.testing.assert_array_equal(stock_u8["image"], want)


def test_uint8_batches_need_the_raw_value_range(fixture):
    with pytest.raises(ValueError, match="value_range must be '0_255'"):
        reader.make_dataset(
            fixture.path, "train", 8, 32, training=True, dtype=tf.uint8, value_range="0_1"
        )
    with pytest.raises(ValueError, match="or uint8"):
        reader.make_dataset(fixture.path, "train", 8, 32, training=True, dtype=tf.int32)


def test_native_ops_true_refuses_settings_it_cannot_serve(op, fixture):
    with pytest.raises(ValueError, match="resize_method='bilinear'"):
        reader.make_dataset(
            fixture.path, "train", 8, 32, training=True, native_ops=True, resize_method="area"
        )
    with pytest.raises(ValueError, match="no image_fn"):
        reader.make_dataset(
            fixture.path,
            "train",
            8,
            32,
            training=True,
            native_ops=True,
            image_fn=lambda image, label: (image, label),
        )


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


_BUILD_AND_REPORT = """
    import json, logging, os, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import numpy as np, reader
    from reader import native
    ds = reader.make_dataset(sys.argv[1] if len(sys.argv) > 1 else {path!r}, "train", 4, 16,
                             training=True, seed=1, **{kwargs})
    images, labels = next(iter(ds))
    print(json.dumps({{"ops": native.ops() is not None, "why": native.unavailable_reason(),
                      "shape": list(images.shape), "finite": bool(np.isfinite(images).all()),
                      "files": sorted(os.listdir(native.cache_dir()))
                               if native.cache_dir().exists() else []}}))
"""


def _report(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_builds_once_into_the_cache_and_reuses_it(fixture, tmp_path):
    code = _BUILD_AND_REPORT.format(path=str(fixture.path), kwargs={})
    env = {native.ENV_CACHE_DIR: str(tmp_path / "cache")}
    first = _report(_python(code, env))
    assert first["ops"] and first["shape"] == [4, 16, 16, 3] and first["finite"]
    libraries = [f for f in first["files"] if f.endswith(".so")]
    assert len(libraries) == 1 and not [f for f in first["files"] if f.startswith(".build-")]
    library = tmp_path / "cache" / libraries[0]
    built_at = library.stat().st_mtime_ns
    second = _report(_python(code, env))
    assert second["ops"] and second["files"] == first["files"]
    assert library.stat().st_mtime_ns == built_at  # loaded, not rebuilt


def test_without_a_compiler_falls_back_with_one_warning(fixture, tmp_path):
    code = _BUILD_AND_REPORT.format(path=str(fixture.path), kwargs={})
    env = {native.ENV_CACHE_DIR: str(tmp_path / "cache"), "CXX": "no-such-compiler-here"}
    result = _python(code, env)
    report = _report(result)
    assert not report["ops"] and "no C++ compiler" in report["why"]
    assert report["shape"] == [4, 16, 16, 3] and report["finite"]
    assert result.stderr.count("native resize op is unavailable") == 1


def test_a_failing_compile_is_reported_with_the_compiler_output(fixture, tmp_path):
    fake = tmp_path / "fake-c++"
    fake.write_text("#!/bin/sh\necho 'fatal: this compiler is broken' >&2\nexit 3\n")
    fake.chmod(0o755)
    code = _BUILD_AND_REPORT.format(path=str(fixture.path), kwargs={"native_ops": True})
    env = {native.ENV_CACHE_DIR: str(tmp_path / "cache"), "CXX": str(fake)}
    result = _python(code, env)
    assert result.returncode != 0
    assert "NativeOpsError" in result.stderr and "this compiler is broken" in result.stderr
    assert "exit 3" in result.stderr
    assert not list((tmp_path / "cache").glob("*.so"))  # no half-built library left


def test_environment_switch_turns_it_off_silently(fixture, tmp_path):
    code = _BUILD_AND_REPORT.format(path=str(fixture.path), kwargs={})
    env = {native.ENV_CACHE_DIR: str(tmp_path / "cache"), native.ENV_DISABLE: "0"}
    result = _python(code, env)
    report = _report(result)
    assert not report["ops"] and report["files"] == [] and report["shape"] == [4, 16, 16, 3]
    assert "unavailable" not in result.stderr


def test_prebuild_command_prints_the_library(op, tmp_path):
    env = {**os.environ, native.ENV_CACHE_DIR: str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "reader.native"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    library = Path(done.stdout.strip().splitlines()[-1])
    assert library.parent == tmp_path / "cache" and library.suffix == ".so" and library.exists()
    assert "Compiling the reader's native resize op" in done.stderr
    env[native.ENV_DISABLE] = "0"
    off = subprocess.run(
        [sys.executable, "-m", "reader.native"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert off.returncode == 1 and "turns the native op off" in off.stdout
