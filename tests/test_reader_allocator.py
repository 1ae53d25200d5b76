"""reader.allocator: importing the reader asks TensorFlow for its BFC CPU allocator.

What the reader controls is tested here: the variable is set on import unless
the user set it (any value, ``false`` included, is kept), and TensorFlow, which
reads it when its first op runs, then has the allocator that keeps
statistics (of TensorFlow's own CPU allocators only BFC does).

The children pin ``TF_ENABLE_ONEDNN_OPTS=0``: where oneDNN is on (TensorFlow
turns it on by itself on some CPUs, AMX ones among them), its own CPU
allocator serves instead and keeps statistics whatever the variable says, so
which allocator answers would be the CPU's decision, not the reader's. How
many page faults the choice saves is the machine's business too (C library,
kernel, oneDNN): ``python -m bench.tools.page_faults`` measures it, default
allocator against BFC, each in its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reader import allocator

REPO = Path(__file__).resolve().parents[1]

_CHILD = textwrap.dedent(
    """
    import json, os
    import tensorflow as tf  # imported first, as users do: no op has run yet
    import reader

    tf.zeros([64, 64])  # the first op: TensorFlow makes its CPU allocator now
    try:
        tf.config.experimental.get_memory_info("CPU:0")  # statistics: the BFC allocator
        bfc = True
    except ValueError:  # "Allocator stats not available": the default allocator
        bfc = False
    print(json.dumps({"env": os.environ.get("TF_CPU_ALLOCATOR_USE_BFC"), "bfc": bfc}))
    """
)


def _start(env_value: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != allocator.ENV}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"  # TensorFlow's own allocators, on any CPU
    if env_value is not None:
        env[allocator.ENV] = env_value
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD],
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


@pytest.mark.e2e
def test_importing_the_reader_gives_tensorflow_the_bfc_allocator_unless_the_user_chose():
    # Both at once (two processes): TensorFlow's start-up dominates.
    children = [_start(None), _start("false")]
    chosen_by_reader, chosen_by_user = (_result(c) for c in children)
    assert chosen_by_reader == {"env": "true", "bfc": True}
    assert chosen_by_user == {"env": "false", "bfc": False}


@pytest.mark.parametrize("users", [None, "true", "false", "0"])
def test_the_variable_is_set_only_when_the_user_left_it_unset(monkeypatch, users):
    if users is None:
        monkeypatch.delenv(allocator.ENV, raising=False)
    else:
        monkeypatch.setenv(allocator.ENV, users)
    allocator.prefer_bfc_cpu_allocator()
    assert os.environ[allocator.ENV] == (users or "true")
