"""A description of the machine and software a benchmark ran on.

Numbers from a 2-core VM shared with other jobs are not numbers from a
workstation: the results table always carries this description, and the load
average before and after the run, so a reader can tell.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return float("nan")


def _nproc() -> int:
    # `nproc` honours CPU affinity / cgroup cpusets, which os.cpu_count() does not.
    try:
        return int(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip())
    except (OSError, ValueError):
        return os.cpu_count() or 1


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _libjpeg() -> str:
    # Pillow wheels bundle libjpeg-turbo; its version decides decode speed.
    from PIL import features

    if features.check_feature("libjpeg_turbo"):
        return f"libjpeg-turbo {features.version('libjpeg_turbo')}"
    return f"libjpeg {features.version('jpg')}"


def git_state() -> str:
    """HEAD, and whether the code under test has uncommitted changes (it is measured as is)."""
    from bench.common.settings import REPO_DIR

    def git(*args):
        return subprocess.run(
            ["git", *args], cwd=REPO_DIR, capture_output=True, text=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "beam_pipeline", "reader")
    except OSError:
        return "unknown"
    return f"{head}" + (" + uncommitted changes in beam_pipeline/ or reader/" if dirty else "")


def describe() -> dict:
    """The machine, OS and library versions, as a JSON-friendly dict."""
    return {
        "nproc": _nproc(),
        "cpu_model": _cpu_model(),
        "ram_gib": round(_mem_total_gib(), 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "versions": {
            dist: _version(dist)
            for dist in ("apache-beam", "tensorflow-cpu", "tensorflow", "keras", "pillow", "numpy")
            if _version(dist) != "not installed"
        },
        "libjpeg": _libjpeg(),
        "git": git_state(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
