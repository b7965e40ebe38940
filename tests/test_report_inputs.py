"""The reports read what the lineage fitted and materialised, nothing else: the benchmark report's frontier takes the
kNN baseline `router_head` fitted (no second fit), and the replication's summary (`routerbench_summary`) reads every
suite partition of `routerbench_replication` through the IO manager, never a stray file of reports/."""
import json

import numpy as np
import pandas as pd
import pytest
from _support import two_cluster_rewards
from dagster import AssetKey, DagsterInstance, materialize

from pipeline.collect.rewards import to_arrays
from pipeline.core.io import atomic_write_parquet
from pipeline.report.benchmark import KNN
from pipeline.report.frontier import policy_table
from pipeline.route.knn import KnnRouter
from resources.storage import asset_path, read_asset

STALE = "### routerbench (a table left by another profile: STALE)\n"


def _no_knn_fit(monkeypatch):
    def refuse(self, *a, **k):
        raise AssertionError("the report fitted a kNN router of its own")

    monkeypatch.setattr(KnnRouter, "fit", refuse)


def test_the_frontier_routes_with_the_knn_router_head_fitted(tmp_path, monkeypatch):
    from assets.benchmark import _frontier
    from pipeline.route import registry
    from pipeline.route.fit import fit_router, fitted_knn
    from pipeline.route.fitted import FittedRouter
    from pipeline.route.train import TrainConfig

    X, rewards, split, _ = two_cluster_rewards(600)
    fit = fit_router(X, rewards, split, TrainConfig(generations=2, log_every=0))
    path = registry.register(tmp_path / "registry", fit.head, registry.PromptFit(
        fit.guard, fit.best_single, fit.scorer, fit.cost_scorer, fit.operating_points),
        backbone={"id": "synthetic", "key": "synthetic", "dim": int(X.shape[1])},
        agents=[{"name": a, "model": a} for a in fit.agents], training={}, data_hashes={}, metrics=fit.metrics)
    _, R, _, C = to_arrays(rewards)
    tr, te = (split == "train").to_numpy(), (split == "test").to_numpy()
    # what the report fitted before: the same train rows, the k the upstream fit chose on validation
    refit = KnnRouter(k=fit.knn_k, agents=fit.agents).fit(X[tr], R[tr])
    stored = FittedRouter.load(fit.to_fitted().save(tmp_path / "router_head"))  # as the IO manager passes it on
    knn = fitted_knn(stored)
    assert knn.k_ == fit.knn_k and np.array_equal(knn.scores(X[te]), refit.scores(X[te]))
    _no_knn_fit(monkeypatch)
    table, _ = _frontier(rewards, split, X, registry.load(path), knn)
    row = table.set_index("policy").loc[KNN]
    want = policy_table({KNN: refit.scores(X[te])}, R[te], C[te]).set_index("policy").loc[KNN]
    assert row.to_dict() == want.to_dict()


def _replication_table(suite: str, head_aiq: float) -> pd.DataFrame:
    t = pd.DataFrame({"policy": ["prior", "trained head"], "quality": [0.7, 0.8], "cost_per_example": [0.001, 0.002],
                      "aiq": [0.65, head_aiq]})
    t.attrs.update(n_train=100, n_test=40, cost_span=[0.0005, 0.003])
    return t


def test_the_summary_reads_every_suite_partition_and_no_stale_report(tmp_path):
    from assets.definitions import build_definitions
    from pipeline.report.replication import table_markdown

    home = tmp_path / "home"
    defs = build_definitions(home=str(home), profile="demo")  # suites: routerbench, zeroeval-outputs
    graph = defs.resolve_asset_graph()
    summary = graph.get(AssetKey("routerbench_summary"))
    assert summary.parent_keys == {AssetKey("routerbench_replication")} and summary.partitions_def is None
    tables = {"routerbench": _replication_table("routerbench", 0.81),
              "zeroeval-outputs": _replication_table("zeroeval-outputs", 0.74)}
    for suite, t in tables.items():
        atomic_write_parquet(t, asset_path(home, "routerbench_replication", suite))
    reports = home / "reports"
    reports.mkdir(parents=True)
    (reports / "replication_aaa-old-suite.md").write_text(STALE)  # sorted first: the glob read it
    result = materialize(list(defs.assets), selection=[AssetKey("routerbench_summary")], resources=defs.resources,
                         instance=DagsterInstance.ephemeral())
    assert result.success
    text = (reports / "routerbench_replication.md").read_text()
    assert text == ("## RouterBench-style replication\n\n" + table_markdown("routerbench", tables["routerbench"])
                    + "\n" + table_markdown("zeroeval-outputs", tables["zeroeval-outputs"]))
    meta = result.asset_materializations_for_node("routerbench_summary")[0].metadata
    assert meta["table"].value == text
    assert meta["aiq_trained_head_routerbench"].value == 0.81
    assert meta["aiq_trained_head_zeroeval-outputs"].value == 0.74
    assert read_asset(home, "routerbench_summary")["aiq_trained_head"] == {"routerbench": 0.81,
                                                                          "zeroeval-outputs": 0.74}


def test_the_lineage_summary_is_the_profiles_suites_only(smoke_home_copy):
    """`router-lite run` from the replication on: the summary holds the smoke profile's one suite, not a stale
    replication_routerbench.md another profile left in reports/."""
    from assets.definitions import build_definitions
    from cli.run import run_lineage

    home = smoke_home_copy()
    reports = home / "reports"
    (reports / "replication_routerbench.md").write_text(STALE)
    run_lineage(build_definitions(home=str(home), profile="smoke"), "smoke", log=lambda m: None,
                start=["routerbench_replication"], instance=DagsterInstance.ephemeral())
    text = (reports / "routerbench_replication.md").read_text()
    assert text == "## RouterBench-style replication\n\n" + (reports / "replication_mmlu-pro-outputs.md").read_text()


def test_the_benchmark_report_fits_no_knn_router(smoke_home_copy, monkeypatch):
    """The benchmark report's kNN row is the upstream router_head's kNN baseline on the test rows."""
    from assets.definitions import build_definitions
    from pipeline.route.fit import reward_embeddings, training_split
    from pipeline.route.fitted import FittedRouter

    home = smoke_home_copy()
    defs = build_definitions(home=str(home), profile="smoke")
    _no_knn_fit(monkeypatch)
    result = materialize(list(defs.assets), selection=[AssetKey("benchmark_report")], resources=defs.resources,
                         instance=DagsterInstance.ephemeral())
    assert result.success
    from pipeline.route.fit import KNN_ROLE  # the companion router_head stores the kNN baseline under
    rewards = read_asset(home, "reward_matrix")
    te = (training_split(rewards, read_asset(home, "task_pool")) == "test").to_numpy()
    X = reward_embeddings(read_asset(home, "prompt_embeddings"), rewards)
    knn = FittedRouter.load(asset_path(home, "router_head", suffix="")).companions[KNN_ROLE]
    _, R, _, C = to_arrays(rewards)
    want = policy_table({KNN: knn.scores(X[te])}, R[te], C[te]).set_index("policy").loc[KNN]
    report = json.loads((home / "reports" / "benchmark_report.json").read_text())
    frontier = {r["policy"]: r for r in report["frontier"]}
    assert frontier[KNN]["aiq"] == pytest.approx(want["aiq"], abs=1e-12)
    assert frontier[KNN]["quality"] == pytest.approx(want["quality"], abs=1e-12)
    rv = json.loads((home / "reports" / "router_value.json").read_text())
    assert rv["aiq"]["knn"] == pytest.approx(want["aiq"], abs=1e-12)
