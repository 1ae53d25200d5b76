"""Runs a command as a child process and measures it from the outside.

Every benchmarked tool runs in a fresh child so that (a) its wall clock
includes its own start-up (interpreter, imports, Beam's worker processes), as
a user would see it, (b) memory is measured per tool rather than accumulated
in one long-lived harness process, and (c) TensorFlow's thread pools from one
reader run cannot slow the next.

Peak memory is reported two ways, because a pool of workers is the point of
two of the converters:

* ``peak_tree_rss_mb``: the largest *sum* of RSS over the child and all its
  descendants, sampled every 50 ms from ``/proc`` (no psutil needed). This is
  what the machine has to have. Sampling can miss a spike shorter than 50 ms;
  a tree that is killed (``kill_when``, the timeout) is sampled once more
  just before, so what it holds when it is killed always counts.
* ``peak_proc_rss_mb``: the largest RSS of any single process in the tree,
  sampled the same way.

Not ``wait4``'s ``ru_maxrss``: Linux keeps a process's RSS high-water mark
across ``exec``, so a child forked from a large parent reports at least the
parent's RSS (a 400 MB bench parent made every child "399 MB"). It is used
only when the child ended before the first sample.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class ProcResult:
    """What one child run did.

    Attributes:
        returncode: exit status (negative: killed by that signal; None: timed out).
        wall_s: wall-clock seconds from spawn to exit.
        cpu_s: user + system CPU seconds of the whole process tree: the larger of
            the kernel's count for the child and the children it waited for, and
            the sum of the last sampled CPU time of every process seen in the
            tree (which also covers workers that were killed, never waited for).
        peak_tree_rss_mb: peak summed RSS of the process tree (sampled).
        peak_proc_rss_mb: peak RSS of the largest single process (exact).
        stdout: captured standard output.
        stderr: captured standard error.
    """

    returncode: int | None
    wall_s: float
    cpu_s: float
    peak_tree_rss_mb: float
    peak_proc_rss_mb: float
    stdout: str
    stderr: str


def process_cpu_s() -> float:
    """CPU seconds (user + system, all threads) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_table() -> tuple[dict[int, list[int]], dict[int, int]]:
    """(parent pid -> child pids, pid -> own user+system CPU ticks) from /proc."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the process ended while we looked
            continue
        # The command name (field 2) may contain spaces and parentheses: split
        # after the last ')'.
        # fields[0] is field 3 of proc(5): ppid is field 4, utime/stime 14/15.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
        ticks[int(entry)] = int(fields[11]) + int(fields[12])
    return children, ticks


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_KB
    except (OSError, IndexError, ValueError):
        return 0


def tree_sample(root_pid: int) -> tuple[int, dict[int, int], int]:
    """(summed RSS in KiB, pid -> CPU ticks, largest single RSS in KiB) of a tree now."""
    children, ticks = _process_table()
    total, largest, cpu, stack = 0, 0, {}, [root_pid]
    while stack:
        pid = stack.pop()
        rss = _rss_kb(pid)
        total += rss
        largest = max(largest, rss)
        cpu[pid] = ticks.get(pid, 0)
        stack.extend(children.get(pid, ()))
    return total, cpu, largest


def tree_cpu_s(root_pid: int) -> float:
    """CPU seconds used so far by a process and every live descendant."""
    _, ticks, _ = tree_sample(root_pid)
    return sum(ticks.values()) / _CLK_TCK


class _RssSampler(threading.Thread):
    def __init__(self, pid: int, interval_s: float = 0.05):
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.peak_kb = 0
        self.peak_proc_kb = 0
        self.cpu_ticks: dict[int, int] = {}  # last seen, per process of the tree
        self._stop_event = threading.Event()
        self._lock = threading.Lock()  # this thread and a last sample before a kill

    def run(self):
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval_s)

    def sample(self):
        rss_kb, cpu, largest_kb = tree_sample(self.pid)
        with self._lock:
            self.peak_kb = max(self.peak_kb, rss_kb)
            self.peak_proc_kb = max(self.peak_proc_kb, largest_kb)
            self.cpu_ticks.update(cpu)

    def stop(self):
        self._stop_event.set()
        self.join()


def run_measured(
    cmd: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 900,
    log_path: Path | None = None,
    kill_when: Callable[[], bool] | None = None,
    sample_every_s: float = 0.05,
) -> ProcResult:
    """Runs ``cmd`` to completion, measuring wall clock, CPU and memory.

    Args:
        cmd: the command line.
        cwd: working directory.
        env: environment (default: inherit).
        timeout_s: kill the whole process group after this many seconds.
        log_path: if given, stdout and stderr are also written there (for
            looking into a failed or slow run afterwards).
        kill_when: asked every ~50 ms while the child runs; once it answers
            True the whole process group gets SIGKILL (an interrupted run, as
            a person or the OOM killer would end it: returncode -9).
        sample_every_s: how often the tree's memory and CPU time are sampled.

    Returns:
        The measurements and captured output.
    """
    start = time.perf_counter()
    # Output goes to temporary files, not pipes: a chatty child (Beam logs a
    # lot) must never block on a full pipe while we are sampling.
    with tempfile.TemporaryDirectory(prefix="bench-proc-") as tmp:
        stdout_path, stderr_path = Path(tmp) / "out", Path(tmp) / "err"
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True
            )
            sampler = _RssSampler(proc.pid, sample_every_s)
            sampler.start()
            returncode: int | None
            try:
                _, status, usage = _wait4_with_timeout(
                    proc.pid, timeout_s, kill_when, before_kill=sampler.sample
                )
                returncode = os.waitstatus_to_exitcode(status) if status is not None else None
            finally:
                sampler.stop()
            if returncode is None:
                # Kill the whole session: Beam's workers must not outlive the run.
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                _, _, usage = os.wait4(proc.pid, 0)
            proc.returncode = returncode if returncode is not None else -9
        wall = time.perf_counter() - start
        stdout = stdout_path.read_text(errors="replace")
        stderr = stderr_path.read_text(errors="replace")
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(
            f"$ {' '.join(cmd)}\n# rc={returncode} wall={wall:.2f}s\n"
            f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        )
    return ProcResult(
        returncode=returncode,
        wall_s=wall,
        cpu_s=max(usage.ru_utime + usage.ru_stime, sum(sampler.cpu_ticks.values()) / _CLK_TCK),
        peak_tree_rss_mb=(sampler.peak_kb or usage.ru_maxrss) / 1024,
        peak_proc_rss_mb=(sampler.peak_proc_kb or usage.ru_maxrss) / 1024,
        stdout=stdout,
        stderr=stderr,
    )


def _wait4_with_timeout(pid: int, timeout_s: float, kill_when=None, before_kill=None):
    """``os.wait4`` with a deadline; returns (pid, None, None) on timeout.

    ``kill_when``: once it answers True, the process group is killed and its
    status (killed by SIGKILL) returned. ``before_kill`` is called first, and
    on the timeout too, while the tree still runs.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        waited, status, usage = os.wait4(pid, os.WNOHANG)
        if waited == pid:
            return waited, status, usage
        if time.monotonic() >= deadline:
            if before_kill is not None:
                before_kill()
            return pid, None, None
        if kill_when is not None and kill_when():
            if before_kill is not None:
                before_kill()
            try:
                os.killpg(pid, 9)
            except ProcessLookupError:
                pass
            return os.wait4(pid, 0)
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
