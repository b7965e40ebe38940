"""The asset graph tells the whole truth: `router-lite run` reads its stages off the Definitions, every router kind
of the table travels the lineage through the router IO manager, and run-time choices are run config."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import RouterLiteError

ROOT = Path(__file__).resolve().parents[1]


def _defs(home, profile="smoke"):
    from assets.definitions import build_definitions

    return build_definitions(home=str(home), profile=profile)


def test_stages_cover_every_asset_once_in_topological_order(tmp_path):
    from assets.automation import OPT_IN_TAG, SENSOR_TAG
    from cli.run import stages_of

    defs = _defs(tmp_path)
    graph = defs.resolve_asset_graph()
    stages = stages_of(defs)
    seen = [k for _, keys, _ in stages for k in keys]
    opt_in = {k.to_user_string() for k in graph.toposorted_asset_keys if OPT_IN_TAG in (graph.get(k).tags or {})}
    by_sensor = {k.to_user_string() for k in graph.toposorted_asset_keys if SENSOR_TAG in (graph.get(k).tags or {})}
    every = {k.to_user_string() for k in graph.toposorted_asset_keys if graph.get(k).is_materializable}
    assert sorted(seen) == sorted(every - opt_in - by_sensor) and len(seen) == len(set(seen))
    assert opt_in == {"hub_release"} and by_sensor == {"traffic"}
    assert "traffic_rewards" in seen  # what reads the sensor's asset stays a stage
    position = {k: i for i, k in enumerate(seen)}
    for k in graph.toposorted_asset_keys:  # every parent runs in an earlier stage or earlier in the same one
        for parent in graph.get(k).parent_keys:
            if k.to_user_string() in position and parent.to_user_string() not in by_sensor:
                assert position[parent.to_user_string()] < position[k.to_user_string()]
    for _, keys, partitions_def in stages:  # one partitioning per stage
        assert {id(graph.get(_key(k)).partitions_def) for k in keys} == {id(partitions_def)}


def _key(name):
    from dagster import AssetKey

    return AssetKey(name)


def test_upto_takes_the_asset_and_what_it_depends_on(tmp_path):
    from cli.run import stages_of

    stages = stages_of(_defs(tmp_path), "task_pool")
    assert [(name, keys) for name, keys, _ in stages] == [("source tasks", ["source_tasks"]),
                                                          ("task pool", ["task_pool"])]
    with pytest.raises(RouterLiteError, match="--upto 'hub_release' is no asset of `router-lite run`"):
        stages_of(_defs(tmp_path), "hub_release")


def test_upto_several_assets_takes_the_union_of_their_ancestries(tmp_path):
    """`--upto benchmark_report --upto baselines`: baselines is no ancestor of the benchmark report, so a run that
    reports both names both; each asset once, parents first."""
    from cli.run import stages_of

    defs = _defs(tmp_path)
    one = [k for _, keys, _ in stages_of(defs, "benchmark_report") for k in keys]
    both = [k for _, keys, _ in stages_of(defs, ["benchmark_report", "baselines"]) for k in keys]
    assert "baselines" not in one and "baselines" in both
    assert sorted(both) == sorted(set(one) | {"baselines"}) and len(both) == len(set(both))
    assert both.index("reward_matrix") < both.index("baselines")
    with pytest.raises(RouterLiteError, match="--upto 'nope' is no asset"):
        stages_of(defs, ["baselines", "nope"])


def test_asset_config_goes_only_to_the_runs_that_hold_the_asset():
    from cli.run import _with_config

    base = {"loggers": {}}
    cfg = {"benchmark_report": {"target": "parity"}}
    assert _with_config(base, cfg, ["router_head"]) == base
    assert _with_config(base, cfg, ["benchmark_report"]) == {"loggers": {}, "ops": {"benchmark_report": {
        "config": {"target": "parity"}}}}


def test_no_asset_reads_another_assets_file_or_an_environment_switch():
    """The done-when of the graph: no asset body opens registry/latest.json (but `promotion`, its one writer) or a
    report another asset wrote, and none reads os.environ (a secret's EnvVar lives in resources/)."""
    text = {p.name: p.read_text() for p in (ROOT / "assets").glob("*.py")}
    for needle, owner in (("latest.json", "promotion.py"), ("os.environ", None),
                          ("pool_report.json", "pool_report.py")):
        assert [n for n, t in text.items() if needle in t and n != owner] == [], needle
    # the served pointer has one writer: the promotion asset (through pipeline/report/promotion.py)
    writers = [n for n, t in text.items() if "mark_latest" in t or "promote(" in t or "decide(" in t]
    assert writers == ["promotion.py"], writers


class CentroidRouter:
    """A toy router kind: each agent's score is the cosine of the query to the mean embedding of the training rows
    that agent answered best."""

    def __init__(self, agents=None, C=None):
        self.agents = None if agents is None else list(agents)
        self.C = C

    def fit(self, X_train, R_train, X_val=None, R_val=None, best_train=None, best_val=None):
        X = X_train / np.linalg.norm(X_train, axis=1, keepdims=True)
        best = R_train.argmax(axis=1)
        self.C = np.stack([X[best == j].mean(axis=0) if (best == j).any() else np.zeros(X.shape[1])
                           for j in range(R_train.shape[1])]).astype(np.float32)
        return self

    @property
    def d(self):
        return int(self.C.shape[1])

    @property
    def K(self):
        return int(self.C.shape[0])

    def scores(self, X):
        return (np.asarray(X, np.float32) / np.linalg.norm(X, axis=1, keepdims=True)) @ self.C.T

    def pick(self, X):
        return self.scores(X).argmax(axis=1)

    def save_files(self, directory):
        np.save(Path(directory) / "centroids.npy", self.C)
        return {"files": {"centroids": "centroids.npy"}}

    @classmethod
    def from_files(cls, directory, manifest):
        return cls([a["name"] for a in manifest["agents"]],
                   np.load(Path(directory) / manifest["files"]["centroids"]))

    def fingerprint(self):
        return [self.C.tobytes()], ["centroid"]


@pytest.mark.slow
def test_a_toy_router_kind_goes_through_router_lite_run(smoke_home_copy, monkeypatch):
    """Register a kind, name it in the profile (train.router), and `router-lite run` fits it, ships it through
    the router IO manager, registers it under its kind and routes the benchmark with it: no line of the lineage
    names the kind."""
    from cli.run import run_lineage
    from pipeline.profile import OVERRIDE_ENV, load_profile
    from pipeline.route import registry
    from pipeline.route.fitted import FittedRouter
    from pipeline.route.kinds import routers_restored
    from pipeline.route.routers import register_router
    from resources.storage import asset_path

    home = smoke_home_copy()
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    override = home / "centroid.yaml"  # ship_gate off: on smoke's few validation rows no router is sure to beat
    override.write_text("train: {router: centroid, ship_gate: false}\n")  # the best single agent
    monkeypatch.setenv(OVERRIDE_ENV, str(override))
    with routers_restored():
        register_router("centroid")(CentroidRouter)
        prof = load_profile("smoke")
        assert prof.train.router == "centroid"
        run_lineage(_defs(home, prof), prof, upto="benchmark_report", log=lambda m: None,
                    asset_config={"benchmark_report": {"target": "max-quality"}})
        fitted = FittedRouter.load(asset_path(home, "router_head", suffix=""))
        assert isinstance(fitted.router, CentroidRouter) and fitted["extra"]["gate"]["router"] == "centroid"
        entry = json.loads(asset_path(home, "registered_head", suffix=".json").read_text())
        reg = registry.load(entry["path"])
        assert reg.kind == "centroid" and entry["name"].startswith("centroid-")
        np.testing.assert_array_equal(reg.router.C, fitted.router.C)
        report = (home / "reports" / "benchmark_report.md").read_text()
        assert f"head {entry['name']}" in report
        cascade = FittedRouter.load(asset_path(home, "cascade_router", suffix=""))
        assert isinstance(cascade.router.fallback, CentroidRouter)  # the cascade falls back on the shipped kind


TOY_REPORT_LOGIC = '''"""Toy report logic: how often each agent is among the best on a task."""
import pandas as pd


def best_agent_counts(reward_matrix: pd.DataFrame) -> str:
    counts = reward_matrix["best_agents"].explode().value_counts().sort_index()
    return "## Best-agent counts\\n\\n" + counts.rename("tasks").to_frame().to_markdown() + "\\n"
'''

TOY_REPORT_ASSET = '''"""Toy report asset: the recipe of docs/architecture.md, "How to add a report"."""
import pandas as pd
from dagster import MetadataValue, Output, asset

from pipeline.core.io import atomic_write_text
from pipeline.report.toy_counts import best_agent_counts
from resources.storage import StorageResource


@asset(group_name="report", io_manager_key="io_manager", description="How often each agent is among the best.")
def toy_report(reward_matrix: pd.DataFrame, storage: StorageResource) -> Output[dict]:
    md = best_agent_counts(reward_matrix)
    atomic_write_text(md, storage.path("reports") / "toy_report.md")
    return Output({"rows": len(reward_matrix)}, metadata={"report": MetadataValue.md(md)})
'''


@pytest.mark.slow
def test_a_new_report_needs_only_its_two_modules(smoke_home_copy, monkeypatch, tmp_path, capsys):
    """Follow the recipe: a pipeline/report/ module and an assets/ module, nothing else edited (the two files sit in
    extra folders of the two packages, as if added to the repo). The definitions find the asset, `router-lite run`
    places it in the report stage and prints its Markdown at the end."""
    import sys

    import assets
    import pipeline.report
    from cli.run import run_lineage, stages_of
    from cli.summary import print_summary

    (tmp_path / "assets_extra").mkdir()
    (tmp_path / "report_extra").mkdir()
    (tmp_path / "assets_extra" / "toy_report.py").write_text(TOY_REPORT_ASSET)
    (tmp_path / "report_extra" / "toy_counts.py").write_text(TOY_REPORT_LOGIC)
    monkeypatch.setattr(assets, "__path__", [*assets.__path__, str(tmp_path / "assets_extra")])
    monkeypatch.setattr(pipeline.report, "__path__", [*pipeline.report.__path__, str(tmp_path / "report_extra")])
    try:
        home = smoke_home_copy()
        monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
        defs = _defs(home)
        stages = stages_of(defs)
        report = ["served_decisions", "router_arena", "pool_report", "phrasings", "benchmark_report", "toy_report"]
        assert ("report", sorted(report)) in [(n, sorted(k)) for n, k, _ in stages]  # one stage, whatever order
        run_lineage(defs, "smoke", upto="toy_report", log=lambda m: None)
        print_summary(defs, [k for _, keys, _ in stages_of(defs, "toy_report") for k in keys])
        out = capsys.readouterr().out
        assert "## Best-agent counts" in out and "| frontier_a" in out
    finally:
        for name in ("assets.toy_report", "pipeline.report.toy_counts"):
            sys.modules.pop(name, None)
