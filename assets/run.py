"""`router-lite run`: materialise the whole lineage in process, stage by stage, on a persistent Dagster instance.

Partitioned stages run one Dagster run per partition (exactly what a UI backfill does); unpartitioned stages run
together. Runs land in the instance under DAGSTER_HOME, so `make ui` shows them afterwards.
"""
import os
import time
from pathlib import Path

from dagster import AssetKey, DagsterInstance, materialize
from dagster import MultiPartitionKey

from pipeline.config import load_profile

# (stage name, asset keys, partitioning: None | "source" | "source_x_repetition" | "suite")
STAGES = [
    ("source tasks", ["source_tasks"], "source"),
    ("task pool", ["task_pool", "agent_pool", "preflight"], None),
    ("collection", ["graded_calls"], "source_x_repetition"),
    ("rewards", ["reward_matrix", "baselines"], None),
    ("router", ["prompt_embeddings", "router_head", "registered_head"], None),
    ("report", ["benchmark_report"], None),
    ("replication", ["routerbench_replication"], "suite"),
]


# the console shows our stage lines and warnings; every event is still in the instance (and the UI)
QUIET = {"loggers": {"console": {"config": {"log_level": os.environ.get("ROUTER_LITE_LOG_LEVEL", "WARNING")}}}}


def _instance() -> DagsterInstance:
    if os.environ.get("DAGSTER_HOME"):
        Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
        return DagsterInstance.get()
    return DagsterInstance.ephemeral()


def _partition_keys(kind, profile, assets_def):
    if kind is None:
        return [None]
    if kind == "source":
        return list(profile.sources)
    if kind == "source_x_repetition":
        return [MultiPartitionKey({"source": s, "repetition": str(r)})
                for s in profile.sources for r in range(profile.repetitions)]
    keys = assets_def.partitions_def.get_partition_keys()
    wanted = profile.benchmark.get("suites")
    return [k for k in keys if k in wanted] if wanted else keys


def _step_seconds(instance, run_id: str, into: dict) -> None:
    """Add each step's wall seconds of one run (summed over partitions) to `into` (step key -> seconds)."""
    try:
        for st in instance.get_run_step_stats(run_id):
            if st.start_time and st.end_time:
                into[st.step_key] = into.get(st.step_key, 0.0) + (st.end_time - st.start_time)
    except Exception:  # noqa: BLE001 - timing is a report, never a failure
        pass


def run_lineage(defs, profile_name: str | None = None, upto: str | None = None, log=print) -> dict:
    """Materialise the stages in order; returns {"stages": {stage: s}, "steps": {asset step: s}, "total_s": s}."""
    profile = load_profile(profile_name)
    times: dict = {"stages": {}, "steps": {}}
    t_all = time.time()
    instance = _instance()
    all_assets = list(defs.assets)
    checks = list(defs.asset_checks or [])
    by_key = {k.to_user_string(): a for a in all_assets for k in a.keys}
    resources = defs.resources
    for stage, keys, kind in STAGES:
        keys = [k for k in keys if k in by_key]
        if not keys:
            continue
        t0 = time.time()
        for pk in _partition_keys(kind, profile, by_key[keys[0]]):
            result = materialize(all_assets + checks, selection=[AssetKey(k) for k in keys], instance=instance,
                                 resources=resources, partition_key=str(pk) if pk is not None else None,
                                 raise_on_error=True, run_config=QUIET)
            _step_seconds(instance, result.run_id, times["steps"])
            failed = [e for e in result.get_asset_check_evaluations() if not e.passed]
            for e in failed:
                log(f"  check FAILED: {e.asset_key.to_user_string()}:{e.check_name} {dict(e.metadata)}")
        times["stages"][stage] = round(time.time() - t0, 1)
        log(f"[{stage}] {', '.join(keys)} done in {time.time() - t0:.1f}s")
        if upto and upto in keys:
            break
    times["total_s"] = round(time.time() - t_all, 1)
    times["steps"] = {k: round(v, 1) for k, v in times["steps"].items()}
    return times
