"""The collection's forecast, budget and completeness, wired to the profile's storage. The logic is in
`pipeline.collect.forecast` and `pipeline.collect.budget`; `assets/collection.py` and `router-lite forecast` call
these helpers, so both show the same figures."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue

from pipeline.collect.agents import AgentSpec
from pipeline.collect.budget import Budget, check_max_usd, collection_state, stop_line
from pipeline.collect.call_log import CallLog
from pipeline.collect.call_log_lock import collection_lock
from pipeline.collect.forecast import completion_lengths, forecast, forecast_line, forecast_table
from pipeline.profile import Profile
from resources.storage import StorageResource

MISSING_SHOWN = 5  # missing cells named in a check's description


def collection_dirs(storage: StorageResource, kind: str, prof: Profile) -> list[Path]:
    """The call-log directory of every partition (source x repetition) of the profile's collection."""
    return [storage.calls_dir(kind, s, r) for s in prof.sources for r in range(prof.repetitions)]


def logged_calls(dirs: list[Path]) -> pd.DataFrame:
    """Every row of the call logs in `dirs` (empty frame when none)."""
    frames = [CallLog(d).read() for d in dirs]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["call_key", "agent", "status", "settings_hash", "completion_tokens", "cost_usd"])


def collection_forecast(prof: Profile, kind: str, storage: StorageResource, task_pool: pd.DataFrame,
                        agents: list[AgentSpec], preflight: pd.DataFrame | None = None,
                        live_prices: dict | None = None, sampled: dict[str, float] | None = None) -> dict:
    """The forecast of the profile's collection from what its call logs already hold (`sampled`: the new agents
    asked on a sample, agent -> fraction; `sampled_fractions`)."""
    calls = logged_calls(collection_dirs(storage, kind, prof))
    sh = prof.collection.hash()
    same = calls[calls["settings_hash"] == sh] if len(calls) else calls
    done = same.loc[same["status"].isin(("ok", "empty")), "call_key"] if len(same) else []
    lengths = completion_lengths(same, preflight)
    return forecast(task_pool, agents, prof.repetitions, prof.collection, done, lengths, live_prices, sampled)


def forecast_metadata(fc: dict) -> dict:
    """Dagster metadata of a forecast (the pre-flight's, before the collection calls)."""
    return {"forecast": forecast_line(fc), "forecast_calls": fc["calls"],
            "forecast_usd_low": round(fc["usd_low"], 6), "forecast_usd_high": round(fc["usd_high"], 6),
            "forecast_table": MetadataValue.md("```\n" + forecast_table(fc) + "\n```")}


@contextlib.contextmanager
def budget_lock(storage: StorageResource, kind: str, prof: Profile, max_usd: float | None) -> Iterator[None]:
    """With a budget, the partitions of the collection collect one at a time (a UI backfill's included): each holds
    the lock of `calls/<kind>/.budget` while it reads what was spent and collects. Without one, nothing is held."""
    if max_usd is None and prof.collection.max_usd is None:
        yield
        return
    with collection_lock(storage.path("calls", kind, ".budget"), "the budgeted collection", wait=None):
        yield


def partition_budget(prof: Profile, max_usd: float | None, kind: str, storage: StorageResource,
                     task_pool: pd.DataFrame, agents: list[AgentSpec]) -> Budget | None:
    """The budget of one partition's collection: `max_usd` (run config) else the profile's, less what the whole
    collection already spent; None without a budget."""
    limit = check_max_usd(max_usd, "--max-usd") if max_usd is not None else prof.collection.max_usd
    if limit is None:
        return None
    state = collection_state(collection_dirs(storage, kind, prof), task_pool, agents, prof.repetitions,
                             prof.collection.hash())
    return Budget(limit, state["spent"], prof.collection.max_tokens)


def budget_check(prof: Profile, budget: Budget | None, kind: str, storage: StorageResource, task_pool: pd.DataFrame,
                 agents: list[AgentSpec]) -> AssetCheckResult:
    """`within_budget` of a graded_calls partition: fails (blocking) when the budget stopped the collection, with the
    stop line (spent, remaining calls, how to resume)."""
    if budget is None or not budget.stopped:
        meta = {} if budget is None else {"spent_usd": round(budget.spent, 6), "max_usd": budget.max_usd}
        return AssetCheckResult(check_name="within_budget", passed=True, metadata=meta)
    state = collection_state(collection_dirs(storage, kind, prof), task_pool, agents, prof.repetitions,
                             prof.collection.hash())
    return AssetCheckResult(check_name="within_budget", passed=False, description=stop_line(budget, state),
                            metadata={"spent_usd": round(state["spent"], 6), "max_usd": budget.max_usd,
                                      "remaining_calls": len(state["missing"]), "wanted_calls": state["wanted"]})


def missing_cells(calls: pd.DataFrame, task_pool: pd.DataFrame, agents: list[str], repetitions: int) -> list[tuple]:
    """(agent, task_id, repetition) of the matrix without a call row (an error row counts as made)."""
    have = set(zip(calls["agent"], calls["task_id"].astype(str), calls["repetition"].astype(int))) if len(calls) \
        else set()
    return [(a, str(t), r) for t in task_pool["task_id"] for a in agents for r in range(repetitions)
            if (a, str(t), r) not in have]


def matrix_complete_check(calls: pd.DataFrame, task_pool: pd.DataFrame, agents: list[str],
                          repetitions: int, on_purpose: list[str] | tuple = (),
                          joining: list[str] | tuple = ()) -> AssetCheckResult:
    """`matrix_complete` of the reward matrix (blocking): every (agent, task, repetition) cell was collected, but
    the cells of `on_purpose` agents (new agents asked on a sample, `collection.new_agent_sample`: estimated and
    marked `imputed` in the matrix), counted apart. `joining`: sampled agents that may join the frontier, whose
    missing cells the next collection makes: the check fails, saying so, until it has (no router is trained on them
    meanwhile)."""
    missing = missing_cells(calls, task_pool, agents, repetitions)
    sampled = set(on_purpose)
    imputed = sum(1 for a, _, _ in missing if a in sampled)
    missing = [m for m in missing if m[0] not in sampled]
    n = len(task_pool) * len(agents) * repetitions
    shown = ", ".join(f"{a}/{t}/rep{r}" for a, t, r in missing[:MISSING_SHOWN])
    pending = sorted({a for a, _, _ in missing if a in set(joining)})
    planned = bool(pending) and all(a in pending for a, _, _ in missing)
    if planned:
        why = (f"planned stop: {len(missing):,} cells of new agents that may join the frontier ({', '.join(pending)}) "
               "are not collected yet, so no router is trained on their estimates; next: the collection of their "
               "remaining calls (recollect_complete_joiners requests collection_job on every partition; without a "
               "daemon, `router-lite run` again), then the routers are retrained and the promotion's gate decides")
    else:
        why = (f"{len(missing):,} of {n:,} cells (agent/task/repetition) were never collected, e.g. {shown}: "
               f"finish the collection (router-lite run, with a higher --max-usd if a budget stopped it)")
    # a planned stop is a warning, not an error: the step and the run succeed (no stack trace), the asset's output
    # is withheld so that nothing downstream runs (`reward_matrix`), and the check says who may join and what is next
    return AssetCheckResult(
        check_name="matrix_complete", passed=not missing,
        severity=AssetCheckSeverity.WARN if planned else AssetCheckSeverity.ERROR,
        metadata={"missing_cells": len(missing), "cells": n, "sampled_out_cells": imputed,
                  "joining": MetadataValue.json(pending), "planned_stop": planned},
        description=why if missing else None)


def planned_stop(check: AssetCheckResult) -> list[str]:
    """The new agents a `matrix_complete` result stops for as planned (empty: no planned stop)."""
    meta = check.metadata or {}
    planned = getattr(meta.get("planned_stop"), "value", meta.get("planned_stop"))
    joining = getattr(meta.get("joining"), "value", None) or []
    return list(joining) if planned else []
