"""A cascade's OOD guard action, chosen on validation rows (pipeline/route/guard_action.py) and obeyed by its view."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.route.cascade import (
    GUARD_BEST_SINGLE,
    GUARD_OFF,
    GUARD_PLAN,
    CascadeView,
    Outcome,
    Policy,
    Stage,
    guard_action,
)
from pipeline.route.guard_action import MIN_FIRED, choose_guard_action


def _outcomes(plan_reward, bs_reward, plan_cost=0.1, bs_cost=1.0):
    n = len(plan_reward)
    mk = lambda r, c: Outcome(np.asarray(r, float), np.full(n, c), np.zeros(n, np.int64),  # noqa: E731
                              np.ones(n, np.int64), np.zeros(n, np.int64))
    o = mk(plan_reward, plan_cost)
    return {GUARD_PLAN: o, GUARD_OFF: o, GUARD_BEST_SINGLE: mk(bs_reward, bs_cost)}


def test_the_plan_ships_when_it_is_as_good_on_enough_guarded_rows_and_cheaper():
    fired = np.ones(2 * MIN_FIRED, bool)
    action, ev = choose_guard_action(_outcomes([1.0] * (2 * MIN_FIRED), [1.0] * (2 * MIN_FIRED)), fired)
    assert action == GUARD_PLAN and ev["guard_fired"] == 2 * MIN_FIRED


@pytest.mark.parametrize("plan, bs, fired, plan_cost, why", [
    ([1.0] * 5, [1.0] * 5, 5, 0.1, "fewer than"),  # too little evidence: the safe default
    ([0.0] * 20, [1.0] * 20, 20, 0.1, "worse"),  # the plan is worse on the guarded rows beyond noise
    ([1.0] * 20, [1.0] * 20, 20, 2.0, "no less"),  # the plan is not cheaper there
])
def test_the_best_single_agent_stays_otherwise(plan, bs, fired, plan_cost, why):
    mask = np.zeros(len(plan), bool)
    mask[:fired] = True
    action, ev = choose_guard_action(_outcomes(plan, bs, plan_cost=plan_cost), mask)
    assert action == GUARD_BEST_SINGLE and why in ev["rule"]


class _Guard:
    def __init__(self, fired):
        self.fired = np.asarray(fired, bool)

    def fires(self, X):
        return self.fired


class _Reg:
    def __init__(self, action, fired):
        self.router = type("R", (), {"path": {"guard_action": action} if action else {}})()
        self.guard, self.best_single, self.scorer, self.name = _Guard(fired), 3, None, "c"


@pytest.mark.parametrize("action, picks, flagged", [
    (None, [3, -1], [True, False]),  # a cascade saved before the choice: the best single agent
    (GUARD_BEST_SINGLE, [3, -1], [True, False]),
    (GUARD_PLAN, [-1, -1], [True, False]),  # flagged, but the plan runs
    (GUARD_OFF, [-1, -1], [False, False]),
])
def test_the_view_obeys_the_guard_action(action, picks, flagged):
    policy = Policy((Stage((0, 1), 2), Stage((2,))))
    view = CascadeView(_Reg(action, [True, False]), {"target": "t"}, policy, "integer")
    got, fired = view.route(np.zeros((2, 4), np.float32))
    assert got.tolist() == picks and fired.tolist() == flagged


def test_an_unknown_guard_action_is_refused_by_name():
    with pytest.raises(Exception, match="sometimes"):
        guard_action({"guard_action": "sometimes"})
