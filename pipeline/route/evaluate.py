"""Held-out metrics of a router, and a per-agent check that no agent gets a share it has not earned.

All rewards are tie-aware (`pipeline.collect.rewards.effective_rewards`): a pick among a row's best agents earns the
row's best reward.
"""
from __future__ import annotations

import numpy as np

from pipeline.collect.rewards import effective_rewards
from pipeline.core.bootstrap import bootstrap_means  # noqa: F401 - re-exported: the intervals here use it
from pipeline.core.errors import RouterLiteError

METRIC_KEYS = ("head", "best_single", "oracle", "random", "knn", "headroom_captured", "distribution", "n_train",
               "n_test")


def _picked(R_eff: np.ndarray, picks, name: str) -> float:
    picks = np.asarray(picks)
    if picks.shape != (R_eff.shape[0],) or (picks.size and (picks.min() < 0 or picks.max() >= R_eff.shape[1])):
        raise RouterLiteError(f"{name}: expected {R_eff.shape[0]} agent indices in [0, {R_eff.shape[1]}), "
                              f"got shape {picks.shape}")
    return float(R_eff[np.arange(len(picks)), picks.astype(np.int64)].mean())


def held_out_metrics(head_picks, R_test, best_test=None, *, knn_picks=None, best_single: int | None = None,
                     agents: list[str] | None = None, n_train: int | None = None) -> dict:
    """Metrics on held-out rows, exactly the keys of `METRIC_KEYS`.

    head / knn: mean reward of the picks (knn None when no kNN picks are given). best_single: the reward of agent
    `best_single` — pass the agent that was best on the *training* rows; None uses the best agent on these rows
    (optimistic). oracle: mean of the per-row best reward. random: expected reward of a uniform random pick.
    headroom_captured = (head − best_single) / (oracle − best_single) (None when oracle == best_single).
    distribution: agent name (or index as str) -> share of the head's picks, over all agents.
    """
    R = np.asarray(R_test, dtype=np.float32)
    if R.ndim != 2 or R.shape[0] == 0:
        raise RouterLiteError(f"test reward matrix must be a non-empty (n, K) array, got shape {R.shape}")
    R_eff = effective_rewards(R, best_test)
    K = R.shape[1]
    names = list(agents) if agents is not None else [str(j) for j in range(K)]
    if len(names) != K:
        raise RouterLiteError(f"{len(names)} agent names for {K} reward columns")
    per_agent = R_eff.mean(axis=0)
    bs = int(np.argmax(per_agent)) if best_single is None else int(best_single)
    head = _picked(R_eff, head_picks, "head picks")
    best = float(per_agent[bs])
    oracle = float(R.max(axis=1).mean())
    picks = np.asarray(head_picks).astype(np.int64)
    counts = np.bincount(picks, minlength=K)
    return {
        "head": head,
        "best_single": best,
        "oracle": oracle,
        "random": float(per_agent.mean()),
        "knn": None if knn_picks is None else _picked(R_eff, knn_picks, "kNN picks"),
        "headroom_captured": (head - best) / (oracle - best) if oracle > best else None,
        "distribution": {names[j]: float(counts[j] / len(picks)) for j in range(K)},
        "n_train": None if n_train is None else int(n_train),
        "n_test": int(R.shape[0]),
    }


def routing_report(picks, R, best_mask=None, *, best_single: int | None = None,
                   agents: list[str] | None = None) -> list[dict]:
    """Per agent: share of picks vs what it earns, to spot a share an agent has not earned.

    share: fraction of rows routed to it. mean_reward: its reward on all rows. best_rate: rows where it is among
    the best agents; sole_best_rate: rows where it alone is best (the most a perfect router would send it).
    routed_reward: its reward on the rows routed to it; best_single_on_routed: what the best single agent earns
    on those same rows; gain = routed_reward − best_single_on_routed (negative: the share is unearned).
    """
    R = np.asarray(R, dtype=np.float32)
    R_eff = effective_rewards(R, best_mask)
    mask = np.asarray(best_mask, dtype=bool) if best_mask is not None else R == R.max(axis=1, keepdims=True)
    picks = np.asarray(picks).astype(np.int64)
    K = R.shape[1]
    names = list(agents) if agents is not None else [str(j) for j in range(K)]
    bs = int(np.argmax(R_eff.mean(axis=0))) if best_single is None else int(best_single)
    sole = mask & (mask.sum(axis=1, keepdims=True) == 1)
    out = []
    for j in range(K):
        rows = picks == j
        rr = float(R_eff[rows, j].mean()) if rows.any() else None
        bb = float(R_eff[rows, bs].mean()) if rows.any() else None
        out.append({"agent": names[j], "share": float(rows.mean()), "mean_reward": float(R_eff[:, j].mean()),
                    "best_rate": float(mask[:, j].mean()), "sole_best_rate": float(sole[:, j].mean()),
                    "routed_reward": rr, "best_single_on_routed": bb,
                    "gain": None if rr is None else rr - bb})
    return out


def paired_gain_ci(picks, R_eff: np.ndarray, baseline, *, n_boot: int = 2000, level: float = 0.95,
                   one_sided: float | None = None, seed: int = 0) -> dict:
    """Gain of `picks` over `baseline` on the same rows, with a paired bootstrap interval. `baseline` is an agent
    (always picking it: the best single agent) or another policy's per-row picks (router against router).

    On a few hundred held-out rows a router and the best single agent differ on few rows, so a point gain of
    +0.005 can be noise; resampling rows (the same rows for both policies) says how much. Returns gain, low, high
    (the `level` percentile interval over `n_boot` resamples) and n; with `one_sided` = c also `lower_one_sided`,
    the gain's one-sided c lower bound from the same resamples.
    """
    R_eff = np.asarray(R_eff, dtype=np.float64)
    picks = np.asarray(picks).astype(np.int64)
    n = len(picks)
    if n == 0 or R_eff.shape[0] != n:
        raise RouterLiteError(f"paired_gain_ci: {n} picks for {R_eff.shape[0]} reward rows")
    base = (R_eff[:, int(baseline)] if np.ndim(baseline) == 0
            else R_eff[np.arange(n), np.asarray(baseline).astype(np.int64)])
    diff = R_eff[np.arange(n), picks] - base
    means = bootstrap_means(diff, n_boot, seed)
    tail = (1.0 - level) / 2.0
    out = {"gain": float(diff.mean()), "low": float(np.quantile(means, tail)),
           "high": float(np.quantile(means, 1.0 - tail)), "n": int(n), "level": level}
    if one_sided is not None:
        out["lower_one_sided"] = float(np.quantile(means, 1.0 - one_sided))
    return out
