"""Lineage stage 3a: the pool report — is this pool complementary or quality-dominated?
(pipeline/report/pool_report.py)"""
import pandas as pd
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    MetadataValue,
    Output,
    asset,
    asset_check,
)

from assets.collection import cost_lower_bounds, pool_of, quarantine_of
from assets.served import served_figures_of
from pipeline.collect.rewards import costs_are_estimated, to_arrays
from pipeline.core.io import atomic_write_json, atomic_write_text
from pipeline.report.pool_report import WARNING, cascade_pays, domain_column, labels_of, report_markdown
from pipeline.report.pool_report import pool_report as build_report
from pipeline.route.fit import reward_embeddings, training_split
from pipeline.route.fitted import FittedRouter
from resources.pool import PoolResource
from resources.profile import ProfileResource
from resources.storage import StorageResource


def _as_served(summary: dict, rewards: pd.DataFrame, tasks: pd.DataFrame, decisions: pd.DataFrame) -> dict:
    """The cascade fit's summary with each variant's held-out targets as served (`served_decisions`), so the pool
    report says what the benchmark report says."""
    served = served_figures_of(rewards, tasks, int(summary["best_single"]), decisions)
    variants = {v: {**s, "targets": {t: {**s.get("targets", {}).get(t, {}), **fig}  # the fit's plan and λ kept
                                     for t, fig in served.get(f"cascade:{v}", {}).items()} or s.get("targets", {})}
                for v, s in (summary.get("variants") or {}).items()}
    return {**summary, "variants": variants}


@asset(group_name="report", io_manager_key="io_manager",
       description="Pool report: accuracy with 95 % CI per agent × domain and × difficulty, the leader of each "
                   "domain, the verdict (quality-dominated or complementary) and the routable headroom "
                   "(label router and kNN, 5-fold CV on the training split); whether a cascade pays (the "
                   "answers-only cascade as served on held-out test: served_decisions); the agents the collection "
                   "quality rules quarantined, with their reasons, "
                   "and the costs that are only lower bounds.")
def pool_report(context: AssetExecutionContext, reward_matrix: pd.DataFrame, task_pool: pd.DataFrame,
                prompt_embeddings: pd.DataFrame, cascade_router: FittedRouter, served_decisions: pd.DataFrame,
                graded_calls: pd.DataFrame, preflight: pd.DataFrame, pool: PoolResource, profile: ProfileResource,
                storage: StorageResource) -> Output[dict]:
    rewards, tasks = reward_matrix, task_pool
    t = rewards[["task_id"]].merge(tasks, on="task_id", how="left")
    agents, R, _, C = to_arrays(rewards)
    col = domain_column(t)
    split = training_split(rewards, tasks).to_numpy(dtype=object)
    rep = build_report(R, C, agents, labels_of(t, col), split, X=reward_embeddings(prompt_embeddings, rewards),
                       difficulty=labels_of(t, "difficulty") if "difficulty" in t else None, domain_name=col)
    rep["costs_estimated"] = costs_are_estimated(rewards)
    rep["cascade"] = cascade_pays(_as_served(cascade_router.summary, rewards, tasks, served_decisions),
                                  int((split == "test").sum()))  # the lineage's own cascade, as serve decides
    # the agents the collection quality rules left out, and the costs that are only lower bounds
    rep["quarantined"] = quarantine_of(profile.get(), graded_calls)
    rep["cost_lower_bound"] = (cost_lower_bounds(pool_of(pool, preflight), agents)
                               if costs_are_estimated(rewards) else {})
    md = report_markdown(rep)
    atomic_write_text(md, storage.path("reports") / "pool_report.md")
    atomic_write_json(rep, storage.path("reports") / "pool_report.json")
    context.log.info("\n" + md)
    h = rep["headroom"]
    return Output(rep, metadata={
        "verdict": rep["verdict"]["text"], "domain_column": col or "(none)",
        "report": MetadataValue.md(md),
        "by_domain": MetadataValue.md(pd.DataFrame(rep["by_domain"]).to_markdown(index=False, floatfmt=".3f")),
        "by_difficulty": MetadataValue.md(pd.DataFrame(rep.get("by_difficulty", [])).to_markdown(
            index=False, floatfmt=".3f")),
        "label_router_cv_gain": h.get("label_router", {}).get("gain"),
        "knn_cv_gain": h.get("knn", {}).get("gain"), "oracle_headroom": h["oracle_headroom"],
        "cascade_pays": rep["cascade"]["text"] if rep["cascade"] else "(no answers-only cascade fitted)",
        "quarantined": MetadataValue.json(rep["quarantined"]),
        "cost_lower_bound": MetadataValue.json(rep["cost_lower_bound"]),
    })


@asset_check(asset=pool_report, description="Warns (does not fail) when one agent leads every domain: "
                                            + WARNING + ".")
def pool_is_complementary(pool_report: dict) -> AssetCheckResult:
    v = pool_report["verdict"]
    dominated = v["kind"] == "quality-dominated"
    return AssetCheckResult(passed=not dominated, severity=AssetCheckSeverity.WARN,
                            description=f"{v['text']}" + (f": {WARNING}" if dominated else ""),
                            metadata={"verdict": v["text"]})
