"""Graded calls → reward matrix (one row per task, the seed's row format) → baselines and headroom.

Errors (transport/provider) are never rewards: an error repetition is left out of the mean, and a task where an
agent has no usable repetition is held back from the matrix (counted in `incomplete`), never scored as wrong.
Empty replies are real answers that earned 0, counted apart in `empty_count`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.core.errors import RouterLiteError

REWARD_COLUMNS = ["task_id", "agent_order", "mean_reward", "best_agents", "is_tie",
                  "empty_count", "error_count", "mean_cost", "n_repetitions", "cost_estimated"]
TIE_TOL = 1e-9


@dataclass(frozen=True)
class RewardMatrix:
    rows: pd.DataFrame  # REWARD_COLUMNS, complete tasks only
    incomplete: pd.DataFrame  # task_id, agent, error_count: tasks held back because an agent has only errors


def call_rewards(calls: pd.DataFrame) -> np.ndarray:
    """The reward of each graded call row: a judge-graded call's `reward` (its judge's probability, in [0, 1]), else
    1.0 for a correct answer; 0.0 for an empty reply or an error (an unjudgeable call: 0 here, but `reward_matrix`
    holds it back)."""
    judged = calls["reward"].astype(float) if "reward" in calls else pd.Series(np.nan, index=calls.index)
    return np.where(calls["status"].eq("ok"),
                    np.where(judged.notna(), judged.fillna(0.0), calls["correct"].eq(True).astype(float)), 0.0)


def reward_matrix(calls: pd.DataFrame, agents: list[str], sampled: tuple[str, ...] | list[str] = ()) -> RewardMatrix:
    """Aggregate graded calls over repetitions into reward rows with `agent_order == agents`. A task where an agent
    of `sampled` (a new agent asked only on a sample, pipeline/collect/sampling.py) has no call stays, with NaN in
    that agent's reward and cost (`sampling.complete_matrix` fills and marks them)."""
    if not agents:
        raise RouterLiteError("reward matrix needs at least one agent")
    unknown = sorted(set(calls["agent"]) - set(agents))
    if unknown:
        calls = calls[calls["agent"].isin(agents)]  # e.g. agents that failed pre-flight
    from pipeline.collect.preflight import ESTIMATED_USAGE

    # a judge-graded call carries its reward in [0, 1] (pipeline/collect/judge.py); an unjudgeable one has none and is
    # held back like an error, never scored 0
    unjudged = calls["judge_state"].eq("unjudgeable") if "judge_state" in calls else False
    calls = calls.assign(
        usable=calls["status"].isin(["ok", "empty"]) & ~pd.Series(unjudged, index=calls.index).astype(bool),
        estimated=calls["usage_source"].isin(ESTIMATED_USAGE) if "usage_source" in calls else False,
        reward=call_rewards(calls),
    )
    u = calls["usable"]
    calls = calls.assign(  # per call what its group sums: one vectorised groupby, no Python function per group
        reward_u=calls["reward"].where(u, 0.0), cost_u=calls["cost_usd"].astype(float).fillna(0.0).where(u, 0.0),
        is_empty=calls["status"].eq("empty"), is_error=calls["status"].eq("error"),
        estimated_u=pd.Series(calls["estimated"], index=calls.index).astype(bool) & u)
    g = calls.groupby(["task_id", "agent"], sort=True)
    per = pd.DataFrame({
        "usable": g["usable"].sum(),
        "reward_sum": g["reward_u"].sum(),
        "cost_sum": g["cost_u"].sum(),
        "empty": g["is_empty"].sum().astype(int),
        "error": g["is_error"].sum().astype(int),
        "estimated": g["estimated_u"].any(),
    }).reset_index()
    wide = per.pivot(index="task_id", columns="agent").reindex(columns=agents, level=1)
    usable = wide["usable"].fillna(0).to_numpy()
    missing = usable == 0
    never_asked = np.isnan(wide["usable"].to_numpy(dtype=float)) & np.isin(agents, list(sampled))[None, :]
    incomplete_mask = (missing & ~never_asked).any(axis=1)
    inc = [(t, agents[j], int(np.nan_to_num(wide["error"].to_numpy()[i, j])))
           for i, t in enumerate(wide.index) for j in np.flatnonzero(missing[i] & ~never_asked[i])]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = wide["reward_sum"].to_numpy() / usable
        cost = wide["cost_sum"].to_numpy() / usable
    rows = []
    for i, task_id in enumerate(wide.index):
        if incomplete_mask[i]:
            continue
        best = [a for a, r in zip(agents, mean[i]) if r >= np.nanmax(mean[i]) - TIE_TOL]
        rows.append({
            "task_id": task_id, "agent_order": list(agents), "mean_reward": mean[i].round(6).tolist(),
            "best_agents": best, "is_tie": len(best) > 1,
            "empty_count": np.nan_to_num(wide["empty"].to_numpy(dtype=float)[i]).astype(int).tolist(),
            "error_count": np.nan_to_num(wide["error"].to_numpy(dtype=float)[i]).astype(int).tolist(),
            "mean_cost": cost[i].tolist(), "n_repetitions": int(usable[i][~never_asked[i]].min()),
            "cost_estimated": bool(np.any(wide["estimated"].to_numpy()[i] == True)),  # noqa: E712 (object array)
        })
    return RewardMatrix(pd.DataFrame(rows, columns=REWARD_COLUMNS),
                        pd.DataFrame(inc, columns=["task_id", "agent", "error_count"]))


def replied_rows(rewards: pd.DataFrame) -> np.ndarray:
    """Per reward row: every agent's cell holds replies collected from it; False where one was estimated (column
    `imputed`: a new agent asked on a sample, or an agent a served request's decision did not ask and exploration
    did not reach) or holds no number. A matrix without `imputed` was collected in full."""
    R = [np.asarray(r, dtype=float) for r in rewards["mean_reward"]]
    ok = np.array([bool(np.isfinite(r).all()) for r in R], bool)
    if "imputed" in rewards:
        ok &= np.array([not (isinstance(m, (list, tuple, np.ndarray)) and bool(np.any(np.asarray(m, dtype=bool))))
                        for m in rewards["imputed"]], bool)
    return ok


def costs_are_estimated(rewards: pd.DataFrame) -> bool | None:
    """Whether any cost of a reward matrix comes from estimated token counts (the replay's ceil(chars/4)); None for
    a matrix that does not say (a user's own file without `cost_estimated`): reports then claim nothing."""
    return bool(rewards["cost_estimated"].fillna(False).astype(bool).any()) if "cost_estimated" in rewards else None


def cost_per_1k_label(estimated: bool | None) -> str:
    """The cost column's header: "(est.)" only where the costs are known to be estimates."""
    return "$/1k (est.)" if estimated else "$/1k"


def to_arrays(rewards: pd.DataFrame) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(agents, R (n,K) mean reward, B (n,K) best-agent mask, C (n,K) mean cost) from reward rows.

    Validates a user's own matrix too: one agent order, no NaN, rewards in [0, 1].
    """
    if rewards.empty:
        raise RouterLiteError("reward matrix is empty")
    missing = [c for c in ("task_id", "agent_order", "mean_reward") if c not in rewards]
    if missing:
        raise RouterLiteError(f"reward matrix lacks column(s) {missing} (contract: docs/architecture.md)")
    agents = list(rewards["agent_order"].iloc[0])
    for i, order in enumerate(rewards["agent_order"]):
        if list(order) != agents:
            raise RouterLiteError(f"reward row {i} (task {rewards['task_id'].iloc[i]}): agent_order {list(order)} "
                                  f"differs from the first row's {agents}")
    R = np.array([np.asarray(r, dtype=float) for r in rewards["mean_reward"]])
    if R.shape != (len(rewards), len(agents)):
        raise RouterLiteError(f"mean_reward lists must have {len(agents)} entries (one per agent)")
    bad = np.argwhere(~np.isfinite(R))
    if len(bad):
        i, j = bad[0]
        raise RouterLiteError(f"reward row {i} (task {rewards['task_id'].iloc[i]}): mean_reward for agent "
                              f"{agents[j]!r} is NaN/inf; drop or fix the row")
    out = np.argwhere((R < 0) | (R > 1))
    if len(out):
        i, j = out[0]
        raise RouterLiteError(f"reward row {i} (task {rewards['task_id'].iloc[i]}): mean_reward for agent "
                              f"{agents[j]!r} is {R[i, j]}, outside [0, 1]")
    if "best_agents" in rewards:
        B = np.array([[a in set(best) for a in agents] for best in rewards["best_agents"]])
    else:
        B = R >= R.max(axis=1, keepdims=True) - TIE_TOL
    C = (np.array([np.asarray(c, dtype=float) for c in rewards["mean_cost"]]) if "mean_cost" in rewards
         else np.zeros_like(R))
    return agents, R, B, np.nan_to_num(C)


def baselines(rewards: pd.DataFrame, split: pd.Series | None = None) -> pd.DataFrame:
    """Every agent, uniform random, best single, oracle and headroom — overall, and on `test` with the best
    single agent chosen on `train` (so the held-out number is honest)."""
    agents, R, _, C = to_arrays(rewards)
    split = split if split is not None else pd.Series("all", index=rewards.index)
    split = split.to_numpy()
    test = split == "test" if (split == "test").any() else np.ones(len(R), bool)
    train = split == "train" if (split == "train").any() else np.ones(len(R), bool)
    best_j = int(np.argmax(R[train].mean(axis=0)))
    rows = [{"policy": a, "reward": R[:, j].mean(), "reward_test": R[test, j].mean(), "cost": C[:, j].mean()}
            for j, a in enumerate(agents)]
    rows.append({"policy": "uniform random", "reward": R.mean(), "reward_test": R[test].mean(), "cost": C.mean()})
    rows.append({"policy": f"best single ({agents[best_j]})", "reward": R[:, best_j].mean(),
                 "reward_test": R[test, best_j].mean(), "cost": C[:, best_j].mean()})
    oracle_j = np.argmax(R - 1e-9 * C, axis=1)  # max reward, ties to the cheapest
    rows.append({"policy": "oracle", "reward": R.max(axis=1).mean(), "reward_test": R[test].max(axis=1).mean(),
                 "cost": C[np.arange(len(R)), oracle_j].mean()})
    rows.append({"policy": "headroom (oracle - best single)",
                 "reward": R.max(axis=1).mean() - R[:, best_j].mean(),
                 "reward_test": R[test].max(axis=1).mean() - R[test, best_j].mean(), "cost": np.nan})
    return pd.DataFrame(rows)


def costs_estimated(calls: pd.DataFrame) -> bool:
    """True when any cost comes from estimated token counts (the replay's ceil(chars/4), or counted here)."""
    from pipeline.collect.preflight import ESTIMATED_USAGE

    return "usage_source" in calls and bool(calls["usage_source"].isin(ESTIMATED_USAGE).any())


ESTIMATED_COST_NOTE = ("costs are ESTIMATED: replayed token counts = ceil(characters / 4) of prompt and reply "
                       "(the recordings carry none) x public list prices (config/prices.yaml)")


def cost_basis(calls: pd.DataFrame) -> str:
    """One line saying what the costs of `calls` rest on (for metadata and reports)."""
    return ESTIMATED_COST_NOTE if costs_estimated(calls) else "costs as reported by the provider, else list prices"


def collection_totals(calls: pd.DataFrame) -> pd.DataFrame:
    """Calls, cost, errors, empties per agent — what a collection run spent and how it went. The cost column is
    `est_cost_usd` when token counts were estimated (`costs_estimated`)."""
    answered = calls["status"] != "error"
    df = calls.assign(ok=calls["status"].eq("ok"), empty=calls["status"].eq("empty"), error=~answered,
                      right=np.where(answered, calls["correct"].eq(True).astype(float), np.nan),
                      cost=calls["cost_usd"].fillna(0.0))
    g = df.groupby("agent", sort=True)
    return pd.DataFrame({"calls": g.size(), "ok": g["ok"].sum(), "empty": g["empty"].sum(), "error": g["error"].sum(),
                         "accuracy": g["right"].mean(),
                         "est_cost_usd" if costs_estimated(calls) else "cost_usd": g["cost"].sum()}).reset_index()


def effective_rewards(R: np.ndarray, best_mask: np.ndarray | None = None) -> np.ndarray:
    """Tie-aware rewards: ``R_eff[i, j] = max(R[i]) if best_mask[i, j] else R[i, j]`` (best_mask None -> R)."""
    R = np.asarray(R, dtype=np.float32)
    if best_mask is None:
        return R
    best_mask = np.asarray(best_mask, dtype=bool)
    if best_mask.shape != R.shape:
        raise RouterLiteError(f"best-agent mask shape {best_mask.shape} != reward matrix shape {R.shape}")
    return np.where(best_mask, R.max(axis=1, keepdims=True), R).astype(np.float32)
