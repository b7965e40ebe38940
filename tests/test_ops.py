"""Operations: the wider-pool re-collection (schedule → pre-flight with the pool as run config → collection sensor →
automation refresh), per-source backfills (Python API + CLI),
concurrency pools per provider. Smoke profile throughout."""
import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    build_run_status_sensor_context,
    build_schedule_context,
    evaluate_automation_conditions,
    materialize,
)

from assets.automation import refresh_keys
from assets.collection import POOL_TAG
from assets.definitions import build_definitions
from assets.ops import (
    COLLECT_SENSOR,
    COLLECTION_JOB,
    COMPLETE_SENSOR,
    PREFLIGHT_JOB,
    RECOLLECTION_TAG,
    REFRESH_SENSOR,
    SCHEDULE,
    SOURCE_TASKS_JOB,
    preflight_run_config,
)
from resources.storage import asset_path

pytestmark = pytest.mark.slow  # Dagster materialisations and the smoke_home lineage (make test-fast leaves it out)

REPO = Path(__file__).resolve().parents[1]
DEMO_AGENTS = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
WIDE_AGENTS = ["wide_jamba", "wide_qwen", "wide_phi"]


def call_log_rows(home: Path) -> dict:
    """(source, repetition dir, agent) -> rows in the durable call log (complete lines only)."""
    out = {}
    for f in (home / "calls").glob("*/*/rep*/*.jsonl"):
        with f.open() as fh:
            out[(f.parent.parent.name, f.parent.name, f.stem)] = sum(1 for line in fh if line.endswith("\n"))
    return out


def materialized_partitions(instance, key: str) -> list:
    records = instance.fetch_materializations(AssetKey(key), limit=1000).records
    return sorted(r.asset_materialization.partition for r in records)


# --- concurrency pools ------------------------------------------------------------------------------------------

def test_collection_steps_run_in_their_providers_pool():
    assert build_definitions(profile="smoke").resolve_assets_def("graded_calls").op.pool == "provider:replay"
    assert build_definitions(profile="demo").resolve_assets_def("graded_calls").op.pool == "provider:replay"
    assert build_definitions(profile="pilot").resolve_assets_def("graded_calls").op.pool == "provider:openrouter"


def test_instance_reads_the_pool_limits_of_dagster_yaml(temp_instance_dir):
    limit = yaml.safe_load((REPO / "dagster.yaml").read_text())["concurrency"]["pools"]["default_limit"]
    inst = DagsterInstance.from_config(str(temp_instance_dir))
    try:
        assert inst.get_concurrency_config().pool_config.default_pool_limit == limit
        assert inst.event_log_storage.supports_global_concurrency_limits
    finally:
        inst.dispose()


@pytest.mark.slow
def test_a_full_provider_pool_holds_the_collection_step(smoke_home_copy, quiet_instance_dir):
    """Pool `provider:replay` at 1 slot, held by another run: the collection step waits; freed, it runs. The run
    executes in a thread of this process, on an instance without compute-log capture: the capture's two `tail -F`
    processes outlived pytest (tests/conftest.py `no_trace` now fails the suite on such a process)."""
    home = smoke_home_copy()
    defs = build_definitions(home=str(home), profile="smoke")
    pool = defs.resolve_assets_def("graded_calls").op.pool
    inst = DagsterInstance.from_config(str(quiet_instance_dir))
    storage = inst.event_log_storage
    try:
        storage.set_concurrency_slots(pool, 1)
        assert storage.claim_concurrency_slot(pool, "another-run", "graded_calls", 0).is_claimed
        job, out = defs.resolve_job_def(COLLECTION_JOB), {}

        def run():
            out["result"] = job.execute_in_process(instance=inst, partition_key="0|mmlu_pro", raise_on_error=False)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(8)
        assert t.is_alive(), "the step did not wait for the provider's pool slot"
        assert storage.get_concurrency_info(pool).pending_step_count >= 1
        storage.free_concurrency_slots_for_run("another-run")
        t.join(120)
        assert not t.is_alive() and out["result"].success
        assert storage.get_concurrency_info(pool).slot_count == 1
    finally:
        inst.dispose()


# --- the wider-pool re-collection -------------------------------------------------------------------------------

def test_recollection_schedule_is_off_by_default_and_sensors_are_wired():
    defs = build_definitions(profile="smoke")
    sched = defs.resolve_schedule_def(SCHEDULE)
    assert sched.default_status == DefaultScheduleStatus.STOPPED
    assert sched.job_name == PREFLIGHT_JOB
    for name in (COLLECT_SENSOR, COMPLETE_SENSOR, REFRESH_SENSOR):
        assert defs.resolve_sensor_def(name).default_status == DefaultSensorStatus.RUNNING
    assert "recollect_refresh_downstream" not in {s.name for s in defs.sensors}  # the hand-rolled relay is gone


def seed_lineage_events(defs, inst) -> None:
    """The instance as `router-lite run` leaves it for the smoke home's files: every asset (partition) materialised,
    every check passed. Runless events: the files are already there, and the automation only reads the events."""
    for a in defs.assets:
        for key in a.keys:
            for p in a.partitions_def.get_partition_keys() if a.partitions_def else [None]:
                inst.report_runless_asset_event(AssetMaterialization(key, partition=p))
    for c in [*defs.asset_checks, *defs.assets]:
        for spec in c.check_specs:
            part = defs.resolve_assets_def(spec.asset_key).partitions_def
            for p in part.get_partition_keys() if part else [None]:
                inst.report_runless_asset_event(AssetCheckEvaluation(asset_key=spec.asset_key, check_name=spec.name,
                                                                     passed=True, partition=p))


class Automation:
    """Dagster's own evaluator over successive ticks (the automation sensor's cursor carried over)."""

    def __init__(self, defs, inst):
        self.defs, self.inst, self.cursor = defs, inst, None

    def tick(self) -> set:
        res = evaluate_automation_conditions(defs=self.defs, instance=self.inst, cursor=self.cursor)
        self.cursor = res.cursor
        return {k for k in refresh_keys("replay") if res.get_num_requested(AssetKey(k))}


@pytest.mark.slow
def test_wide_pool_recollection_makes_only_the_new_agents_calls(smoke_home_copy, tmp_path, capsys):
    """schedule → pre-flight (the wide pool as run config) → collection sensor → one run per partition → the
    automation refreshes the downstream assets once all are done, in one run; only the new agents' calls are made."""
    home = smoke_home_copy()
    defs = build_definitions(home=str(home), profile="smoke")
    before = call_log_rows(home)
    assert {a for (_, _, a) in before} == set(DEMO_AGENTS)
    n_tasks = len(pd.read_parquet(asset_path(home, "task_pool")))
    (tmp_path / "dagster").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "dagster")) as inst:
        seed_lineage_events(defs, inst)
        automation = Automation(defs, inst)
        assert automation.tick() == set()
        # the schedule's tick: a pre-flight run with the profile's wider pool as run config
        with build_schedule_context(instance=inst) as ctx:
            requests = defs.resolve_schedule_def(SCHEDULE).evaluate_tick(ctx).run_requests
        assert len(requests) == 1 and requests[0].run_config == preflight_run_config("mmlu_pro_wide")
        assert requests[0].tags[POOL_TAG] == "mmlu_pro_wide"  # a label for the runs list
        pf = defs.resolve_job_def(PREFLIGHT_JOB).execute_in_process(
            instance=inst, run_config=requests[0].run_config, tags=requests[0].tags)
        assert pf.success
        preflight = pd.read_parquet(asset_path(home, "preflight"))
        assert list(preflight["agent"]) == DEMO_AGENTS + WIDE_AGENTS
        assert set(preflight["pool"]) == {"mmlu_pro_wide"} and set(preflight["pool_kind"]) == {"replay"}
        meta = pf.asset_materializations_for_node("preflight")[0].metadata
        assert meta["pool"].value == "mmlu_pro_wide" and meta["pool_kind"].value == "replay"
        assert meta["agents"].value == DEMO_AGENTS + WIDE_AGENTS
        assert automation.tick() == set()  # a pre-flight alone refreshes nothing: its collection comes next

        # pre-flight done -> one collection run per source x repetition of the profile, submitted in one tick
        collect = defs.resolve_sensor_def(COLLECT_SENSOR)(_status_context(COLLECT_SENSOR, pf, inst))
        assert sorted(r.partition_key for r in collect) == ["0|mmlu_pro", "1|mmlu_pro", "2|mmlu_pro"]
        assert all(r.tags[RECOLLECTION_TAG] == pf.run_id and r.tags[POOL_TAG] == "mmlu_pro_wide" for r in collect)
        job = defs.resolve_job_def(COLLECTION_JOB)
        # what the daemon does with the tick's requests: every run created (planned, not started) at once
        queued = [inst.create_run_for_job(job, tags={**req.tags, **_partition_tags(req.partition_key)},
                                          asset_selection={AssetKey("graded_calls")}) for req in collect]
        assert automation.tick() == set()
        for i, (req, waiting) in enumerate(zip(collect, queued)):
            inst.report_run_canceled(waiting)  # stands in for the queued run, which runs here in process
            res = job.execute_in_process(instance=inst, tags=req.tags, partition_key=req.partition_key)
            assert res.success
            requested = automation.tick()
            if i < len(collect) - 1:
                assert requested == set(), f"refresh requested with {len(collect) - 1 - i} partition(s) to go"
        assert requested == set(refresh_keys("replay"))

        # ... then the downstream assets refresh, over the wider pool, in the one run the automation launches
        ref = materialize([*defs.assets, *defs.asset_checks], selection=[AssetKey(k) for k in sorted(requested)],
                          instance=inst, resources=defs.resources)
        assert ref.success
        assert automation.tick() == set()  # handled: requested once per collection
        new_calls = {r.asset_materialization.partition: r.asset_materialization.metadata["new_calls"].value
                     for r in inst.fetch_materializations(AssetKey("graded_calls"), limit=10).records
                     if r.run_id}
        report = inst.get_latest_materialization_event(AssetKey("benchmark_report"))
        assert report is not None and report.run_id == ref.run_id
    after = call_log_rows(home)
    made = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    per_agent = collections.Counter()
    for (_, rep, agent), n in made.items():
        per_agent[agent] += n
        assert n == (n_tasks if agent in WIDE_AGENTS else 0), (rep, agent, n)
    assert new_calls == {f"{r}|mmlu_pro": n_tasks * len(WIDE_AGENTS) for r in range(3)}
    rewards = pd.read_parquet(asset_path(home, "reward_matrix"))
    assert list(rewards["agent_order"].iloc[0]) == DEMO_AGENTS + WIDE_AGENTS
    assert len(rewards) == n_tasks
    with capsys.disabled():
        print(f"\n[wide re-collection] {n_tasks} tasks; new call-log rows per agent over 3 repetitions: "
              f"{dict(per_agent)}; per partition (graded_calls new_calls): {new_calls}; refreshed by the "
              f"automation in run {ref.run_id[:8]}: {sorted(requested)}")


def _status_context(name, result, inst):
    return build_run_status_sensor_context(sensor_name=name, dagster_event=result.get_run_success_event(),
                                           dagster_instance=inst, dagster_run=result.dagster_run)


def _partition_tags(pk) -> dict:
    return {"dagster/partition": str(pk), **{f"dagster/partition/{d}": k for d, k in pk.keys_by_dimension.items()}}


def _preflight_failure(defs, **kw) -> str:
    res = defs.resolve_job_def(PREFLIGHT_JOB).execute_in_process(raise_on_error=False, **kw)
    assert not res.success
    return next(e for e in res.all_events if e.event_type_value == "STEP_FAILURE").step_failure_data.error.to_string()


def test_a_preflight_on_a_pool_of_another_kind_or_a_stale_pool_tag_is_one_clear_error(smoke_home_copy):
    """Run config naming an OpenRouter pool on the replay profile, an unknown pool, or the old pool tag: one message
    naming the pool, before any call."""
    home = smoke_home_copy(drop=("calls",))
    defs = build_definitions(home=str(home), profile="smoke")
    msg = _preflight_failure(defs, run_config=preflight_run_config("pilot_wide"))
    assert "pool 'pilot_wide' (provider openrouter) is not of the same kind" in msg
    assert "no_such_pool" in _preflight_failure(defs, run_config=preflight_run_config("no_such_pool"))
    msg = _preflight_failure(defs, tags={POOL_TAG: "mmlu_pro_wide"})
    assert f"run tag {POOL_TAG}=mmlu_pro_wide but this pre-flight runs on pool 'mmlu_pro'" in msg
    assert "config: {pool: mmlu_pro_wide}" in msg
    # a later stage consuming a pre-flight of a pool the profile's cannot stand in for (the profile changed kind)
    pf_file = asset_path(home, "preflight")
    pd.read_parquet(pf_file).assign(pool="pilot_wide").to_parquet(pf_file)
    res = defs.resolve_job_def(COLLECTION_JOB).execute_in_process(partition_key="0|mmlu_pro", raise_on_error=False)
    assert not res.success
    msg = next(e for e in res.all_events if e.event_type_value == "STEP_FAILURE").step_failure_data.error.to_string()
    assert ("the pre-flight this stage consumes ran on pool 'pilot_wide'" in msg
            and "materialise `preflight` again" in msg)
    assert not (home / "calls").exists() or call_log_rows(home) == {}


# --- per-source backfills ---------------------------------------------------------------------------------------

def test_partitions_come_from_the_profile():
    """One source in the profile: one source_tasks partition in the UI, its 3 repetitions of graded_calls."""
    smoke = build_definitions(profile="smoke")
    assert smoke.resolve_assets_def("source_tasks").partitions_def.get_partition_keys() == ["mmlu_pro"]
    assert smoke.resolve_assets_def("graded_calls").partitions_def.get_partition_keys() == [
        "0|mmlu_pro", "1|mmlu_pro", "2|mmlu_pro"]
    pilot = build_definitions(profile="pilot")
    assert pilot.resolve_assets_def("source_tasks").partitions_def.get_partition_keys() == [
        "math500", "gsm8k", "aime2025_i", "aime2025_ii", "arc_challenge", "mmlu", "mmlu_pro"]
    assert len(pilot.resolve_assets_def("graded_calls").partitions_def.get_partition_keys()) == 7 * 3
    with pytest.raises(Exception, match="gsm8k"):  # not a partition of the smoke definitions
        smoke.resolve_job_def(SOURCE_TASKS_JOB).execute_in_process(partition_key="gsm8k")


def test_one_source_backfill_materialises_that_source_only(tmp_path, temp_instance_dir):
    home = tmp_path / "home"
    defs = build_definitions(home=str(home), profile="pilot")  # 7 sources; backfill two of them
    job = defs.resolve_job_def(SOURCE_TASKS_JOB)
    inst = DagsterInstance.from_config(str(temp_instance_dir))
    try:
        assert job.execute_in_process(instance=inst, partition_key="mmlu_pro").success
        mmlu_pro = asset_path(home, "source_tasks", "mmlu_pro")
        stamp, content = mmlu_pro.stat().st_mtime_ns, mmlu_pro.read_bytes()
        res = job.execute_in_process(instance=inst, partition_key="gsm8k")
        assert res.success
        assert sorted(p.name for p in mmlu_pro.parent.iterdir()) == ["gsm8k.parquet",
                                                                                        "mmlu_pro.parquet"]
        assert mmlu_pro.stat().st_mtime_ns == stamp and mmlu_pro.read_bytes() == content
        assert [m.partition for m in res.asset_materializations_for_node("source_tasks")] == ["gsm8k"]
        assert materialized_partitions(inst, "source_tasks") == ["gsm8k", "mmlu_pro"]
        assert inst.get_latest_materialization_event(AssetKey("task_pool")) is None
        gsm8k = pd.read_parquet(asset_path(home, "source_tasks", "gsm8k"))
        assert len(gsm8k) > 0 and set(gsm8k["source"]) == {"gsm8k"}
        print(f"\n[backfill] source_tasks[gsm8k]: {len(gsm8k)} tasks; "
              f"files {sorted(p.name for p in mmlu_pro.parent.iterdir())}")
    finally:
        inst.dispose()


@pytest.mark.slow
def test_one_source_backfill_from_the_command_line(tmp_path, temp_instance_dir):
    """The documented command: dagster asset materialize -m assets.definitions --select source_tasks --partition X"""
    home = tmp_path / "home"
    env = {**os.environ, "DAGSTER_HOME": str(temp_instance_dir), "ROUTER_LITE_HOME": str(home),
           "ROUTER_LITE_PROFILE": "pilot", "PYTHONPATH": str(REPO)}
    dagster = Path(sys.executable).with_name("dagster")
    cmd = [str(dagster), "asset", "materialize", "-m", "assets.definitions", "--select", "source_tasks",
           "--partition", "arc_challenge"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in asset_path(home, "source_tasks").parent.iterdir()) == ["arc_challenge.parquet"]
    inst = DagsterInstance.from_config(str(temp_instance_dir))
    try:
        assert materialized_partitions(inst, "source_tasks") == ["arc_challenge"]
        assert inst.get_latest_materialization_event(AssetKey("task_pool")) is None
    finally:
        inst.dispose()
    print(f"\n[backfill cli] source_tasks[arc_challenge] in {time.time() - t0:.1f}s")
