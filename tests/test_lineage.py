"""The whole lineage on the smoke profile, through Dagster (in-process materialize on a persistent instance)."""
import json

import datasets
import pandas as pd
import pytest
from _support import promote_the_other_router
from dagster import AssetKey, DagsterInstance

from pipeline.route import pointer, registry
from resources.storage import asset_path

pytestmark = pytest.mark.slow  # the smoke_home lineage (make test-fast leaves it out)


def test_every_stage_materialised_and_checks_pass(smoke_home):
    home, dagster_home = smoke_home
    inst = DagsterInstance.from_config(str(dagster_home))
    for key in ["task_pool", "agent_pool", "preflight", "reward_matrix", "baselines", "prompt_embeddings",
                "pool_report", "router_head", "registered_head", "benchmark_report"]:
        assert inst.get_latest_materialization_event(AssetKey(key)) is not None, key
    pool = pd.read_parquet(asset_path(home, "task_pool"))
    assert len(pool) == 300
    rewards = pd.read_parquet(asset_path(home, "reward_matrix"))
    assert set(rewards["task_id"]) == set(pool["task_id"])  # replay answers every pool task: nothing held back
    assert "prompt" not in rewards.columns
    dd = datasets.load_from_disk(str(home / "datasets" / "rewards" / "hf"))
    assert "prompt" not in dd["train"].column_names


def test_collection_made_every_call_once_with_no_errors(smoke_home):
    home, _ = smoke_home
    calls = pd.concat([pd.read_parquet(f) for f in asset_path(home, "graded_calls").parent.glob("*.parquet")])
    assert len(calls) == 300 * 5 * 3
    assert calls["call_key"].is_unique
    assert (calls["status"] == "ok").all()


def test_registered_head_loads_and_routes_like_the_asset(smoke_home):
    home, _ = smoke_home
    latest = registry.latest_entry(home / "registry")
    reg = registry.load(latest["head"]["path"])  # the head beside the ★ router latest.json names
    assert reg.name.startswith("head-all-minilm-l6-v2-") and len(reg.name.split("-")[-1]) == 10
    assert [a["name"] for a in reg.agents] == ["frontier_a", "frontier_b", "frontier_c", "open_mid",
                                              "open_cheap_reasoning"]
    assert reg.agents[0]["model"] == "gemini-1.5-pro-002"
    summary = json.loads((asset_path(home, "router_head", suffix=".json")).read_text())
    assert set(summary["metrics"]) == {"head", "best_single", "oracle", "random", "knn", "headroom_captured",
                                       "distribution", "n_train", "n_test"}
    assert summary["metrics"]["head"] > summary["metrics"]["random"]


def test_benchmark_report_routes_with_real_replies(smoke_home):
    home, _ = smoke_home
    per_q = pd.read_csv(home / "reports" / "benchmark_test.csv")
    assert (per_q["status"] == "ok").all() and len(per_q) > 0
    report = json.loads((home / "reports" / "benchmark_report.json").read_text())
    assert set(report["variants"]) == {"test", "ood"}
    policies = {r["policy"] for r in report["frontier"]}
    assert {"trained head", "prior", "individual hull", "oracle", "random", "kNN router"} <= policies
    assert (home / "reports" / "frontier_smoke.png").stat().st_size > 10_000
    assert (home / "reports" / "replication_mmlu-pro-outputs.csv").exists()


def test_the_benchmark_report_says_one_headline_the_star_routers(smoke_home):
    from pipeline.report.value import mark_served, report_headline, served_headline, star_line, value_line

    home, dagster_home = smoke_home
    inst = DagsterInstance.from_config(str(dagster_home))
    meta = inst.get_latest_materialization_event(AssetKey("benchmark_report")).asset_materialization.metadata
    rv = json.loads((home / "reports" / "router_value.json").read_text())
    latest = registry.latest_entry(home / "registry")
    models = {a["name"]: a["model"] for a in registry.load(latest["head"]["path"]).agents}
    # the smoke profile's serve.target, as the report said it before the promotion named the router served
    headline = report_headline({**rv, "served": None}, "quality>=0.98", models)
    assert headline.startswith("best validation AIQ: ") and meta["headline"].value == headline and \
        meta["best_router"].value == rv["best_router"]
    assert not {"value_line", "cascade_routed_test_accuracy", "test_accuracy"} & set(meta)  # no second headline
    md = meta["report"].value
    # one ★, the router served: the promotion wrote it into the report and router_value.json after the report
    on_disk = (home / "reports" / "benchmark_report.md").read_text()
    assert rv["served"]["name"] == latest["name"] and rv["served"]["promoted_by"] == latest["promoted_by"]
    assert on_disk == mark_served(md, served_headline(rv, "quality>=0.98", models))
    star = served_headline(rv, "quality>=0.98", models)
    assert [x for x in on_disk.splitlines() if x.startswith("**★")] == [f"**{star}**"]
    assert md.count(headline) == 1 and md.index(headline) < md.index("Pool verdict")
    head = json.loads(asset_path(home, "router_head", suffix=".json").read_text())["value"]
    assert value_line(head, "parity", models) not in md  # the prompt-only head's parity line led the old report
    # the plot is named by its path (the UI cannot resolve a relative image link; `frontier_plot` inlines it)
    assert "![" not in md and f"`{home / 'reports' / 'frontier_smoke.png'}`" in md
    assert meta["frontier_plot"].value.startswith("![frontier_smoke.png](data:image/png;base64,")
    # the promotion says one too: the router served now, the only ★ of its metadata
    promo = inst.get_latest_materialization_event(AssetKey("promotion")).asset_materialization.metadata
    assert promo["headline"].value == star_line(latest["star"], latest["name"])
    assert "★" not in promo["candidates"].value and "(candidate)" in promo["candidates"].value


def test_router_value_and_pool_report(smoke_home):
    from pipeline.report.value import ROUTER_VALUE_KEYS, TARGET_KEYS

    home, _ = smoke_home
    rv = json.loads((home / "reports" / "router_value.json").read_text())
    assert set(rv) == set(ROUTER_VALUE_KEYS)
    arena = rv["router_arena"]  # RouterArena's measures re-run the fitted routers: the report's own decisions
    for kind, r in rv["routers"].items():
        for name, t in r["targets"].items():
            assert arena["routers"][kind][name]["quality"] == pytest.approx(t["quality"], abs=1e-6)
    for kind, r in rv["prompt_routers"].items():
        assert arena["prompt_routers"][kind]["max-quality"]["quality"] == pytest.approx(r["test"], abs=1e-6)
    assert arena["baselines"]["oracle"]["optimal_selection"] == 1.0 and arena["perturbations"]["seed"]
    assert arena["routers"]["head"]["decision_ms"]["batch_size"] == 1
    assert rv["profile"] == "smoke" and rv["pool_verdict"].startswith(("quality-dominated", "complementary"))
    assert set(rv["best_single"]) == {"agent", "quality", "cost_per_1k"}
    assert set(rv["max_quality"]) == {"quality", "ci_low", "ci_high", "gain", "cost_per_1k"}
    assert {"max-quality", "parity", "quality>=0.98"} <= set(rv["targets"])
    for t in rv["targets"].values():  # the prompt router's held-out targets as served (its guard's rate beside)
        assert set(t) == {*TARGET_KEYS, "guard_rate"} and abs(sum(t["shares"].values()) - 1) < 1e-9
    assert set(rv["aiq"]) == {"head", "prior", "hull", "knn"}
    assert rv["n_test"] > 0 and rv["oracle"] >= rv["best_single"]["quality"]
    rep = json.loads((home / "reports" / "pool_report.json").read_text())
    assert rep["verdict"]["text"] == rv["pool_verdict"]
    # whether a cascade pays is the lineage's cascade (answers only) as served, not a second fit of its own
    fitted = rv["routers"]["cascade:cascade"]["targets"]["quality>=0.98"]
    assert rep["cascade"]["quality_ratio"] == fitted["quality_ratio"]
    assert rep["cascade"]["cost_ratio"] == fitted["cost_ratio"]
    latest = registry.latest_entry(home / "registry")
    manifest = registry.load(latest["head"]["path"]).manifest
    assert manifest["operating_points"]["points"][0]["lambda"] == 0
    # latest.json names the router the promotion asset promoted at the profile's serving target (its only writer):
    # one of the run's router kinds, chosen on cross-fitted rows; its held-out figures are the value report's
    star = latest["star"]
    assert star["router"] in rv["routers"] and star["target"] == latest["target"] == "quality>=0.98"
    assert registry.load(latest["path"]).kind == ("head" if star["router"] == "head" else "cascade")
    reported = rv["routers"][star["router"]]["targets"]["quality>=0.98"]
    for k in ("quality", "quality_ratio", "cost_per_1k", "cost_ratio"):
        assert star["held_out"][k] == pytest.approx(reported[k], rel=1e-9), k
    assert star["aiq_validation"] == pytest.approx(rv["routers"][star["router"]]["aiq_validation"], rel=1e-9)
    stored = json.loads((home / "registry" / "latest.json").read_text())
    assert stored["path"] == latest["name"] and stored["promoted_by"] == "gate" and stored["kind"] == latest["kind"]
    first, = pointer.history(home / "registry")  # one run: one promotion, nothing before it
    assert first["action"] == "promoted" and first["previous"] is None and "first promotion" in first["reason"]
    evidence = json.loads((home / "registry" / stored["evidence"]).read_text())
    assert len(evidence["reward"]) == len(evidence["task_ids"]) == rv["n_test"]
    assert 0 < star["validation"]["quality_ratio"] and star["validation"]["cost_ratio"] > 0


def test_the_promotion_gate_refuses_a_candidate_on_a_degraded_matrix_and_keeps_the_pointer(smoke_home_copy,
                                                                                            monkeypatch, capsys):
    """Another entry promoted by hand, holding evidence as good as the run's candidate on the same held-out rows
    (its stored per-row outcome); the promotion asset re-run on a degraded matrix (every test reply wrong) pairs the
    candidate with it, refuses it, and the pointer stays; on the clean matrix the candidate is not worse and not
    dearer: promoted, the hand-promoted entry as `previous`."""
    from dagster import materialize

    from assets.definitions import build_assets, build_resources

    home = smoke_home_copy()
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    root, candidate, other = promote_the_other_router(home)
    assert other in capsys.readouterr().out
    assert registry.latest_entry(root)["evidence"] == f"evidence/{other}.json"
    clean = pd.read_parquet(asset_path(home, "reward_matrix"))
    pool = pd.read_parquet(asset_path(home, "task_pool")).set_index("task_id")
    test = clean["task_id"].map(pool["split"]).eq("test")
    degraded = clean.copy()
    degraded.loc[test, "mean_reward"] = degraded.loc[test, "mean_reward"].map(lambda r: [0.0] * len(r))
    assets, res = build_assets("smoke"), build_resources(str(home), profile="smoke")

    def promote_on(frame):
        frame.to_parquet(asset_path(home, "reward_matrix"), index=False)
        result = materialize(assets, selection=["promotion"], resources=res)
        assert result.success
        return result.output_for_node("promotion")

    before = (root / "latest.json").read_text()
    out = promote_on(degraded)
    assert out["action"] == "refused" and out["candidate"] == candidate and out["served"] == other
    assert out["verdict"]["mode"] == "paired" and "worse in quality" in out["verdict"]["reason"]
    assert (root / "latest.json").read_text() == before
    out = promote_on(clean)
    assert out["action"] == "promoted" and out["served"] == candidate and out["verdict"]["mode"] == "paired"
    lines = pointer.history(root)
    assert [(r["action"], r["by"], r["name"]) for r in lines[-3:]] == [
        ("promoted", "promote", other), ("refused", "gate", candidate), ("promoted", "gate", candidate)]
    assert lines[-1]["previous"]["name"] == other and registry.latest_entry(root)["promoted_by"] == "gate"


def test_after_a_wider_pools_cheaper_router_the_rerun_does_not_promote_a_dearer_one(smoke_home_copy, monkeypatch,
                                                                                     capsys):
    """The operator's case, end to end on the smoke lineage: a wider pool's refresh promoted a cheaper router (here
    another entry of the home whose evidence is the run's candidate's over two more agents at 30 % of its cost, on
    the same held-out tasks); the promotion re-run on the default pool pairs on the shared tasks, refuses the dearer
    candidate saying so and naming the router it would replace, and keeps the pointer; the report's bold ★ line and
    router_value.json's `served` name the router served; `promote CANDIDATE` shows the refusal and asks for --force."""
    from dagster import materialize

    from assets.definitions import build_assets, build_resources
    from cli.main import main
    from cli.summary import promotion_lines
    from pipeline.report.value import served_headline

    home = smoke_home_copy()
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    root = home / "registry"
    served = registry.latest_entry(root)
    candidate = served["name"]
    other = next(p.name for p in sorted(root.iterdir()) if (p / "manifest.json").exists() and p.name != candidate)
    ev = json.loads((root / served["evidence"]).read_text())
    assert sum(ev["cost"]) > 0
    wide = {**ev, "name": other, "agents": ev["agents"] + ["wide_a", "wide_b"], "cost": [0.3 * c for c in ev["cost"]]}
    (root / "evidence" / f"{other}.json").write_text(json.dumps(wide))
    assert main(["promote", other, "--profile", "smoke"]) == 0  # the gate passes the cheaper one (shared tasks)
    assert f"gate: passes {other}" in capsys.readouterr().out
    before = (root / "latest.json").read_text()
    result = materialize(build_assets("smoke"), selection=["promotion"],
                         resources=build_resources(str(home), profile="smoke"))
    out = result.output_for_node("promotion")
    v = out["verdict"]
    assert out["action"] == "refused" and out["candidate"] == candidate and out["served"] == other
    assert v["mode"] == "shared" and v["dearer"] is True and v["replaces"] == other and not v["passed"]
    assert "the pool changed (−wide_a, −wide_b)" in v["reason"] and "dearer beyond noise" in v["reason"]
    assert (root / "latest.json").read_text() == before
    said = "\n".join(promotion_lines(out))
    assert f"{candidate} refused by the gate; {other} stays served" in said and "--force" in said
    rv = json.loads((home / "reports" / "router_value.json").read_text())
    assert rv["served"]["name"] == other
    bold = [x for x in (home / "reports" / "benchmark_report.md").read_text().splitlines() if x.startswith("**★")]
    models = {a["name"]: a["model"] for a in registry.load(served["head"]["path"]).agents}
    assert bold == [f"**{served_headline(rv, 'quality>=0.98', models)}**"]
    capsys.readouterr()
    assert main(["promote", candidate, "--check", "--profile", "smoke"]) == 1
    assert main(["promote", candidate, "--profile", "smoke"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"the gate refuses {candidate}" in err[-1] and "dearer" in err[-1] and "--force" in err[-1]
    assert (root / "latest.json").read_text() == before
