"""Checks that need a fresh process: tf.distribute over logical CPUs, and import hygiene.

``tf.config.set_logical_device_configuration`` only works before TensorFlow
initialises its devices, and pytest-xdist runs several test files in one worker
process, so these run in subprocesses.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.shard_fixtures import write_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("dist") / "ds", per_class=24)


def run_python(code: str, *args: str, timeout: int = 900) -> dict:
    """Runs ``code`` in a fresh interpreter; its last stdout line is JSON.

    ``timeout`` only stops a child that hangs: TensorFlow's start-up and a
    short training took over 120 s on 2 cores beside two busy processes.
    """
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Installed first in the tf.distribute run: the whole training + evaluation then
# also shows that the reader works where Beam, Pillow and GCS are not installed.
BLOCK_CONVERTER_PACKAGES = """
import importlib.abc, sys
FORBIDDEN = ("apache_beam", "PIL", "google.cloud.storage", "beam_pipeline", "google_crc32c")

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(FORBIDDEN):
            raise ModuleNotFoundError(f"blocked for this test: {name}")
        return None

sys.meta_path.insert(0, Blocker())
"""

MIRRORED = (
    BLOCK_CONVERTER_PACKAGES
    + """
import json
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import reader

path = sys.argv[1]
info = reader.load_info(path)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
out = {"replicas": strategy.num_replicas_in_sync}

# Training: per-replica batches of global/replicas, a custom loop that learns.
train = reader.distributed_dataset(strategy, path, "train", global_batch_size=8, image_size=16,
                                   training=True, seed=1, value_range="0_1")
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)),
                                 tf.keras.layers.GlobalAveragePooling2D(),
                                 tf.keras.layers.Dense(info.num_classes)])
    optimizer = tf.keras.optimizers.SGD(0.5)

@tf.function
def train_step(iterator):
    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = tf.keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=8)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    images, labels = next(iterator)
    per_replica = strategy.run(replica_step, args=(images, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

iterator = iter(train)
images, labels = next(iterator)
out["per_replica_shapes"] = [list(x.shape) for x in strategy.experimental_local_results(images)]
out["devices"] = [x.device for x in strategy.experimental_local_results(images)]
for _ in range(40):
    train_step(iterator)

# Evaluation with padding: every val example exactly once over both replicas, and
# how many of them the trained model gets right.
val = reader.distributed_dataset(strategy, path, "val", global_batch_size=8, image_size=16,
                                 training=False, pad_to_batch=True, return_dict=True)
names, right = [], 0
for batch in val:
    for images, labels, weights, files in zip(
        *(strategy.experimental_local_results(batch[k]) for k in ("image", "label", "weight",
                                                                   "filename"))):
        real = weights.numpy() > 0
        names += [f.decode() for f, r in zip(files.numpy(), real) if r]
        guessed = np.argmax(model(images, training=False).numpy(), axis=-1)
        right += int(np.sum((guessed == labels.numpy()) & real))
out["val_names"] = names
out["val_accuracy"] = right / len(names)
print(json.dumps(out))
"""
)


@pytest.mark.e2e
def test_distributed_dataset_under_mirrored_strategy(fixture):
    out = run_python(MIRRORED, fixture.path)
    assert out["replicas"] == 2
    assert out["per_replica_shapes"] == [[4, 16, 16, 3], [4, 16, 16, 3]]
    assert len(set(out["devices"])) == 2
    # Each class is one far-apart colour: a model fed the right labels with the
    # right images tells them all apart, whatever the machine's arithmetic; fed
    # garbage, constant or mismatched labels it scores about 1/3.
    assert out["val_accuracy"] >= 0.9, out["val_accuracy"]
    assert sorted(out["val_names"]) == sorted(fixture.filenames("val"))


# TensorFlow's bundled Keras itself imports Pillow when it is installed, so the
# check is on what *the reader* adds to sys.modules on top of TensorFlow.
IMPORTS = """
import json, sys
import tensorflow as tf
before = set(sys.modules)
import reader

for training in (True, False):
    next(iter(reader.make_dataset(sys.argv[1], "train", 4, 16, training=training)))
reader.load_info(sys.argv[1])
forbidden = ("apache_beam", "PIL", "google.cloud", "beam_pipeline", "google_crc32c")
added = sorted(set(sys.modules) - before)
print(json.dumps({"added": added, "forbidden": [m for m in added if m.startswith(forbidden)]}))
"""


@pytest.mark.e2e
def test_reader_imports_neither_beam_nor_pillow(fixture):
    out = run_python(IMPORTS, fixture.path)
    assert "reader" in out["added"] and "reader.dataset" in out["added"]
    assert out["forbidden"] == []


def test_reader_source_imports_only_tensorflow_the_codec_and_the_standard_library():
    # imagerecords is the bottom package: its codec (imagerecords/codec.py) needs
    # only protobuf, which TensorFlow brings.
    allowed = set(sys.stdlib_module_names) | {"tensorflow", "reader", "imagerecords", "__future__"}
    folder = os.path.join(REPO, "reader")
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            tree = ast.parse(f.read(), name)
        # The inspect tool draws with Pillow, imported inside the functions that
        # need it (tests/test_inspect.py checks that importing it loads no Pillow).
        extra = {"pictures.py": {"PIL"}}.get(name, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            else:
                continue
            assert set(roots) <= allowed | extra, f"reader/{name}:{node.lineno} imports {roots}"
