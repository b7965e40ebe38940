"""The refresh benchmark's bundled pool (real graded replies, nothing invented) and the vectorised
reward matrix (the same frame as the per-group computation it replaced)."""
import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.collect.rewards import reward_matrix

ROOT = Path(__file__).resolve().parents[1]


def refresh_module():
    spec = importlib.util.spec_from_file_location("bench_refresh", ROOT / "bench" / "refresh.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reward_matrix_per_group(calls: pd.DataFrame, agents: list[str]) -> pd.DataFrame:
    """The former per-group aggregation (a Python function per (task, agent)), for the equality check."""
    from pipeline.collect.preflight import ESTIMATED_USAGE

    calls = calls.assign(usable=calls["status"].isin(["ok", "empty"]),
                         estimated=calls["usage_source"].isin(ESTIMATED_USAGE),
                         reward=np.where(calls["status"].eq("ok"), calls["correct"].eq(True).astype(float), 0.0))
    g = calls.groupby(["task_id", "agent"], sort=True)
    return pd.DataFrame({
        "usable": g["usable"].sum(),
        "reward_sum": g.apply(lambda d: d.loc[d["usable"], "reward"].sum(), include_groups=False),
        "cost_sum": g.apply(lambda d: d.loc[d["usable"], "cost_usd"].fillna(0).sum(), include_groups=False),
        "empty": g["status"].apply(lambda s: int((s == "empty").sum())),
        "error": g["status"].apply(lambda s: int((s == "error").sum())),
        "estimated": g.apply(lambda d: bool(d.loc[d["usable"], "estimated"].any()), include_groups=False),
    }).reset_index()


def test_vectorised_reward_matrix_equals_per_group():
    rng = np.random.default_rng(0)
    rows = []
    for t in range(40):
        for a in ("a", "b", "c"):
            for rep in range(3):
                status = rng.choice(["ok", "ok", "ok", "empty", "error"])
                rows.append({"task_id": f"t{t:02d}", "agent": a, "repetition": rep, "status": status,
                             "correct": bool(rng.random() < 0.6) if status == "ok" else None,
                             "cost_usd": None if rng.random() < 0.1 else float(rng.uniform(0, 1e-3)),
                             "usage_source": rng.choice(["provider", "provider_estimate"])})
    calls = pd.DataFrame(rows)
    m = reward_matrix(calls, ["a", "b", "c"])
    ref = reward_matrix_per_group(calls, ["a", "b", "c"])
    wide = ref.pivot(index="task_id", columns="agent")
    usable = wide["usable"].to_numpy()
    complete = ~(usable == 0).any(axis=1)
    assert len(m.rows) == complete.sum() and len(m.incomplete) == int((usable == 0).sum())
    assert len(m.rows) > 10  # both kinds of task are in the sample
    for (_, r), i in zip(m.rows.iterrows(), np.flatnonzero(complete)):
        assert r["mean_reward"] == (wide["reward_sum"].to_numpy()[i] / usable[i]).round(6).tolist()
        assert np.allclose(r["mean_cost"], wide["cost_sum"].to_numpy()[i] / usable[i], rtol=1e-12)
        assert r["empty_count"] == wide["empty"].to_numpy()[i].astype(int).tolist()
        assert r["error_count"] == wide["error"].to_numpy()[i].astype(int).tolist()
        assert r["cost_estimated"] == bool(wide["estimated"].to_numpy()[i].any())


def test_bundled_pool_is_real_and_complete():
    g = pd.read_parquet(ROOT / "data" / "zeroeval_graded" / "graded.parquet")
    qids = set(pd.read_parquet(ROOT / "data" / "sources" / "zeroeval" / "tasks.parquet")["qid"])
    assert g["model"].nunique() == 26  # every ZeroEval model with a reply to all 2,840 questions, no more
    assert not g.duplicated(["model", "question_id"]).any()
    assert (g.groupby("model")["question_id"].nunique() == 2840).all() and set(g["question_id"]) == qids
    assert set(g["status"]) <= {"ok", "empty"} and not g.loc[g["status"] == "empty", "correct"].any()
    assert (g["cost_usd"] > 0).all()
    mod = refresh_module()
    order = mod.model_order(sorted(g["model"].unique()))
    assert order[:2] == ["gpt-4o-2024-08-06", "claude-3-5-sonnet-20240620"] and len(order) == 26


@pytest.mark.parametrize("k", [5, 12])
def test_refresh_calls_make_a_complete_matrix(k):
    mod = refresh_module()
    g = pd.read_parquet(ROOT / "data" / "zeroeval_graded" / "graded.parquet")
    tasks = pd.read_parquet(ROOT / "data" / "sources" / "zeroeval" / "tasks.parquet")[["qid"]].iloc[::40]
    tasks = tasks.assign(task_id=[f"t{i}" for i in range(len(tasks))]).rename(columns={"qid": "question_id"})
    models = mod.model_order(sorted(g["model"].unique()))[:k]
    calls = mod.graded_calls(g, tasks, models)
    m = reward_matrix(calls, [mod.agent_name(x) for x in models])
    assert len(m.rows) == len(tasks) and m.incomplete.empty
    R = np.array(m.rows["mean_reward"].tolist())
    sub = g[g["model"].isin(models)].merge(tasks, on="question_id")
    assert R.mean() == pytest.approx(sub["correct"].mean())
