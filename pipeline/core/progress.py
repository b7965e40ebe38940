"""Progress lines with rate and ETA for long steps (embedding, collection, training).

``RateLog(what, unit, log)`` is called as ``tick(done, total)``; it emits at most one line every ``every_s``
seconds (plus the final one), e.g. ``embedding: 640/2,990 prompts, 85.2 prompts/s, ETA 28 s``. ``log`` is any
``str -> None``: a ``logging`` method in plain Python, ``context.log.info`` in an asset, so the same line shows in
the Dagster step log.
"""
from __future__ import annotations

import time
from collections.abc import Callable


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
                 clock: Callable[[], float] = time.monotonic):
        self.what, self.unit, self.log, self.every_s, self.clock = what, unit, log, float(every_s), clock
        self.t0 = clock()
        self._last = None

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
        if done >= total or self._last is None or now - self._last >= self.every_s:
            self._last = now
            self.log(self.line(done, total))
