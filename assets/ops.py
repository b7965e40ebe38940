"""Operations: jobs, the wider-pool re-collection schedule and the sensors that carry it through, the Dask job.

How to use each from the UI and the command line: docs/operations.md.

- `source_tasks_job` / `collection_job`: per-source (and source × repetition) backfills from the UI or
  `dagster asset materialize -m assets.definitions --select source_tasks --partition gsm8k`.
- `recollect_wide_pool` schedule (STOPPED by default): a run of `recollect_preflight` tagged
  `router_lite/pool=<the profile's pool.wide_name>` (demo_wide, pilot_wide); then
  `recollect_collect_partitions` requests one `collection_job` run per source × repetition of the profile with the
  same tag (the call log makes only the calls it lacks: the wider pool's new agents), and
  `recollect_refresh_downstream`, once all of them succeeded, one `refresh_downstream` run (reward matrix,
  baselines, router head, registry, benchmark report) with the same tag.
- `collection_dask`: `graded_calls` through the `dagster-dask` executor (a small LocalCluster by default;
  `ROUTER_LITE_DASK_ADDRESS=tcp://host:8786` points it at an existing Dask scheduler).
"""
from __future__ import annotations

import os

from dagster import (
    AssetSelection,
    DagsterEvent,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    MultiPartitionKey,
    RunRequest,
    RunsFilter,
    SkipReason,
    define_asset_job,
    executor,
    multiple_process_executor_requirements,
    run_status_sensor,
    schedule,
)
from dagster_dask import dask_executor
from dagster_dask.executor import DaskExecutor, get_dask_resource_requirements

from assets.collection import POOL_TAG, REGRADE_TAG
from pipeline.config import Profile

RECOLLECTION_TAG = "router_lite/recollection"  # run id of the pre-flight run that started a re-collection
DASK_ADDRESS_ENV = "ROUTER_LITE_DASK_ADDRESS"
RECOLLECT_CRON = "0 3 * * 0"  # Sundays 03:00 (instance timezone)

SOURCE_TASKS_JOB = "source_tasks_job"
COLLECTION_JOB = "collection_job"
PREFLIGHT_JOB = "recollect_preflight"
REFRESH_JOB = "refresh_downstream"
DASK_JOB = "collection_dask"
REGRADE_JOB = "regrade_calls"
SCHEDULE = "recollect_wide_pool"
COLLECT_SENSOR = "recollect_collect_partitions"
REFRESH_SENSOR = "recollect_refresh_downstream"

# what a re-collection refreshes after the calls: everything downstream of the rewards that is not partitioned
REFRESH_ASSETS = ["reward_matrix", "baselines", "prompt_embeddings", "router_head", "registered_head",
                  "benchmark_report"]


class _StepArgs:
    """The arguments of one step, handed to Dask as a single opaque object. dask >= 2025 walks tuple arguments of
    `Client.submit` looking for futures, and trips on Dagster's `@record` types inside `DagsterRun` (dagster-dask
    0.29.27 passes the run as a plain argument): "Iteration is not allowed on `@record` RunOpConcurrency"."""

    def __init__(self, *args):
        self.args = args


def _run_step_on_worker(dependencies, step_args: _StepArgs):
    """On a Dask worker: dagster-dask's own step runner (`dependencies` only orders the futures)."""
    import dagster_dask.executor

    return dagster_dask.executor.query_on_dask_worker(dependencies, *step_args.args)


class RouterLiteDaskExecutor(DaskExecutor):
    """dagster-dask's `DaskExecutor`, submitting each step's arguments wrapped (see `_StepArgs`); clusters `existing`
    (a scheduler address) and `local` (a LocalCluster); other cluster types go to dagster-dask unchanged."""

    def execute(self, plan_context, execution_plan):
        import dask.distributed
        from dagster._core.errors import raise_execution_interrupts
        from dagster._utils import iterate_with_context

        if self.cluster_type not in ("existing", "local"):
            yield from super().execute(plan_context, execution_plan)
            return
        if not plan_context.instance.is_persistent:
            raise ValueError("Dask execution requires a persistent DagsterInstance (set DAGSTER_HOME)")
        if self.cluster_type == "existing":
            cluster = self.cluster_configuration["address"]
        else:
            cluster = dask.distributed.LocalCluster(**self.build_dict(plan_context.job_name))
        try:
            with dask.distributed.Client(cluster) as client:
                futures_by_step = {}
                for level in execution_plan.get_steps_to_execute_by_level():
                    for step in level:
                        deps = [futures_by_step[k] for inp in step.step_inputs for k in inp.dependency_keys]
                        futures_by_step[step.key] = client.submit(
                            _run_step_on_worker, deps,
                            _StepArgs(plan_context.reconstructable_job, plan_context.dagster_run,
                                      plan_context.run_config, [step.key], plan_context.instance.get_ref(),
                                      execution_plan.known_state),
                            key=f"{plan_context.job_name}.{step.key}.{plan_context.run_id[:8]}",
                            resources=get_dask_resource_requirements(step.tags))
                done = dask.distributed.as_completed(list(futures_by_step.values()), with_results=True)
                for _, events in iterate_with_context(raise_execution_interrupts, done):
                    for event in events:
                        assert isinstance(event, DagsterEvent)
                        yield event
        finally:
            if self.cluster_type == "local":
                cluster.close()


@executor(name="dask", config_schema=dask_executor.config_schema.as_field(),
          requirements=multiple_process_executor_requirements())
def router_lite_dask_executor(init_context):
    """The dagster-dask executor config (`cluster: {existing: {address}} | {local: {...}} | ...`)."""
    ((cluster_type, cluster_configuration),) = init_context.executor_config["cluster"].items()
    return RouterLiteDaskExecutor(cluster_type, cluster_configuration)


def dask_cluster_config(address: str | None = None) -> dict:
    """The dask executor's `cluster` config: an existing scheduler when an address is given (or
    ROUTER_LITE_DASK_ADDRESS is set), else a small in-process LocalCluster (2 workers × 1 thread, dashboard on
    loopback only)."""
    address = address or os.environ.get(DASK_ADDRESS_ENV)
    if address:
        return {"existing": {"address": address}}
    return {"local": {"n_workers": 2, "threads_per_worker": 1, "processes": False,
                      "dashboard_address": "127.0.0.1:0", "worker_dashboard_address": "127.0.0.1:0"}}


def collection_keys(profile) -> list[MultiPartitionKey]:
    """The graded_calls partitions a profile uses: its sources × its repetitions."""
    return [MultiPartitionKey({"source": s, "repetition": str(r)})
            for s in profile.sources for r in range(profile.repetitions)]


def build_ops(prof: Profile) -> dict:
    """Jobs, schedules and sensors for the profile; `Definitions(**parts)`-ready."""
    wide = prof.pool.wide_name

    source_tasks_job = define_asset_job(
        SOURCE_TASKS_JOB, selection=AssetSelection.assets("source_tasks"),
        description="Normalised tasks of one source: backfill one partition or several from the UI or CLI.")
    collection_job = define_asset_job(
        COLLECTION_JOB, selection=AssetSelection.assets("graded_calls"),
        description="Graded calls of one source × repetition through the call log (only missing calls are made). "
                    f"Tag {POOL_TAG}=<pool> collects with another pool of the same kind.")
    preflight_job = define_asset_job(
        PREFLIGHT_JOB, selection=AssetSelection.assets("preflight"),
        description=f"Pre-flight of the pool named by tag {POOL_TAG} (the configured pool without it); on success "
                    f"{COLLECT_SENSOR} re-collects every partition of the profile with the same tag.")
    refresh_job = define_asset_job(
        REFRESH_JOB, selection=AssetSelection.assets(*REFRESH_ASSETS),
        description="Rewards, baselines, router head, registry and benchmark report from the current call data.")
    regrade_job = define_asset_job(
        REGRADE_JOB, selection=AssetSelection.assets("graded_calls"), tags={REGRADE_TAG: "true"},
        description="Regrade stored calls from their stored completions with the current graders (zero API calls): "
                    f"backfill every partition of the profile, then run {REFRESH_JOB}.")
    dask_job = define_asset_job(
        DASK_JOB, selection=AssetSelection.assets("graded_calls"),
        executor_def=router_lite_dask_executor.configured({"cluster": dask_cluster_config()}, name="dask"),
        description="graded_calls through the dagster-dask executor (a small LocalCluster; with "
                    f"{DASK_ADDRESS_ENV}=tcp://host:8786 in the code location's environment, that Dask scheduler).")

    @schedule(name=SCHEDULE, job=preflight_job, cron_schedule=RECOLLECT_CRON,
              default_status=DefaultScheduleStatus.STOPPED,
              description=f"Re-collect profile {prof.name!r} on its wider pool {wide!r}: pre-flight, then only the "
                          "calls missing from the call log, then the downstream assets. Off by default.")
    def recollect_wide_pool(context):
        if not wide:
            return SkipReason(f"profile {prof.name!r} names no `pool.wide_name`")
        return RunRequest(tags={POOL_TAG: wide})

    @run_status_sensor(name=COLLECT_SENSOR, run_status=DagsterRunStatus.SUCCESS, monitored_jobs=[preflight_job],
                       request_job=collection_job, default_status=DefaultSensorStatus.RUNNING,
                       description=f"After a {PREFLIGHT_JOB} run: one {COLLECTION_JOB} run per source × repetition "
                                   "of the profile, with the pre-flight's pool tag.")
    def recollect_collect_partitions(context):
        run = context.dagster_run
        tags = {RECOLLECTION_TAG: run.run_id}
        if run.tags.get(POOL_TAG):
            tags[POOL_TAG] = run.tags[POOL_TAG]
        return [RunRequest(run_key=f"{run.run_id}:{pk}", partition_key=pk, tags=tags) for pk in collection_keys(prof)]

    @run_status_sensor(name=REFRESH_SENSOR, run_status=DagsterRunStatus.SUCCESS, monitored_jobs=[collection_job],
                       request_job=refresh_job, default_status=DefaultSensorStatus.RUNNING,
                       description=f"When every {COLLECTION_JOB} run of one re-collection succeeded: one "
                                   f"{REFRESH_JOB} run with its pool tag.")
    def recollect_refresh_downstream(context):
        run = context.dagster_run
        rid = run.tags.get(RECOLLECTION_TAG)
        if not rid:
            return SkipReason(f"run {run.run_id} is not part of a re-collection")
        done = context.instance.get_runs(filters=RunsFilter(job_name=COLLECTION_JOB, tags={RECOLLECTION_TAG: rid},
                                                            statuses=[DagsterRunStatus.SUCCESS]))
        missing = {str(k) for k in collection_keys(prof)} - {r.tags.get("dagster/partition") for r in done}
        if missing:
            return SkipReason(f"re-collection {rid}: {len(missing)} partition(s) still to finish")
        tags = {RECOLLECTION_TAG: rid, **({POOL_TAG: run.tags[POOL_TAG]} if run.tags.get(POOL_TAG) else {})}
        return [RunRequest(run_key=f"{rid}:refresh", tags=tags)]

    return {"jobs": [source_tasks_job, collection_job, preflight_job, refresh_job, regrade_job, dask_job],
            "schedules": [recollect_wide_pool],
            "sensors": [recollect_collect_partitions, recollect_refresh_downstream]}
