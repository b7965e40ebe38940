"""Lineage stage 1: source tasks (one partition per source) → the balanced, split task pool."""

import pandas as pd
from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetIn,
    AssetsDefinition,
    MetadataValue,
    Output,
    PartitionsDefinition,
    asset,
    asset_check,
)

from pipeline.profile import SourceSettings
from pipeline.report.datasets import TASKS_TITLE, publish_dataset
from pipeline.tasks.sources import load_source
from pipeline.tasks.task_pool import (
    SPLITS,
    build_task_pool,
    cross_split_duplicates,
    drop_duplicate_prompts,
    pool_counts,
)
from resources.profile import ProfileResource
from resources.storage import StorageResource


def _source_tasks(context: AssetExecutionContext, profile: ProfileResource) -> Output[pd.DataFrame]:
    key = context.partition_key
    src = profile.get().sources.get(key) or SourceSettings()
    tasks = load_source(key, path=src.path, hub_id=src.hub_id, hub_config=src.hub_config, hub_split=src.hub_split)
    return Output(tasks, metadata={
        "rows": len(tasks),
        "by_difficulty": MetadataValue.json(tasks["difficulty"].value_counts().to_dict()),
        "grader": str(tasks["grader"].iloc[0]),
        "preview": MetadataValue.md(tasks.head(5)[["task_id", "gold", "grader", "difficulty"]]
                                    .to_markdown(index=False)),
    })


def source_tasks_asset(partitions_def: PartitionsDefinition) -> AssetsDefinition:
    """`source_tasks` with one partition per source of `partitions_def` (the profile's: built only by the definitions
    factory, `assets.definitions.build_assets`)."""
    return asset(name="source_tasks", partitions_def=partitions_def, group_name="tasks", io_manager_key="io_manager",
                 description="Normalised tasks of one public benchmark source (task contract: docs/architecture.md)."
                 )(_source_tasks)


def eligible_tasks(tasks: pd.DataFrame, prof) -> pd.DataFrame:
    """A pool of a recorded-only kind (`PoolKind.recorded_only`: replay) answers only prompts recorded in the replay
    store: keep tasks recorded for every agent of the profile's wider pool, so both the demo collection and the wider
    re-collection run without a single unanswerable call."""
    from resources.pool import default_agents_file, pool_kind

    if not pool_kind(prof.pool.kind).recorded_only:
        return tasks
    from pipeline.collect.agents import load_agents
    from pipeline.collect.replay import ReplayStore
    from pipeline.core.prompts import prompt_hash

    store = ReplayStore.load()
    agents = load_agents(default_agents_file(), prof.pool.wide_name or prof.pool.name)
    recorded = set.intersection(*(store.hashes(a.model) for a in agents))
    return tasks[tasks["prompt"].map(prompt_hash).isin(recorded)]


@asset(group_name="tasks", io_manager_key="io_manager",
       description="Balanced task pool with a seeded train/validation/test split; published as the tasks dataset.")
def task_pool(context: AssetExecutionContext, source_tasks: pd.DataFrame, profile: ProfileResource,
              storage: StorageResource) -> Output[pd.DataFrame]:
    """`source_tasks`: the profile's source partitions, concatenated by the IO manager."""
    prof = profile.get()
    tasks = eligible_tasks(source_tasks, prof)
    dropped = drop_duplicate_prompts(tasks)[1]  # build_task_pool keeps one task per prompt; this counts the rest
    if dropped:
        context.log.info(f"{dropped} task(s) repeat the prompt of another task: one task per prompt kept")
    pool = build_task_pool(tasks, prof.task_pool)
    out = publish_dataset(pool, storage.path("datasets") / "tasks", TASKS_TITLE.format(profile=prof.name),
                          prof.description)
    counts = pool_counts(pool)
    context.log.info(f"task pool: {len(pool)} tasks; {counts}")
    return Output(pool, metadata={
        "rows": len(pool), "profile": prof.name, "dataset_dir": str(out),
        **{f"count_by_{k}": MetadataValue.json(v) for k, v in counts.items()},
        "ood_tasks": int(pool["ood"].sum()), "duplicate_prompts_dropped": dropped,
    })


# --- asset checks: each guards the hand-off to collection; a failing blocking one stops every downstream asset --------

@asset_check(asset=task_pool, blocking=True, description="No task_id appears twice.")
def task_pool_unique_ids(task_pool: pd.DataFrame) -> AssetCheckResult:
    dup = task_pool["task_id"][task_pool["task_id"].duplicated()]
    return AssetCheckResult(passed=dup.empty, metadata={"duplicates": len(dup),
                                                         "first": str(dup.iloc[0]) if len(dup) else ""},
                            description=f"{len(dup)} duplicate task_id (first: {dup.iloc[0]})" if len(dup) else None)


@asset_check(asset=task_pool, blocking=True, description="No prompt appears in two splits (a train/test leak).")
def task_pool_no_cross_split_prompts(task_pool: pd.DataFrame) -> AssetCheckResult:
    leak = cross_split_duplicates(task_pool)
    return AssetCheckResult(passed=leak.empty, metadata={"rows": len(leak),
                                                          "first": str(leak["task_id"].iloc[0]) if len(leak) else ""},
                            description=(f"{len(leak)} task(s) share a prompt with a task of another split (first: "
                                         f"{leak['task_id'].iloc[0]})") if len(leak) else None)


@asset_check(asset=task_pool, blocking=True, description="Every task has a gold answer and a known grader.")
def task_pool_gold_and_grader(task_pool: pd.DataFrame) -> AssetCheckResult:
    from pipeline.collect.grading import GRADERS

    bad = task_pool[task_pool["gold"].fillna("").astype(str).str.strip().eq("") | ~task_pool["grader"].isin(GRADERS)]
    return AssetCheckResult(passed=bad.empty, metadata={"bad_rows": len(bad),
                                                         "first": str(bad["task_id"].iloc[0]) if len(bad) else ""},
                            description=(f"{len(bad)} task(s) without a gold answer or a known grader (first: "
                                         f"{bad['task_id'].iloc[0]})") if len(bad) else None)


@asset_check(asset=task_pool, description="Domain thirds (domain-balanced pools) and split fractions within ±2 points, "
                                          "or within what rounding allows in a small pool.")
def task_pool_proportions(task_pool: pd.DataFrame, profile: ProfileResource) -> AssetCheckResult:
    cfg = profile.get().task_pool
    inside = task_pool[~task_pool["ood"]]
    # each stratum is split by largest-remainder rounding, off by under one task per split: over S strata a split's
    # share can be off by up to S tasks, so a 63-task pool (9 strata) cannot hold ±2 points; ±2 holds from ~450 tasks
    strata = ["domain", "difficulty"] if cfg.balance == "domain_difficulty" else [cfg.stratify_column]
    n_strata = inside.groupby(strata).ngroups if len(inside) else 1
    allowed = {f"split:{s}": max(2.0, 100 * n_strata / max(len(inside), 1)) for s in SPLITS}
    off = {f"split:{s}": abs((inside["split"] == s).mean() - cfg.split[s]) * 100 for s in SPLITS}
    if cfg.balance == "domain_difficulty":
        for d, share in task_pool["domain"].value_counts(normalize=True).items():
            off[f"domain:{d}"] = abs(share - 1 / 3) * 100
            allowed[f"domain:{d}"] = max(2.0, 100 / len(task_pool))  # domains take whole tasks
    worst = max(off, key=lambda k: off[k] - allowed[k])
    return AssetCheckResult(passed=bool(all(off[k] <= allowed[k] for k in off)),
                            metadata={"worst": worst, "points_off": float(round(off[worst], 2)),
                                      "allowed_points": float(round(allowed[worst], 2)),
                                      "all_points_off": {k: float(round(v, 2)) for k, v in off.items()}})


@asset_check(asset=task_pool, additional_ins={"source_tasks": AssetIn("source_tasks")},
             description="Same seed and inputs → identical pool (rebuilt and compared).")
def task_pool_deterministic(task_pool: pd.DataFrame, source_tasks: pd.DataFrame,
                            profile: ProfileResource) -> AssetCheckResult:
    prof = profile.get()
    again = build_task_pool(eligible_tasks(source_tasks, prof), prof.task_pool)
    same = again.reset_index(drop=True).equals(task_pool.reset_index(drop=True))
    return AssetCheckResult(passed=bool(same), metadata={"rows": len(task_pool)})
