"""reader.allocator: importing the reader makes large batches reuse memory.

Measured the way the kernel sees it, not by time: the minor page faults of
pulling float32 batches of 50 MB (64 x 256 x 256 x 3), each in a fresh
process. With TensorFlow's default CPU allocator every batch is a fresh
``mmap`` whose ~12,000 pages are faulted in (and zeroed) again; with the BFC
allocator the reader asks for, the blocks are reused after the first batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.shard_fixtures import write_dataset

REPO = Path(__file__).resolve().parents[1]

_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    import tensorflow as tf  # imported first, as users do: no op runs before the reader
    import reader

    ds = reader.make_dataset(sys.argv[1], "train", 64, 256, training=True, seed=0)
    iterator = iter(ds)
    for _ in range(3):
        next(iterator)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        next(iterator)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(json.dumps({"env": os.environ.get("TF_CPU_ALLOCATOR_USE_BFC"), "faults": faults}))
    """
)


def _start(path: str, env_value: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if env_value is not None:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = env_value
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, path],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(child: subprocess.Popen) -> dict:
    try:
        out, err = child.communicate(timeout=300)
    finally:
        child.kill()
    assert child.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_importing_the_reader_makes_batches_reuse_memory(tmp_path):
    # ~96 training images: at least one full batch of 64 (a smaller split is refused).
    fixture = write_dataset(tmp_path / "ds", per_class=40, max_side=64)
    # Both at once (two processes, two cores): TensorFlow's start-up dominates.
    children = [_start(fixture.path, None), _start(fixture.path, "false")]
    reused, default = (_result(c) for c in children)  # "false": the user's choice is kept
    assert reused["env"] == "true" and default["env"] == "false"
    # 4 batches x 50 MB = ~49,000 pages with the default allocator.
    assert default["faults"] > 30_000, default
    assert reused["faults"] * 5 < default["faults"], (reused, default)
