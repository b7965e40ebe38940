"""Progress lines with rate and ETA for long steps (embedding, collection, training).

``RateLog(what, unit, log)`` is called as ``tick(done, total)``; it emits at most one line every ``every_s``
seconds (plus the final one), e.g. ``embedding: 640/2,990 prompts, 85.2 prompts/s, ETA 28 s``. ``log`` is any
``str -> None``: a ``logging`` method in plain Python, ``context.log.info`` in an asset, so the same line shows in
the Dagster step log.

``phase_progress(what, unit, logger)``: the same for a phase of plain Python code (kind selection, cross-fitting,
operating points, cascade search, pool report), at most one line every ``PHASE_EVERY_S`` seconds on a ``pipeline.*``
logger: Dagster's managed loggers (dagster.yaml `python_logs`) carry it into the run log, `router-lite train` and
`router-lite run` print it on the console. ``PhaseSteps(progress, total)`` counts a phase's steps into it, one call
per step done, for loops that finish their steps in several places (a fold's kinds, a search's variants).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

PHASE_EVERY_S = 10.0


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 90:
        return f"{s} s"
    if s < 5400:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class RateLog:
    """Throttled ``done/total, rate, ETA`` lines; the rate counts from the first tick's baseline (``start``)."""

    def __init__(self, what: str, unit: str, log: Callable[[str], None], every_s: float = 5.0,
                 clock: Callable[[], float] | None = None):
        clock = clock or time.monotonic  # looked up per instance: a test's fake clock reaches every phase
        self.what, self.unit, self.log, self.every_s, self.clock = what, unit, log, float(every_s), clock
        self.t0 = clock()
        self._last = None
        self.final_always = True  # the last tick's line ("in 42 s") even within every_s of the previous one

    def line(self, done: int, total: int) -> str:
        dt = self.clock() - self.t0
        rate = done / dt if dt > 0 else 0.0
        text = f"{self.what}: {done:,}/{total:,} {self.unit}"
        if done and rate > 0:
            text += f", {rate:,.1f} {self.unit}/s"
            text += f", ETA {_duration((total - done) / rate)}" if done < total else f", in {_duration(dt)}"
        return text

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if (done >= total and self.final_always) or self._last is None or now - self._last >= self.every_s:
            self._last = now
            self.log(self.line(done, total))


def phase_progress(what: str, unit: str, logger: logging.Logger) -> RateLog:
    """A `RateLog` for one phase of plain Python code: INFO lines on `logger`, at most one per `PHASE_EVERY_S`
    (the last one too: a phase that ends within the interval says nothing more)."""
    progress = RateLog(what, unit, logger.info, every_s=PHASE_EVERY_S)
    progress.final_always = False
    return progress


class PhaseSteps:
    """Counts a phase's steps into its progress line (`phase_progress`): ``step()`` after each step done."""

    def __init__(self, progress: RateLog, total: int):
        self.progress, self.total, self.done = progress, int(total), 0

    def __call__(self) -> None:
        self.done += 1
        self.progress(self.done, self.total)
