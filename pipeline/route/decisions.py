"""Every fitted router's held-out decisions on given test embeddings, as the value report scores them (no router is
refitted): the shipped prompt router at each report target (`head_decisions`, the picks of
pipeline.route.value.held_out_value), each prompt-only kind at max quality with the OOD guard (`kind_decisions`, the
picks of pipeline.route.select.kind_figures) and each cascade variant at each target (`cascade_decisions`, the
outcomes of pipeline.route.cascade_fit.held_out_cascade). Called once on the test prompts and once per perturbation
of them (pipeline/report/arena.py, RouterArena's measures).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pipeline.route.cascade import Outcome, Plan, run_plan
from pipeline.route.targets import REPORT_TARGETS, resolve
from pipeline.route.value import PromptParts, target_picks  # PromptParts: the prompt router's bundle


def head_pick(parts: PromptParts, X: np.ndarray) -> np.ndarray:
    """The shipped router's max-quality picks with its OOD guard."""
    picks = np.asarray(parts.router.pick(X))
    return parts.guard.route(picks, X, parts.best) if parts.guard is not None else picks


def head_decisions(parts: PromptParts, X: np.ndarray, targets=REPORT_TARGETS) -> dict[str, np.ndarray]:
    """{resolved target name: picks (n,)} of the shipped prompt router."""
    base = head_pick(parts, X)
    out = {}
    for name in targets:
        picks, point = target_picks(name, parts, X, base)
        out[point["target"]] = np.asarray(picks, dtype=np.int64)
    return out


def kind_decisions(kinds: dict, guard, best: int, X: np.ndarray) -> dict[str, np.ndarray]:
    """{kind: max-quality picks (n,) with the OOD guard} of every fitted prompt-only kind."""
    return {k: np.asarray(guard.route(np.asarray(r.pick(X)), X, best) if guard is not None else r.pick(X), np.int64)
            for k, r in kinds.items()}


@dataclass(frozen=True)
class CascadeRows:
    """The test rows a cascade runs on: tie-aware rewards, costs, the agreement of the recorded answers
    (pipeline.collect.answers.Agreement), each row's answer format."""

    U: np.ndarray
    C: np.ndarray
    E: object
    graders: np.ndarray

    def row(self, i: int) -> CascadeRows:
        return CascadeRows(self.U[i:i + 1], self.C[i:i + 1], self.E[np.array([i])], self.graders[i:i + 1])


def cascade_plans(variant: dict, agents: list[str], targets=REPORT_TARGETS) -> dict[str, Plan]:
    """{resolved target name: plan} of a cascade variant's summary (`CascadeVariant` as a dict: path, order)."""
    out = {}
    for name in targets:
        point = resolve(name, variant["path"])
        out[point["target"]] = Plan.from_dict(variant["path"]["points"][point["index"]]["plan"], agents)
    return out


def cascade_decisions(plans: dict[str, Plan], order, rows: CascadeRows, P: np.ndarray | None) -> dict[str, Outcome]:
    """{target: outcome on `rows`} of a variant's plans; `P` the prompt router's predicted success (n, K) for the
    variant that reads it (None for the answers-only one)."""
    order = np.asarray(order, dtype=np.int64)
    return {name: run_plan(plan, rows.U, rows.C, rows.E, order, P, rows.graders) for name, plan in plans.items()}


def cascade_decision(o: Outcome) -> np.ndarray:
    """(n, 2) what a cascade decided per row: the stage that answered (or the shortcut taken), which fixes the agents
    asked, and the agent whose reply it returned."""
    return np.stack([o.stage, o.answered_by], axis=1)


def all_decisions(parts: PromptParts, kinds: dict, cascades: dict, rows: CascadeRows, X: np.ndarray) -> dict:
    """On embeddings X of the test rows: {"routers" | "prompt_routers": {router: {target: decision}}, "outcomes":
    {cascade variant: {target: outcome}}}; head and cascade variants at each target, prompt-only kinds at max
    quality (their only figures). A cascade's decision: (stage or shortcut, answering
    agent) per row; with it, its outcome (for the optimality)."""
    out = {"routers": {"head": head_decisions(parts, X)}, "prompt_routers": {}, "outcomes": {}}
    for k, picks in kind_decisions(kinds, parts.guard, parts.best, X).items():
        out["prompt_routers"][k] = {"max-quality": picks}
    for variant, (plans, order, reads_p) in cascades.items():
        P = parts.scorer.scores(X) if reads_p else None
        outcomes = cascade_decisions(plans, order, rows, P)
        out["outcomes"][variant] = outcomes
        out["routers"][variant] = {t: cascade_decision(o) for t, o in outcomes.items()}
    return out


def _decide_one(name: str, x: np.ndarray, i: int, parts: PromptParts, kinds: dict, cascades: dict,
                fresh: CascadeRows) -> None:
    """One router's max-quality decision for test row i embedded as x (what `decision_ms` times)."""
    if name == "head":
        head_pick(parts, x)
    elif name.startswith("prompt:"):
        kind_decisions({name: kinds[name[len("prompt:"):]]}, parts.guard, parts.best, x)
    else:
        plans, order, reads_p = cascades[name]
        plan = plans.get("max-quality", next(iter(plans.values())))
        cascade_decisions({"max-quality": plan}, order, fresh.row(i), parts.scorer.scores(x) if reads_p else None)


def decision_ms(prompts: list[str], encode, parts: PromptParts, kinds: dict, cascades: dict,
                fresh: CascadeRows) -> dict[str, list[float]]:
    """Per-query times (ms) for `prompts` (the test rows' first ones, in order): "embed", each prompt embedded alone
    by `encode` (not from the cache), and per router its max-quality pick on that embedding; a cascade also runs its
    plan on the row, comparing the recorded answers the plan reads (`fresh`: an agreement store with nothing
    compared yet), its agents' own latency excluded. Routers named as in `all_decisions`, prompt-only kinds
    "prompt:<kind>"."""
    names = ["head", *(f"prompt:{k}" for k in kinds), *cascades]
    ms: dict[str, list] = {name: [] for name in ["embed", *names]}
    for i, p in enumerate(prompts):
        t0 = time.perf_counter()
        x = encode([p])
        ms["embed"].append(1000.0 * (time.perf_counter() - t0))
        for name in names:
            t1 = time.perf_counter()
            _decide_one(name, x, i, parts, kinds, cascades, fresh)
            ms[name].append(1000.0 * (time.perf_counter() - t1))
    return ms
