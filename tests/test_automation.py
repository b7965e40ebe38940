"""Declarative refresh after a collection (assets/automation.py), decided by Dagster's own evaluator
(`evaluate_automation_conditions`, what the automation sensor runs on each tick: tests/_support.py `AutomationTicks`)
on a real instance."""
import shutil
from pathlib import Path

import pytest
from _support import AutomationTicks
from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    DefaultSensorStatus,
    MultiPartitionKey,
)

from assets.automation import FREE_REFRESH, REFRESH_SENSOR, refresh_keys
from assets.definitions import build_definitions
from assets.ops import COLLECTION_JOB
from cli.run import run_lineage

pytestmark = pytest.mark.slow  # the smoke_home lineage (make test-fast leaves it out)

NEVER = {"source_tasks", "task_pool", "agent_pool", "preflight", "graded_calls", "prompt_embeddings", "hub_release",
         "routerbench_replication", "routerbench_summary"}


def automated(defs) -> set:
    return {k.to_user_string() for a in defs.assets for k, c in a.automation_conditions_by_key.items() if c}


def test_only_assets_computed_from_the_calls_without_a_paid_call_are_automated():
    smoke, pilot = build_definitions(profile="smoke"), build_definitions(profile="pilot")
    # replay pool: the benchmark is free, and the gated promotion follows it (a re-collection reaches `serve`)
    assert automated(smoke) == set(FREE_REFRESH) | {"benchmark_report", "promotion"}
    assert automated(pilot) == set(FREE_REFRESH)  # OpenRouter: the benchmark calls paid agents, by hand only
    assert not automated(smoke) & NEVER and not automated(pilot) & NEVER
    for defs, kind in ((smoke, "replay"), (pilot, "openrouter")):
        sensor = defs.resolve_sensor_def(REFRESH_SENSOR)
        assert sensor.default_status == DefaultSensorStatus.RUNNING
        assert sensor.asset_selection.resolve(defs.resolve_asset_graph()) == {AssetKey(k) for k in refresh_keys(kind)}
        assert "default_automation_condition_sensor" not in {s.name for s in defs.sensors}


def instance_copy(dagster_home: Path, dst: Path) -> Path:
    """A copy of the Dagster instance at `dagster_home` (its dagster.yaml names its folders by absolute path) at `dst`:
    the same runs and events, for a test to add its own."""
    shutil.copytree(dagster_home, dst)
    (dst / "dagster.yaml").write_text((dst / "dagster.yaml").read_text().replace(str(dagster_home), str(dst)))
    return dst


def _pk(rep: int) -> MultiPartitionKey:
    return MultiPartitionKey({"source": "mmlu_pro", "repetition": str(rep)})


def _tags(pk) -> dict:
    return {"dagster/partition": str(pk), **{f"dagster/partition/{d}": k for d, k in pk.keys_by_dimension.items()}}


@pytest.mark.slow
def test_refresh_follows_a_complete_collection_never_router_lite_run(smoke_lineage, smoke_home_copy, tmp_path,
                                                                     monkeypatch):
    # `router-lite run` materialises every stage itself: no refresh on top, neither after the whole lineage (the
    # suite's smoke lineage ran between two ticks: on the empty instance, then after the run) nor between its stages
    assert smoke_lineage.ticks == (set(), set())
    home = smoke_home_copy()
    dagster_home = instance_copy(smoke_lineage.dagster_home, tmp_path / "dagster")
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    defs = build_definitions(home=str(home), profile="smoke")
    inst = DagsterInstance.from_config(str(dagster_home))
    tick, want = AutomationTicks(defs, inst, smoke_lineage.cursor), set(refresh_keys("replay"))
    try:
        # here stopped right after the collection, the downstream assets now older
        run_lineage(defs, "smoke", upto="graded_calls", log=lambda m: None)
        assert tick() == set(), "a daemon would refresh between router-lite run's stages"

        # a UI backfill of the three partitions: nothing while one is still submitted or failed
        job = defs.resolve_job_def(COLLECTION_JOB)
        waiting = {r: inst.create_run_for_job(job, tags=_tags(_pk(r)), asset_selection={AssetKey("graded_calls")})
                   for r in (1, 2)}
        assert job.execute_in_process(instance=inst, partition_key=str(_pk(0))).success
        assert tick() == set(), "refresh requested while partitions 1 and 2 are in progress"
        inst.report_run_failed(waiting[1])
        inst.report_run_canceled(waiting[2])
        assert job.execute_in_process(instance=inst, partition_key=str(_pk(2))).success
        assert tick() == set(), "refresh requested although partition 1's latest run failed"
        assert job.execute_in_process(instance=inst, partition_key=str(_pk(1))).success
        assert tick() == want  # every partition done: the refresh, once
        assert tick() == set()

        # a failed blocking check of graded_calls holds the refresh back until a collection passes it again
        inst.report_runless_asset_event(AssetMaterialization(AssetKey("graded_calls"), partition=str(_pk(0))))
        inst.report_runless_asset_event(AssetCheckEvaluation(
            asset_key=AssetKey("graded_calls"), check_name="empty_rate_below_5pct", passed=False,
            partition=str(_pk(0))))
        assert tick() == set(), "refresh requested over a failed blocking check"
        assert job.execute_in_process(instance=inst, partition_key=str(_pk(0))).success
        assert tick() == want
    finally:
        inst.dispose()
