"""What a person sees during a long run: each phase's done/total, rate and time left.

A live line per phase on a terminal (tqdm), a plain line every :data:`PLAIN_INTERVAL_S`
elsewhere; ``--quiet`` silences it. Pure of Beam.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from tqdm import tqdm

from beam_pipeline.core import counters

PLAIN_INTERVAL_S = 15.0
# A terminal line is redrawn at most this often: drawing is cheap, but not free.
REDRAW_INTERVAL_S = 0.5
PREFIX = "imagerecords: "
# The width of a terminal that does not say its own (a pseudo-terminal whose
# size nobody set: `script` without a terminal, `docker run -t` in CI): tqdm
# would draw a zero-width, empty line.
FALLBACK_COLUMNS = 100
FALLBACK_ROWS = 24


def _size(stream: TextIO) -> dict:
    """tqdm's size arguments: follow the terminal's size, or a fixed one when the
    terminal says 0 x 0 (tqdm then hides the line as if it were off screen)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    if columns:
        return {"dynamic_ncols": True}
    return {"ncols": FALLBACK_COLUMNS, "nrows": FALLBACK_ROWS}


def _duration(seconds: float) -> str:
    return tqdm.format_interval(max(0.0, seconds))


def _count(n: int) -> str:
    return f"{n:,}"


class _Bar(tqdm):
    """tqdm's live line, with the phase's rate: work found done is not in it.

    tqdm's own rate counts every unit it is given. A resumed run finds half a
    million images converted in a minute or two, and at that rate the line
    would promise the rest in seconds; the phase's rate (and so the time left)
    counts only what this run did, as the plain lines do.
    """

    def __init__(self, phase: Phase, **kwargs):
        self._phase = phase
        super().__init__(**kwargs)

    @property
    def format_dict(self):
        shown = super().format_dict
        # 0, not None: tqdm would put its own average (resumed work included) in its place.
        shown["rate"] = self._phase.rate(time.monotonic())
        return shown


class Phase:
    """One phase's progress: call :meth:`update` as work finishes, :meth:`close` at its end."""

    def __init__(self, reporter: Reporter, name: str, total: int | None, unit: str):
        self._reporter = reporter
        self.name = name
        self.total = total
        self.unit = unit
        self.done = 0
        # Work found done already (resumed images) is not part of the rate.
        self.skipped = 0
        self.extra: dict[str, int] = {}
        self.started = time.monotonic()
        self._bar = None
        if reporter.interactive:
            self._bar = _Bar(
                self,
                total=total,
                desc=f"{PREFIX}{name}",
                unit=f" {unit}",
                file=reporter.stream,
                mininterval=REDRAW_INTERVAL_S,
                **_size(reporter.stream),
                leave=True,
            )
        # A log's first line comes one interval in; a terminal's as soon as there is news.
        self._next_draw = self.started + (0 if self._bar is not None else reporter.plain_interval_s)

    def set_total(self, total: int) -> None:
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def update(self, n: int = 1, skipped: int = 0, **extra: int) -> None:
        """``n`` more units done, ``skipped`` of them found done already; named counts beside.

        Called once per finished image on a million-image run, so it only adds
        up, and draws when the interval has passed
        (docs/performance.md, "Measurements behind code choices").
        """
        self.done += n
        self.skipped += skipped
        for name, value in extra.items():
            if value:
                self.extra[name] = self.extra.get(name, 0) + value
        now = time.monotonic()
        if now >= self._next_draw:
            self._draw(now)

    def _draw(self, now: float) -> None:
        if self._bar is not None:
            self._next_draw = now + REDRAW_INTERVAL_S
            if self.extra:
                self._bar.set_postfix_str(self._extras(), refresh=False)
            self._bar.update(self.done - self._bar.n)
        elif self._reporter.enabled:
            self._next_draw = now + self._reporter.plain_interval_s
            self._reporter.say(self.line(now))
        else:
            self._next_draw = float("inf")

    def rate(self, now: float) -> float:
        """Units per second done by this run (what an earlier run did is not counted)."""
        elapsed = now - self.started
        return (self.done - self.skipped) / elapsed if elapsed > 0 else 0.0

    def line(self, now: float | None = None) -> str:
        """``converting 8,552/12,800 images (66.8%), 6,581 images/s, 00:07 left (rejected 3)``."""
        now = time.monotonic() if now is None else now
        rate = self.rate(now)
        parts = [f"{self.name} {_count(self.done)}"]
        if self.total:
            parts[0] += f"/{_count(self.total)} {self.unit} ({100 * self.done / self.total:.1f}%)"
        else:
            parts[0] += f" {self.unit}"
        parts.append(f"{rate:,.0f} {self.unit}/s")
        if self.total and rate > 0:
            parts.append(f"{_duration((self.total - self.done) / rate)} left")
        text = ", ".join(parts)
        if self.extra:
            text += f" ({self._extras()})"
        return text

    def _extras(self) -> str:
        return ", ".join(f"{name} {_count(value)}" for name, value in self.extra.items())

    def close(self) -> None:
        """Ends the phase with one line saying what it did and how long it took."""
        if self._bar is not None:
            if self.total is not None and self.total != self._bar.total:
                self._bar.total = self.total
            self._bar.set_postfix_str(self._extras(), refresh=False)
            self._bar.update(self.done - self._bar.n)
            self._bar.close()
            self._bar = None
            return
        if self._reporter.enabled:
            seconds = time.monotonic() - self.started
            text = f"{self.name}: {_count(self.done)} {self.unit} in {_duration(seconds)}"
            if self.extra:
                text += f" ({self._extras()})"
            self._reporter.say(text)

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Reporter:
    """Where progress goes: a terminal (live lines), a log (plain lines), or nowhere."""

    def __init__(
        self,
        stream: TextIO | None = None,
        enabled: bool = True,
        interactive: bool | None = None,
        plain_interval_s: float = PLAIN_INTERVAL_S,
    ):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        if interactive is None:
            isatty = getattr(self.stream, "isatty", None)
            interactive = bool(isatty and isatty())
        self.interactive = enabled and interactive
        self.plain_interval_s = plain_interval_s

    def phase(self, name: str, total: int | None = None, unit: str = "images") -> Phase:
        return Phase(self, name, total, unit)

    def step(self, text: str) -> None:
        """A step too short for a count: one line saying what is being done."""
        self.say(text)

    def say(self, text: str) -> None:
        if self.enabled:
            print(f"{PREFIX}{text}", file=self.stream, flush=True)


SILENT = Reporter(enabled=False)


# The ``converting`` phase of a Beam step that sees every image (DirectRunner
# in_memory runs it in the launching process): the local engine's line.


def converting_line(enabled: bool, interactive: bool, total: int | None) -> Phase:
    """A new ``converting`` phase of ``total`` images (None: not known)."""
    reporter = Reporter(enabled=enabled, interactive=interactive, plain_interval_s=PLAIN_INTERVAL_S)
    return reporter.phase("converting", total, "images")


def count_converted(phase: Phase, counted: dict[str, int]) -> None:
    """One image's outcome (its counters, ``outcomes.counts``) on the line."""
    if phase.total is not None and phase.done >= phase.total:
        phase.set_total(phase.done + 1)  # more than the estimate found
    resumed = counted.get(counters.RESUMED, 0)
    rejected, reused = counted.get(counters.REJECTED, 0), counted.get(counters.REUSED, 0)
    phase.update(1, skipped=resumed, resumed=resumed, rejected=rejected, reused=reused)


def close_converting_line(phase: Phase) -> None:
    """Every image went through the one step: its count is the exact total, as the
    local engine's listing gives it."""
    phase.set_total(phase.done)
    phase.close()
