"""A ResNet-50 training step fed by each input pipeline: ``python -m bench.gpu_step ...``.

Only meaningful on a machine with a GPU; without one it prints one JSON line
saying the part was skipped, and exits 0. With a GPU, for each pipeline
(imagerecords' reader with uint8 batches normalised inside the model, and
``image_dataset_from_directory`` on the original files) it runs
``--warmup`` untimed steps, then ``--steps`` timed steps of a Keras ResNet-50
(random weights, SGD, mixed precision) at 224 px, and reports:

* ``images_per_s``: training images per second over the timed steps;
* ``input_wait_fraction``: the share of the timed wall clock spent waiting for
  the next batch (``next(iterator)``), each step being synchronised (its loss
  read back) before the next batch is asked for. While the host waits the
  accelerator has nothing to do, so this is the accelerator's idle fraction
  caused by the input pipeline (an approximation: it ignores the host-side
  dispatch of the step itself).

UNTESTED here: the machine this was written on has no GPU; the code path with
one has not been run. Only the "skipped" path is exercised by the tests.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _no_gpu_reason() -> str:
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return "skipped: no GPU (tf.config.list_physical_devices('GPU') is empty)"
    return ""


def _model(num_classes: int):
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    inputs = keras.Input((224, 224, 3), dtype="uint8")
    # Normalised on the accelerator: the host ships uint8 (a quarter of the bytes).
    x = keras.layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)  # casts to the compute dtype
    outputs = keras.applications.ResNet50(weights=None, classes=num_classes, input_tensor=None)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(),
    )
    return model


def _time(model, dataset, warmup: int, steps: int) -> dict:
    import tensorflow as tf

    iterator = iter(dataset)
    step = tf.function(model.train_step, jit_compile=False)
    for _ in range(warmup):
        images, labels = next(iterator)[:2]
        float(step((tf.saturate_cast(images, tf.uint8), labels))["loss"])
    waited = images_done = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        images, labels = next(iterator)[:2]
        waited += time.perf_counter() - t0
        float(step((tf.saturate_cast(images, tf.uint8), labels))["loss"])  # synchronise
        images_done += int(images.shape[0])
    wall = time.perf_counter() - start
    return {"images_per_s": images_done / wall, "input_wait_fraction": waited / wall}


def main(argv: list[str] | None = None) -> None:
    """Prints one JSON line: the skip reason, or one row per pipeline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--files-root", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)
    why = _no_gpu_reason()
    if why:
        print(json.dumps({"skipped": why, "rows": []}))
        return
    import keras
    import tensorflow as tf

    import reader

    info = json.loads((args.records / "dataset_info.json").read_text())
    model = _model(int(info["num_classes"]))
    pipelines = {
        "imagerecords_train_uint8": reader.make_dataset(
            str(args.records), "train", args.batch, 224, training=True, dtype=tf.uint8
        ),
        "keras_dir": keras.utils.image_dataset_from_directory(
            str(args.files_root), image_size=(224, 224), batch_size=args.batch, seed=42,
            verbose=False,
        ).repeat().prefetch(tf.data.AUTOTUNE),
    }  # fmt: skip
    rows = []
    for name, dataset in pipelines.items():
        rows.append({"variant": name, **_time(model, dataset, args.warmup, args.steps)})
    print(json.dumps({"skipped": "", "rows": rows}))


if __name__ == "__main__":
    main()
