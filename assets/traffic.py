"""Served traffic in the lineage: the daily `traffic` partitions (one per UTC day of the log `router-lite serve` writes
when recording), the sensor that materialises them, and `traffic_rewards`, the explored and graded ones as reward rows
of their own source `traffic` (pipeline/collect/traffic.py; docs/tasks.md, "Traffic as a source").

`traffic` is materialised by its sensor (or by hand, a backfill per day like per source), never by `router-lite run`
(tag `SENSOR_TAG`); `traffic_rewards` reads the partitions materialised so far (none: an empty table) and refreshes
after each one through the refresh automation (assets/automation.py)."""

import json
from datetime import UTC, datetime

import pandas as pd
from dagster import (
    AllPartitionMapping,
    AssetExecutionContext,
    AssetIn,
    AssetsDefinition,
    DefaultSensorStatus,
    MetadataValue,
    Output,
    PartitionsDefinition,
    RunRequest,
    SensorResult,
    SkipReason,
    asset,
    define_asset_job,
    sensor,
)

from assets.automation import SENSOR_TAG
from pipeline.collect.traffic import (
    TRAFFIC_COLUMNS,
    day_summary,
    due_days,
    pool_judge,
    traffic_reward_rows,
    traffic_rows,
)
from pipeline.collect.traffic_log import read_day
from resources.pool import PoolResource
from resources.profile import ProfileResource
from resources.storage import BY_PARTITION, MATERIALISED_ONLY, StorageResource, asset_path
from resources.traffic import day_bytes, day_files, day_rows, days

TRAFFIC_JOB = "traffic_job"
TRAFFIC_SENSOR = "traffic_days"


def _traffic(context: AssetExecutionContext, profile: ProfileResource, pool: PoolResource,
             storage: StorageResource) -> Output[pd.DataFrame]:
    day = context.partition_key
    prof = profile.get()
    files = day_files(storage.root(), day)
    log = read_day(files)
    for where in log.unreadable[:20]:
        context.log.warning(f"traffic {day}: skipped an unreadable line: {where}")
    if log.torn:
        context.log.info(f"traffic {day}: {log.torn} torn last line(s) skipped (a write under way; read next time)")
    agents = pool.agents()
    js = prof.collection.judge
    judge = None
    if js.model and js.reference and js.reference in {a.name for a in agents}:
        judge = pool_judge(pool.client_for, agents, js, prof.collection, prof.collection.concurrency)
    stored = asset_path(storage.root(), "traffic", day)  # the day as read before: its judged replies are kept
    prior = pd.read_parquet(stored) if judge and stored.exists() else None
    rows = traffic_rows(log.requests, day, agents, prof.traffic, dict(prof.task_pool.split), judging=judge,
                        prior=prior)
    summary = day_summary(rows)
    return Output(rows, metadata={
        **{k: (MetadataValue.json(v) if isinstance(v, dict) else v) for k, v in summary.items() if v is not None},
        "files": len(files), "lines": log.lines, "torn_lines": log.torn, "unreadable_lines": len(log.unreadable),
        "orphan_explorations": log.orphans, "duplicate_requests": log.duplicates,
        "judge": js.model if judge else "(none)", "judge_cost_usd": float(rows["judge_cost_usd"].sum()),
    })


def traffic_calls(traffic: dict) -> pd.DataFrame:
    """The materialised `traffic` partitions ({day: rows}, as an `AllPartitionMapping` input loads) as one table of
    calls (TRAFFIC_COLUMNS; empty without any)."""
    frames = [d for d in traffic.values() if isinstance(d, pd.DataFrame) and len(d)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=TRAFFIC_COLUMNS)


def traffic_asset(partitions_def: PartitionsDefinition) -> AssetsDefinition:
    """`traffic`, one partition per UTC day of `partitions_def` (assets/partitions.py `traffic_partitions`)."""
    return asset(name="traffic", partitions_def=partitions_def, group_name="traffic", io_manager_key="io_manager",
                 tags={SENSOR_TAG: "true"},
                 description="One day of served traffic (the log of `router-lite serve --record-traffic`): a task per "
                             "request, its calls graded against the strongest agents' agreed answer, else by the "
                             "judge, else `ungraded` with the reason (docs/tasks.md, \"Traffic as a source\")."
                 )(_traffic)


@asset(group_name="rewards", io_manager_key="io_manager",
       ins={"traffic": AssetIn("traffic", partition_mapping=AllPartitionMapping(),
                               metadata={BY_PARTITION: True, MATERIALISED_ONLY: True})},
       description="The explored, graded traffic requests as reward rows of their own source `traffic` (the reward "
                   "matrix's agents and order, plus source and split); empty while no traffic day is materialised.")
def traffic_rewards(context: AssetExecutionContext, traffic: dict, reward_matrix: pd.DataFrame) -> Output[pd.DataFrame]:
    rows = traffic_calls(traffic)
    agents = list(reward_matrix["agent_order"].iloc[0]) if len(reward_matrix) else []
    out = traffic_reward_rows(rows, agents) if agents else traffic_reward_rows(None, [])
    n_req = rows["task_id"].nunique() if len(rows) else 0
    return Output(out, metadata={"days": MetadataValue.json(sorted(traffic)), "requests": int(n_req),
                                 "reward_rows": len(out),
                                 "by_split": MetadataValue.json(out["split"].value_counts().to_dict())})


# ---------------------------------------------------------------------------------------------------- the sensor
def traffic_sensor(prof, partitions_def: PartitionsDefinition):
    job = define_asset_job(TRAFFIC_JOB, selection=["traffic"],
                           description="One day of served traffic, read and graded (a backfill per day).")

    @sensor(name=TRAFFIC_SENSOR, job=job, minimum_interval_seconds=60, default_status=DefaultSensorStatus.RUNNING,
            description="Materialises a day's `traffic` partition once its UTC day is over (again when late lines "
                        f"arrive), and the open day's each time its log grows by traffic.sensor_rows lines "
                        f"({prof.traffic.sensor_rows} for {prof.name!r}).")
    def traffic_days(context, storage: StorageResource):
        home = storage.root()
        first = partitions_def.get_first_partition_key()
        # cursor: {"requested": {day: rows last requested}, "seen": {day: [bytes, rows]}} (lines are counted again
        # only in a day whose size in bytes changed since the last tick)
        state = json.loads(context.cursor) if context.cursor else {}
        requested, seen = state.get("requested", {}), state.get("seen", {})
        for d in (d for d in days(home) if first is None or d >= first):
            size = day_bytes(home, d)
            if seen.get(d, [None])[0] != size:
                seen[d] = [size, day_rows(home, d)]
        sizes = {d: rows for d, (_, rows) in seen.items()}
        due = due_days(sizes, datetime.now(UTC).strftime("%Y-%m-%d"), requested, prof.traffic.sensor_rows)
        cursor = json.dumps({"requested": {**requested, **dict(due)}, "seen": seen}, sort_keys=True)
        if not due:
            context.update_cursor(cursor)
            return SkipReason(f"no traffic day due ({len(sizes)} day(s) logged)")
        return SensorResult(run_requests=[RunRequest(run_key=f"traffic:{d}:{n}", partition_key=d) for d, n in due],
                            cursor=cursor)

    return job, traffic_days
