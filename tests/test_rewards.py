import numpy as np
import pandas as pd
import pytest

from pipeline.collect.rewards import (
    baselines,
    collection_totals,
    cost_basis,
    cost_per_1k_label,
    costs_are_estimated,
    reward_matrix,
    to_arrays,
)
from pipeline.core.errors import RouterLiteError

AGENTS = ["a", "b"]


def _call(task, agent, rep, status="ok", correct=True, cost=0.01):
    return {"task_id": task, "agent": agent, "repetition": rep, "status": status,
            "correct": None if status == "error" else (correct if status == "ok" else False), "cost_usd": cost}


def test_mean_over_repetitions_ties_and_counts():
    calls = pd.DataFrame([
        _call("t1", "a", 0, correct=True), _call("t1", "a", 1, correct=False), _call("t1", "a", 2, correct=True),
        _call("t1", "b", 0, correct=True), _call("t1", "b", 1, status="empty"), _call("t1", "b", 2, correct=True),
        _call("t2", "a", 0, correct=True), _call("t2", "b", 0, correct=True),
    ])
    m = reward_matrix(calls, AGENTS)
    r1 = m.rows.set_index("task_id").loc["t1"]
    assert r1["mean_reward"] == pytest.approx([2 / 3, 2 / 3])  # the empty reply counts as a wrong answer
    assert list(r1["best_agents"]) == ["a", "b"] and r1["is_tie"]
    assert list(r1["empty_count"]) == [0, 1] and list(r1["error_count"]) == [0, 0]
    assert m.incomplete.empty


def test_errors_are_never_scored_as_wrong():
    calls = pd.DataFrame([
        _call("t1", "a", 0, correct=True), _call("t1", "a", 1, status="error"),
        _call("t1", "b", 0, correct=False), _call("t1", "b", 1, correct=False),
        _call("t2", "a", 0, status="error"), _call("t2", "b", 0, correct=True),
    ])
    m = reward_matrix(calls, AGENTS)
    r1 = m.rows.set_index("task_id").loc["t1"]
    assert r1["mean_reward"] == pytest.approx([1.0, 0.0])  # the error repetition is left out, not a zero
    assert list(r1["error_count"]) == [1, 0]
    assert "t2" not in set(m.rows["task_id"])  # agent a has only errors on t2: held back, not wrong
    assert m.incomplete.to_dict("records") == [{"task_id": "t2", "agent": "a", "error_count": 1}]


def test_baselines_table_and_headroom():
    rows = pd.DataFrame({"task_id": ["t1", "t2", "t3", "t4"], "agent_order": [AGENTS] * 4,
                         "mean_reward": [[1, 0], [0, 1], [1, 1], [1, 0]], "mean_cost": [[2, 1]] * 4})
    split = pd.Series(["train", "train", "test", "test"])
    t = baselines(rows, split).set_index("policy")
    assert t.loc["oracle", "reward"] == 1.0
    assert t.loc["best single (a)", "reward_test"] == 1.0  # a is best on train (tie 1/2 vs 1/2 → first)
    assert t.loc["uniform random", "reward"] == pytest.approx(5 / 8)
    assert t.loc["headroom (oracle - best single)", "reward"] == pytest.approx(0.25)


def test_user_matrix_validation():
    good = pd.DataFrame({"task_id": ["t1"], "agent_order": [AGENTS], "mean_reward": [[0.5, 1.0]]})
    agents, R, B, C = to_arrays(good)
    assert agents == AGENTS and B.tolist() == [[False, True]] and C.tolist() == [[0.0, 0.0]]
    with pytest.raises(RouterLiteError, match="NaN"):
        to_arrays(good.assign(mean_reward=[[np.nan, 1.0]]))
    with pytest.raises(RouterLiteError, match="agent_order"):
        to_arrays(pd.concat([good, good.assign(agent_order=[["b", "a"]])], ignore_index=True))
    with pytest.raises(RouterLiteError, match="lacks column"):
        to_arrays(good.drop(columns=["mean_reward"]))
    with pytest.raises(RouterLiteError, match=r"\[0, 1\]"):
        to_arrays(good.assign(mean_reward=[[2.0, 1.0]]))


def test_collection_totals():
    calls = pd.DataFrame([_call("t1", "a", 0), _call("t1", "a", 1, status="error"),
                          _call("t1", "b", 0, status="empty")])
    t = collection_totals(calls).set_index("agent")
    assert t.loc["a", "error"] == 1 and t.loc["a", "accuracy"] == 1.0 and t.loc["b", "empty"] == 1
    assert "cost_usd" in t.columns and "estimated" not in cost_basis(calls)
    est = calls.assign(usage_source="provider_estimate")  # replayed token counts
    assert "est_cost_usd" in collection_totals(est).columns and "ESTIMATED" in cost_basis(est)


def test_cost_provenance_travels_with_the_matrix():
    """A task's costs are estimated when any of its usable calls counted tokens itself (replay: ceil(chars/4));
    provider-reported usage is not; a matrix without the column claims nothing."""
    rows = [_call("t1", "a", 0), _call("t1", "b", 0), _call("t2", "a", 0), _call("t2", "b", 0)]
    usage = ["provider", "provider", "provider", "provider_estimate"]
    calls = pd.DataFrame([{**r, "usage_source": u} for r, u in zip(rows, usage)])
    m = reward_matrix(calls, AGENTS).rows.set_index("task_id")
    assert m["cost_estimated"].to_dict() == {"t1": False, "t2": True}
    assert costs_are_estimated(m) is True and costs_are_estimated(m.loc[["t1"]]) is False
    assert costs_are_estimated(m.drop(columns="cost_estimated")) is None
    assert cost_per_1k_label(True) == "$/1k (est.)" and cost_per_1k_label(False) == cost_per_1k_label(None) == "$/1k"
