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

``heartbeat(what, log)``: a step that can run for minutes (a lineage stage, the prompt router's fit, the cascade
search, `router-lite train`) is never silent for longer than ``HEARTBEAT_S``: a daemon thread says what runs and for
how long (with the running phase's count and ETA) whenever no line came from a progress line or a ``pipeline.*``
logger for that long. A phase's steps can be slow (one cross-fit of a kind under load) and the code between phases
has no steps at all (the final fit, the guard, the report tables): a tick alone cannot promise a line every 10 s.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PHASE_EVERY_S = 10.0
# below the 10 s promise: the beat thread may wake late with a second job on the cores
HEARTBEAT_S = 8.0


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
        self.done = self.total = 0
        self.final_always = True  # the last tick's line ("in 42 s") even within every_s of the previous one

    def line(self, done: int, total: int) -> str:
        dt = self.clock() - self.t0
        rate = done / dt if dt > 0 else 0.0
        text = f"{self.what}: {done:,}/{total:,} {self.unit}"
        if done and rate > 0 and dt >= 1.0:  # a rate over the first instant says nothing
            text += f", {rate:,.1f} {self.unit}/s"
            text += f", ETA {_duration((total - done) / rate)}" if done < total else f", in {_duration(dt)}"
        return text

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        self.done, self.total = done, total
        _BEAT.phase = self if done < total else None
        if (done >= total and self.final_always) or self._last is None or now - self._last >= self.every_s:
            self._last = now
            self.log(self.line(done, total))
            _BEAT.said()


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


class _Beat:
    """The one heartbeat thread of a process, shared by nested `heartbeat` blocks: `doing` is the stack of what
    they do (innermost last), `phase` the last progress line still counting, `last` when a line last came."""

    def __init__(self):
        self.lock = threading.Lock()
        self.doing: list[tuple[str, Callable[[str], None], float]] = []
        self.phase: RateLog | None = None
        self.last = time.monotonic()
        self.every_s = HEARTBEAT_S
        self.stop: threading.Event | None = None
        self.tracker = _Said(self)

    def said(self) -> None:
        self.last = time.monotonic()

    def line(self, now: float) -> str:
        t0 = self.doing[-1][2]
        text = f"{' > '.join(d[0] for d in self.doing)}: still working, {_duration(now - t0)} in"
        phase = self.phase
        if phase is not None and getattr(phase, "total", 0):
            phase._last = phase.clock()  # this line stands for the phase's next one
            text += f"; {phase.line(phase.done, phase.total)}"
        return text

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(min(0.5, self.every_s / 4)):
            with self.lock:
                now = time.monotonic()
                if not self.doing or now - self.last < self.every_s:
                    continue
                log, text = self.doing[-1][1], self.line(now)
                self.last = now
            log(text)  # outside the lock: a handler may log again (Dagster's capture does)


class _Said(logging.Handler):
    """Marks every record of the `pipeline` loggers as a line said (propagated from pipeline.*)."""

    def __init__(self, beat: _Beat):
        super().__init__(logging.INFO)
        self.beat = beat

    def emit(self, record: logging.LogRecord) -> None:
        self.beat.said()


_BEAT = _Beat()


@contextmanager
def heartbeat(what: str, log: Callable[[str], None] | logging.Logger) -> Iterator[None]:
    """While the block runs, at most `HEARTBEAT_S` without a line: "<what>: still working, 42 s in; <the running
    phase's progress line>" on `log` (a `str -> None`, or a logger: its INFO). Nested blocks share one thread; the
    innermost names what runs and takes the line."""
    say = log.info if isinstance(log, logging.Logger) else log
    beat = _BEAT
    with beat.lock:
        outermost = not beat.doing
        entry = (what, say, time.monotonic())
        beat.doing.append(entry)
        beat.phase = None  # a phase left counting belongs to the step before this block
        if outermost:
            beat.last = time.monotonic()
            logging.getLogger("pipeline").addHandler(beat.tracker)
            beat.stop = threading.Event()
            threading.Thread(target=beat.run, args=(beat.stop,), name="heartbeat", daemon=True).start()
    try:
        yield
    finally:
        with beat.lock:
            beat.doing.remove(entry)
            beat.phase = None
            if not beat.doing:
                beat.stop.set()
                logging.getLogger("pipeline").removeHandler(beat.tracker)
