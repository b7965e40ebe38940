"""The decision `serve` takes on a prompt, as pure functions of a registered router, its answer-format guess and the
prompt's embedding. serve's handler (pipeline/serve/app.py) routes through `AutoFormatView` and the views of the
registry, and the held-out figures (`served_outcomes`, read by the reports) through the very same objects, so a
held-out figure is what serve decides on that row: the OOD guard, the prompt shortcuts, the answer-format guess and
the prompt-only fallback of a prompt whose format is not guessed, all included.

A plain OpenAI request names no answer format: a cascade then guesses it from the nearest training prompts
(`FormatGuess`), runs that format's plan, and routes a prompt without a guess prompt-only. That is the decision
measured here; a client naming its format (`router_grader`) gets that format's view instead.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.core.errors import RouterLiteError
from pipeline.route.cascade import Outcome, run_policy
from pipeline.route.formats import FormatGuess

PROMPT_ONLY = "prompt-only"  # the view of a row routed by the prompt router alone


class AutoFormatView:
    """A cascade's view at one target for requests that name no answer format: per prompt, the format the nearest
    training prompts have (`FormatGuess`) selects that format's cascade view; a prompt without a guess is routed
    prompt-only (the head's view). One embedding serves the guess and the pick: `route` returns each prompt's guessed
    format index (-1: none) beside its pick, `resolved(format)` the (view, point) that runs it."""

    def __init__(self, cascades: Sequence[tuple], head_view, point: dict, formats: FormatGuess, name: str):
        self.cascades, self.head_view, self.point, self.formats = list(cascades), head_view, point, formats
        self.name, self.tag = name, f"auto|{self.cascades[0][1]['target']}"

    def route(self, X: np.ndarray):
        guessed = np.asarray(self.formats.predict(X), dtype=np.int64)
        picks, fired = self.head_view.route(X)
        picks, fired = np.asarray(picks, dtype=np.int64).copy(), np.asarray(fired, dtype=bool).copy()
        for g, (view, _) in enumerate(self.cascades):
            rows = guessed == g
            if rows.any():
                picks[rows], fired[rows] = view.route(X[rows])
        return picks, fired, guessed

    def resolved(self, fmt: int) -> tuple:
        """(view, point) of a prompt whose guessed format index is `fmt`: that format's cascade view, else the
        head's view."""
        if fmt < 0:
            return self.head_view, self.point
        view, point = self.cascades[fmt]
        return view, {**point, "guessed": True}


def head_view(registered, target: str | None) -> tuple:
    """(view, point) of the prompt router at `target`; a router without operating points: its max-quality pick."""
    try:
        view = registered.at(target)
    except RouterLiteError:
        if not getattr(registered, "needs_grader", False):
            raise
        view = registered.at("max-quality")
    return view, view.point


def auto_view(registered, formats: FormatGuess, target: str | None,
              view_for: Callable | None = None, cascade_view_for: Callable | None = None) -> AutoFormatView:
    """The `AutoFormatView` of a cascade at `target`; serve passes its cached view makers, a report none."""
    view_for = view_for or (lambda t: head_view(registered, t))
    cascade_view_for = cascade_view_for or (lambda t, g: _with_point(registered.cascade_at(t, g)))
    return AutoFormatView([cascade_view_for(target, g) for g in formats.graders], *view_for(target), formats,
                          registered.name)


def _with_point(view) -> tuple:
    return view, view.point


@dataclass(frozen=True)
class ServedRows:
    """What a router served on held-out rows: per row the view that decided (PROMPT_ONLY or the guessed answer
    format), the agent asked alone (-1: the cascade's stages ran), whether the OOD guard fired, and the outcome on
    the recorded rewards and costs (`Outcome`: reward, cost, answered_by, n_calls, stage)."""

    view: np.ndarray
    pick: np.ndarray
    fired: np.ndarray
    outcome: Outcome

    def frame(self, task_ids: Sequence[str], router: str, target: str) -> pd.DataFrame:
        o = self.outcome
        return pd.DataFrame({"router": router, "target": target, "task_id": list(task_ids), "view": self.view,
                             "pick": self.pick, "ood": self.fired, "answered_by": o.answered_by, "stage": o.stage,
                             "calls": o.n_calls, "reward": o.reward, "cost_usd": o.cost})


def served_outcomes(registered, X: np.ndarray, target: str | None, U: np.ndarray, C: np.ndarray,
                    answers: list[list[str | None]] | None = None, formats: FormatGuess | None = None,
                    agreement_for: Callable | None = None) -> ServedRows:
    """The served decision of `registered` at `target` on rows embedded as `X` and its outcome on the recorded
    tie-aware rewards `U` and costs `C` (n, K). A cascade needs the agents' recorded `answers` (row, agent) and its
    format guess; its stages compare them under the guessed format, as serve's would (`agreement_for(answers,
    graders)` -> a pipeline.collect.answers.Agreement)."""
    n, K = U.shape
    rows = np.arange(n)
    if not getattr(registered, "needs_grader", False) or formats is None:
        view, _ = head_view(registered, target)
        picks, fired = view.route(X)
        picks = np.asarray(picks, dtype=np.int64)
        o = Outcome(U[rows, picks], C[rows, picks], picks, np.ones(n, dtype=np.int64), np.full(n, -1, np.int64))
        return ServedRows(np.full(n, PROMPT_ONLY, dtype=object), picks, np.asarray(fired, bool), o)
    if answers is None or agreement_for is None:
        raise RouterLiteError(f"router {registered.name} is a cascade: its served outcome needs the recorded answers")
    auto = auto_view(registered, formats, target)
    picks, fired, guessed = auto.route(X)
    names = np.array([PROMPT_ONLY, *formats.graders], dtype=object)[guessed + 1]
    reward, cost = U[rows, np.maximum(picks, 0)].copy(), C[rows, np.maximum(picks, 0)].copy()
    by, calls, stage = picks.copy(), np.ones(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    staged = np.flatnonzero(picks < 0)
    if len(staged):
        E = agreement_for([answers[i] for i in staged], names[staged].tolist())
        P = registered.scorer.scores(X[staged]) if registered.scorer is not None else None
        for g in sorted(set(names[staged])):
            m = names[staged] == g
            view, _ = auto.resolved(formats.graders.index(g))
            o = run_policy(view.policy, U[staged[m]], C[staged[m]], E[np.flatnonzero(m)],
                           registered.router.order, None if P is None else P[m])
            i = staged[m]
            reward[i], cost[i], by[i], calls[i], stage[i] = o.reward, o.cost, o.answered_by, o.n_calls, o.stage
    return ServedRows(names, picks, np.asarray(fired, bool), Outcome(reward, cost, by, calls, stage))


def served_figures(rows: ServedRows, R_best: np.ndarray, C_best: np.ndarray, agents: list[str]) -> dict:
    """A router's held-out figures at one target from what it served (`rows`), in the shape of the cascade's
    held-out targets: quality and its CI, cost per 1k, paired gain to the best single agent, quality and cost ratios
    with their paired 95 % CIs, reply shares, calls per query; and how it decided: the OOD guard's firing rate and
    the share routed prompt-only."""
    from pipeline.route.cascade_fit import outcome_stats, ratio_ci

    o = rows.outcome
    s = outcome_stats(o.reward, o.cost, o.answered_by, o.n_calls, R_best, agents)
    bq, bc = float(R_best.mean()), float(1000 * C_best.mean())
    return {**{k: s[k] for k in ("quality", "ci_low", "ci_high", "cost_per_1k", "gain", "gain_low", "gain_high",
                                 "shares", "calls_per_query")},
            "quality_ratio": s["quality"] / bq if bq > 0 else None,
            "quality_ratio_ci": list(ratio_ci(o.reward, R_best)),
            "cost_ratio": s["cost_per_1k"] / bc if bc > 0 else None, "cost_ratio_ci": list(ratio_ci(o.cost, C_best)),
            "guard_rate": float(rows.fired.mean()) if len(rows.fired) else 0.0,
            "prompt_only": float((rows.view == PROMPT_ONLY).mean()) if len(rows.view) else 0.0}


def rows_of(frame) -> ServedRows:
    """The `ServedRows` of one (router, target) slice of a `ServedRows.frame` table (the `served_decisions` asset)."""
    o = Outcome(frame["reward"].to_numpy(float), frame["cost_usd"].to_numpy(float),
                frame["answered_by"].to_numpy(np.int64), frame["calls"].to_numpy(np.int64),
                frame["stage"].to_numpy(np.int64))
    return ServedRows(frame["view"].to_numpy(object), frame["pick"].to_numpy(np.int64), frame["ood"].to_numpy(bool), o)


def served_table(frame, R_best: np.ndarray, C_best: np.ndarray, agents: list[str], order: list[str]) -> dict:
    """{router: {target: served_figures}} of a `served_decisions` table whose rows of each (router, target) are the
    held-out rows in the order `order` (task ids) of `R_best` / `C_best`."""
    out: dict = {}
    for (router, target), g in frame.groupby(["router", "target"], sort=False):
        if g["task_id"].tolist() != list(order):
            raise RouterLiteError(f"served_decisions: {router} at {target} does not hold the held-out rows in order")
        out.setdefault(router, {})[target] = served_figures(rows_of(g), R_best, C_best, agents)
    return out


def with_guard_action(registered, action: str):
    """A registered cascade whose OOD guard takes `action` (pipeline.route.cascade.GUARD_ACTIONS), everything else
    the same: what the report compares the shipped action with."""
    import dataclasses

    from pipeline.route.cascade import CascadeRouter

    r = registered.router
    return dataclasses.replace(registered, router=CascadeRouter(r.fallback, {**r.path, "guard_action": action},
                                                                r.order, r.agents))


def served_all(routers: dict, X: np.ndarray, targets, U: np.ndarray, C: np.ndarray, answers, formats,
               agreement_for: Callable) -> dict:
    """Every router's served decisions at each target on rows `X`, in the shape RouterArena's measures read
    (pipeline/route/decisions.py `all_decisions`): {"routers": {router: {target: (n, 4) view, agent asked alone,
    agent answering, stage}}, "outcomes": {router: {target: Outcome}}}."""
    out: dict = {"routers": {}, "outcomes": {}}
    for name, reg in routers.items():
        for target in targets:
            rows = served_outcomes(reg, X, target, U, C, answers, formats, agreement_for)
            code = np.array([-1 if v == PROMPT_ONLY else formats.graders.index(v) for v in rows.view], dtype=np.int64)
            out["routers"].setdefault(name, {})[target] = np.stack(
                [code, rows.pick, rows.outcome.answered_by, rows.outcome.stage], axis=1)
            out["outcomes"].setdefault(name, {})[target] = rows.outcome
    return out
