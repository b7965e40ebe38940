"""Grading with a budget: a model's reply is untrusted text, so every extraction and comparison that serve, train,
the agreement tensor, collection and regrade run goes through here.

- A text cap: a reply longer than `max_chars` is graded on its last `max_chars` characters (answers are read
  last-first); an extracted answer longer than it compares with nothing.
- A fast path in process: the graders' text work is linear in the capped text (pipeline/collect/grading.py), and
  runs under `sympy_refused()`, so it stops with `NeedsSympy` where sympy would evaluate.
- sympy (math-verify's parsing and comparison, pipeline/collect/math_values.py) cannot be interrupted inside a
  thread, and math-verify's own SIGALRM timeout works in the main thread only, so what needs it runs in a persistent
  worker process (a pool of
  `POOL_SIZE`, forked from a forkserver that imported the graders once) with a deadline of `budget_ms`: past it the
  worker is killed and a fresh one forked for the next job.
- An overrun or any exception is "no answer" (`Outcome.status` "overrun" / "error"): an extraction gives None, a
  comparison disagrees. Each is counted (`counts()`), so callers report them (a serve header, asset metadata, a
  collection log line).
- Queues. The blocking API (collection, regrade, the agreement tensor, train) waits for a worker as long as it takes:
  a batch's verdicts never depend on the machine's load. The `*_async` API (serve) never lets one answer format's
  poison delay anything else: a reply's in-process part runs in a thread pool of its own (`TEXT_THREADS`) that never
  waits for a worker, so text-only grading (mcq_letter, plain numbers) never queues behind sympy; each job that needs
  sympy goes to its format's lane (`FORMAT_SLOTS` threads per grader: the worker jobs one format runs at once, so the
  other `POOL_SIZE - FORMAT_SLOTS` workers stay for the other formats); and a job that holds no worker within its
  budget, counted from when it was queued, is an overrun like one that runs past it (so a flood of poison drains at
  once instead of queueing for minutes). A request's grading awaits its sympy jobs one at a time (its grading is a
  generator, `Steps`, that yields them), so a request has at most one job queued or running and poisoned requests
  take turns in their lane. Lanes are threads, not asyncio primitives: the worker slots are shared with the
  blocking API, and one process runs several event loops (serve_in_thread, tests). (Whole gradings used to run in
  the event loop's default thread pool, whose few threads then all waited for the two workers behind poisoned
  comparisons: text-only grading of every format queued behind them, bench/grading_starvation.py.)

The budget and the cap are `collection.grading_budget_ms` / `collection.grading_max_chars` of a profile (and
`--grading-budget-ms` of `serve` and `train`); `configure` sets this process's defaults.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import multiprocessing
import pickle
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

from pipeline.collect.grading import NeedsSympy, grader_spec, is_empty, sympy_refused
from pipeline.core.errors import RouterLiteError

log = logging.getLogger(__name__)

DEFAULT_BUDGET_MS = 250.0
DEFAULT_MAX_CHARS = 32_768
POOL_SIZE = 2  # worker processes for the sympy part (jobs from more threads wait for one)
FORMAT_SLOTS = 1  # serve: worker jobs one answer format runs at once (its lane); the other workers stay for the rest
TEXT_THREADS = 1  # serve: the thread for the in-process part of grading (never waits for a worker; GIL-bound: one)
START_TIMEOUT_S = 60.0  # a worker that does not report ready by then is an error, not an overrun


@dataclass(frozen=True)
class Budget:
    """budget_ms: wall time one sympy evaluation (an extraction or a comparison) may take in the worker; max_chars:
    the text cap."""

    budget_ms: float = DEFAULT_BUDGET_MS
    max_chars: int = DEFAULT_MAX_CHARS

    def __post_init__(self) -> None:
        if isinstance(self.budget_ms, bool) or not isinstance(self.budget_ms, (int, float)) or \
                not math.isfinite(self.budget_ms) or not 1 <= self.budget_ms <= 600_000:
            raise RouterLiteError(f"grading budget must be 1..600000 ms, got {self.budget_ms!r}")
        if isinstance(self.max_chars, bool) or not isinstance(self.max_chars, int) or \
                not 1000 <= self.max_chars <= 10_000_000:
            raise RouterLiteError(f"grading text cap must be 1000..10000000 characters, got {self.max_chars!r}")

    @classmethod
    def of(cls, settings: Any) -> Budget:
        """The budget of a CollectionSettings (or anything with grading_budget_ms / grading_max_chars)."""
        return cls(float(getattr(settings, "grading_budget_ms", DEFAULT_BUDGET_MS)),
                   int(getattr(settings, "grading_max_chars", DEFAULT_MAX_CHARS)))


_default = Budget()


def configure(budget: Budget) -> Budget:
    """Set this process's default budget (serve/train at start-up); returns the previous one."""
    global _default
    previous, _default = _default, budget
    return previous


def default_budget() -> Budget:
    return _default


class Outcome(NamedTuple):
    value: Any
    status: str  # "ok", "overrun" (past the budget: the worker was killed) or "error" (an exception)


_counts: collections.Counter = collections.Counter()
_counts_lock = threading.Lock()


def _count(status: str, worker: bool) -> None:
    with _counts_lock:
        _counts["jobs"] += 1
        _counts["worker_jobs"] += int(worker)
        if status != "ok":
            _counts[status + "s"] += 1


def counts() -> dict[str, int]:
    """This process's totals: jobs, worker_jobs (needed sympy), overruns, errors."""
    with _counts_lock:
        return {k: int(_counts.get(k, 0)) for k in ("jobs", "worker_jobs", "overruns", "errors")}


# ------------------------------------------------------------------------------------------------- the worker
def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: a worker spinning in sympy dies when its forkserver (and so the main process) goes."""
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _worker_main(conn) -> None:
    _die_with_parent()
    # Ctrl-C reaches the whole terminal's process group: the server stops its workers itself (kill, PDEATHSIG), so a
    # worker takes no SIGINT and prints no KeyboardInterrupt traceback of its own
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        conn.send("ready")
    except OSError:  # the parent gave up waiting (or is gone)
        return
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result = ("ok", fn(*args))
        except Exception:  # noqa: BLE001 - any exception on a reply is "no answer"
            result = ("error", None)
        try:
            conn.send(result)
        except (OSError, ValueError):
            return


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="router-lite-grading")
        self.proc.start()
        child.close()
        if not self.conn.poll(START_TIMEOUT_S) or self.conn.recv() != "ready":
            self.kill()
            raise RuntimeError("grading worker did not start")

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.join(5)
        with contextlib.suppress(Exception):
            self.conn.close()


class _Pool:
    def __init__(self, size: int = POOL_SIZE):
        self.slots = threading.BoundedSemaphore(size)
        self.idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.ctx = None

    def _context(self):
        with self.lock:
            if self.ctx is None:
                try:
                    ctx = multiprocessing.get_context("forkserver")
                    from multiprocessing import forkserver

                    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:  # not started yet
                        ctx.set_forkserver_preload(["pipeline.collect.bounded", "pipeline.collect.bounded_warm"])
                except ValueError:  # no forkserver on this platform
                    ctx = multiprocessing.get_context("spawn")
                self.ctx = ctx
            return self.ctx

    def call(self, fn: Callable, args: tuple, timeout_s: float, queued_until: float | None = None) -> Outcome:
        """`fn(*args)` in a worker, killed past `timeout_s`. `queued_until` (time.monotonic()): a job that holds no
        worker by then is an overrun (serve's lanes); None waits for one as long as it takes."""
        left = None if queued_until is None else queued_until - time.monotonic()
        if (left is not None and left <= 0) or not self.slots.acquire(timeout=left):
            return Outcome(None, "overrun")
        try:
            return self._on_worker(fn, args, timeout_s)
        finally:
            self.slots.release()

    def _on_worker(self, fn: Callable, args: tuple, timeout_s: float) -> Outcome:
        try:
            worker = self.idle.get_nowait()
        except queue.Empty:
            try:
                worker = _Worker(self._context())
            except Exception as exc:  # noqa: BLE001 - no worker: this reply gets no answer, said once here
                log.warning("grading worker failed to start: %s", exc)
                return Outcome(None, "error")
        try:
            worker.conn.send((fn, args))
            if not worker.conn.poll(timeout_s):
                worker.kill()
                return Outcome(None, "overrun")
            status, value = worker.conn.recv()
        except (EOFError, OSError, ValueError, pickle.PicklingError):
            worker.kill()
            return Outcome(None, "error")
        self.idle.put(worker)
        return Outcome(value, status)

    def close(self) -> None:
        while True:
            try:
                self.idle.get_nowait().kill()
            except queue.Empty:
                return


_pool = _Pool()


def warm_up(background: bool = True) -> None:
    """Start one grading worker now (the forkserver imports and warms sympy once: seconds), so the first reply that
    needs sympy does not wait for it; in a daemon thread unless `background` is False (serve calls it at start)."""
    def start() -> None:
        with _pool.slots:
            try:
                _pool.idle.put(_Worker(_pool._context()))
            except Exception as exc:  # noqa: BLE001 - the first job will try again and count an error if it fails
                log.warning("grading worker failed to start: %s", exc)

    if background:
        threading.Thread(target=start, name="grading-warm-up", daemon=True).start()
    else:
        start()


def close() -> None:
    """Stop the idle workers (tests; a process exit stops them anyway)."""
    _pool.close()


# --------------------------------------------------------------------------------------------------- the jobs
Job = tuple[Callable, tuple]  # what a worker runs: fn(*args)
Steps = Generator[Job, Outcome, Any]  # a grading: yields each job that needs a worker, is sent its Outcome


def _job(fn: Callable, args: tuple) -> Steps:
    """One extraction or comparison: the fast path in process; where it needs sympy, the job is yielded for a worker
    (the driver sends back its Outcome)."""
    try:
        with sympy_refused():
            out = Outcome(fn(*args), "ok")
        _count("ok", False)
        return out
    except NeedsSympy:
        pass
    except Exception:  # noqa: BLE001 - any exception on a reply is "no answer"
        _count("error", False)
        return Outcome(None, "error")
    try:
        pickle.dumps(fn)
    except Exception:  # noqa: BLE001 - a registered grader made of lambdas cannot go to a worker
        log.warning("grader function %r cannot be sent to the grading worker: graded in process, unbounded", fn)
        try:
            out = Outcome(fn(*args), "ok")
        except Exception:  # noqa: BLE001
            out = Outcome(None, "error")
        _count(out.status, False)
        return out
    out = yield fn, args
    _count(out.status, True)
    return out


def _drive(steps: Steps, budget: Budget) -> Any:
    """Run a grading in this thread; each worker job waits for a worker as long as it takes (the blocking API)."""
    try:
        job = next(steps)
        while True:
            job = steps.send(_pool.call(*job, budget.budget_ms / 1000.0))
    except StopIteration as done:
        return done.value


_executors: dict[str, ThreadPoolExecutor] = {}
_executors_lock = threading.Lock()


def _executor(name: str, threads: int) -> ThreadPoolExecutor:
    with _executors_lock:
        if name not in _executors:
            _executors[name] = ThreadPoolExecutor(threads, thread_name_prefix=f"grading-{name}")
        return _executors[name]


def _advance(steps: Steps, sent: Outcome | None) -> tuple[bool, Any]:
    try:
        return False, steps.send(sent)
    except StopIteration as done:
        return True, done.value


async def _drive_async(steps: Steps, grader: str, budget: Budget) -> Any:
    """Run a grading off the event loop: its in-process parts in the text threads, each worker job in the grader's
    lane, one at a time (see the module docstring: "Queues")."""
    loop = asyncio.get_running_loop()
    sent = None
    while True:
        finished, value = await loop.run_in_executor(_executor("text", TEXT_THREADS), _advance, steps, sent)
        if finished:
            return value
        budget_s = budget.budget_ms / 1000.0
        sent = await loop.run_in_executor(_executor(f"lane-{grader}", FORMAT_SLOTS), _pool.call, *value, budget_s,
                                          time.monotonic() + budget_s)


def _capped(text: str, budget: Budget) -> str:
    return text[-budget.max_chars:] if len(text) > budget.max_chars else text


def _extract_job(spec, text: str):
    from pipeline.collect.grading import extract_answer_with

    return extract_answer_with(spec, text)


def _grade_job(spec, text: str, gold: str):
    from pipeline.collect.grading import extract_answer_with

    extracted = extract_answer_with(spec, text)
    return extracted, (False if extracted is None else bool(spec.equal(extracted, gold)))


def _agree_job(spec, a: str, b: str) -> bool:
    return bool(spec.agree(a, b))


def _extract_steps(spec, text: str | None, budget: Budget) -> Steps:
    if text is None or is_empty(text):
        return Outcome(None, "ok")
    return (yield from _job(_extract_job, (spec, _capped(str(text), budget))))


def _agree_steps(spec, a: str | None, b: str | None, budget: Budget) -> Steps:
    if a is None or b is None or is_empty(a) or is_empty(b):
        return Outcome(False, "ok")
    a, b = str(a), str(b)  # identical answers are compared too: a degenerate one agrees with nothing, itself included
    if len(a) > budget.max_chars or len(b) > budget.max_chars:
        return Outcome(False, "ok")
    out = yield from _job(_agree_job, (spec, a, b))
    return out if out.status == "ok" else Outcome(False, out.status)


def _table_steps(spec, answers: Iterable[str | None], budget: Budget) -> Steps:
    given = collections.Counter(str(a) for a in answers if a is not None and not is_empty(a))
    distinct = sorted(given)
    out, bad = {}, 0
    for i, a in enumerate(distinct):
        # an answer two agents gave is compared with itself too: identical text is no verdict (an integer task's
        # 2.5 agrees with nothing), and the cascade reads the table for every pair of agents
        for b in distinct[i if given[a] > 1 else i + 1:]:
            o = yield from _agree_steps(spec, a, b, budget)
            bad += o.status != "ok"
            out[(a, b)] = out[(b, a)] = bool(o.value)
    return out, bad


def _stage_steps(spec, texts: dict[Any, str | None], known: dict[Any, str | None], budget: Budget) -> Steps:
    got = {}
    for k, t in texts.items():
        got[k] = (yield from _extract_steps(spec, t, budget)) if t and t.strip() else Outcome(None, "ok")
    table, bad = yield from _table_steps(spec, [*known.values(), *(o.value for o in got.values())], budget)
    return got, table, bad + sum(o.status != "ok" for o in got.values())


def extract(text: str | None, grader: str, budget: Budget | None = None) -> Outcome:
    """The answer in `text` under `grader` (grading.extract_answer), bounded; an unknown grader is the caller's
    error (RouterLiteError), anything else that goes wrong is Outcome(None, status)."""
    budget = budget or _default
    return _drive(_extract_steps(grader_spec(grader), text, budget), budget)


def grade(text: str | None, gold: str, grader: str, budget: Budget | None = None) -> tuple[str | None, bool, str]:
    """(extracted, correct, status) like grading.grade, bounded: an overrun or an error is (None, False, status)."""
    budget = budget or _default
    spec = grader_spec(grader)
    if text is None or is_empty(text):
        return None, False, "ok"
    out = _drive(_job(_grade_job, (spec, _capped(str(text), budget), str(gold))), budget)
    if out.status != "ok":
        return None, False, out.status
    extracted, correct = out.value
    return extracted, correct, "ok"


def agree_outcome(a: str | None, b: str | None, grader: str, budget: Budget | None = None) -> Outcome:
    """Whether two extracted answers are equivalent (GraderSpec.agree), bounded: an overrun or an error disagrees.
    Identical answers are compared too: a degenerate answer (grading.py) agrees with nothing, itself included."""
    budget = budget or _default
    return _drive(_agree_steps(grader_spec(grader), a, b, budget), budget)


def agree(a: str | None, b: str | None, grader: str, budget: Budget | None = None) -> bool:
    return bool(agree_outcome(a, b, grader, budget).value)


def grade_stage(texts: dict[Any, str | None], known: dict[Any, str | None], grader: str, budget: Budget | None = None
                ) -> tuple[dict[Any, Outcome], dict[tuple[str, str], bool], int]:
    """One cascade stage's grading at once: the new replies' `texts` extracted (key -> Outcome), then the table of
    `agree_table_async` over those answers and the `known` ones; the count of extractions and comparisons without a
    verdict."""
    budget = budget or _default
    return _drive(_stage_steps(grader_spec(grader), texts, known, budget), budget)


# ---------------------------------------------------------------------------------------------- off the loop
async def extract_async(text: str | None, grader: str, budget: Budget | None = None) -> Outcome:
    """`extract` off the event loop (serve): in the text threads, sympy in the grader's lane."""
    budget = budget or _default
    return await _drive_async(_extract_steps(grader_spec(grader), text, budget), grader, budget)


async def agree_table_async(answers: Iterable[str | None], grader: str,
                            budget: Budget | None = None) -> tuple[dict[tuple[str, str], bool], int]:
    """({(a, b): agree} for every pair of distinct answers, both orders, and each answer given twice with itself; how
    many comparisons overran or failed), off
    the event loop (serve's cascade: its agreement rule then reads the table)."""
    budget = budget or _default
    return await _drive_async(_table_steps(grader_spec(grader), list(answers), budget), grader, budget)


async def grade_stage_async(texts: dict[Any, str | None], known: dict[Any, str | None], grader: str,
                            budget: Budget | None = None):
    """`grade_stage` off the event loop (serve): one hop to the text threads when no reply needs sympy."""
    budget = budget or _default
    return await _drive_async(_stage_steps(grader_spec(grader), dict(texts), dict(known), budget), grader, budget)
