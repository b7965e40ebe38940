"""Grading queues in serve (pipeline/collect/bounded.py, "Queues"): grading that needs no sympy worker never waits
behind work that does, one answer format's sympy jobs never hold the others' workers, and a job that gets no worker
within its budget is an overrun. The assertions are on order (what finished while what was still waiting), with
bounds far above the time each step takes."""
from __future__ import annotations

import asyncio
import threading

import pytest

from pipeline.collect import bounded

EXP3, TAN = r"\exp(\exp(\exp(100)))", r"\tan(\exp(\exp(20)))"
SYMPY_PAIR = ["2x+1", "1+2x"]  # equal, and only sympy says so
MANY = 64  # more sympy gradings than any event loop's default thread pool has threads (32 at most)


@pytest.fixture(scope="module", autouse=True)
def _pool():
    bounded.warm_up(background=False)  # the forkserver's start (seconds) is not what these tests look at
    yield


class _AllSlotsHeld:
    """Every worker slot taken, as by jobs that never end."""

    def __enter__(self):
        for _ in range(bounded.POOL_SIZE):
            bounded._pool.slots.acquire()
        return self

    def __exit__(self, *exc):
        for _ in range(bounded.POOL_SIZE):
            bounded._pool.slots.release()


def test_text_only_grading_never_waits_behind_sympy():
    budget = bounded.Budget(budget_ms=60_000)  # the sympy gradings may wait that long for a worker

    async def scenario():
        with _AllSlotsHeld():
            sympy = [asyncio.ensure_future(bounded.agree_table_async(SYMPY_PAIR, "math_expression", budget))
                     for _ in range(MANY)]
            await asyncio.sleep(0.5)  # all of them queued for a worker
            stage = await asyncio.wait_for(bounded.grade_stage_async(
                {"a": "The answer is 7", "b": "So the answer is $7$."}, {"c": "7"}, "integer"), 20)
            waiting = sum(not s.done() for s in sympy)
        return stage, waiting, await asyncio.wait_for(asyncio.gather(*sympy), 60)

    (got, table, bad), waiting, tables = asyncio.run(scenario())
    assert {k: o.value for k, o in got.items()} == {"a": "7", "b": "7"} and bad == 0
    assert waiting == MANY  # graded while every sympy job still waited: it was never queued behind them
    assert all(t == ({("1+2x", "2x+1"): True, ("2x+1", "1+2x"): True}, 0) for t in tables)  # none lost


def test_one_formats_poison_leaves_the_other_formats_a_worker():
    poison = bounded.Budget(budget_ms=5000)  # each poisoned comparison spins 5 s before its worker is killed

    async def scenario():
        spinning = [asyncio.ensure_future(bounded.agree_table_async([EXP3, TAN], "math_expression", poison))
                    for _ in range(3)]
        await asyncio.sleep(0.3)  # in the workers (or queued for one)
        out = await asyncio.wait_for(bounded.extract_async(r"The answer is $\sqrt{16}$", "integer", poison), 20)
        still = sum(not s.done() for s in spinning)
        return out, still, await asyncio.gather(*spinning)

    before = bounded.counts()
    out, still, tables = asyncio.run(scenario())
    assert out == bounded.Outcome("4", "ok")  # an integer that needs sympy (a worker) got one
    assert still == 3  # ... while the math_expression poison still held its own
    assert all(t == ({(EXP3, TAN): False, (TAN, EXP3): False}, 1) for t in tables)  # each an overrun: no answer
    assert bounded.counts()["overruns"] - before["overruns"] == 3


def test_no_worker_within_the_budget_is_an_overrun_in_serve_only():
    before = bounded.counts()

    async def serve_side():
        with _AllSlotsHeld():  # released before asyncio.run waits for its threads
            return await asyncio.wait_for(bounded.agree_table_async(SYMPY_PAIR, "math_expression",
                                                                    bounded.Budget(budget_ms=200)), 20)

    table, bad = asyncio.run(serve_side())
    assert bad == 1 and table[tuple(sorted(SYMPY_PAIR))] is False  # no verdict: escalate
    assert bounded.counts()["overruns"] - before["overruns"] == 1

    # the blocking API (collection, regrade, train) waits for a worker: its verdicts never depend on the load
    got = []
    with _AllSlotsHeld():
        batch = threading.Thread(target=lambda: got.append(
            bounded.agree_outcome(*SYMPY_PAIR, "math_expression", bounded.Budget(budget_ms=200))))
        batch.start()
        batch.join(1.0)
        assert batch.is_alive()  # still waiting, past its budget
    batch.join(30)
    assert got == [bounded.Outcome(True, "ok")]
