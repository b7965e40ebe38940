"""`collect(...)`: the calls of (tasks x agents x repetition) missing from a `CallLog`, bounded concurrency per
provider, each finished call graded and appended (group-committed, fsync'ed) at once; a progress line with rate and
ETA every 10 s. `run_collect` / `run_sync`: the same from synchronous code."""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from pipeline.collect import bounded
from pipeline.collect.agents import AgentSpec
from pipeline.collect.budget import Budget
from pipeline.collect.call_log import CallLog, call_key
from pipeline.collect.client import call_once
from pipeline.collect.costs import logged_cost
from pipeline.collect.grading import GRADERS
from pipeline.collect.judge import JUDGE_GRADER, JudgeSettings, judge_agent, judge_prompts, tie_fields
from pipeline.collect.judge_call import judge_reply
from pipeline.collect.settings import CollectionSettings
from pipeline.core.errors import RouterLiteError
from pipeline.core.progress import RateLog

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------- collection
GradeFn = Callable[[Any, str, str], tuple]
TASK_COLUMNS = ("task_id", "prompt", "gold", "grader")


def _check_tasks(tasks_df: pd.DataFrame) -> None:
    missing = [c for c in TASK_COLUMNS if c not in tasks_df.columns]
    if missing:
        raise RouterLiteError(f"tasks frame lacks column(s) {missing} (has {list(tasks_df.columns)})")
    dup = tasks_df["task_id"][tasks_df["task_id"].duplicated()].unique().tolist()
    if dup:
        raise RouterLiteError(f"duplicate task_id(s) in tasks frame: {dup[:5]}")
    bad = [t for t, p in zip(tasks_df["task_id"], tasks_df["prompt"]) if not isinstance(p, str) or not p.strip()]
    if bad:
        raise RouterLiteError(f"task(s) without a prompt: {bad[:5]}")
    graders = set(tasks_df["grader"]) - set(GRADERS)
    if graders:
        raise RouterLiteError(f"unknown grader(s) {sorted(map(str, graders))} in tasks frame; "
                              f"known: {', '.join(GRADERS)}")


def check_agents(agents: list[AgentSpec]) -> None:
    if not agents:
        raise RouterLiteError("empty agent pool: nothing to collect")
    dup = sorted(n for n, c in collections.Counter(a.name for a in agents).items() if c > 1)
    if dup:
        raise RouterLiteError(f"duplicate agent name(s) {dup}")


class _GroupCommit:
    """Appends rows to a CallLog from a background task: all rows waiting are written with one fsync per file;
    `write(row)` returns once its row is on disk."""

    def __init__(self, call_log: CallLog):
        self.call_log = call_log
        self.pending: list[tuple[dict, asyncio.Future]] = []
        self.wake = asyncio.Event()
        self.closed = False

    async def write(self, row: dict) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((row, fut))
        self.wake.set()
        await fut

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.pending = self.pending, []
            if batch:
                try:
                    await asyncio.to_thread(self.call_log.append_many, [r for r, _ in batch])
                except BaseException as exc:  # noqa: BLE001 - hand the failure to every waiting writer
                    for _, f in batch:
                        if not f.done():
                            f.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for _, f in batch:
                    if not f.done():
                        f.set_result(None)
            elif self.closed:
                return


async def close_clients(clients: dict) -> None:
    for c in {id(c): c for c in clients.values()}.values():
        close = getattr(c, "close", None)
        if close is not None:
            try:
                res = close()
                if asyncio.iscoroutine(res):
                    await res
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


async def collect(tasks_df: pd.DataFrame, agents: list[AgentSpec], repetition: int, call_log: CallLog,
                  client_for: Callable[[AgentSpec], Any], settings: CollectionSettings | None = None,
                  grade_fn: GradeFn | None = None, budget: Budget | None = None) -> pd.DataFrame:
    """Make the calls of (tasks x agents x `repetition`) missing from `call_log`; return all of them, graded.

    `tasks_df` needs task_id, prompt, gold, grader. Done = a row with status ok or empty in the log; error rows are
    logged but retried by the next collection. At most `settings.concurrency` calls are in flight per provider.
    Each finished call is graded (`grade_fn(text, gold, grader) -> (extracted, correct)`, default
    `pipeline.collect.grading.grade` under the settings' grading budget (pipeline/collect/bounded.py: a reply that
    overruns it or raises is logged and graded as unparsable); errors are not graded: correct None), in a thread, and
    appended to the log before the next call of that worker starts. `client_for(agent)` is called once per agent
    before any call (so a missing key fails first); the clients are closed at the end. Returns one row per call key
    (CALL_FIELDS columns), in task x agent order. A USD `budget` (pipeline/collect/budget.py): each call reserves its
    worst case first, settles once logged; once it stops, no call starts (`budget.stopped`), the rows made return.
    """
    settings = settings or CollectionSettings()
    grading, before = bounded.Budget.of(settings), bounded.counts()  # grading's time budget (not the USD `budget`)
    grade_fn = grade_fn or (lambda text, gold, grader: _bounded_grade(text, gold, grader, grading))
    _check_tasks(tasks_df)
    check_agents(agents)
    sh = settings.hash()
    judging = _Judging.of(tasks_df, agents, settings, call_log, repetition, sh)
    clients = {a.name: client_for(a) for a in [*agents, *([judging.judge] if judging is not None else [])]}
    done = call_log.keys()
    tasks = tasks_df[list(TASK_COLUMNS)].to_dict("records")
    wanted, queues = _call_queues(tasks, agents, repetition, sh, done)
    rounds = [queues] if judging is None else judging.rounds(queues)
    n_todo = sum(len(q) for q in queues.values())
    log.info("collect: %d calls wanted, %d already done, %d to make", len(wanted), len(wanted) - n_todo, n_todo)
    counts = collections.Counter()
    committer = _GroupCommit(call_log)
    progress = RateLog("collect", "calls", log.info, every_s=10.0)  # rate + ETA, in the Dagster step log too

    async def worker(queue: collections.deque) -> None:
        while queue:
            k, a, t = queue.popleft()
            held = None if budget is None else await budget.reserve(a, t["prompt"])
            if budget is not None and held is None:  # the budget stopped: this call and the rest stay unmade
                return
            fields = await call_once(clients[a.name], a, t["prompt"], settings)
            judged = None
            if judging is not None and t["grader"] == JUDGE_GRADER and fields["status"] == "ok":
                if held is not None:  # settled before the judge reserves: a worker never waits on its own call
                    await budget.settle(held, fields["cost_usd"])
                    held = None
                judged = await judging.judge_fields(clients, a, t, fields["response_text"], budget)
            row = await asyncio.to_thread(_graded_row, k, a, t, repetition, sh, fields, grade_fn, judged)
            await committer.write(row)
            if held is not None:
                await budget.settle(held, fields["cost_usd"])
            counts[fields["status"]] += 1
            progress(sum(counts.values()), n_todo)

    try:
        await _run_rounds(rounds, settings.concurrency, worker, committer)
    finally:
        await close_clients(clients)
    log.info("collect: made %d calls (%s)", sum(counts.values()), dict(counts))
    _warn_no_verdict(before, grading)
    return _estimated_refused(_in_order(call_log, wanted), agents)


async def _run_rounds(rounds: list[dict], concurrency: int, worker, committer) -> None:
    """Each round's queues drained by up to `concurrency` workers a queue, round after round (a judged collection:
    the reference agent's replies first, then the others), the call log's group commit running beside them."""
    async with asyncio.TaskGroup() as tg:
        commit_task = tg.create_task(committer.run())
        for qs in rounds:
            async with asyncio.TaskGroup() as workers:
                for q in qs.values():
                    for _ in range(min(concurrency, len(q))):
                        workers.create_task(worker(q))
        committer.close()
        await commit_task


def _warn_no_verdict(before: dict, grading: bounded.Budget) -> None:
    after = bounded.counts()
    bad = {k: after[k] - before[k] for k in ("overruns", "errors") if after[k] > before[k]}
    if bad:
        log.warning("collect: grading gave no verdict on some replies (%s; graded as unparsable, budget %g ms; "
                    "counts of this process, concurrent graders included)", bad, grading.budget_ms)


def _in_order(call_log: CallLog, wanted: list[str]) -> pd.DataFrame:
    """The log's latest row of every wanted call key, in the wanted (task x agent) order."""
    latest = call_log.latest()
    order = {k: i for i, k in enumerate(wanted)}
    out = latest[latest["call_key"].isin(order)].copy()
    out["_order"] = out["call_key"].map(order)
    return out.sort_values("_order").drop(columns="_order").reset_index(drop=True)


def _estimated_refused(calls: pd.DataFrame, agents: list[AgentSpec]) -> pd.DataFrame:
    """`calls` with the cost of a row whose logged cost was refused (CallLog reads it as None, `cost_invalid`: a log
    written before costs were checked) estimated from its agent's prices x tokens (pipeline/collect/costs.py)."""
    if "cost_invalid" not in calls.columns:
        return calls
    by_name = {a.name: a for a in agents}
    bad = (calls["cost_invalid"] == True) & calls["cost_usd"].isna()  # noqa: E712 - None / NaN / True in one column
    if bad.any():
        calls.loc[bad, "cost_usd"] = [logged_cost(r, by_name.get(r["agent"])) for r in calls[bad].to_dict("records")]
    return calls


def _call_queues(tasks: list[dict], agents: list[AgentSpec], repetition: int, sh: str, done):
    """(every wanted call key in task x agent order, per provider a queue of the (key, agent, task) not done)."""
    wanted: list[str] = []
    queues: dict[str, collections.deque] = collections.defaultdict(collections.deque)
    for t in tasks:
        for a in agents:
            k = call_key(a.name, str(t["task_id"]), repetition, sh)
            wanted.append(k)
            if k not in done:
                queues[a.provider].append((k, a, t))
    return wanted, queues


class _Judging:
    """What a collection of judge-graded tasks needs (pipeline/collect/judge.py): the judge agent, its settings, and
    the reference agent's reply to each task (from the log, then from this collection's own calls, made first)."""

    def __init__(self, js: JudgeSettings, judge: AgentSpec, settings, references: dict[str, str]):
        self.js, self.judge, self.settings, self.references = js, judge, settings, references

    @classmethod
    def of(cls, tasks_df, agents, settings, call_log: CallLog, repetition: int, sh: str) -> _Judging | None:
        if "grader" not in tasks_df or not (tasks_df["grader"] == JUDGE_GRADER).any():
            return None
        js = getattr(settings, "judge", None) or JudgeSettings()
        if not js.model or not js.reference:
            js.check([])  # the one error naming what is missing
        ref = next((a for a in agents if a.name == js.reference), agents[0])
        latest = call_log.latest()
        refs = {}
        if len(latest):
            mine = latest[(latest["agent"] == js.reference) & (latest["status"] == "ok")
                          & (latest["repetition"] == repetition) & (latest["settings_hash"] == sh)]
            refs = dict(zip(mine["task_id"].astype(str), mine["response_text"].astype(str)))
        return cls(js, judge_agent(js, ref), settings, refs)

    def rounds(self, queues: dict) -> list[dict]:
        first = {p: collections.deque(x for x in q if x[1].name == self.js.reference) for p, q in queues.items()}
        rest = {p: collections.deque(x for x in q if x[1].name != self.js.reference) for p, q in queues.items()}
        return [first, rest]

    async def judge_fields(self, clients: dict, a: AgentSpec, t: dict, text: str, budget: Budget | None) -> dict:
        task_id = str(t["task_id"])
        if a.name == self.js.reference:
            self.references[task_id] = text
            return tie_fields(self.js)
        reference = self.references.get(task_id)
        held = None
        if budget is not None and reference is not None:
            prompts = judge_prompts(self.js, task_id, a.name, str(t["prompt"]), text, reference)
            held = await budget.reserve(self.judge, "".join(prompts), self.js.max_tokens * len(prompts))
            if held is None:
                from pipeline.collect.judge import unjudgeable_fields

                return unjudgeable_fields(self.js, "the collection budget stopped before the judge call")
        out = await judge_reply(clients[self.judge.name], self.judge, self.js, self.settings, task_id, a.name,
                                str(t["prompt"]), (text, reference))
        if held is not None:
            await budget.settle(held, out["judge_cost_usd"])
        return out


def _graded_row(k: str, a: AgentSpec, t: dict, repetition: int, sh: str, fields: dict, grade_fn: GradeFn,
                judged: dict | None = None) -> dict:
    """The call-log row of one finished call, graded (errors are not graded; an empty reply is not correct); a
    judge-graded reply carries its judge fields (`reward` in [0, 1], or None when unjudgeable: never a 0)."""
    if judged is not None:
        extracted, correct = None, (None if judged["reward"] is None else judged["reward"] > 0.5)
    elif fields["status"] == "error":
        extracted, correct = None, None
    elif t["grader"] == JUDGE_GRADER:  # an empty reply (earns 0), unjudged
        extracted, correct = None, False
    else:
        extracted, correct = grade_fn(fields["response_text"], str(t["gold"]), t["grader"])
        correct = bool(correct) if fields["status"] == "ok" else False
    return {"call_key": k, "agent": a.name, "model": a.model, "task_id": str(t["task_id"]),
            "repetition": int(repetition), "settings_hash": sh, "status": fields["status"],
            "error_kind": fields["error_kind"], "response_text": fields["response_text"],
            "extracted": extracted, "correct": correct, "prompt_tokens": fields["prompt_tokens"],
            "completion_tokens": fields["completion_tokens"], "cost_usd": fields["cost_usd"],
            "latency_ms": fields["latency_ms"], "finish_reason": fields["finish_reason"],
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "attempts": fields["attempts"], "error_message": fields["error_message"],
            "usage_source": fields["usage_source"],
            **({"cost_invalid": True} if fields.get("cost_invalid") else {}),  # the provider's cost refused
            **(judged or {})}


def _bounded_grade(text, gold: str, grader: str, budget: bounded.Budget) -> tuple:
    extracted, correct, status = bounded.grade(text, gold, grader, budget)
    if status != "ok":
        log.warning("collect: grading %s on a %s reply of %d characters (graded as unparsable)", status, grader,
                    len(text or ""))
    return extracted, correct


def _stop_in(group: BaseExceptionGroup) -> BaseException | None:
    """The interrupt a task group wrapped (a BaseException that is no Exception: Ctrl-C as KeyboardInterrupt or as an
    orchestrator's own interrupt), None when it holds only errors."""
    for e in group.exceptions:
        found = _stop_in(e) if isinstance(e, BaseExceptionGroup) else None if isinstance(e, Exception) else e
        if found is not None:
            return found
    return None


async def _stoppable(coro):
    """`coro`, stopped by an interrupt that a signal handler raised inside one of the loop's own callbacks. An
    orchestrator's SIGINT handler raises its interrupt wherever the main thread is; inside a callback (the loop's
    wake-up read, a timer) asyncio hands every BaseException but KeyboardInterrupt/SystemExit to the exception
    handler, which logs it and goes on: Ctrl-C was lost and the collection ran to its end."""
    loop, main = asyncio.get_running_loop(), asyncio.current_task()
    stops: list[BaseException] = []

    def on_error(loop, context):
        exc = context.get("exception")
        if isinstance(exc, BaseException) and not isinstance(exc, Exception):
            stops.append(exc)
            main.cancel()
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(on_error)
    try:
        result = await coro
    except asyncio.CancelledError:
        if stops:
            raise stops[0] from None
        raise
    if stops:  # the coroutine took the cancel and returned what it had: the stop still stands
        raise stops[0]
    return result


def run_sync(coro):
    """Run a coroutine from synchronous code: its own event loop, in a helper thread inside a running loop. An
    interrupt inside one of its tasks, or raised by a signal handler inside one of the loop's callbacks, leaves as
    itself, not wrapped in an exception group nor logged and dropped, so the caller sees a stop."""
    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(_stoppable(coro))
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            return ex.submit(asyncio.run, _stoppable(coro)).result()
    except BaseExceptionGroup as group:
        stop = None if isinstance(group, Exception) else _stop_in(group)
        if stop is None:
            raise
        raise stop from None


def run_collect(*args: Any, **kwargs: Any) -> pd.DataFrame:
    """`collect` from synchronous code (its own event loop; a helper thread inside a running loop)."""
    return run_sync(collect(*args, **kwargs))
