import numpy as np
import pandas as pd

from pipeline.route.fit import fit_router
from pipeline.route.train import TrainConfig


def _data(signal: bool, n=900, d=16, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    if signal:  # agent 1 is right exactly where x0 > 0, agent 0 elsewhere; agent 2 never
        R = np.stack([(X[:, 0] <= 0), (X[:, 0] > 0), np.zeros(n, bool)], axis=1).astype(float)
    else:  # pure noise: agent 0 is right 70 % of the time, agent 1 50 %, independent of x
        R = np.stack([rng.random(n) < 0.7, rng.random(n) < 0.5, rng.random(n) < 0.2], axis=1).astype(float)
    rewards = pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "agent_order": [["a", "b", "c"]] * n,
                            "mean_reward": list(R)})
    split = pd.Series(np.array(["train", "validation", "test"])[np.arange(n) % 3])
    return X, rewards, split


def test_a_head_that_learns_is_shipped():
    X, rewards, split = _data(signal=True)
    fit = fit_router(X, rewards, split, TrainConfig(generations=10))
    assert fit.extra["gate"]["shipped"] == "head"
    assert fit.metrics["head"] > fit.metrics["best_single"] + 0.3
    ci = fit.extra["head_gain_ci"]  # a real gain: the whole interval is above zero
    assert 0.3 < ci["low"] <= ci["gain"] <= ci["high"]
    assert abs(ci["gain"] - (fit.metrics["head"] - fit.metrics["best_single"])) < 1e-6


def test_noise_falls_back_to_the_best_single_agent():
    X, rewards, split = _data(signal=False, seed=0)  # seed 0: the head ties agent a on validation
    fit = fit_router(X, rewards, split, TrainConfig(generations=10))
    gate = fit.extra["gate"]
    assert gate["shipped"] == "best_single"
    assert gate["head_validation"] <= gate["best_single_validation"]
    assert fit.metrics["distribution"] == {"a": 1.0, "b": 0.0, "c": 0.0}
    assert fit.metrics["head"] == fit.metrics["best_single"]
    assert fit.extra["head_gain_ci"]["gain"] == 0.0


def test_paired_gain_ci_brackets_the_gain_and_detects_a_real_one():
    from pipeline.route.evaluate import paired_gain_ci

    rng = np.random.default_rng(0)
    R = (rng.random((400, 2)) < [0.7, 0.6]).astype(np.float32)
    none = paired_gain_ci(np.zeros(400, dtype=int), R, 0)
    assert none["gain"] == none["low"] == none["high"] == 0.0
    oracle = paired_gain_ci(R.argmax(1), R, 0)
    assert 0 < oracle["low"] <= oracle["gain"] <= oracle["high"]
    noisy = paired_gain_ci(rng.integers(0, 2, 400), R, 0)
    assert noisy["low"] < noisy["gain"] < noisy["high"]


def test_ship_gate_wants_a_gain_beyond_validation_noise():
    from pipeline.route.fit import ship_gate
    from pipeline.route.head import Head

    # the head picks agent 1 where feature 1 is set: 40 rows, of which it wins 11 and loses 9 -> +2 rows of 400
    X = np.zeros((400, 2), np.float32)
    X[:, 0] = 1.0
    X[:40] = [0.0, 1.0]
    R = np.zeros((400, 2), np.float32)
    R[40:, 0] = 1.0
    R[:11, 1] = 1.0          # head right, agent 0 wrong
    R[11:20, 0] = 1.0        # head wrong, agent 0 right
    R[20:40] = 1.0           # both right
    head = Head(np.eye(2, dtype=np.float32), np.zeros(2, np.float32), agents=["a", "b"])
    point = ship_gate(head, 0, X, R, None, confidence=0.0)
    assert point["shipped"] == "head"
    assert abs(point["head_validation"] - point["best_single_validation"] - 0.005) < 1e-6
    gated = ship_gate(head, 0, X, R, None, confidence=0.9)
    assert gated["shipped"] == "best_single" and gated["gain_lower_bound"] < 0
    R[11:20, 0] = 0.0        # now it wins 11 rows and loses none: a real gain
    assert ship_gate(head, 0, X, R, None, confidence=0.9)["shipped"] == "head"


def test_paired_gain_ci_against_another_policys_picks():
    """A per-row baseline (router against router) bootstraps the same row differences as those two policies' rewards
    set side by side as two agents."""
    from pipeline.route.evaluate import paired_gain_ci

    rng = np.random.default_rng(3)
    R = (rng.random((300, 4)) > 0.4).astype(float)
    a, b = rng.integers(0, 4, 300), rng.integers(0, 4, 300)
    rows = np.arange(300)
    stacked = paired_gain_ci(np.zeros(300, np.int64), np.column_stack([R[rows, a], R[rows, b]]), 1)
    assert paired_gain_ci(a, R, b) == stacked
    assert paired_gain_ci(a, R, np.full(300, 2)) == paired_gain_ci(a, R, 2)  # a constant policy = that agent
