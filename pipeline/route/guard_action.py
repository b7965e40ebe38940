"""What a cascade does with a prompt its OOD guard finds unfamiliar, chosen on validation rows (never on test rows).

Sending everything unfamiliar to the dearest agent is one policy; for a cascade the cheap agents' answers are evidence
whatever the prompt looked like. `guard_action_outcomes` scores the plan at the serving target on validation rows
under each action (pipeline.route.cascade.GUARD_ACTIONS: best_single, plan, off; "off" decides as "plan" and only hides
the flag, so it is compared, never shipped); `choose_guard_action` ships "plan" only when the validation rows the
guard fires on are enough to say anything (`MIN_FIRED`) and the plan is not worse there than the best single agent
beyond noise (the paired 95 % CI of the reward difference on those rows reaches 0) while costing less; otherwise the
safe choice, "best_single".
"""
from __future__ import annotations

import numpy as np

from pipeline.route.cascade import GUARD_BEST_SINGLE, GUARD_OFF, GUARD_PLAN, Outcome, Plan, run_plan
from pipeline.route.targets import bootstrap_mean_ci

MIN_FIRED = 10  # guarded validation rows below which the evidence cannot move the choice off the safe default


def guard_action_outcomes(plan: Plan, rows, fired: np.ndarray, best: int, order) -> dict[str, Outcome]:
    """{action: outcome} of `plan` on `rows` (pipeline.route.cascade_fit.Rows) with the guard firing on `fired`."""
    o = run_plan(plan, rows.R, rows.C, rows.E, order, rows.P, rows.graders)
    bs = Outcome(np.where(fired, rows.R[:, best], o.reward), np.where(fired, rows.C[:, best], o.cost),
                 np.where(fired, best, o.answered_by), np.where(fired, 1, o.n_calls), np.where(fired, -1, o.stage))
    return {GUARD_BEST_SINGLE: bs, GUARD_PLAN: o, GUARD_OFF: o}


def choose_for_path(path: dict, agents: list[str], order, rows, fired: np.ndarray, best: int,
                    target: str) -> tuple[str, dict]:
    """`choose_guard_action` for a cascade's validation path at `target` on validation `rows`."""
    from pipeline.route.targets import resolve

    plan = Plan.from_dict(path["points"][resolve(target, path)["index"]]["plan"], agents)
    action, evidence = choose_guard_action(guard_action_outcomes(plan, rows, fired, best, order), fired)
    return action, {**evidence, "target": target}


def choose_guard_action(outcomes: dict[str, Outcome], fired: np.ndarray) -> tuple[str, dict]:
    """(action shipped, evidence) from the validation outcomes of each action (`guard_action_outcomes`)."""
    m = np.asarray(fired, dtype=bool)
    plan, bs = outcomes[GUARD_PLAN], outcomes[GUARD_BEST_SINGLE]
    diff = plan.reward[m] - bs.reward[m]
    lo, hi = bootstrap_mean_ci(diff) if m.any() else (float("nan"), float("nan"))
    evidence = {"validation_rows": int(len(m)), "guard_fired": int(m.sum()),
                "plan_minus_best_single": float(diff.mean()) if m.any() else None, "ci": [lo, hi],
                "cost_per_1k": {a: float(1000 * o.cost.mean()) for a, o in outcomes.items()},
                "quality": {a: float(o.reward.mean()) for a, o in outcomes.items()}, "min_fired": MIN_FIRED}
    cheaper = plan.cost[m].sum() < bs.cost[m].sum()
    if m.sum() >= MIN_FIRED and hi >= 0 and cheaper:
        return GUARD_PLAN, {**evidence, "rule": "the plan is not worse on the guarded validation rows beyond noise "
                                               "and costs less"}
    why = (f"only {int(m.sum())} guarded validation row(s), fewer than {MIN_FIRED}" if m.sum() < MIN_FIRED else
           "the plan is worse on the guarded validation rows beyond noise" if hi < 0 else
           "the plan costs no less there")
    return GUARD_BEST_SINGLE, {**evidence, "rule": f"safe default: {why}"}
