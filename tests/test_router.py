import numpy as np
import pandas as pd

from pipeline.router import fit_router
from pipeline.train import TrainConfig


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
    from pipeline.evaluate import paired_gain_ci

    rng = np.random.default_rng(0)
    R = (rng.random((400, 2)) < [0.7, 0.6]).astype(np.float32)
    none = paired_gain_ci(np.zeros(400, dtype=int), R, 0)
    assert none["gain"] == none["low"] == none["high"] == 0.0
    oracle = paired_gain_ci(R.argmax(1), R, 0)
    assert 0 < oracle["low"] <= oracle["gain"] <= oracle["high"]
    noisy = paired_gain_ci(rng.integers(0, 2, 400), R, 0)
    assert noisy["low"] < noisy["gain"] < noisy["high"]
