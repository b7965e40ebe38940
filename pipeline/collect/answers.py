"""Graded calls → the answer each agent gives each task, and which agents agree (a cascade's evidence).

A task's answer for an agent is its majority extracted answer over the usable repetitions (ok or empty); an empty
reply or one without an extractable answer votes for "no answer". Ties are broken by the earliest repetition and
recorded (`answer_tie`), so a report can say how often the majority was a coin flip. Errors never vote.

`agreement(answers, graders)` is the (n, K, K) boolean tensor the cascade is fitted and scored on: agents j and l
agree on task i when both have an answer and the task's grader says the two answers are equivalent
(`GraderSpec.agree`, symmetric). With it every cascade policy can be scored on the static matrix, zero API calls.
Each comparison runs under the grading budget (pipeline/collect/bounded.py): one that overruns it or raises
disagrees, and is counted in `stats` when the caller passes a dict.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from pipeline.collect import bounded
from pipeline.collect.grading import grader_spec
from pipeline.core.errors import RouterLiteError

ANSWER_COLUMNS = ["task_id", "agent_order", "answers", "answer_votes", "answer_tie", "no_answer"]


def majority(extracted: list) -> tuple[str | None, int, bool]:
    """(answer, its votes, tie) over one agent's repetitions in repetition order; None = "no answer"."""
    norm = [None if a is None or (isinstance(a, float) and np.isnan(a)) or not str(a).strip() else str(a)
            for a in extracted]
    if not norm:
        return None, 0, False
    votes = Counter(norm)
    top = max(votes.values())
    leaders = {a for a, c in votes.items() if c == top}
    first = next(a for a in norm if a in leaders)
    return first, top, len(leaders) > 1


def agent_answers(calls: pd.DataFrame, agents: list[str]) -> pd.DataFrame:
    """One row per task (ANSWER_COLUMNS): per agent, in `agents` order, the majority answer (None: none), its
    votes, whether it tied, and how many usable repetitions gave no answer."""
    if not agents:
        raise RouterLiteError("agent answers need at least one agent")
    usable = calls[calls["agent"].isin(agents) & calls["status"].isin(["ok", "empty"])]
    usable = usable.sort_values(["task_id", "agent", "repetition"])
    per = {}
    for (task, agent), d in usable.groupby(["task_id", "agent"], sort=False):
        ex = d["extracted"].where(d["status"].eq("ok"), None).tolist()
        ans, votes, tie = majority(ex)
        per[(task, agent)] = (ans, votes, tie, sum(1 for a in ex if a is None or not str(a).strip()))
    rows = []
    for task in sorted({t for t, _ in per}):
        got = [per.get((task, a), (None, 0, False, 0)) for a in agents]
        rows.append({"task_id": task, "agent_order": list(agents), "answers": [g[0] for g in got],
                     "answer_votes": [int(g[1]) for g in got], "answer_tie": [bool(g[2]) for g in got],
                     "no_answer": [int(g[3]) for g in got]})
    return pd.DataFrame(rows, columns=ANSWER_COLUMNS)


def answers_matrix(answers: pd.DataFrame, task_ids, agents: list[str]) -> list[list[str | None]]:
    """Answers (n lists of K) for `task_ids` in that order; a task without answers -> all None."""
    by_task = {}
    for t, order, ans in zip(answers["task_id"], answers["agent_order"], answers["answers"]):
        pos = {a: i for i, a in enumerate(order)}
        by_task[t] = [ans[pos[a]] if a in pos else None for a in agents]
    return [by_task.get(t, [None] * len(agents)) for t in task_ids]


def agreement(answers: list[list[str | None]], graders: list[str], budget: bounded.Budget | None = None,
              stats: dict | None = None) -> np.ndarray:
    """(n, K, K) bool: E[i, j, l] = agents j and l give equivalent answers to task i (E[i, j, j] = j answered).
    `stats` (optional) gets `grading_overruns` / `grading_errors`: comparisons that disagree for lack of a verdict,
    and `agreement_pairs`: the agent pairs compared (on every task)."""
    return Agreement(answers, graders, budget, stats).full()


class Agreement:
    """The agreement tensor of `agreement`, computed lazily: a pair of agents is compared on every task the first
    time a reader asks for it (`sub`), so a cascade search that reads O(K) pairs pays O(K) comparisons, not the
    K(K-1)/2 of the whole tensor. Each comparison is the one `agreement` makes (same grader, budget and cache of
    equal answer pairs), so every entry read equals the eager tensor's.

    `cache` ({(grader, answer, answer): agree}) may be shared by several stores over the same answers (a report
    that compares them under several answer-format guesses compares each pair once).

    `A[m]` (a boolean mask or an index array over the rows) is a view on those rows sharing the computed pairs;
    `sub(agents)` -> (rows, L, L) bool for ascending agent indices; `full()` -> the whole (rows, K, K) tensor."""

    def __init__(self, answers: list[list[str | None]], graders: list[str], budget: bounded.Budget | None = None,
                 stats: dict | None = None, *, cache: dict | None = None, _store: dict | None = None,
                 _rows: np.ndarray | None = None):
        if _store is None:
            if len(answers) != len(graders):
                raise RouterLiteError(f"{len(answers)} answer rows for {len(graders)} graders")
            for g in sorted(set(graders)):
                grader_spec(g)  # an unknown grader: the caller's error
            n = len(answers)
            K = len(answers[0]) if n else 0
            E = np.zeros((n, K, K), dtype=bool)
            for i, row in enumerate(answers):
                for j in range(K):
                    E[i, j, j] = row[j] is not None
            _store = {"answers": answers, "graders": list(graders), "budget": budget, "stats": stats, "E": E,
                      "done": np.eye(K, dtype=bool), "cache": {} if cache is None else cache}
        self._s = _store
        self._rows = np.arange(len(_store["answers"])) if _rows is None else _rows

    @property
    def shape(self) -> tuple[int, int, int]:
        K = self._s["E"].shape[1]
        return (len(self._rows), K, K)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def graders(self) -> np.ndarray:
        """Each row's grader (object array), in row order."""
        return np.asarray(self._s["graders"], dtype=object)[self._rows]

    def __getitem__(self, m) -> Agreement:
        return Agreement([], [], _store=self._s, _rows=self._rows[m])

    def _compare(self, j: int, m: int) -> None:
        """Fill E[:, j, m] and E[:, m, j] on every task of the store (`agreement`'s loop body for one pair)."""
        s = self._s
        E, cache, budget = s["E"], s["cache"], s["budget"]
        bad: Counter = Counter()
        for i, (row, g) in enumerate(zip(s["answers"], s["graders"])):
            a, b = row[j], row[m]
            if a is None or b is None:
                continue
            key = (g, a, b) if a <= b else (g, b, a)
            if key not in cache:
                out = bounded.agree_outcome(a, b, g, budget)
                cache[key] = bool(out.value)
                bad[out.status] += 1
            E[i, j, m] = E[i, m, j] = cache[key]
        s["done"][j, m] = s["done"][m, j] = True
        stats = s["stats"]
        if stats is not None:
            stats["grading_overruns"] = stats.get("grading_overruns", 0) + bad["overrun"]
            stats["grading_errors"] = stats.get("grading_errors", 0) + bad["error"]
            stats["agreement_pairs"] = stats.get("agreement_pairs", 0) + 1  # agent pairs compared on every task

    def _ensure(self, agents) -> None:
        done = self._s["done"]
        for x, j in enumerate(agents):
            for m in agents[x + 1:]:
                if not done[j, m]:
                    self._compare(int(min(j, m)), int(max(j, m)))

    def sub(self, agents) -> np.ndarray:
        agents = np.asarray(agents, dtype=np.int64)
        self._ensure(agents.tolist())
        return self._s["E"][self._rows[:, None, None], agents[None, :, None], agents[None, None, :]]

    def full(self) -> np.ndarray:
        K = self._s["E"].shape[1]
        self._ensure(list(range(K)))
        return self._s["E"][self._rows]


def agreement_maker():
    """`make(answers, graders)` -> an `Agreement`, every store it makes sharing one comparison cache (a report that
    compares the same answers under several answer-format guesses compares each pair once)."""
    cache: dict = {}
    return lambda answers, graders: Agreement(answers, graders, cache=cache)
