"""Lineage stage 2: agents → pre-flight → graded calls (source × repetition) → reward matrix → baselines."""
import pandas as pd
from dagster import (AssetCheckResult, AssetCheckSpec, AssetExecutionContext, MetadataValue, MultiPartitionsDefinition, Output,
                     StaticPartitionsDefinition, asset, asset_check)

from assets.partitions import source_partitions
from assets.tasks import task_pool
from pipeline.calls import CallLog
from pipeline.errors import RouterLiteError
from pipeline.io import atomic_write_text
from pipeline.pool import CollectionSettings, preflight as run_preflight, run_collect
from pipeline.publish import publish_dataset
from pipeline.rewards import baselines as compute_baselines, collection_totals, reward_matrix as build_matrix
from resources.pool import PoolResource
from resources.profile import ProfileResource
from resources.storage import StorageResource

MAX_REPETITIONS = 3  # the seed's 3 repetitions; a profile may use fewer
repetition_partitions = StaticPartitionsDefinition([str(r) for r in range(MAX_REPETITIONS)])
collection_partitions = MultiPartitionsDefinition({"source": source_partitions, "repetition": repetition_partitions})
LIVE_PREFLIGHT_PROMPT = "What is 2 + 2? Reply with the number only."


def _settings(profile) -> CollectionSettings:
    if not 1 <= profile.repetitions <= MAX_REPETITIONS:
        raise RouterLiteError(f"collection.repetitions must be 1..{MAX_REPETITIONS}, got {profile.repetitions}")
    return CollectionSettings.from_dict(profile.collection)


@asset(group_name="collection", io_manager_key="io_manager",
       description="Agents of the active pool config: role, model, provider, list price.")
def agent_pool(pool: PoolResource) -> Output[pd.DataFrame]:
    agents = pool.agents()
    pool.check(agents)
    df = pd.DataFrame([{"agent": a.name, "model": a.model, "provider": a.provider, "role": a.role,
                        "price_in_per_mtok": a.price_in_per_mtok, "price_out_per_mtok": a.price_out_per_mtok}
                       for a in agents])
    return Output(df, metadata={"pool": pool.pool, "kind": pool.kind, "agents": MetadataValue.md(df.to_markdown(index=False))})


@asset(deps=[agent_pool, task_pool], group_name="collection", io_manager_key="io_manager",
       description="Pre-flight: 20 calls per agent (valid completion, max_tokens, usage, empty-rate < 5 %).")
def preflight(context: AssetExecutionContext, pool: PoolResource, profile: ProfileResource,
              storage: StorageResource) -> Output[pd.DataFrame]:
    prof = profile.get()
    agents = pool.agents()
    if pool.kind == "replay":  # recorded prompts only: the replay pool answers nothing else
        tasks = storage.read_asset("task_pool")
        prompts = tasks[tasks["split"] == "train"]["prompt"].head(20).tolist()
    else:
        prompts = [LIVE_PREFLIGHT_PROMPT]
    result = run_preflight(pool.client_for, agents, prompts, _settings(prof))
    failed = result[~result["passed"]]
    for _, r in failed.iterrows():
        context.log.warning(f"pre-flight failed for {r['agent']} ({r['model']}): {r['reason']}")
    if failed.shape[0] == len(result):
        raise RouterLiteError(f"every agent of pool {pool.pool!r} failed pre-flight: "
                              + "; ".join(f"{a}: {why}" for a, why in zip(failed["agent"], failed["reason"])))
    return Output(result, metadata={
        "passed": int(result["passed"].sum()), "failed": MetadataValue.json(dict(zip(failed["agent"], failed["reason"]))),
        "table": MetadataValue.md(result.drop(columns=["reason"]).to_markdown(index=False)),
    })


def passed_agents(pool: PoolResource, storage: StorageResource):
    ok = set(storage.read_asset("preflight").query("passed")["agent"])
    return [a for a in pool.agents() if a.name in ok]


@asset(partitions_def=collection_partitions, deps=[task_pool, preflight], group_name="collection",
       io_manager_key="io_manager", pool="llm_provider",
       check_specs=[AssetCheckSpec("no_error_counted_as_wrong", asset="graded_calls",
                                   description="No error is ever graded: error rows carry no correctness."),
                    AssetCheckSpec("empty_rate_below_5pct", asset="graded_calls",
                                   description="Empty replies stay under 5 % per agent.")],
       description="One graded call per (task, agent) for one source × repetition, from the durable call log: "
                   "re-materialising makes only the calls missing from the log.")
def graded_calls(context: AssetExecutionContext, pool: PoolResource, profile: ProfileResource,
                 storage: StorageResource):
    prof = profile.get()
    keys = context.partition_key.keys_by_dimension
    source, rep = keys["source"], int(keys["repetition"])
    if source not in prof.sources:
        raise RouterLiteError(f"source {source!r} is not in profile {prof.name!r} (sources: {list(prof.sources)})")
    if rep >= prof.repetitions:
        raise RouterLiteError(f"repetition {rep} is beyond profile {prof.name!r}'s {prof.repetitions} repetitions")
    tasks = storage.read_asset("task_pool")
    tasks = tasks[tasks["source"] == source]
    agents = passed_agents(pool, storage)
    log = CallLog(storage.calls_dir(pool.kind, source, rep))
    before = len(log.keys())
    calls = run_collect(tasks, agents, rep, log, pool.client_for, _settings(prof))
    made = len(log.keys()) - before
    totals = collection_totals(calls)
    context.log.info(f"{source} rep {rep}: {len(calls)} graded calls, {made} new\n{totals.to_string(index=False)}")
    # checks run inside the step: a check outside it would load every partition of this asset
    graded_errors = calls[(calls["status"] == "error") & calls["correct"].notna()]
    yield AssetCheckResult(check_name="no_error_counted_as_wrong", passed=bool(graded_errors.empty),
                           metadata={"bad_rows": len(graded_errors)})
    rates = calls.groupby("agent")["status"].apply(lambda s: float((s == "empty").mean()))
    yield AssetCheckResult(check_name="empty_rate_below_5pct", passed=bool((rates < 0.05).all()),
                           metadata={"empty_rate": MetadataValue.json(rates.to_dict())})
    yield Output(calls, metadata={
        "calls": len(calls), "new_calls": made, "errors": int((calls["status"] == "error").sum()),
        "empties": int((calls["status"] == "empty").sum()), "cost_usd": float(calls["cost_usd"].fillna(0).sum()),
        "totals": MetadataValue.md(totals.to_markdown(index=False, floatfmt=".4f")),
        "call_log": str(log.directory),
    })


def profile_calls(prof, pool: PoolResource, storage: StorageResource) -> pd.DataFrame:
    parts = [storage.read_asset("graded_calls", f"{r}|{s}") for s in prof.sources for r in range(prof.repetitions)]
    return pd.concat(parts, ignore_index=True)


@asset(deps=[graded_calls], group_name="rewards", io_manager_key="io_manager",
       description="Per task: agent_order, mean_reward, best_agents, is_tie, empty/error counts, mean cost. "
                   "Published as the rewards dataset (no prompt text).")
def reward_matrix(context: AssetExecutionContext, pool: PoolResource, profile: ProfileResource,
                  storage: StorageResource) -> Output[pd.DataFrame]:
    prof = profile.get()
    calls = profile_calls(prof, pool, storage)
    agents = [a.name for a in passed_agents(pool, storage)]
    matrix = build_matrix(calls, agents)
    tasks = storage.read_asset("task_pool")[["task_id", "source", "split"]]
    published = matrix.rows.merge(tasks, on="task_id", how="left")
    out = publish_dataset(published, storage.path("datasets") / "rewards",
                          f"BenchGen Router Lite rewards ({prof.name})",
                          "Mean reward per task and agent over repetitions; no prompt text (join tasks by task_id).")
    if len(matrix.incomplete):
        context.log.warning(f"{matrix.incomplete['task_id'].nunique()} tasks held back: an agent has only errors")
    return Output(matrix.rows, metadata={
        "tasks": len(matrix.rows), "agents": MetadataValue.json(agents),
        "tie_rate": float(matrix.rows["is_tie"].mean()), "incomplete_tasks": int(matrix.incomplete["task_id"].nunique()),
        "dataset_dir": str(out),
    })


@asset_check(asset=reward_matrix, description="Join complete: every pool task of the profile has a reward row.")
def reward_join_complete(reward_matrix: pd.DataFrame, storage: StorageResource) -> AssetCheckResult:
    pool_ids = set(storage.read_asset("task_pool")["task_id"])
    missing = pool_ids - set(reward_matrix["task_id"])
    return AssetCheckResult(passed=not missing, metadata={"missing": len(missing), "tasks": len(pool_ids)})


@asset(group_name="rewards", io_manager_key="io_manager",
       description="Every agent, uniform random, best single, oracle, headroom (overall and held-out test).")
def baselines(context: AssetExecutionContext, reward_matrix: pd.DataFrame, profile: ProfileResource,
              pool: PoolResource, storage: StorageResource) -> Output[pd.DataFrame]:
    prof = profile.get()
    split = reward_matrix[["task_id"]].merge(storage.read_asset("task_pool")[["task_id", "split"]], how="left")["split"]
    table = compute_baselines(reward_matrix, split)
    totals = collection_totals(profile_calls(prof, pool, storage))
    md = (f"## Baselines ({prof.name}: {len(reward_matrix)} tasks, test n={int((split == 'test').sum())})\n\n"
          + table.to_markdown(index=False, floatfmt=".3f")
          + "\n\n## Collection totals\n\n" + totals.to_markdown(index=False, floatfmt=".4f") + "\n")
    atomic_write_text(md, storage.path("reports") / "baselines.md")
    context.log.info("\n" + md)
    return Output(table, metadata={"table": MetadataValue.md(md)})
