"""New agents measured on a sample (pipeline/collect/sampling.py): the draw, the estimate, the imputed
cells, and a replay collection that calls a new agent only on its sample."""
import numpy as np
import pandas as pd
import pytest

from pipeline.collect.forecast import forecast
from pipeline.collect.sampling import (
    Existing,
    NewAgents,
    NewAgentSample,
    choose_sample,
    collect_with_sample,
    complete_matrix,
    disagreement,
    estimate_agent,
    imputed_cells,
)
from pipeline.core.errors import RouterLiteError
from pipeline.core.pareto import on_frontier, pareto


def _toy(n_per=50, sources=("a", "b", "c"), K=3, seed=0):
    rng = np.random.default_rng(seed)
    src = np.repeat(sources, n_per)
    ids = np.array([f"{s}/{i}" for s, i in zip(src, range(len(src)))])
    B = (rng.random((len(src), K)) < 0.6).astype(float)
    return ids, src, B


def test_the_sample_is_stratified_seeded_and_deterministic():
    ids, src, B = _toy()
    s = choose_sample(ids, src, B, 0.2, "disagreement", seed=3, agent="new")
    for name in ("a", "b", "c"):  # 20 % of each source's 50 tasks
        assert np.sum(src[s] == name) == 10
    assert np.array_equal(s, choose_sample(ids, src, B, 0.2, "disagreement", seed=3, agent="new"))
    assert not np.array_equal(s, choose_sample(ids, src, B, 0.2, "disagreement", seed=4, agent="new"))
    assert not np.array_equal(s, choose_sample(ids, src, B, 0.2, "disagreement", seed=3, agent="other"))
    # the rows' order does not change which tasks are drawn
    perm = np.random.default_rng(1).permutation(len(ids))
    s2 = choose_sample(ids[perm], src[perm], B[perm], 0.2, "disagreement", seed=3, agent="new")
    assert set(ids[perm][s2]) == set(ids[s])
    # at least half of each source's quota where the existing agents disagree
    dis = disagreement(B)
    for name in ("a", "b", "c"):
        assert np.sum(dis[s] & (src[s] == name)) >= 5
    assert len(np.unique(s)) == len(s) == 30
    with pytest.raises(RouterLiteError, match="strategy"):
        choose_sample(ids, src, B, 0.2, "best")
    with pytest.raises(RouterLiteError, match="fraction"):
        choose_sample(ids, src, B, 0.0)


def test_the_setting_is_off_by_default_and_checked():
    from pipeline.profile import load_profile

    assert not NewAgentSample().on and not load_profile("smoke").collection.new_agent_sample.on  # off unless set
    assert NewAgentSample(fraction=0.2).on
    for bad in ({"fraction": 1.5}, {"strategy": "x"}, {"model": "x"}, {"complete": "x"}, {"confidence": 1.0}):
        with pytest.raises(RouterLiteError, match="new_agent_sample"):
            NewAgentSample(**bad)


def test_the_estimate_reads_only_the_sample_and_covers_a_predictable_agent():
    ids, src, B = _toy(n_per=200, K=4, seed=2)
    rng = np.random.default_rng(5)
    y_full = np.where(rng.random(len(ids)) < 0.85, B[:, 0], 1 - B[:, 0])  # follows agent 0 most of the time
    s = choose_sample(ids, src, B, 0.25, seed=0, agent="n")
    y = np.full(len(ids), np.nan)
    y[s] = y_full[s]  # NaN elsewhere: reading them would poison the estimate
    costs = np.ones_like(B)
    est = estimate_agent(Existing(B, costs, src), y, np.where(np.isnan(y), np.nan, 2.0), s, boot=100)
    assert est.ci_low <= y_full.mean() <= est.ci_high and abs(est.quality - y_full.mean()) < 0.04
    assert set(est.per_source) == {"a", "b", "c"} and all(v["sampled"] == 50 for v in est.per_source.values())
    assert est.cost == pytest.approx(2.0)  # the ratio estimate: twice the existing agents' cost everywhere
    assert np.array_equal(est.p_task[s], y_full[s])


def test_on_frontier():
    assert on_frontier([0.5, 0.9, 0.7], [1.0, 3.0, 2.0], 2)
    assert not on_frontier([0.5, 0.9, 0.7], [1.0, 3.0, 3.5], 2)
    assert on_frontier([0.7, 0.7], [2.0, 2.0], 1)  # a tie with an existing agent is not dominated
    rng = np.random.default_rng(0)  # without ties, the one-agent test and the frontier set agree
    for _ in range(50):
        q, c = rng.random(7), rng.random(7)
        front = set(pareto(np.c_[c, q]).tolist())
        assert {j for j in range(7) if on_frontier(q, c, j)} == front


def _rows(R, C, agents):
    return pd.DataFrame({"task_id": [f"t{i}" for i in range(len(R))], "agent_order": [list(agents)] * len(R),
                         "mean_reward": [list(r) for r in R], "best_agents": [[]] * len(R),
                         "is_tie": [False] * len(R), "mean_cost": [list(c) for c in C]})


def test_imputed_cells_are_marked_and_filled():
    ids, src, B = _toy(n_per=40, K=3, seed=4)
    new = B[:, 0].copy()
    s = choose_sample(ids, src, B, 0.25, agent="n")
    R = np.column_stack([B, np.where(np.isin(np.arange(len(ids)), s), new, np.nan)])
    C = np.column_stack([np.ones_like(B), np.where(np.isnan(R[:, 3]), np.nan, 0.5)])
    rows, report = complete_matrix(_rows(R, C, ["x", "y", "z", "n"]), src, ["n"], NewAgentSample(fraction=0.25,
                                                                                                  boot=20))
    mask = np.array(rows["imputed"].tolist())
    assert mask[:, :3].sum() == 0 and np.array_equal(mask[:, 3], np.isnan(R[:, 3]))
    assert imputed_cells(rows) == report["imputed_cells"] == int(np.isnan(R[:, 3]).sum())
    filled = np.array(rows["mean_reward"].tolist())
    assert np.isfinite(filled).all() and ((filled >= 0) & (filled <= 1)).all()
    assert np.array_equal(filled[s, 3], new[s])  # asked cells keep their measured reward
    d = report["agents"]["n"]
    assert d["sampled"] == len(s) and {"joins", "join_share", "collect_rest", "per_source"} <= set(d)
    assert imputed_cells(rows.drop(columns="imputed")) == 0


def test_the_reward_matrix_keeps_tasks_a_sampled_agent_was_not_asked():
    from pipeline.collect.rewards import reward_matrix

    calls = pd.DataFrame({"task_id": ["t1", "t1", "t2", "t2", "t1"], "agent": ["a", "b", "a", "b", "new"],
                          "status": ["ok"] * 5, "correct": [True, False, True, True, True],
                          "cost_usd": [1.0] * 5, "repetition": [0] * 5, "usage_source": ["provider"] * 5})
    assert len(reward_matrix(calls, ["a", "b", "new"]).rows) == 1  # without the setting: t2 is held back
    m = reward_matrix(calls, ["a", "b", "new"], sampled=["new"])
    assert list(m.rows["task_id"]) == ["t1", "t2"] and np.isnan(m.rows["mean_reward"].iloc[1][2])
    assert m.incomplete.empty


def test_matrix_complete_passes_the_cells_sampled_out_on_purpose():
    from assets.collection_budget import matrix_complete_check

    tasks = pd.DataFrame({"task_id": ["s/1", "s/2"]})
    calls = pd.DataFrame({"agent": ["a", "a", "b"], "task_id": ["s/1", "s/2", "s/1"], "repetition": [0, 0, 0]})
    res = matrix_complete_check(calls, tasks, ["a", "b"], 1, on_purpose=["b"])
    assert res.passed and res.metadata["sampled_out_cells"].value == 1
    assert not matrix_complete_check(calls, tasks, ["a", "b"], 1, on_purpose=["a"]).passed


@pytest.fixture(scope="module")
def demo_tasks():
    from cli.forecast import profile_task_pool
    from pipeline.profile import load_profile

    tasks = profile_task_pool(load_profile("demo"))
    return tasks.groupby("source", group_keys=False).head(40).reset_index(drop=True)  # 40 per source


def test_a_replay_collection_calls_the_new_agents_only_on_their_sample(demo_tasks, tmp_path):
    """demo_wide through the replay pool, setting on (25 %): the demo agents are called on every task, each new one
    on 10 of each source's 40; a rerun makes no call; the decision's `rest` completes an agent; the matrix marks
    exactly the cells never asked."""
    from pipeline.collect.call_log import CallLog
    from pipeline.collect.rewards import reward_matrix
    from pipeline.collect.settings import CollectionSettings
    from resources.pool import PoolResource

    pool = PoolResource(kind="replay", pool="demo_wide")
    agents = pool.agents()
    base = [a.name for a in PoolResource(kind="replay", pool="demo").agents()]
    new = [a.name for a in agents if a.name not in base]
    setting = NewAgentSample(fraction=0.25, boot=20)
    settings = CollectionSettings(concurrency=8)
    fc = forecast(demo_tasks, agents, 1, settings, sampled={a: 0.25 for a in new})  # before any call
    frames = []
    for source, tasks in demo_tasks.groupby("source"):
        log = CallLog(tmp_path / source)
        calls, asked = collect_with_sample(tasks, agents, NewAgents(base, setting), 0, log, pool.client_for, settings)
        assert asked == {a: 10 for a in new}
        per_agent = log.read()["agent"].value_counts()
        assert all(per_agent[a] == 40 for a in base) and all(per_agent[a] == 10 for a in new)
        before = len(log.read())
        collect_with_sample(tasks, agents, NewAgents(base, setting), 0, log, pool.client_for, settings)
        assert len(log.read()) == before  # the same sample again: every call already logged
        frames.append(calls)
    calls = pd.concat(frames, ignore_index=True)
    assert fc["sampled"] == sorted(new) and fc["calls"] == fc["calls_low"] == 3 * 40 * len(base) + 3 * 10 * len(new)
    for a, f in fc["per_agent"].items():  # the forecast counted each agent's calls, and its range holds the bill
        bill = float(calls.loc[calls["agent"] == a, "cost_usd"].sum())
        assert f["calls"] == (calls["agent"] == a).sum() and f["usd_low"] <= bill <= f["usd_high"], (a, f, bill)
    m = reward_matrix(calls, [a.name for a in agents], sampled=new)
    assert len(m.rows) == len(demo_tasks)
    src = m.rows[["task_id"]].merge(demo_tasks[["task_id", "source"]])["source"].to_numpy()
    rows, report = complete_matrix(m.rows, src, new, setting)
    assert imputed_cells(rows) == 5 * 90 == report["imputed_cells"]
    asked_cells = set(zip(calls["agent"], calls["task_id"]))
    for _, r in rows.iterrows():
        for a, imp in zip(r["agent_order"], r["imputed"]):
            assert imp == ((a, r["task_id"]) not in asked_cells)
    # the decision's rest: one new agent completed on a later collection of one source
    one = new[0]
    tasks = demo_tasks[demo_tasks["source"] == demo_tasks["source"].iloc[0]]
    log = CallLog(tmp_path / tasks["source"].iloc[0])
    _, asked = collect_with_sample(tasks, agents, NewAgents(base, setting, [one]), 0, log, pool.client_for, settings)
    assert asked[one] == 40 and log.read()["agent"].value_counts()[one] == 40


def test_the_collection_completes_only_the_agents_the_last_decision_on_its_pool_named(tmp_path):
    import json

    from assets.collection import NEW_AGENTS_REPORT, new_agents_markdown, rest_of, sampled_agents
    from pipeline.profile import load_profile
    from resources.storage import StorageResource

    storage = StorageResource(home=str(tmp_path))
    assert rest_of(storage, "demo_wide") == []
    report = {"pool": "demo_wide", "imputed_cells": 7, "agents": {
        "n1": {"collect_rest": True, "sampled": 3, "tasks": 10, "quality_estimate": 0.5, "ci_low": 0.4, "ci_high": 0.6,
               "cost_estimate": 0.001, "joins": True, "join_share": 0.95,
               "per_source": {"s": {"estimate": 0.5, "ci_low": 0.4, "ci_high": 0.6}}},
        "n2": {"collect_rest": False}}}
    (storage.path("reports") / NEW_AGENTS_REPORT).write_text(json.dumps(report))
    assert rest_of(storage, "demo_wide") == ["n1"] and rest_of(storage, "other_pool") == []
    assert "| n1 | 3/10 | 0.5000 [0.4000, 0.6000] |" in new_agents_markdown({**report, "agents": {
        "n1": report["agents"]["n1"]}})
    smoke = load_profile("smoke")  # the setting off: nobody is sampled, whatever the pool
    assert sampled_agents(smoke, ["frontier_a", "wide_qwen72b"]) == []


@pytest.mark.slow
def test_a_dagster_run_on_the_wider_pool_asks_the_new_agents_only_their_sample(tmp_path, monkeypatch):
    """smoke (60 tasks, 1 repetition) with `collection.new_agent_sample: {fraction: 0.25}`, pre-flight on
    mmlu_pro_wide: graded_calls calls the 5 mmlu_pro agents on all 60 tasks and each of the 3 new ones on 15 (counted
    in the call log); reward_matrix keeps all 60 rows, marks the 3 x 45 cells never asked, passes matrix_complete
    and writes the decisions; a rerun of the collection makes no call (no new agent may join on this pool)."""
    import json

    import yaml
    from dagster import MultiPartitionKey, materialize

    from assets.definitions import build_assets, build_resources
    from pipeline.collect.call_log import CallLog
    from resources.storage import StorageResource, asset_path

    over = tmp_path / "o.yaml"
    over.write_text(yaml.safe_dump({"task_pool": {"size": 60}, "collection": {
        "repetitions": 1, "new_agent_sample": {"fraction": 0.25, "boot": 20}}}))
    monkeypatch.setenv("ROUTER_LITE_OVERRIDE", str(over))
    home = tmp_path / "home"
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    res = build_resources(str(home), profile="smoke")
    assets = build_assets("smoke")
    by = {a.key.to_user_string(): a for a in assets}
    assert materialize([by["source_tasks"]], partition_key="mmlu_pro", resources=res).success
    cfg = {"ops": {"preflight": {"config": {"pool": "mmlu_pro_wide"}}}}
    assert materialize(assets, selection=["task_pool", "agent_pool", "preflight"], resources=res,
                       run_config=cfg).success
    pk = MultiPartitionKey({"source": "mmlu_pro", "repetition": "0"})
    assert materialize(assets, selection=["graded_calls"], partition_key=pk, resources=res).success
    log = CallLog(StorageResource(home=str(home)).calls_dir("replay", "mmlu_pro", 0))
    counts = log.read()["agent"].value_counts().to_dict()
    new = {"wide_jamba", "wide_qwen", "wide_phi"}
    assert {a: n for a, n in counts.items() if a in new} == {a: 15 for a in new}
    assert len(counts) == 8 and all(n == 60 for a, n in counts.items() if a not in new)
    result = materialize(assets, selection=["reward_matrix"], resources=res)
    assert result.success
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["matrix_complete"].passed
    rm = pd.read_parquet(asset_path(home, "reward_matrix"))
    assert len(rm) == 60 and sum(int(np.sum(m)) for m in rm["imputed"]) == 3 * 45
    decisions = json.loads((home / "reports" / "new_agents.json").read_text())
    assert decisions["pool"] == "mmlu_pro_wide" and set(decisions["agents"]) == new
    before = len(log.read())
    assert materialize(assets, selection=["graded_calls"], partition_key=pk, resources=res).success
    assert len(log.read()) == before + sum(45 for a, d in decisions["agents"].items() if d["collect_rest"])


def test_calls_already_logged_for_a_new_agent_are_kept_not_imputed(demo_tasks, tmp_path):
    """A new agent collected in full before the setting was turned on keeps its whole column: nothing is imputed."""
    from pipeline.collect.call_log import CallLog
    from pipeline.collect.calls import run_collect
    from pipeline.collect.settings import CollectionSettings
    from resources.pool import PoolResource

    pool = PoolResource(kind="replay", pool="demo_wide")
    agents = pool.agents()
    base = [a.name for a in PoolResource(kind="replay", pool="demo").agents()]
    tasks = demo_tasks[demo_tasks["source"] == demo_tasks["source"].iloc[0]].head(12)
    settings = CollectionSettings(concurrency=4)
    log = CallLog(tmp_path / "log")
    first = next(a for a in agents if a.name not in base)
    run_collect(tasks, [first], 0, log, pool.client_for, settings)  # its full column, earlier
    calls, asked = collect_with_sample(tasks, agents, NewAgents(base, NewAgentSample(fraction=0.25)), 0, log,
                                       pool.client_for, settings)
    assert asked[first.name] == 12 and all(n == 3 for a, n in asked.items() if a != first.name)
    # the forecast of that collection, had it been made first: 3 calls for each new agent (12 x 0.25), none for
    # `first` (all 12 logged: its sample is among them)
    done = set(CallLog(tmp_path / "log").read().query("agent == @first.name")["call_key"])
    fc = forecast(tasks, agents, 1, settings, done, sampled={a.name: 0.25 for a in agents if a.name not in base})
    assert fc["per_agent"][first.name]["calls"] == fc["per_agent"][first.name]["calls_low"] == 0
    assert all(fc["per_agent"][a]["calls"] == 3 for a in asked if a != first.name)
    assert (calls["agent"] == first.name).sum() == 12


def test_the_shipped_wider_pool_profiles_sample_their_new_agents(tmp_path, monkeypatch):
    """demo, mmlu_pro(_full) and pilot ship the sample on: a collection on their wider pool asks the new agents on
    20 % first; the profile's own pool (and a run whose pool *is* the wider one: docs/wide_pool.md's) samples
    nobody."""
    from assets.collection import sampled_agents
    from pipeline.collect.agents import load_agents
    from pipeline.profile import load_profile

    for name in ("demo", "mmlu_pro", "mmlu_pro_full", "pilot"):
        prof = load_profile(name)
        assert prof.collection.new_agent_sample.fraction == 0.2, name
        wide = [a.name for a in load_agents("config/agents.yaml", prof.pool.wide_name)]
        own = [a.name for a in load_agents("config/agents.yaml", prof.pool.name)]
        assert sampled_agents(prof, wide) == [a for a in wide if a not in own] and len(sampled_agents(prof, wide)) >= 3
        assert sampled_agents(prof, own) == []
    (tmp_path / "demo_wide.yaml").write_text("pool: {name: demo_wide}\n")
    monkeypatch.setenv("ROUTER_LITE_OVERRIDE", str(tmp_path / "demo_wide.yaml"))
    wide_run = load_profile("demo")
    assert sampled_agents(wide_run, [a.name for a in load_agents("config/agents.yaml", "demo_wide")]) == []


def test_an_agent_that_may_join_holds_the_routers_until_it_is_collected():
    """A planned stop, not a failure: a WARN naming the agent and the next step (the step succeeds, no trace); a cell
    missing for another reason stays an ERROR that fails the run."""
    from dagster import AssetCheckSeverity

    from assets.collection_budget import matrix_complete_check, planned_stop

    tasks = pd.DataFrame({"task_id": ["s/1", "s/2", "s/3"]})
    calls = pd.DataFrame({"agent": ["a", "a", "a", "j", "n"], "task_id": ["s/1", "s/2", "s/3", "s/1", "s/1"],
                          "repetition": [0] * 5})
    res = matrix_complete_check(calls, tasks, ["a", "j", "n"], 1, on_purpose=["n"], joining=["j"])
    assert not res.passed and res.metadata["joining"].value == ["j"] and planned_stop(res) == ["j"]
    assert res.severity == AssetCheckSeverity.WARN
    assert res.description.startswith("planned stop: 2 cells of new agents that may join the frontier (j) are not "
                                      "collected yet") and "next: the collection of their remaining calls" in \
        res.description and "recollect_complete_joiners" in res.description
    assert res.metadata["sampled_out_cells"].value == 2  # n's, estimated on purpose
    broken = calls[calls["task_id"] != "s/3"]  # a's s/3 never collected: not a planned stop
    res = matrix_complete_check(broken, tasks, ["a", "j", "n"], 1, on_purpose=["n"], joining=["j"])
    assert res.severity == AssetCheckSeverity.ERROR and planned_stop(res) == [] and "never collected" in \
        res.description
    done = pd.concat([calls, pd.DataFrame({"agent": ["j", "j"], "task_id": ["s/2", "s/3"], "repetition": [0, 0]})])
    assert matrix_complete_check(done, tasks, ["a", "j", "n"], 1, on_purpose=["n"], joining=[]).passed


@pytest.mark.slow
def test_the_demo_schedule_asks_the_sample_first_and_completes_only_the_joiners(tmp_path, monkeypatch):
    """The shipped demo profile (a 120-task slice, bootstrap 20) on its wider pool through the assets: graded_calls
    asks each new agent 20 % of each source's tasks; reward_matrix decides and, while an agent that may join has
    unasked cells, fails `matrix_complete` naming it (no router is trained on its estimates) and the completion
    sensor requests every partition's collection; it makes exactly the joiners' remaining calls and nobody else's;
    then the matrix passes, only the others' cells imputed."""
    import json

    import yaml
    from dagster import (
        DagsterEventType,
        DagsterInstance,
        MultiPartitionKey,
        build_run_status_sensor_context,
        materialize,
    )

    from assets.definitions import build_assets, build_definitions, build_resources
    from assets.ops import COMPLETE_SENSOR, COMPLETION_TAG, preflight_run_config
    from pipeline.collect.call_log import CallLog
    from pipeline.profile import load_profile
    from resources.storage import StorageResource, asset_path

    over = tmp_path / "o.yaml"
    # the slice must hold both kinds of new agent (joiners and not): since the regrade on math-verify all four sampled
    # agents may join on the 90-task slice this test used; the 60-, 120- and 150-task slices each hold both
    over.write_text(yaml.safe_dump({"task_pool": {"size": 120}, "collection": {"new_agent_sample": {"boot": 20}}}))
    monkeypatch.setenv("ROUTER_LITE_OVERRIDE", str(over))
    home = tmp_path / "home"
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    prof = load_profile("demo")
    res = build_resources(str(home), profile="demo")
    assets = build_assets("demo")
    by = {a.key.to_user_string(): a for a in assets}
    for s in prof.sources:
        assert materialize([by["source_tasks"]], partition_key=s, resources=res).success
    assert materialize(assets, selection=["task_pool", "agent_pool", "preflight"], resources=res,
                       run_config=preflight_run_config(prof.pool.wide_name)).success
    pool = pd.read_parquet(asset_path(home, "task_pool"))
    n = pool["source"].value_counts().to_dict()
    storage = StorageResource(home=str(home))

    def collect() -> dict:
        for s in prof.sources:
            pk = MultiPartitionKey({"source": s, "repetition": "0"})
            assert materialize(assets, selection=["graded_calls"], partition_key=pk, resources=res).success
        out = {}
        for s in prof.sources:
            for a, k in CallLog(storage.calls_dir("replay", s, 0)).read()["agent"].value_counts().items():
                out[(s, a)] = int(k)
        return out

    first = collect()
    own = {"frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"}
    new = {a for _, a in first} - own
    assert len(new) == 5
    for (s, a), k in first.items():
        assert k == (n[s] if a in own else max(2, round(0.2 * n[s]))), (s, a, k)
    with DagsterInstance.ephemeral() as inst:
        # a planned stop reads as one: the run succeeds, no step fails (no trace), the matrix and everything
        # downstream of it wait (skipped), the check warns naming the joiners and the next step
        result = materialize(assets, selection=["reward_matrix", "baselines"], resources=res, raise_on_error=False,
                             instance=inst)
        assert result.success
        assert not inst.all_logs(result.run_id, of_type=DagsterEventType.STEP_FAILURE)
        assert not result.asset_materializations_for_node("reward_matrix")
        skipped = inst.all_logs(result.run_id, of_type=DagsterEventType.STEP_SKIPPED)
        assert [e.dagster_event.step_key for e in skipped] == ["baselines"]
        check = {e.check_name: e for e in result.get_asset_check_evaluations()}["matrix_complete"]
        assert check.severity.value == "WARN" and check.description.startswith("planned stop: ")
        # the daemon's next step: the completion sensor asks for every partition's collection after that run
        success = inst.all_logs(result.run_id, of_type=DagsterEventType.RUN_SUCCESS)[0].dagster_event
        sensor = build_definitions(home=str(home), profile="demo").resolve_sensor_def(COMPLETE_SENSOR)
        ctx = build_run_status_sensor_context(COMPLETE_SENSOR, success, inst, inst.get_run_by_id(result.run_id))
        requests = sensor(ctx)
    assert sorted(r.partition_key for r in requests) == sorted(f"0|{s}" for s in prof.sources)
    assert all(r.tags[COMPLETION_TAG] == result.run_id for r in requests)
    decisions = json.loads((home / "reports" / "new_agents.json").read_text())["agents"]
    joiners = sorted(a for a, d in decisions.items() if d["collect_rest"])
    assert joiners and len(joiners) < len(decisions)  # the slice has both kinds
    assert not check.passed and check.metadata["joining"].value == joiners
    assert f"may join the frontier ({', '.join(joiners)})" in check.description
    second = collect()
    made = {k: second[k] - first.get(k, 0) for k in second if second[k] != first.get(k, 0)}
    assert made == {(s, a): n[s] - first[(s, a)] for s in prof.sources for a in joiners}
    result = materialize(assets, selection=["reward_matrix"], resources=res)
    check = {e.check_name: e for e in result.get_asset_check_evaluations()}["matrix_complete"]
    assert check.passed and check.metadata["joining"].value == []
    rm = pd.read_parquet(asset_path(home, "reward_matrix"))
    agents = list(rm["agent_order"].iloc[0])
    imputed = np.array([np.asarray(m, dtype=bool) for m in rm["imputed"]])
    assert {agents[j] for j in np.flatnonzero(imputed.any(axis=0))} == set(decisions) - set(joiners)
