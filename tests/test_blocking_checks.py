"""Blocking hand-off checks: a planted bad row fails its check, Dagster skips every downstream
asset of the run, and `router-lite run` stops with exit 2 and the check's message on one line. WARN checks never
block."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from dagster import AssetCheckResult, AssetCheckSeverity, DagsterInstance, asset, asset_check, materialize

from assets import collection, pool_report, tasks
from assets.definitions import build_assets, build_definitions, build_resources
from cli.run import failed_blocking_check
from resources.storage import asset_path

pytestmark = pytest.mark.slow  # Dagster materialisations of the lineage (make test-fast leaves it out)

REPO = Path(__file__).resolve().parents[1]
TASK_ASSETS = [a for a in build_assets("smoke") if a.key.to_user_string() in ("source_tasks", "task_pool")] + [
    tasks.task_pool_unique_ids, tasks.task_pool_gold_and_grader, tasks.task_pool_proportions,
    tasks.task_pool_deterministic, tasks.task_pool_no_cross_split_prompts, collection.agent_pool, collection.preflight]
SOURCE_TASKS = next(a for a in TASK_ASSETS if a.key.to_user_string() == "source_tasks")  # as the factory builds it
HAND_OFF = {("task_pool", "task_pool_unique_ids"), ("task_pool", "task_pool_gold_and_grader"),
            ("task_pool", "task_pool_no_cross_split_prompts"),
            ("reward_matrix", "reward_join_complete"), ("graded_calls", "no_error_counted_as_wrong"),
            ("graded_calls", "empty_rate_below_5pct"),
            ("graded_calls", "within_budget"), ("reward_matrix", "matrix_complete")}  # the budget


def test_the_hand_off_checks_and_only_they_block():
    defs = build_definitions(home="/nonexistent", profile="smoke")
    blocking = {(s.asset_key.to_user_string(), s.name) for c in defs.asset_checks for s in c.check_specs if s.blocking}
    blocking |= {(s.asset_key.to_user_string(), s.name) for a in defs.assets for s in a.check_specs if s.blocking}
    assert blocking == HAND_OFF
    assert not any(s.blocking for s in pool_report.pool_is_complementary.check_specs)  # the WARN check


def _plant_empty_gold(monkeypatch):
    real = tasks.build_task_pool

    def planted(*args):
        pool = real(*args)
        pool.loc[pool.index[3], "gold"] = ""
        return pool

    monkeypatch.setattr(tasks, "build_task_pool", planted)


def test_a_failing_blocking_check_stops_downstream_in_process(tmp_path, monkeypatch):
    res = build_resources(str(tmp_path), profile="smoke")
    assert materialize([SOURCE_TASKS], partition_key="mmlu_pro", resources=res).success
    _plant_empty_gold(monkeypatch)
    with DagsterInstance.ephemeral() as inst:
        result = materialize(TASK_ASSETS, selection=["task_pool", "agent_pool", "preflight"], resources=res,
                             instance=inst, raise_on_error=False)
    assert not result.success
    done = {m.asset_key.to_user_string() for m in result.get_asset_materialization_events()}
    assert done == {"task_pool", "agent_pool"}  # preflight (downstream of task_pool) never ran
    assert not asset_path(tmp_path, "preflight").exists()
    first = pd.read_parquet(asset_path(tmp_path, "task_pool"))["task_id"].iloc[3]
    assert failed_blocking_check(result) == ("check task_pool:task_pool_gold_and_grader failed: 1 task(s) without a "
                                             f"gold answer or a known grader (first: {first})")


def test_a_failing_warn_check_does_not_block():
    @asset
    def upstream():
        return 1

    @asset_check(asset=upstream, blocking=True)
    def only_a_warning(upstream) -> AssetCheckResult:
        return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN, description="one agent leads")

    @asset
    def downstream(upstream):
        return upstream + 1

    with DagsterInstance.ephemeral() as inst:
        result = materialize([upstream, only_a_warning, downstream], instance=inst, raise_on_error=False)
    assert result.success and failed_blocking_check(result) is None
    assert {m.asset_key.to_user_string() for m in result.get_asset_materialization_events()} == {"upstream",
                                                                                                 "downstream"}


PLANTED_RUN = """
import sys
import assets.tasks as t
real = t.build_task_pool
def planted(*args):
    pool = real(*args)
    pool.loc[pool.index[3], "gold"] = ""  # the planted bad row: a task without a gold answer
    return pool
t.build_task_pool = planted
from cli.main import main
sys.exit(main(["run", "--profile", "smoke", "--upto", "preflight"]))
"""


def test_router_lite_run_stops_at_a_failing_blocking_check(tmp_path, temp_instance_dir):
    home = tmp_path / "home"
    env = {**os.environ, "ROUTER_LITE_HOME": str(home), "DAGSTER_HOME": str(temp_instance_dir),
           "PYTHONPATH": str(REPO)}
    env.pop("ROUTER_LITE_LOG_LEVEL", None)
    env.pop("ROUTER_LITE_DEBUG", None)
    p = subprocess.run([sys.executable, "-c", PLANTED_RUN], env=env, capture_output=True, text=True, timeout=300,
                       cwd=REPO, check=False)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert lines[0].startswith("[source tasks] source_tasks done in")  # the stage before, then one error line
    errors = lines[1:]
    assert len(errors) == 1, lines
    assert errors[0].startswith("router-lite: error: task pool: check task_pool:task_pool_gold_and_grader failed: "
                                "1 task(s) without a gold answer or a known grader (first: mmlu_pro/"), errors
    assert asset_path(home, "task_pool").exists() and not asset_path(home, "preflight").exists()
    assert "[task pool]" not in p.stderr  # the stage never reported done


def test_a_graded_error_stops_the_lineage_before_the_rewards(smoke_home_copy, monkeypatch):
    """The in-step blocking check of graded_calls: an error row that carries a grade stops `run_lineage` at the
    collection stage; the reward matrix is not rebuilt."""
    import pytest

    from cli.run import run_lineage
    from pipeline.core.errors import RouterLiteError

    home = smoke_home_copy()
    monkeypatch.delenv("DAGSTER_HOME", raising=False)  # an ephemeral instance (outside the repository's root)
    monkeypatch.chdir(home)
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    rewards = asset_path(home, "reward_matrix")
    stamp = rewards.stat().st_mtime_ns
    real = collection.collect_with_sample  # the collection step of graded_calls (run_collect, new agents sampled)

    def planted(*args, **kwargs):
        calls, asked = real(*args, **kwargs)
        calls.loc[calls.index[0], ["status", "correct"]] = ["error", False]  # an error graded as wrong
        return calls, asked

    monkeypatch.setattr(collection, "collect_with_sample", planted)
    with pytest.raises(RouterLiteError) as exc:
        run_lineage(build_definitions(home=str(home), profile="smoke"), "smoke", log=lambda m: None)
    assert str(exc.value).startswith("graded calls (partition ")
    assert str(exc.value).endswith("check graded_calls:no_error_counted_as_wrong failed: 1 error call(s) carry a "
                                   "correctness grade")
    assert rewards.stat().st_mtime_ns == stamp
