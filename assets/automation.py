"""Declarative automation: what refreshes by itself after a collection, and what never does.

After new graded calls (a re-collection, a UI backfill of `graded_calls`), the assets computed from them without an
API call refresh through Dagster's own `AutomationCondition.eager()`, evaluated by the automation sensor
`refresh_after_collection` (declared RUNNING; the daemon of `dagster dev` evaluates it every 30 s). Never automated:
`graded_calls` and `preflight` (they call the pool: paid on OpenRouter; a collection starts only from a
`recollect_preflight` run, see assets/ops.py), `hub_release` (pushes to the Hub), and `benchmark_report` and
`promotion` when the pool is live (the benchmark calls the routed agents, and the gate reads its evidence); on a pool
of a free kind (`PoolKind.free`: replay) the benchmark costs nothing and refreshes too, and so does the promotion
behind its gate: the schedule retrains, the gate promotes or refuses, a running `serve` follows.

The condition is `eager()` with four changes, each for a case the plain one gets wrong here:
- updates of the collection's inputs (source_tasks, task_pool, agent_pool, preflight) are no trigger: a pre-flight
  on another pool is followed by its collection, and refreshing in between would mix the new pool's agents with the
  old calls;
- updates made by `router-lite run` (runs tagged `router_lite/in_process`) are no trigger: it materialises every stage
  itself, in order, and a daemon on the same instance must not start a second refresh between its stages;
- no refresh while a blocking check of an upstream asset failed (`graded_calls`' no-error-graded, empty rate);
- no refresh while an upstream asset's latest run failed (one failed partition of a re-collection holds it back).
eager()'s own rules stay: nothing while a dependency is missing or in progress (the re-collection sensor submits
every partition's run in one tick, so all are queued before the first finishes), at most one request per update.
"""
from __future__ import annotations

from dagster import (
    AssetSelection,
    AssetSpec,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
)

from resources.pool import pool_kind

IN_PROCESS_TAG = "router_lite/in_process"  # on every run of `router-lite run` (cli/run.py)
SENSOR_TAG = "router_lite/by_sensor"  # an asset tag: materialised by its sensor (the daily `traffic`), not by
# `router-lite run`; unlike opt-in, what depends on it stays a stage (it reads the partitions there are)
OPT_IN_TAG = "router_lite/opt_in"  # an asset tag: not one of `router-lite run`'s stages (cli/run.py), e.g. hub_release
REFRESH_SENSOR = "refresh_after_collection"

# computed from the graded calls without any API call
FREE_REFRESH = ("reward_matrix", "agent_answers", "baselines", "pool_report", "router_head", "registered_head",
                "cascade_router", "registered_cascade", "served_decisions", "phrasings", "router_arena",
                "traffic_rewards")
# calls the routed agents through the pool: automated only where that costs nothing (a free pool kind: replay)
BENCHMARK = "benchmark_report"
# the gated promotion reads the benchmark report's evidence: refreshed after it, so a re-collection's retrained ★ is
# promoted (or refused, its evidence in the UI) without a hand; on a live pool both wait for a run someone starts
PROMOTION = "promotion"
NOT_A_TRIGGER = AssetSelection.assets("source_tasks", "task_pool", "agent_pool", "preflight")
# the daily traffic partitions: a new one is a trigger, the days never materialised (most of the calendar) are no
# missing dependency
SOMETIMES_MISSING = AssetSelection.assets("traffic")


def refresh_condition() -> AutomationCondition:
    """eager(), changed as the module docstring says."""
    updated = (AutomationCondition.newly_updated() & ~AutomationCondition.executed_with_root_target()
               & ~AutomationCondition.all_new_updates_have_run_tags(tag_keys={IN_PROCESS_TAG}))
    eager = AutomationCondition.eager().replace("newly_updated_without_root", updated.with_label(
        "newly_updated_outside_router_lite_run")).ignore(NOT_A_TRIGGER)
    eager = eager.replace("any_deps_missing", AutomationCondition.any_deps_missing().ignore(
        NOT_A_TRIGGER | SOMETIMES_MISSING))
    return (eager & AutomationCondition.all_deps_blocking_checks_passed()
            & ~AutomationCondition.any_deps_match(AutomationCondition.execution_failed()).with_label(
                "any_deps_failed")).with_label("refresh_after_collection")


def refresh_keys(kind: str) -> list[str]:
    """The assets the automation refreshes for a pool of kind `kind` (the benchmark only where calls are free)."""
    return list(FREE_REFRESH) + ([BENCHMARK, PROMOTION] if pool_kind(kind).free else [])


def with_refresh_automation(assets: list, kind: str) -> list:
    """`assets` with `refresh_condition()` on the refreshed ones (the rest untouched)."""
    wanted, cond = set(refresh_keys(kind)), refresh_condition()

    def spec(s: AssetSpec) -> AssetSpec:
        return s.replace_attributes(automation_condition=cond) if s.key.to_user_string() in wanted else s

    return [a.map_asset_specs(spec) if any(k.to_user_string() in wanted for k in a.keys) else a for a in assets]


def refresh_sensor(kind: str) -> AutomationConditionSensorDefinition:
    return AutomationConditionSensorDefinition(
        REFRESH_SENSOR, target=AssetSelection.assets(*refresh_keys(kind)),
        default_status=DefaultSensorStatus.RUNNING, minimum_interval_seconds=30,
        description="Refreshes the assets computed from the graded calls once a collection is complete "
                    "(assets/automation.py); updates made by `router-lite run` are not a trigger.")
