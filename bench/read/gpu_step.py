"""A ResNet-50 training step fed by each input pipeline: ``python -m bench.read.gpu_step ...``.

Only meaningful on a machine with a GPU; without one it prints one JSON line
saying the part was skipped, and exits 0.

The model is Keras' ResNet-50 (random weights, SGD with momentum, bfloat16
compute, 224 px, uint8 or float32 input normalised inside the model). It runs on
whichever backend sees the GPU: Keras on TensorFlow when TensorFlow does, else
Keras on JAX when JAX does. The second case is the common one for a
``tensorflow-cpu`` install: the tf.data pipeline runs on the host and hands
NumPy batches to a jitted JAX step, as Flax and MaxText training scripts do.

For each host CPU count in ``--host-cpus`` (the process is pinned to that many
cores before TensorFlow starts, so tf.data's thread pools and AUTOTUNE see only
those), each pipeline runs alone in its own process:

* ``synthetic``: one uint8 batch already on the accelerator, reused every
  step: the model-only rate, the ceiling every input pipeline is held to;
* ``imagerecords_train_uint8`` / ``imagerecords_train_float32``: the reader,
  training mode (random crops, flips);
* ``keras_dir``: ``keras.utils.image_dataset_from_directory`` over the original
  files (float32, as it yields).

Each process runs ``--warmup`` untimed steps (compilation, file cache, AUTOTUNE),
then ``--steps`` timed steps without synchronising in between (the accelerator
works through its queue while the host fetches the next batch, as in real
training), and synchronises once at the end. Reported per row:

* ``images_per_s``: training images per second over the timed steps;
* ``step_ms``: wall milliseconds per step;
* ``host_wait_ms``: host milliseconds per step spent in ``next(iterator)``;
* ``accelerator_idle_fraction``: ``1 - steps * synthetic step time / wall``,
  the share of the wall clock the accelerator had no step to run because the
  input was late (:func:`idle_fraction`).

The TensorFlow-backend path has not been run on a GPU by this project (the
machines it was measured on had TensorFlow without CUDA); the JAX path has.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PIPELINES = (
    "synthetic",
    "imagerecords_train_uint8",
    "imagerecords_train_float32",
    "keras_dir",
)
LABELS = {
    "synthetic": "synthetic: one batch kept on the accelerator (model only)",
    "imagerecords_train_uint8": "imagerecords reader, training, uint8 batches",
    "imagerecords_train_float32": "imagerecords reader, training, float32 batches",
    "keras_dir": "keras image_dataset_from_directory (files, float32)",
}
_IMAGE_SIZE = 224


def idle_fraction(model_step_s: float, steps: int, wall_s: float) -> float:
    """The share of ``wall_s`` the accelerator had no work, given its busy time.

    Args:
        model_step_s: Seconds per step when the input is never late (the
            ``synthetic`` row): the accelerator's busy time per step.
        steps: Timed steps.
        wall_s: Wall seconds the timed steps took with the real input.

    Returns:
        A fraction in [0, 1]; 0 when the input kept up (timing noise can make the
        real run a little faster than the synthetic one: clamped).
    """
    if wall_s <= 0 or steps <= 0:
        raise ValueError(f"wall_s and steps must be positive, got {wall_s}, {steps}")
    return min(1.0, max(0.0, 1.0 - model_step_s * steps / wall_s))


def parse_cpu_counts(text: str, available: int) -> list[int]:
    """``"2,all"`` -> ``[2, available]``; counts above ``available`` are dropped.

    Raises:
        ValueError: an entry is neither a positive integer nor ``all``.
    """
    counts = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "all":
            count = available
        elif part.isdigit() and int(part) > 0:
            count = int(part)
        else:
            raise ValueError(f"--host-cpus: {part!r} is not a positive integer or 'all'")
        if count <= available and count not in counts:
            counts.append(count)
    return counts


# --- child process: one pipeline, one backend --------------------------------


def _probe(allow_cpu: bool) -> dict:
    """Which backend sees a GPU (run in a child: importing TF or JAX is for keeps)."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        name = tf.config.experimental.get_device_details(
            tf.config.list_physical_devices("GPU")[0]
        ).get("device_name", "GPU")
        return {"backend": "tensorflow", "device": name, "why": ""}
    try:
        import jax
    except ImportError:
        return {
            "backend": "",
            "why": "skipped: no GPU (TensorFlow sees none; JAX is not installed)",
        }
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = jax.devices("cpu") if allow_cpu else []
    if not gpus:
        return {"backend": "", "why": "skipped: no GPU (neither TensorFlow nor JAX sees one)"}
    return {"backend": "jax", "device": gpus[0].device_kind, "why": ""}


def _model(num_classes: int, input_dtype: str):
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    inputs = keras.Input((_IMAGE_SIZE, _IMAGE_SIZE, 3), dtype=input_dtype)
    # Normalised on the accelerator: a uint8 batch is a quarter of float32's bytes.
    x = keras.layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
    resnet = keras.applications.ResNet50(
        weights=None,
        input_shape=(_IMAGE_SIZE, _IMAGE_SIZE, 3),
        classes=num_classes,
        classifier_activation=None,
    )
    return keras.Model(inputs, resnet(x))


def _dataset(pipeline: str, records: Path, files_root: Path, batch: int):
    import tensorflow as tf

    if pipeline.startswith("imagerecords_train_"):
        import reader

        dtype = tf.uint8 if pipeline.endswith("uint8") else tf.float32
        return reader.make_dataset(
            str(records), "train", batch, _IMAGE_SIZE, training=True, dtype=dtype
        )
    if pipeline == "keras_dir":
        import keras

        # Unbatched, then batched after repeat() with the remainder dropped: every
        # batch has the same shape, as a jitted step needs (a short last batch per
        # epoch would compile the step again, inside the timed steps).
        return (
            keras.utils.image_dataset_from_directory(
                str(files_root),
                image_size=(_IMAGE_SIZE, _IMAGE_SIZE),
                batch_size=None,
                seed=42,
                verbose=False,
            )
            .repeat()
            .batch(batch, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )
    raise ValueError(f"unknown pipeline {pipeline!r}")


def _batches(pipeline: str, records: Path, files_root: Path, batch: int, num_classes: int):
    """An iterator of NumPy ``(images, labels)`` batches, and the images' dtype."""
    import numpy as np

    if pipeline == "synthetic":
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (batch, _IMAGE_SIZE, _IMAGE_SIZE, 3), dtype=np.uint8)
        labels = rng.integers(0, num_classes, (batch,), dtype=np.int32)
        return None, (images, labels), "uint8"
    dataset = _dataset(pipeline, records, files_root, batch)
    dtype = dataset.element_spec[0].dtype.name
    return dataset, None, dtype


def _time(next_batch, run_step, finish, warmup: int, steps: int) -> dict:
    """Runs ``warmup`` then ``steps`` steps; synchronises only after each phase.

    Args:
        next_batch: () -> ``(images, labels)``.
        run_step: batch -> the step's loss (dispatched, not waited for).
        finish: loss -> float, waiting for the accelerator to finish.
    """
    for _ in range(warmup):
        loss = run_step(next_batch())
    finish(loss)
    waited = 0.0
    images_done = 0
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next_batch()
        waited += time.perf_counter() - t0
        loss = run_step(batch)
        images_done += int(batch[0].shape[0])
    loss = finish(loss)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "images": images_done, "host_wait_s": waited, "loss": loss}


def _time_jax(model, dataset, fixed, warmup: int, steps: int) -> dict:
    import jax
    import keras

    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def compute_loss(trainable, non_trainable, images, labels):
        logits, non_trainable = model.stateless_call(
            trainable, non_trainable, images, training=True
        )
        return loss_fn(labels, logits), non_trainable

    grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

    def train_step(state, images, labels):
        trainable, non_trainable, opt_vars = state
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, images, labels)
        trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
        return (trainable, non_trainable, opt_vars), loss

    step = jax.jit(train_step, donate_argnums=0)
    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in optimizer.variables],
    )

    def run_step(batch):
        nonlocal state
        state, loss = step(state, *batch)
        return loss

    if fixed is not None:
        on_device = tuple(jax.device_put(a) for a in fixed)

        def next_batch():
            return on_device
    else:
        iterator = dataset.as_numpy_iterator()

        def next_batch():
            images, labels = next(iterator)[:2]
            # One label dtype for every pipeline: one compiled step per image dtype.
            return images, labels.astype("int32", copy=False)

    def finish(loss):
        return float(jax.block_until_ready(loss))

    return _time(next_batch, run_step, finish, warmup, steps)


def _time_tensorflow(model, dataset, fixed, warmup: int, steps: int) -> dict:
    import keras
    import tensorflow as tf

    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    step = tf.function(model.train_step)
    if fixed is not None:
        on_device = tuple(tf.constant(a) for a in fixed)

        def next_batch():
            return on_device
    else:
        iterator = iter(dataset)

        def next_batch():
            return next(iterator)[:2]

    return _time(next_batch, lambda batch: step(batch)["loss"], float, warmup, steps)


def _child(args) -> dict:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cpus])
    os.environ["KERAS_BACKEND"] = args.backend
    if args.backend == "jax":
        # One compilation per input dtype, kept on disk for the next process.
        import jax

        jax.config.update("jax_compilation_cache_dir", str(args.compile_cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    import reader  # a training host needs TensorFlow only, not the converter's packages

    num_classes = reader.load_info(str(args.records)).num_classes
    dataset, fixed, dtype = _batches(
        args.child, args.records, args.files_root, args.batch, num_classes
    )
    model = _model(num_classes, dtype)
    timer = _time_jax if args.backend == "jax" else _time_tensorflow
    timed = timer(model, dataset, fixed, args.warmup, args.steps)
    return {"variant": args.child, "host_cpus": args.cpus, "dtype": dtype, **timed}


# --- parent: probe, then one child per (host CPUs, pipeline) ----------------------


def _run_child(argv: list[str], timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "bench.read.gpu_step", *argv]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"[:300]}
    return json.loads(lines[-1])


def _rows(args, backend: str, cpu_counts: list[int]) -> list[dict]:
    rows = []
    common = ["--records", str(args.records), "--files-root", str(args.files_root)]
    common += ["--batch", str(args.batch), "--warmup", str(args.warmup)]
    common += ["--steps", str(args.steps), "--backend", backend]
    common += ["--compile-cache", str(args.compile_cache)]
    for cpus in cpu_counts:
        model_step_s = None
        for pipeline in PIPELINES:
            result = _run_child(["--child", pipeline, "--cpus", str(cpus), *common], args.timeout_s)
            row = {"variant": pipeline, "host_cpus": cpus, **result}
            if "error" not in row:
                row["images_per_s"] = row["images"] / row["wall_s"]
                row["step_ms"] = 1000 * row["wall_s"] / args.steps
                row["host_wait_ms"] = 1000 * row["host_wait_s"] / args.steps
                if pipeline == "synthetic":
                    model_step_s = row["wall_s"] / args.steps
                if model_step_s is not None:
                    row["accelerator_idle_fraction"] = idle_fraction(
                        model_step_s, args.steps, row["wall_s"]
                    )
            print(f"[gpu_step] {json.dumps(row)}", file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Prints one JSON line: the skip reason, or one row per (host CPUs, pipeline)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path)
    parser.add_argument("--files-root", type=Path)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument(
        "--host-cpus",
        default="2,all",
        help="comma-separated host CPU counts to pin each run to ('all': every core)",
    )
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument(
        # bench/.cache (gitignored), two folders up from bench/read/gpu_step.py.
        "--compile-cache",
        type=Path,
        default=Path(__file__).resolve().parents[1] / ".cache" / "jax",
    )
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run on JAX's CPU device when no GPU is seen: tests this harness; "
        "the numbers mean nothing",
    )
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=PIPELINES, help=argparse.SUPPRESS)
    parser.add_argument("--cpus", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=("jax", "tensorflow"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(_probe(args.allow_cpu)))
        return
    if args.records is None or args.files_root is None:
        parser.error("--records and --files-root are required")
    if args.child:
        print(json.dumps(_child(args)))
        return
    try:
        cpu_counts = parse_cpu_counts(args.host_cpus, len(os.sched_getaffinity(0)))
    except ValueError as error:
        parser.error(str(error))
    probe = _run_child(["--probe"] + (["--allow-cpu"] if args.allow_cpu else []), args.timeout_s)
    if probe.get("error") or not probe.get("backend"):
        why = probe.get("why") or f"skipped: no GPU (the probe failed: {probe.get('error')})"
        print(json.dumps({"skipped": why, "rows": []}))
        return
    rows = _rows(args, probe["backend"], cpu_counts)
    print(
        json.dumps(
            {
                "skipped": "",
                "backend": probe["backend"],
                "device": probe["device"],
                "batch": args.batch,
                "warmup": args.warmup,
                "steps": args.steps,
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
