"""Served traffic as a task source: one task per request of the log (pipeline/collect/traffic_log.py), its calls graded
like a collection's, and the explored, graded ones as reward rows of their own source `traffic`.

- **The task**: `traffic/<day>/<request_id>`, source `traffic`; `prompt` the user's last message as sent, `user_text`
  the text the router embedded, `messages` the whole conversation (JSON); a seeded split by a hash of the
  conversation with the profile's task-pool fractions (the same conversation sent again, that day or later, stays in
  its split: a held-out prompt is never trained on); `explored` when every agent of the router's pool replied.
- **Grading** by the decision's answer format (`FORMAT_GRADERS`): where the format has a grader and a reference
  answer exists, every reply is graded against it. The reference is the answer a strict majority of the strongest
  agents (at least two) give (`TrafficSettings.strongest`, else the pool's agents whose role is `strong*` in
  config/agents.yaml, fixed by role before any result): their agreement stands in for the gold answer a benchmark has.
  Without a reference (open-ended prompts, an unknown format, the strongest disagree or were not asked) a judge grades
  where the profile has one (`collection.judge`: each reply against the reference agent's reply to the same request,
  pipeline/collect/judge.py); else the call is `ungraded` with its reason: kept, never a reward, never a silent 0.
- **Reward rows**: only explored tasks whose every agent's call is graded (an error, an unjudgeable verdict or an
  ungraded call holds the task back), built by the collection's own `rewards.reward_matrix` in the matrix's agent order.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import pandas as pd
import pydantic

from pipeline.collect import bounded
from pipeline.collect.grading import GRADERS, is_empty
from pipeline.collect.judge import JUDGE_GRADER
from pipeline.collect.rewards import REWARD_COLUMNS
from pipeline.collect.rewards import reward_matrix as build_matrix
from pipeline.collect.traffic_log import TrafficRequest
from pipeline.core.config import Int, check_fields
from pipeline.core.errors import RouterLiteError

SOURCE = "traffic"
# the decision's `format` (the writer's names) -> the grader; a grader's own name is read as itself
FORMAT_GRADERS = {"integer": "integer", "expression": "math_expression", "letter": "mcq_letter",
                  "literal": "python_literal", "open": JUDGE_GRADER}
TASK_COLUMNS = ["task_id", "source", "day", "request_id", "ts", "prompt", "user_text", "messages",
                "conversation_hash", "split", "explored", "grader", "format", "router", "target", "served_agent",
                "policy", "ood", "reference", "reference_by"]
CALL_COLUMNS = ["agent", "model", "asked_by", "status", "error_kind", "response_text", "extracted", "correct",
                "reward", "grade_state", "grade_reason", "cost_usd", "latency_ms", "finish_reason", "repetition"]
TRAFFIC_COLUMNS = TASK_COLUMNS + CALL_COLUMNS
# grade_state: graded (against the reference answer), judged (the judge's reward), ungraded (its reason), error
GRADED_STATES = ("graded", "judged")


@dataclass(frozen=True)
class TrafficSettings:
    """`traffic:`: the served traffic as a task source (pycma style: option = default, meaning).

    strongest = ()
        The agents whose agreement makes a reference answer (a strict majority of them, at least two, must give the
        same answer). () = the pool's agents whose role starts with "strong" (config/agents.yaml).
    sensor_rows = 500
        The traffic sensor materialises the open day's partition each time its log has grown by this many lines
        since the last request (a closed day: once its UTC day is over, again if late lines arrive).
    seed = 0
        Seed of the split by conversation hash (the fractions are the task pool's `task_pool.split`).
    format = None
        The answer format of a request whose decision names none (a prompt-only router records none; a cascade
        its guess), e.g. "mcq_letter" for a deployment that serves only multiple choice. None: such a request is
        graded by the judge where the profile has one, else ungraded.
    """

    strongest: tuple[str, ...] = ()
    sensor_rows: Annotated[Int, pydantic.Field(ge=1)] = 500
    seed: Int = 0
    format: str | None = None

    def __post_init__(self) -> None:
        check_fields(self, "traffic")
        if self.format is not None and grader_of(self.format) is None:
            raise RouterLiteError(f"traffic.format {self.format!r} is no answer format: one of "
                                  f"{', '.join([*FORMAT_GRADERS, *GRADERS])}")


def grader_of(fmt: str | None) -> str | None:
    """The grader of a decision's answer format; None for an unknown or missing one."""
    if fmt is None:
        return None
    g = FORMAT_GRADERS.get(fmt, fmt)
    return g if g in GRADERS else None


def split_of(key: str, fractions: dict[str, float], seed: int = 0) -> str:
    """The seeded split of a request: a hash of (seed, its conversation hash) read as a uniform draw against the
    fractions in train, validation, test order."""
    u = int(hashlib.sha256(f"{seed}|{key}".encode()).hexdigest()[:12], 16) / float(1 << 48)
    edge = 0.0
    for name in ("train", "validation", "test"):
        edge += float(fractions.get(name, 0.0))
        if u < edge:
            return name
    return "test"


def strongest_agents(agents, settings: TrafficSettings) -> list[str]:
    """The agents whose agreement is the reference: the setting, else the `strong*` roles, in pool order."""
    names = [a.name for a in agents]
    if settings.strongest:
        unknown = [a for a in settings.strongest if a not in names]
        if unknown:
            raise RouterLiteError(f"traffic.strongest names {unknown}, not agents of the pool ({', '.join(names)})")
        return list(settings.strongest)
    return [a.name for a in agents if str(a.role or "").startswith("strong")]


def _status(call) -> str:
    if call.error is not None:
        return "error"
    return "empty" if call.reply is None or is_empty(call.reply) else "ok"


def _reference(answers: dict[str, str | None], strongest: list[str], grader: str,
               budget: bounded.Budget) -> tuple[str | None, str]:
    """(the answer a strict majority of the strongest agents give, who gave it) or (None, why not)."""
    asked = [a for a in strongest if a in answers]
    given = [(a, answers[a]) for a in asked if answers[a] is not None]
    need = max(2, len(strongest) // 2 + 1)
    if len(strongest) < 2:
        return None, f"fewer than two strongest agents ({', '.join(strongest) or 'none'}) to agree"
    for a, ans in given:
        with_it = [b for b, other in given if b == a or bounded.agree(ans, other, grader, budget)]
        if len(with_it) >= need:
            return ans, ",".join(with_it)
    return None, (f"no reference: {len(given)} of the strongest ({', '.join(strongest)}) gave an answer, "
                  f"{need} must agree")


def task_rows(req: TrafficRequest, day: str, fractions: dict[str, float], settings: TrafficSettings) -> dict:
    r = req.request
    fmt = r.decision.format if r.decision.format is not None else settings.format
    users = [m.content for m in r.messages if m.role == "user"]
    return {"task_id": f"{SOURCE}/{day}/{r.request_id}", "source": SOURCE, "day": day, "request_id": r.request_id,
            "ts": r.ts, "prompt": users[-1] if users else r.messages[-1].content, "user_text": r.routed_text,
            "messages": json.dumps([m.model_dump() for m in r.messages], ensure_ascii=False),
            "conversation_hash": r.conversation_hash,
            "split": split_of(r.conversation_hash, fractions, settings.seed),  # the same conversation: one split
            "explored": req.explored, "grader": grader_of(fmt), "format": fmt,
            "router": r.router, "target": r.target, "served_agent": r.decision.agent, "policy": r.decision.policy,
            "ood": bool(r.decision.ood), "reference": None, "reference_by": None}


def _instruction(req: TrafficRequest) -> str:
    """What the judge is shown as the instruction: the user's message; a conversation as its turns, so a follow-up is
    judged with what it follows."""
    msgs = req.request.messages
    if len(msgs) == 1:
        return msgs[0].content
    return "\n\n".join(f"{m.role}: {m.content}" for m in msgs)


# judge([(task_id, agent, instruction, reply, reference reply)]) -> the judge fields of each (judge_call.py)
Judge = Callable[[list[tuple[str, str, str, str, str]]], list[dict]]


@dataclass(frozen=True)
class TrafficJudge:
    """The judge of the replies without a reference answer: `judge` compares each with `reference`'s reply (the
    profile's `collection.judge.reference`) to the same request."""

    judge: Judge
    reference: str


def _answers(calls, grader: str | None, strongest: list[str], budget: bounded.Budget):
    """(each replying agent's extracted answer, the reference answer or None, who gave it or why there is none)."""
    if grader is None or grader == JUDGE_GRADER:
        return {}, None, ("open-ended (no answer to agree on)" if grader == JUDGE_GRADER
                          else "answer format unknown")
    answers = {c.agent: bounded.extract(c.reply, grader, budget).value if _status(c) == "ok" else None
               for c, _ in calls if _status(c) != "error"}
    ref, by = _reference(answers, strongest, grader, budget)
    return answers, ref, by


def _grade(row: dict, call, ref: str | None, by: str, budget: bounded.Budget) -> dict:
    """The row's grade against the reference answer, or why it has none yet (the judge may still grade it)."""
    if row["status"] == "error":
        return {"grade_state": "error", "grade_reason": f"call failed: {call.error}"}
    if ref is None:
        return {}
    ok = row["status"] == "ok" and bounded.grade(call.reply, ref, row["grader"], budget)[1]
    return {"correct": bool(ok), "reward": float(ok), "grade_state": "graded",
            "grade_reason": f"against the answer of {by}"}


def _judged(rows: list[dict], to_judge: list[tuple[int, tuple]], judge: Judge) -> None:
    for (i, _), got in zip(to_judge, judge([item for _, item in to_judge])):
        judged = got.get("reward") is not None
        reason = f"judge: {got.get('judge_state')}" + (f" ({got['judge_reason']})" if got.get("judge_reason") else "")
        rows[i].update(reward=got.get("reward"), correct=got["reward"] > 0.5 if judged else None,
                       grade_state="judged" if judged else "ungraded", grade_reason=reason,
                       judge_cost_usd=float(got.get("judge_cost_usd") or 0.0))


def _judged_before(prior: pd.DataFrame | None) -> dict[tuple[str, str, str], dict]:
    """(task_id, agent, reply) -> the judge's grade in an earlier read of the same day: not asked again."""
    if prior is None or not len(prior) or "grade_state" not in prior:
        return {}
    done = prior[(prior["grade_state"] == "judged") & prior["response_text"].notna()]
    return {(t, a, x): {"reward": float(r), "correct": bool(c), "grade_state": "judged", "grade_reason": why,
                        "judge_cost_usd": 0.0}
            for t, a, x, r, c, why in zip(done["task_id"], done["agent"], done["response_text"], done["reward"],
                                          done["correct"], done["grade_reason"])}


def traffic_rows(requests: list[TrafficRequest], day: str, agents, settings: TrafficSettings,
                 fractions: dict[str, float], judging: TrafficJudge | None = None,
                 budget: bounded.Budget | None = None, prior: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (request, call), TRAFFIC_COLUMNS + judge_cost_usd, graded as the module docstring says. `agents`:
    the profile's pool (AgentSpec: name, role); `judging`: the profile's judge (None: it has none); `prior`: this
    day's rows as read before (the open day is read again as it grows): a reply judged then keeps its grade, no
    second judge call."""
    budget = budget or bounded.default_budget()
    judge, judge_reference = (judging.judge, judging.reference) if judging is not None else (None, None)
    strongest = strongest_agents(agents, settings)
    before = _judged_before(prior)
    rows, to_judge = [], []
    for req in requests:
        task, calls = task_rows(req, day, fractions, settings), req.calls
        answers, ref, by = _answers(calls, task["grader"], strongest, budget)
        if task["grader"] is None:
            by = f"{by} (decision format {task['format']!r})"
        task.update(reference=ref, reference_by=by if ref is not None else None)
        replies = {c.agent: c.reply for c, _ in calls if _status(c) == "ok"}
        for c, asked_by in calls:
            row = {**task, "agent": c.agent, "model": c.model, "asked_by": asked_by, "status": _status(c),
                   "error_kind": c.error, "response_text": c.reply, "extracted": answers.get(c.agent),
                   "correct": None, "reward": None, "grade_state": "ungraded", "grade_reason": by,
                   "cost_usd": c.cost_usd, "latency_ms": c.latency_ms, "finish_reason": c.finish_reason,
                   "repetition": 0, "judge_cost_usd": 0.0}
            row.update(_grade(row, c, ref, by, budget))
            ungraded = row["grade_state"] == "ungraded"
            if ungraded and judge is not None and judge_reference in replies:
                if row["status"] == "empty":  # an empty reply earns 0, as in a collection: no judge call
                    row.update(correct=False, reward=0.0, grade_state="judged", grade_reason="empty reply")
                elif (task["task_id"], c.agent, c.reply) in before:
                    row.update(before[(task["task_id"], c.agent, c.reply)])
                else:
                    to_judge.append((len(rows), (task["task_id"], c.agent, _instruction(req), c.reply,
                                                 replies[judge_reference])))
            elif ungraded:
                row["grade_reason"] = (f"{by}; the judge's reference agent {judge_reference!r} did not reply"
                                       if judge is not None else f"{by}; the profile has no judge (collection.judge)")
            rows.append(row)
    if to_judge:
        _judged(rows, to_judge, judge)
    return pd.DataFrame(rows, columns=[*TRAFFIC_COLUMNS, "judge_cost_usd"])


def pool_judge(client_for, agents, js, settings, concurrency: int = 8) -> TrafficJudge:
    """A `Judge` through the pool's clients: `pipeline.collect.judge_call.judge_reply` per reply, the reference being
    `js.reference`'s reply to the same request (its own reply: a tie without a call)."""
    from pipeline.collect.calls import close_clients, run_sync
    from pipeline.collect.judge import judge_agent
    from pipeline.collect.judge_call import judge_reply

    ref = next(a for a in agents if a.name == js.reference)
    judge = judge_agent(js, ref)

    def run(items: list[tuple[str, str, str, str, str]]) -> list[dict]:
        async def all_of() -> list[dict]:
            client, gate = client_for(judge), asyncio.Semaphore(concurrency)

            async def one(task_id, agent, instruction, reply, reference):
                async with gate:
                    return await judge_reply(client, judge, js, settings, task_id, agent, instruction,
                                             (reply, reference))
            try:
                return list(await asyncio.gather(*(one(*it) for it in items)))
            finally:
                await close_clients({judge.name: client})

        return run_sync(all_of())

    return TrafficJudge(run, js.reference)


def traffic_reward_rows(rows: pd.DataFrame, agents: list[str]) -> pd.DataFrame:
    """Reward rows (REWARD_COLUMNS, then source, split) of the explored traffic tasks whose every agent of `agents` has
    a graded call; `agents`: the reward matrix's agent order. Nothing else becomes a reward."""
    cols = [*REWARD_COLUMNS, "source", "split"]
    if rows is None or not len(rows):
        return pd.DataFrame(columns=cols)
    mine = rows[rows["agent"].isin(agents)]
    ok = mine.groupby("task_id")["grade_state"].agg(lambda s: bool(s.isin(GRADED_STATES).all()))
    covered = mine.groupby("task_id")["agent"].agg(lambda s: set(agents) <= set(s))
    explored = rows.groupby("task_id")["explored"].first().astype(bool)
    keep = [t for t in ok.index if ok[t] and covered[t] and explored.get(t, False)]
    if not keep:
        return pd.DataFrame(columns=cols)
    calls = mine[mine["task_id"].isin(keep)].assign(
        reward=lambda d: d["reward"].astype(float), correct=lambda d: d["reward"].astype(float) > 0.5)
    matrix = build_matrix(calls, list(agents)).rows
    split = rows.groupby("task_id")["split"].first()
    return matrix.assign(source=SOURCE, split=matrix["task_id"].map(split))[cols]


def traffic_tasks(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per traffic task (TASK_COLUMNS, and `gold`: the reference answer, None without one), in the task
    contract's names: what a consumer embeds (`user_text`) and splits on, joined to the reward rows by task_id."""
    if rows is None or not len(rows):
        return pd.DataFrame(columns=[*TASK_COLUMNS, "gold"])
    return rows.drop_duplicates("task_id")[TASK_COLUMNS].assign(gold=lambda d: d["reference"]).reset_index(drop=True)


def with_traffic(reward_rows: pd.DataFrame, traffic: pd.DataFrame) -> pd.DataFrame:
    """The reward matrix with the traffic reward rows after its own (same agent order, REWARD_COLUMNS); without
    traffic rows, `reward_rows` itself, unchanged."""
    if traffic is None or not len(traffic):
        return reward_rows
    agents = list(reward_rows["agent_order"].iloc[0]) if len(reward_rows) else None
    bad = [t for t, order in zip(traffic["task_id"], traffic["agent_order"]) if agents and list(order) != agents]
    if bad:
        raise RouterLiteError(f"traffic reward row {bad[0]} has another agent order than the reward matrix ({agents})")
    return pd.concat([reward_rows, traffic[list(reward_rows.columns)]], ignore_index=True)


def day_summary(rows: pd.DataFrame) -> dict[str, Any]:
    """Counts for a partition's metadata: requests, explored, and calls per grade state."""
    tasks = rows.drop_duplicates("task_id") if len(rows) else rows
    return {"requests": int(len(tasks)), "explored": int(tasks["explored"].sum()) if len(tasks) else 0,
            "calls": int(len(rows)),
            "grade_states": {str(k): int(v) for k, v in rows["grade_state"].value_counts().items()} if len(rows)
            else {},
            "mean_reward": float(np.nanmean(rows["reward"].astype(float))) if len(rows) and
            rows["reward"].notna().any() else None}


def due_days(sizes: dict[str, int], today: str, cursor: dict[str, int], min_rows: int) -> list[tuple[str, int]]:
    """The (day, size) to materialise: a closed day (before `today`, UTC) whose size differs from the size last
    requested (late exploration lines too); the open day once it has grown by `min_rows` lines since the last request.
    `cursor`: day -> the size last requested; a (day, size) already requested is never requested again."""
    due = []
    for day, size in sorted(sizes.items()):
        last = cursor.get(day)
        if size <= 0 or last == size:
            continue
        if day < today or (day == today and size - (last or 0) >= min_rows):
            due.append((day, size))
    return due
