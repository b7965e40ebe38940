"""Scale-out on an existing engine: graded_calls partitions through the dagster-dask executor (job `collection_dask`).

Here a small in-process LocalCluster (2 workers × 1 thread); ROUTER_LITE_DASK_ADDRESS (or the run config's
execution.config.cluster.existing.address) points the same job at a real Dask scheduler.
"""
import os
import threading
import time

import pandas as pd
import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    Definitions,
    MultiPartitionKey,
    asset,
    define_asset_job,
    execute_job,
    reconstructable,
)

from assets.dask_executor import PRIVATE_NAMES, private_name, router_lite_dask_executor
from assets.ops import DASK_ADDRESS_ENV, DASK_JOB, dask_cluster_config
from resources.storage import asset_path

pytestmark = pytest.mark.slow  # the smoke_home lineage (make test-fast leaves it out)

AGENTS = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]


def dask_collection_job():
    """The job as the Dask workers rebuild it (reconstructable: by this module-level function)."""
    from assets.definitions import build_definitions

    return build_definitions(home=os.environ["ROUTER_LITE_HOME"], profile="smoke").resolve_job_def(DASK_JOB)


def test_dask_job_uses_the_dask_executor_with_a_small_local_cluster(monkeypatch):
    monkeypatch.delenv(DASK_ADDRESS_ENV, raising=False)
    from assets.definitions import build_definitions

    job = build_definitions(profile="smoke").resolve_job_def(DASK_JOB)
    assert job.executor_def.name == "dask"
    assert [k.to_user_string() for k in job.asset_layer.executable_asset_keys] == ["graded_calls"]


def test_dask_cluster_config_points_at_a_scheduler_when_given(monkeypatch):
    monkeypatch.delenv(DASK_ADDRESS_ENV, raising=False)
    local = dask_cluster_config()["local"]
    assert local["n_workers"] == 2 and local["threads_per_worker"] == 1
    assert local["dashboard_address"].startswith("127.0.0.1:")
    monkeypatch.setenv(DASK_ADDRESS_ENV, "tcp://10.0.0.5:8786")
    assert dask_cluster_config() == {"existing": {"address": "tcp://10.0.0.5:8786"}}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_collection_partitions_run_on_dask_workers(smoke_home_copy, tmp_path, monkeypatch):
    import dagster_dask.executor as dask_exec

    home = smoke_home_copy(drop=("calls",))  # task_pool, agent_pool, preflight kept; no call made yet
    for f in asset_path(home, "graded_calls").parent.glob("*.parquet"):
        f.unlink()
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    monkeypatch.delenv(DASK_ADDRESS_ENV, raising=False)

    ran_on = []  # (thread name, step keys) of every step the Dask workers executed
    real = dask_exec.query_on_dask_worker

    def spy(dependencies, recon_job, dagster_run, run_config, step_keys, instance_ref, known_state):
        ran_on.append((threading.current_thread().name, tuple(step_keys)))
        return real(dependencies, recon_job, dagster_run, run_config, step_keys, instance_ref, known_state)

    monkeypatch.setattr(dask_exec, "query_on_dask_worker", spy)
    keys = [MultiPartitionKey({"source": "mmlu_pro", "repetition": str(r)}) for r in range(3)]
    t0 = time.time()
    (tmp_path / "dagster").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "dagster")) as inst:
        for pk in keys:
            tags = {"dagster/partition": str(pk),
                    **{f"dagster/partition/{d}": k for d, k in pk.keys_by_dimension.items()}}
            with execute_job(reconstructable(dask_collection_job), instance=inst, tags=tags) as result:
                assert result.success, [e.message for e in result.all_events if e.is_failure]
        records = inst.fetch_materializations(AssetKey("graded_calls"), limit=10).records
        assert sorted(r.asset_materialization.partition for r in records) == sorted(str(k) for k in keys)
        assert all(r.asset_materialization.metadata["new_calls"].value == 300 * 5 for r in records)
    assert len(ran_on) == 3 and all(steps == ("graded_calls",) for _, steps in ran_on)
    assert all("Dask-Default-Threads" in name for name, _ in ran_on), ran_on  # a Dask worker thread
    for pk in keys:
        calls = pd.read_parquet(asset_path(home, "graded_calls", str(pk)))
        assert len(calls) == 300 * 5 and (calls["status"] == "ok").all()
        assert sorted(calls["agent"].unique()) == sorted(AGENTS)
        assert calls["repetition"].eq(int(pk.keys_by_dimension["repetition"])).all()
    print(f"\n[dask] 3 partitions × 1,500 calls on {sorted({n for n, _ in ran_on})} in {time.time() - t0:.1f}s")

    # the same job against an existing Dask scheduler (here a loopback TCP one): ROUTER_LITE_DASK_ADDRESS
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as cluster:
        monkeypatch.setenv(DASK_ADDRESS_ENV, cluster.scheduler_address)
        before = len(ran_on)
        with DagsterInstance.local_temp(str(tmp_path / "dagster")) as inst:
            pk = keys[0]
            tags = {"dagster/partition": str(pk),
                    **{f"dagster/partition/{d}": k for d, k in pk.keys_by_dimension.items()}}
            with execute_job(reconstructable(dask_collection_job), instance=inst, tags=tags) as result:
                assert result.success
            (rec,) = inst.fetch_materializations(AssetKey("graded_calls"), limit=1).records
            assert rec.asset_materialization.metadata["new_calls"].value == 0  # the call log already has them
        assert len(ran_on) == before + 1


# --- the shim (assets/dask_executor.py): why it exists, and what it needs from Dagster ---------------------------

def test_the_shims_private_dagster_names_still_exist():
    """Fails on a Dagster upgrade that removes a private name the shim uses, saying which and what to do."""
    for module, name in PRIVATE_NAMES:
        assert callable(private_name(module, name)), f"{module}.{name}"
    with pytest.raises(ImportError,
                       match=r"needs the private Dagster name dagster\._utils\.no_such_name.*drop the shim"):
        private_name("dagster._utils", "no_such_name")


@asset(pool="provider:test")  # a step in a concurrency pool: its run carries a `@record` RunOpConcurrency
def pooled_step():
    return 1


def _pooled_job(executor_def):
    return Definitions(assets=[pooled_step], jobs=[define_asset_job("pooled", executor_def=executor_def)]
                       ).resolve_job_def("pooled")


_ONE_WORKER = {"cluster": {"local": {"n_workers": 1, "threads_per_worker": 1, "processes": False,
                                     "dashboard_address": "127.0.0.1:0"}}}


def plain_dask_job():
    from dagster_dask import dask_executor

    return _pooled_job(dask_executor.configured(_ONE_WORKER))


def shim_dask_job():
    return _pooled_job(router_lite_dask_executor.configured(_ONE_WORKER, name="dask"))


@pytest.mark.timeout(300)
def test_plain_dagster_dask_still_fails_on_a_pooled_step_and_the_shim_runs_it(tmp_path):
    """The measurement behind the shim: if plain dagster-dask runs a pooled step, this fails - drop the shim."""
    with DagsterInstance.local_temp(str(tmp_path)) as inst:
        with execute_job(reconstructable(plain_dask_job), instance=inst) as plain:
            errors = [e.event_specific_data.error.message for e in plain.all_events
                      if e.is_failure and getattr(e.event_specific_data, "error", None)]
        assert not plain.success, ("plain dagster-dask now runs a step of a concurrency pool: drop the shim "
                                   "(assets/dask_executor.py) and use dagster_dask.dask_executor")
        assert any("Iteration is not allowed on `@record` RunOpConcurrency" in m for m in errors), errors
        with execute_job(reconstructable(shim_dask_job), instance=inst) as shim:
            assert shim.success
            assert shim.asset_materializations_for_node("pooled_step")
