"""Operations: jobs, the wider-pool re-collection schedule and the sensors that carry it through, the Dask job.

How to use each from the UI and the command line: docs/operations.md.

- `source_tasks_job` / `collection_job`: per-source (and source × repetition) backfills from the UI or
  `dagster asset materialize -m assets.definitions --select source_tasks --partition gsm8k`.
- `recollect_wide_pool` schedule (STOPPED by default): a run of `recollect_preflight` with run config
  `ops: {preflight: {config: {pool: <the profile's pool.wide_name>}}}` (demo_wide, pilot_wide); on its success the
  run-status sensor `recollect_collect_partitions` requests one `collection_job` run per source × repetition of the
  profile (the call log makes only the calls it lacks: the wider pool's new agents; every stage takes the pool from
  the pre-flight it consumes), and once all are done the automation sensor `refresh_after_collection`
  (assets/automation.py, `AutomationCondition.eager()`) refreshes the assets computed from the calls.
  With `collection.new_agent_sample` on (the shipped demo, mmlu_pro and pilot profiles), the collection asks each new
  agent on a sample and the refresh's `reward_matrix` decides which may join the frontier; while one of those has
  unasked tasks, the refresh stops as planned: `matrix_complete` warns naming them and the next step, `reward_matrix`
  withholds its output (no router trains on their estimates; the steps downstream are skipped, the run succeeds,
  no stack trace), and the run-status sensor `recollect_complete_joiners` requests every partition's collection
  again: their remaining calls only; the automation then refreshes once more and the promotion's gate decides.
  The collection stays a run-status sensor on purpose: it makes (possibly paid) calls, so only an explicit
  `recollect_preflight` run starts one, never an incidental pre-flight materialisation.
- `collection_dask`: `graded_calls` through the `dagster-dask` executor (a small LocalCluster by default;
  `ROUTER_LITE_DASK_ADDRESS=tcp://host:8786` points it at an existing Dask scheduler).
"""
from __future__ import annotations

from dagster import (
    AssetSelection,
    DagsterEventType,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    MultiPartitionKey,
    RunRequest,
    SkipReason,
    define_asset_job,
    run_status_sensor,
    schedule,
)

# REFRESH_SENSOR: the automation sensor's name
from assets.automation import BENCHMARK, FREE_REFRESH, PROMOTION, REFRESH_SENSOR, refresh_sensor  # noqa: F401
from assets.collection import POOL_TAG, REGRADE_TAG
from assets.dask_executor import router_lite_dask_executor
from pipeline.profile import Profile
from resources.dask import DASK_ADDRESS_ENV, dask_address

RECOLLECTION_TAG = "router_lite/recollection"  # run id of the pre-flight run that started a re-collection
RECOLLECT_CRON = "0 3 * * 0"  # Sundays 03:00 (instance timezone)

SOURCE_TASKS_JOB = "source_tasks_job"
COLLECTION_JOB = "collection_job"
PREFLIGHT_JOB = "recollect_preflight"
REFRESH_JOB = "refresh_downstream"
DASK_JOB = "collection_dask"
REGRADE_JOB = "regrade_calls"
SCHEDULE = "recollect_wide_pool"
COLLECT_SENSOR = "recollect_collect_partitions"
COMPLETE_SENSOR = "recollect_complete_joiners"
COMPLETION_TAG = "router_lite/completion"  # run id of the run whose reward matrix asked for the joiners' rest

# the manual refresh job (no daemon, or a live pool's benchmark): everything downstream of the rewards that is not
# partitioned: what the automation refreshes, the embeddings, the benchmark on any pool, and the promotion (its gate
# decides whether the refreshed routers are served; automated with the benchmark on a free pool, assets/automation.py)
REFRESH_ASSETS = [*FREE_REFRESH, "prompt_embeddings", BENCHMARK, PROMOTION]


def preflight_run_config(pool: str) -> dict:
    """The run config of a pre-flight on `pool` (assets/collection.py AgentPoolConfig)."""
    return {"ops": {"preflight": {"config": {"pool": pool}}}}


def run_config_pool(run_config: dict) -> str | None:
    """The pool a pre-flight run was configured with (None: the profile's)."""
    return ((run_config or {}).get("ops", {}).get("preflight", {}).get("config") or {}).get("pool") or None


def dask_cluster_config(address: str | None = None) -> dict:
    """The dask executor's `cluster` config: an existing scheduler when an address is given (or
    ROUTER_LITE_DASK_ADDRESS is set), else a small in-process LocalCluster (2 workers × 1 thread, dashboard on
    loopback only)."""
    address = address or dask_address()
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
        description="Graded calls of one source × repetition through the call log (only missing calls are made), "
                    "over the agents of the pool the latest pre-flight ran on.")
    preflight_job = define_asset_job(
        PREFLIGHT_JOB, selection=AssetSelection.assets("preflight"),
        description="Pre-flight of the pool given as run config (ops: {preflight: {config: {pool: <name>}}}; the "
                    f"profile's pool without it); on success {COLLECT_SENSOR} re-collects every partition of the "
                    f"profile, and then {REFRESH_SENSOR} refreshes the assets computed from the calls.")
    refresh_job = define_asset_job(
        REFRESH_JOB, selection=AssetSelection.assets(*REFRESH_ASSETS),
        description="Rewards, baselines, pool report, router head, registry and benchmark report from the current "
                    f"call data, by hand (without a daemon; on a live pool the benchmark, which {REFRESH_SENSOR} "
                    "leaves out because it calls the agents).")
    regrade_job = define_asset_job(
        REGRADE_JOB, selection=AssetSelection.assets("graded_calls"), tags={REGRADE_TAG: "true"},
        config={"ops": {"graded_calls": {"config": {"regrade": True}}}},
        description="Regrade stored calls from their stored completions with the current graders (zero API calls): "
                    f"backfill every partition of the profile; {REFRESH_SENSOR} refreshes the rest.")
    dask_job = define_asset_job(
        DASK_JOB, selection=AssetSelection.assets("graded_calls"),
        executor_def=router_lite_dask_executor.configured({"cluster": dask_cluster_config()}, name="dask"),
        description="graded_calls through the dagster-dask executor (a small LocalCluster; with "
                    f"{DASK_ADDRESS_ENV}=tcp://host:8786 in the code location's environment, that Dask scheduler).")

    @schedule(name=SCHEDULE, job=preflight_job, cron_schedule=RECOLLECT_CRON,
              default_status=DefaultScheduleStatus.STOPPED,
              description=f"Re-collect profile {prof.name!r} on its wider pool {wide!r}: pre-flight (the pool as run "
                          "config), then only the calls missing from the call log, then the downstream assets. Off "
                          "by default.")
    def recollect_wide_pool(context):
        if not wide:
            return SkipReason(f"profile {prof.name!r} names no `pool.wide_name`")
        return RunRequest(run_config=preflight_run_config(wide), tags={POOL_TAG: wide})

    @run_status_sensor(name=COLLECT_SENSOR, run_status=DagsterRunStatus.SUCCESS, monitored_jobs=[preflight_job],
                       request_job=collection_job, default_status=DefaultSensorStatus.RUNNING,
                       description=f"After a {PREFLIGHT_JOB} run: one {COLLECTION_JOB} run per source × repetition "
                                   "of the profile, all in one tick (the refresh waits while any is queued).")
    def recollect_collect_partitions(context):
        run = context.dagster_run
        tags = {RECOLLECTION_TAG: run.run_id, POOL_TAG: run_config_pool(run.run_config) or prof.pool.name}
        return [RunRequest(run_key=f"{run.run_id}:{pk}", partition_key=pk, tags=tags) for pk in collection_keys(prof)]

    return {"jobs": [source_tasks_job, collection_job, preflight_job, refresh_job, regrade_job, dask_job],
            "schedules": [recollect_wide_pool],
            "sensors": [recollect_collect_partitions, complete_sensor(prof, collection_job),
                        refresh_sensor(prof.pool.kind)]}


def complete_sensor(prof: Profile, collection_job):
    """The sensor that completes the new agents that may join (their calls beyond the sample)."""

    # a planned stop is a successful run (reward_matrix withholds its output, its check warns naming the joiners):
    # this sensor watches successful runs and acts on those whose check says so
    @run_status_sensor(name=COMPLETE_SENSOR, run_status=DagsterRunStatus.SUCCESS, request_job=collection_job,
                       default_status=DefaultSensorStatus.RUNNING,
                       description=f"After a run whose reward matrix stopped as planned for new agents that may "
                                   f"join (matrix_complete warning, naming them): one {COLLECTION_JOB} run per "
                                   "source × repetition, which makes their remaining calls; the refresh follows.")
    def recollect_complete_joiners(context):
        run = context.dagster_run
        joining = joiners_waiting(context.instance, run.run_id)
        if not joining:
            return SkipReason(f"run {run.run_id} did not hold the routers for new agents")
        tags = {COMPLETION_TAG: run.run_id, POOL_TAG: run.tags.get(POOL_TAG, prof.pool.wide_name or prof.pool.name)}
        return [RunRequest(run_key=f"complete:{run.run_id}:{pk}", partition_key=pk, tags=tags)
                for pk in collection_keys(prof)]

    return recollect_complete_joiners


def joiners_waiting(instance, run_id: str) -> list[str]:
    """The new agents that may join whose remaining calls a run's `reward_matrix:matrix_complete` check stopped for
    as planned (its metadata `joining`; none when the check passed or failed for another reason)."""
    for record in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
        ev = record.dagster_event.event_specific_data
        if ev.check_name == "matrix_complete" and not ev.passed:
            joining = ev.metadata.get("joining")
            return list(getattr(joining, "value", None) or [])
    return []
