"""Lineage stage 2: agents → pre-flight → graded calls (source × repetition) → reward matrix → baselines."""
import json

import pandas as pd
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    AssetsDefinition,
    Config,
    MetadataValue,
    Output,
    PartitionsDefinition,
    asset,
    asset_check,
)
from pydantic import Field

from assets.collection_budget import (
    budget_check,
    budget_lock,
    collection_forecast,
    forecast_metadata,
    matrix_complete_check,
    partition_budget,
    planned_stop,
)
from pipeline.collect.agents import load_agents
from pipeline.collect.answers import agent_answers as build_answers
from pipeline.collect.call_log import CallLog, call_key
from pipeline.collect.call_log_lock import collection_lock, wait_setting
from pipeline.collect.preflight import preflight as run_preflight
from pipeline.collect.preflight import preflight_judge
from pipeline.collect.quality import RULE_SETTING, empty_rates, kept_agents, quarantine_markdown, quarantined
from pipeline.collect.regrade import regrade
from pipeline.collect.rewards import baselines as compute_baselines
from pipeline.collect.rewards import collection_totals, cost_basis, costs_are_estimated
from pipeline.collect.rewards import reward_matrix as build_matrix
from pipeline.collect.sampling import NewAgents, collect_with_sample, complete_matrix, imputed_cells, new_agents
from pipeline.collect.settings import CollectionSettings
from pipeline.core.errors import RouterLiteError
from pipeline.core.io import atomic_write_text
from pipeline.profile import Profile
from pipeline.report.datasets import REWARDS_DESCRIPTION, REWARDS_TITLE, publish_dataset, rewards_table
from resources.backbone import BackboneResource
from resources.pool import PoolResource, default_agents_file
from resources.profile import ProfileResource
from resources.storage import StorageResource

REGRADE_TAG = "router_lite/regrade"  # a label on the regrade job's runs; the regrade itself is run config
# the assets whose steps call the pool: only these need its key (OPENROUTER_API_KEY for an openrouter pool);
# `router-lite run` checks the key before the first of them, and each checks it itself (a UI launch)
POOL_CALLERS = ("preflight", "graded_calls", "benchmark_report")


# --- which pool a run uses, and its concurrency pool ---------------------------------------------------------------
POOL_TAG = "router_lite/pool"  # a label only (set by the re-collection schedule and sensor): the pool is run config


class AgentPoolConfig(Config):
    """Run config of `preflight`: the agent pool of config/agents.yaml this pre-flight runs on. The pre-flight records
    it (metadata and its `pool` / `pool_kind` columns) and every later stage takes the pool from the pre-flight it
    consumes, so one lineage never mixes pools. Launchpad: `ops: {preflight: {config: {pool: demo_wide}}}`."""

    pool: str = Field(default="", description="A pool of config/agents.yaml of the same kind as the profile's "
                                              "(e.g. demo_wide, mmlu_pro_wide); empty: the profile's pool.")


def provider_concurrency_pool(prof: Profile) -> str:
    """The Dagster concurrency pool of the profile's collection steps: `provider:<provider>` of its pool's agents
    (`provider:replay` for demo/smoke, `provider:openrouter` for pilot; the pool kind when agents mix providers).
    Limits per pool live in the instance (dagster.yaml `concurrency:`, or `dagster instance concurrency set`)."""
    try:
        providers = sorted({a.provider for a in load_agents(default_agents_file(), prof.pool.name)})
    except RouterLiteError:
        providers = []
    return "provider:" + (providers[0] if len(providers) == 1 else prof.pool.kind)


def pool_named(pool: PoolResource, name: str) -> PoolResource:
    """A copy of `pool` (same kind, endpoint and key) for another pool of the agents file. Its providers must be
    among `pool`'s: a replay pool cannot be swapped for an OpenRouter one by run config."""
    if name == pool.pool:
        return pool
    other = PoolResource(**{**{f: getattr(pool, f) for f in PoolResource.model_fields}, "pool": name})
    other._store = pool._store  # share loaded replay recordings
    mine = {a.provider for a in pool.agents()}
    theirs = {a.provider for a in other.agents()}  # unknown pool -> RouterLiteError naming it
    if not theirs <= mine:
        raise RouterLiteError(f"pool {name!r} (provider {', '.join(sorted(theirs))}) is not of the same kind as the "
                              f"configured pool {pool.pool!r} (provider {', '.join(sorted(mine))})")
    return other


def chosen_pool(context, pool: PoolResource, config: AgentPoolConfig) -> PoolResource:
    """The pool a pre-flight runs on: `config.pool`, else the profile's. A run tag `router_lite/pool` is a label; one
    that names another pool than the config is a mistake (the tag chose the pool before run config did)."""
    name = config.pool or pool.pool
    label = context.run.tags.get(POOL_TAG) if context is not None else None
    if label and label != name:
        raise RouterLiteError(f"run tag {POOL_TAG}={label} but this pre-flight runs on pool {name!r}: the tag is a "
                              f"label only; choose the pool with run config ops: {{preflight: {{config: {{pool: "
                              f"{label}}}}}}}")
    other = pool_named(pool, name)
    other.check(other.agents(), needed_by="preflight")
    return other


def ran_on(preflight: pd.DataFrame) -> str | None:
    """The pool a pre-flight ran on (None for an older pre-flight without the column)."""
    return str(preflight["pool"].iloc[0]) if "pool" in preflight.columns and len(preflight) else None


def pool_of(pool: PoolResource, preflight: pd.DataFrame) -> PoolResource:
    """The pool of the pre-flight a stage consumes (the configured one for an older pre-flight without it): the one
    source of truth along the lineage. After a re-collection on a wider pool every later stage works over that
    pool's agents until `preflight` runs again on another."""
    name = ran_on(preflight)
    if not name or name == pool.pool:
        return pool
    try:
        return pool_named(pool, name)
    except RouterLiteError as e:
        raise RouterLiteError(f"the pre-flight this stage consumes ran on pool {name!r}, which the profile's pool "
                              f"{pool.pool!r} cannot stand in for ({e}): materialise `preflight` again") from None


@asset(group_name="collection", io_manager_key="io_manager",
       description="Agents of the profile's pool: role, model, provider, list price (a pre-flight on another "
                   "pool, chosen by run config, records that pool's agents itself).")
def agent_pool(pool: PoolResource) -> Output[pd.DataFrame]:
    agents = pool.agents()
    pool.check_setup(agents)  # listing the agents calls nothing: no key needed
    df = pd.DataFrame([{"agent": a.name, "model": a.model, "provider": a.provider, "role": a.role,
                        "price_in_per_mtok": a.price_in_per_mtok, "price_out_per_mtok": a.price_out_per_mtok}
                       for a in agents])
    return Output(df, metadata={"pool": pool.pool, "kind": pool.kind,
                                "agents": MetadataValue.md(df.to_markdown(index=False))})


@asset(deps=[agent_pool], group_name="collection", io_manager_key="io_manager",
       description="Pre-flight: 20 calls per agent (valid completion, max_tokens, usage, empty-rate < 5 %).")
def preflight(context: AssetExecutionContext, config: AgentPoolConfig, task_pool: pd.DataFrame, pool: PoolResource,
              profile: ProfileResource, storage: StorageResource) -> Output[pd.DataFrame]:
    prof = profile.get()
    pool = chosen_pool(context, pool, config)
    agents = pool.agents()
    prompts = pool.spec().preflight_prompts(task_pool)  # recorded train prompts on a recorded-only pool (replay)
    result = (run_preflight(pool.client_for, agents, prompts, prof.collection)
              .assign(pool=pool.pool, pool_kind=pool.kind))
    failed = result[~result["passed"]]
    for _, r in failed.iterrows():
        context.log.warning(f"pre-flight failed for {r['agent']} ({r['model']}): {r['reason']}")
    if failed.shape[0] == len(result):
        raise RouterLiteError(f"every agent of pool {pool.pool!r} failed pre-flight: "
                              + "; ".join(f"{a}: {why}" for a, why in zip(failed["agent"], failed["reason"])))
    # the collection's forecast, before it makes a call: the passed agents, less the logged calls
    passed = [a for a in agents if a.name in set(result.query("passed")["agent"])]
    judge = {}
    if "grader" in task_pool and (task_pool["grader"] == "judge").any():  # the judge of open-ended tasks, checked too
        judge = preflight_judge(pool.client_for, passed, prompts, prof.collection)
        if not judge["passed"]:
            raise RouterLiteError(f"the judge {judge['model']!r} failed pre-flight: {judge['reason']}")
        context.log.info(f"judge pre-flight: {judge['n_judged']} of {judge['n_calls']} comparisons judged")
    fc = collection_forecast(prof, pool.kind, storage, task_pool, passed, result,
                             sampled=sampled_fractions(prof, [a.name for a in passed], storage, pool.pool))
    context.log.info(f"collection forecast: {fc['calls']:,} calls, USD {fc['usd_low']:.4f} .. {fc['usd_high']:.4f}")
    return Output(result, metadata={**forecast_metadata(fc),
        "pool": pool.pool, "pool_kind": pool.kind, "agents": MetadataValue.json([a.name for a in agents]),
        "passed": int(result["passed"].sum()),
        "failed": MetadataValue.json(dict(zip(failed["agent"], failed["reason"]))),
        **({"judge_preflight": MetadataValue.json(judge)} if judge else {}),
        "table": MetadataValue.md(result.drop(columns=["reason"]).to_markdown(index=False)),
    })


def cost_lower_bounds(pool: PoolResource, agents: list[str]) -> dict[str, str]:
    """agent -> why its estimated cost is a lower bound (`AgentSpec.cost_note`: a reasoning model whose hidden
    reasoning tokens are billed but not recorded), for the agents of `agents` that have one."""
    return {a.name: a.cost_note for a in pool.agents() if a.name in agents and a.cost_note}


def passed_agents(pool: PoolResource, preflight: pd.DataFrame):
    """Agents that passed the pre-flight, from the pool it ran on (`pool_of`)."""
    pool = pool_of(pool, preflight)
    ok = set(preflight.query("passed")["agent"])
    return [a for a in pool.agents() if a.name in ok]


class GradedCallsConfig(Config):
    """Run config of `graded_calls` (launchpad: `ops: {graded_calls: {config: {...}}}`; `router-lite run
    --wait-for-collection / --quarantine-bad-log-lines`; the regrade job sets `regrade`)."""

    regrade: bool = Field(default=False, description="Regrade the stored calls of this partition from their stored "
                                                     "completions with the current graders: zero API calls.")
    wait_for_collection: str = Field(
        default="", description="When another run is collecting this partition: empty or false = fail at once, "
                                "true = wait as long as it takes, a number = wait at most that many seconds.")
    quarantine_bad_log_lines: bool = Field(
        default=False, description="Move a call-log line that is not a JSON call row to <agent>.jsonl.quarantine "
                                   "instead of stopping.")
    max_usd: float | None = Field(default=None, description="USD the whole collection may spend (router-lite run "
                                                            "--max-usd); unset: the profile's collection.max_usd.")


NEW_AGENTS_REPORT = "new_agents.json"  # reports/: the sampled new agents' estimates and decisions (reward_matrix)


def profile_pool_agents(prof: Profile) -> list[str]:
    """The agents of the profile's own pool: an agent of the run's pool that is not one of them is new."""
    try:
        return [a.name for a in load_agents(default_agents_file(), prof.pool.name)]
    except RouterLiteError:
        return []


def sampled_agents(prof: Profile, agents: list[str]) -> list[str]:
    """The new agents collected on a sample (none with `collection.new_agent_sample` off)."""
    return new_agents(agents, profile_pool_agents(prof)) if prof.collection.new_agent_sample.on else []


def sampled_fractions(prof: Profile, agents: list[str], storage: StorageResource, pool_name: str) -> dict[str, float]:
    """The new agents this collection asks on a sample (agent -> fraction): `sampled_agents` less those whose rest
    is collected (`rest_of`): what the forecast counts."""
    rest = set(rest_of(storage, pool_name))
    return {a: prof.collection.new_agent_sample.fraction for a in sampled_agents(prof, agents) if a not in rest}


def rest_of(storage: StorageResource, pool_name: str) -> list[str]:
    """New agents whose remaining calls are collected: those the last decision on this pool (reports/
    new_agents.json, written by `reward_matrix`) marked `collect_rest`."""
    path = storage.path("reports") / NEW_AGENTS_REPORT
    if not path.is_file():
        return []
    report = json.loads(path.read_text())
    if report.get("pool") != pool_name:
        return []
    return [a for a, d in report.get("agents", {}).items() if d.get("collect_rest")]


def _graded_calls(context: AssetExecutionContext, config: GradedCallsConfig, task_pool: pd.DataFrame,
                  preflight: pd.DataFrame, pool: PoolResource, profile: ProfileResource, storage: StorageResource):
    prof = profile.get()
    pool = pool_of(pool, preflight)
    keys = context.partition_key.keys_by_dimension
    source, rep = keys["source"], int(keys["repetition"])
    if source not in prof.sources:
        raise RouterLiteError(f"source {source!r} is not in profile {prof.name!r} (sources: {list(prof.sources)})")
    if rep >= prof.repetitions:
        raise RouterLiteError(f"repetition {rep} is beyond profile {prof.name!r}'s {prof.repetitions} repetitions")
    tasks = task_pool[task_pool["source"] == source]
    agents = passed_agents(pool, preflight)
    regrading = config.regrade  # stored completions only, zero calls
    if not regrading:
        pool.require_key("graded_calls")  # a missing key: one line naming it, before the lock and any call
    log = CallLog(storage.calls_dir(pool.kind, source, rep), quarantine=config.quarantine_bad_log_lines)
    # one collection per call log at a time (pipeline/collect/call_log_lock.py): a second run fails now, or waits
    # when asked
    wait = wait_setting(config.wait_for_collection)
    budget = None
    with collection_lock(log.directory, f"{source} repetition {rep}", wait):
        before = len(log.keys())
        asked = {}
        if regrading:
            calls = regrade_from_log(log, tasks, agents, rep, prof.collection)
        else:  # a budget counts the whole collection: its partitions collect one at a time
            with budget_lock(storage, pool.kind, prof, config.max_usd):
                budget = partition_budget(prof, config.max_usd, pool.kind, storage, task_pool, agents)
                plan = NewAgents(profile_pool_agents(prof), prof.collection.new_agent_sample,
                                 rest_of(storage, pool.pool))
                calls, asked = collect_with_sample(tasks, agents, plan, rep, log, pool.client_for, prof.collection,
                                                   budget=budget)
        made = len(log.keys()) - before
    totals = collection_totals(calls)
    context.log.info(f"{source} rep {rep}: {len(calls)} graded calls, {made} new\n{totals.to_string(index=False)}")
    # checks run inside the step: a check outside it would load every partition of this asset
    graded_errors = calls[(calls["status"] == "error") & calls["correct"].notna()]
    yield AssetCheckResult(check_name="no_error_counted_as_wrong", passed=bool(graded_errors.empty),
                           metadata={"bad_rows": len(graded_errors)},
                           description=f"{len(graded_errors)} error call(s) carry a correctness grade"
                           if len(graded_errors) else None)
    yield from empty_rate_checks(calls, prof.collection.empty_rate_max, [a.name for a in agents])
    yield budget_check(prof, budget, pool.kind, storage, task_pool, agents)
    yield Output(calls, metadata={
        "calls": len(calls), "new_calls": made, "new_agents_asked": MetadataValue.json(asked),
        "errors": int((calls["status"] == "error").sum()),
        "empties": int((calls["status"] == "empty").sum()), "cost_usd": float(calls["cost_usd"].fillna(0).sum()),
        "totals": MetadataValue.md(totals.to_markdown(index=False, floatfmt=".4f")),
        "call_log": str(log.directory), "pool": pool.pool,
    })


def empty_rate_checks(calls: pd.DataFrame, limit: float, agents: list[str]):
    """The two checks of the empty-reply rule (`collection.empty_rate_max`, 0.05 by default) on one partition. An
    agent at or over the limit is quarantined (`pipeline.collect.quality`): left out of every downstream asset.
    `empty_rate_below_5pct` (blocking; its name predates the setting) guards the hand-off: it passes while the
    quarantine keeps the downstream assets clean, and fails only when every agent of the partition breaks the rule.
    `no_agent_quarantined` (a warning: it never holds the lineage or the refresh automation) names each quarantined
    agent and why."""
    rates = empty_rates(calls)
    quarantine = quarantined(calls, limit)
    what = "; ".join(f"{a}: {why}" for a, why in quarantine.items())
    every = bool(agents) and all(a in quarantine for a in agents)
    meta = {"empty_rate": MetadataValue.json(rates.to_dict()), "empty_rate_max": float(limit),
            "quarantined": MetadataValue.json(quarantine)}
    yield AssetCheckResult(check_name="empty_rate_below_5pct", passed=not every, metadata=meta,
                           description=(f"every agent breaks the empty-reply rule ({what}); raise {RULE_SETTING} in "
                                        f"the profile, or fix the agents") if every else
                           (f"quarantined, the others go on: {what}" if quarantine else None))
    yield AssetCheckResult(check_name="no_agent_quarantined", passed=not quarantine, severity=AssetCheckSeverity.WARN,
                           metadata={"quarantined": MetadataValue.json(quarantine), "empty_rate_max": float(limit)},
                           description=f"quarantined for the downstream assets: {what}" if quarantine else None)


def quarantine_of(prof, calls: pd.DataFrame) -> dict[str, str]:
    """The agents the profile's quality rule quarantines over the lineage's graded calls (every partition)."""
    return quarantined(calls, prof.collection.empty_rate_max)


def regrade_from_log(log: CallLog, tasks: pd.DataFrame, agents, rep: int, settings: CollectionSettings) -> pd.DataFrame:
    """This partition's calls as stored in the call log, regraded with the current graders. A call the log lacks
    is an error here (the regrade job never calls): collect it first."""
    keys = {call_key(a.name, t, rep, settings.hash()) for t in tasks["task_id"] for a in agents}
    stored = log.latest()
    stored = stored[stored["call_key"].isin(keys)]
    if len(stored) < len(keys):
        raise RouterLiteError(f"regrade: {len(keys) - len(stored)} of {len(keys)} calls of this partition are not in "
                              f"the call log {log.directory}; materialise graded_calls without `regrade` first")
    from pipeline.collect.bounded import Budget

    return regrade(stored, tasks, Budget.of(settings))[0].reset_index(drop=True)


def graded_calls_asset(concurrency_pool: str, partitions_def: PartitionsDefinition) -> AssetsDefinition:
    """`graded_calls` with its steps in Dagster concurrency pool `concurrency_pool` (see `provider_concurrency_pool`),
    one partition per source × repetition of `partitions_def` (the profile's: built only by the definitions factory,
    `assets.definitions.build_assets`)."""
    return asset(
        name="graded_calls", partitions_def=partitions_def,
        group_name="collection", io_manager_key="io_manager", pool=concurrency_pool,
        check_specs=[AssetCheckSpec("no_error_counted_as_wrong", asset="graded_calls", blocking=True,
                                    description="No error is ever graded: error rows carry no correctness."),
                     AssetCheckSpec("empty_rate_below_5pct", asset="graded_calls", blocking=True,
                                    description="Empty replies stay under the profile's collection.empty_rate_max "
                                                "(5 % by default) per agent and source: an agent over it is "
                                                "quarantined (a warning naming it and why; the lineage goes on "
                                                "without it), every agent over it fails the check."),
                     AssetCheckSpec("no_agent_quarantined", asset="graded_calls", blocking=False,
                                    description="Warns when the collection quality rules quarantine an agent: its "
                                                "name and reason; the others go on."),
                     AssetCheckSpec("within_budget", asset="graded_calls", blocking=True,
                                    description="The collection budget (collection.max_usd / --max-usd) did not "
                                                "stop this partition; when it did: spent, remaining calls, resume.")],
        description="One graded call per (task, agent) for one source × repetition, from the durable call log: "
                    "re-materialising makes only the calls missing from the log.")(_graded_calls)


def profile_calls(prof, graded_calls: pd.DataFrame) -> pd.DataFrame:
    """The profile's graded calls (every partition, concatenated by the IO manager) in source-then-repetition order,
    the order the rewards were always summed in."""
    order = {s: i for i, s in enumerate(prof.sources)}
    key = graded_calls["task_id"].str.split("/", n=1).str[0].map(order) * 1000 + graded_calls["repetition"].astype(int)
    return graded_calls.iloc[key.argsort(kind="stable")].reset_index(drop=True)


@asset(group_name="rewards", io_manager_key="io_manager", output_required=False,  # a planned stop yields none
       check_specs=[AssetCheckSpec("matrix_complete", asset="reward_matrix", blocking=True,
                                   description="Every (agent, task, repetition) cell was collected (a budget stop "
                                               "leaves cells out: they are named).")],
       description="Per task: agent_order, mean_reward, best_agents, is_tie, empty/error counts, mean cost. "
                   "Published as the rewards dataset (no prompt text).")
def reward_matrix(context: AssetExecutionContext, graded_calls: pd.DataFrame, task_pool: pd.DataFrame,
                  preflight: pd.DataFrame, pool: PoolResource, profile: ProfileResource,
                  storage: StorageResource, backbone: BackboneResource):
    prof = profile.get()
    pool = pool_of(pool, preflight)
    calls = profile_calls(prof, graded_calls)
    quarantine = quarantine_of(prof, calls)
    agents = kept_agents([a.name for a in passed_agents(pool, preflight)], quarantine, "reward matrix")
    sampled = sampled_agents(prof, agents)
    matrix = build_matrix(calls, agents, sampled)
    decisions = None
    if sampled and len(matrix.rows) and any(pd.isna(v) for r in matrix.rows["mean_reward"] for v in r):
        rows, decisions = _completed(matrix.rows, task_pool, sampled, prof, pool.pool, backbone, storage)
        matrix = type(matrix)(rows, matrix.incomplete)
        atomic_write_text(json.dumps(decisions, indent=2) + "\n", storage.path("reports") / NEW_AGENTS_REPORT)
        for a, d in decisions["agents"].items():
            context.log.info(f"new agent {a}: {d['sampled']}/{d['tasks']} tasks asked, quality "
                             f"{d['quality_estimate']:.4f} [{d['ci_low']:.4f}, {d['ci_high']:.4f}], joins the "
                             f"frontier: {d['joins']} (in {d['join_share']:.0%} of the draws), rest collected: "
                             f"{d['collect_rest']}")
    # an agent that may join is completed before any router is trained on its estimates: its unasked cells fail
    # the check (the routers wait) until the next collection on this pool makes them (`rest_of`); that planned stop
    # withholds the output (nothing published, the steps downstream skipped, the run a success: docs/operations.md)
    joining = [a for a, d in (decisions or {}).get("agents", {}).items() if d["collect_rest"] and d["imputed"]]
    check = matrix_complete_check(calls, task_pool, agents, prof.repetitions,
                                  on_purpose=[a for a in sampled if a not in joining], joining=joining)
    yield check
    if planned_stop(check):
        context.log.info(f"reward_matrix: {check.description}")
        return
    out = publish_dataset(rewards_table(matrix.rows, task_pool), storage.path("datasets") / "rewards",
                          REWARDS_TITLE.format(profile=prof.name), REWARDS_DESCRIPTION)
    if len(matrix.incomplete):
        context.log.warning(f"{matrix.incomplete['task_id'].nunique()} tasks held back: an agent has only errors")
    for a, why in quarantine.items():
        context.log.warning(f"agent {a} quarantined (left out of the reward matrix): {why}")
    lower = cost_lower_bounds(pool, agents) if costs_are_estimated(matrix.rows) else {}
    yield Output(matrix.rows, metadata={
        "imputed_cells": imputed_cells(matrix.rows),
        "new_agents": MetadataValue.md(new_agents_markdown(decisions) if decisions else "(none sampled)"),
        "tasks": len(matrix.rows), "agents": MetadataValue.json(agents), "cost_basis": cost_basis(calls),
        "quarantined": MetadataValue.json(quarantine),
        "quarantine": MetadataValue.md(quarantine_markdown(quarantine) or "(none)"),
        "cost_lower_bound": MetadataValue.json(lower),
        "tie_rate": float(matrix.rows["is_tie"].mean()),
        "incomplete_tasks": int(matrix.incomplete["task_id"].nunique()),
        "dataset_dir": str(out),
    })


def _completed(rows: pd.DataFrame, task_pool: pd.DataFrame, sampled: list[str], prof: Profile, pool_name: str,
               backbone: BackboneResource, storage: StorageResource) -> tuple[pd.DataFrame, dict]:
    """The reward rows with the sampled new agents' missing cells estimated (`pipeline.collect.sampling`), from the
    existing agents' rewards, the source and the prompt embedding (the shared embedding cache: `prompt_embeddings`
    embeds the same prompts once)."""
    from pipeline.collect.sampling import embedding_features
    from pipeline.core.prompts import task_texts
    from pipeline.embed.backbone import EmbeddingCache

    t = rows[["task_id"]].merge(task_pool, on="task_id", how="left")
    emb = EmbeddingCache(storage.path("embeddings")).get_or_compute(task_texts(t), backbone.get_backbone())
    return complete_matrix(rows, t["source"].to_numpy(), sampled, prof.collection.new_agent_sample,
                           embedding_features(emb), pool_name)


def new_agents_markdown(decisions: dict) -> str:
    """The sampled new agents' estimates (overall and per source, 95 % intervals) and frontier decisions."""
    lines = ["| agent | asked | quality [95 % CI] | per source | cost/task | joins (share) | rest collected |",
             "|---|---:|---|---|---:|---|---|"]
    for a, d in decisions["agents"].items():
        per = "; ".join(f"{s} {v['estimate']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
                        for s, v in d["per_source"].items())
        lines.append(f"| {a} | {d['sampled']}/{d['tasks']} | {d['quality_estimate']:.4f} [{d['ci_low']:.4f}, "
                     f"{d['ci_high']:.4f}] | {per} | {d['cost_estimate']:.6f} | {d['joins']} "
                     f"({d['join_share']:.0%}) | {d['collect_rest']} |")
    return "\n".join(lines) + f"\n\n{decisions['imputed_cells']} cells imputed (column `imputed`)."


@asset(group_name="rewards", io_manager_key="io_manager",
       description="Per task and agent the extracted answer (majority over repetitions; ties and no-answers counted): "
                   "the evidence a cascade router is fitted on. Not published with the rewards (docs/training.md).")
def agent_answers(context: AssetExecutionContext, graded_calls: pd.DataFrame, preflight: pd.DataFrame,
                  pool: PoolResource, profile: ProfileResource) -> Output[pd.DataFrame]:
    prof = profile.get()
    calls = profile_calls(prof, graded_calls)
    agents = kept_agents([a.name for a in passed_agents(pool_of(pool, preflight), preflight)],
                         quarantine_of(prof, calls), "agent answers")
    answers = build_answers(calls, agents)
    n = max(len(answers), 1)
    no_answer = {a: float(sum(ans[j] is None for ans in answers["answers"]) / n) for j, a in enumerate(agents)}
    ties = {a: float(sum(t[j] for t in answers["answer_tie"]) / n) for j, a in enumerate(agents)}
    return Output(answers, metadata={"tasks": len(answers), "agents": MetadataValue.json(agents),
                                     "no_answer_rate": MetadataValue.json(no_answer),
                                     "majority_tie_rate": MetadataValue.json(ties)})


@asset_check(asset=reward_matrix, blocking=True, additional_ins={"task_pool": AssetIn("task_pool")},
             description="Join complete: every pool task of the profile has a reward row.")
def reward_join_complete(reward_matrix: pd.DataFrame, task_pool: pd.DataFrame) -> AssetCheckResult:
    pool_ids = set(task_pool["task_id"])
    missing = pool_ids - set(reward_matrix["task_id"])
    return AssetCheckResult(passed=not missing, metadata={"missing": len(missing), "tasks": len(pool_ids)},
                            description=(f"{len(missing)} of {len(pool_ids)} pool tasks have no reward row (first: "
                                         f"{sorted(missing)[0]})") if missing else None)


@asset(group_name="rewards", io_manager_key="io_manager",
       description="Every agent, uniform random, best single, oracle, headroom (overall and held-out test).")
def baselines(context: AssetExecutionContext, reward_matrix: pd.DataFrame, task_pool: pd.DataFrame,
              graded_calls: pd.DataFrame, profile: ProfileResource, storage: StorageResource) -> Output[pd.DataFrame]:
    prof = profile.get()
    split = reward_matrix[["task_id"]].merge(task_pool[["task_id", "split"]], how="left")["split"]
    table = compute_baselines(reward_matrix, split)
    calls = profile_calls(prof, graded_calls)
    totals = collection_totals(calls)
    md = (f"## Baselines ({prof.name}: {len(reward_matrix)} tasks, test n={int((split == 'test').sum())})\n\n"
          + f"Cost column: mean USD per task; {cost_basis(calls)}.\n\n"
          + table.to_markdown(index=False, floatfmt=".3f")
          + "\n\n## Collection totals\n\n" + totals.to_markdown(index=False, floatfmt=".4f") + "\n")
    atomic_write_text(md, storage.path("reports") / "baselines.md")
    context.log.info("\n" + md)
    return Output(table, metadata={"table": MetadataValue.md(md)})
