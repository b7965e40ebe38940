"""Lineage stage 3: prompt embeddings (frozen backbone) → router head (sep-CMA-ES) → registered head."""
import json
import time
from dataclasses import dataclass

import pandas as pd
from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetExecutionContext,
    AssetIn,
    MetadataValue,
    Output,
    asset,
    asset_check,
)

from assets.collection import pool_of
from assets.metadata import md_table, rounded
from assets.metadata import table as shown_table
from assets.traffic import traffic_calls
from pipeline.collect.answers import Agreement, answers_matrix
from pipeline.core.io import frame_version
from pipeline.core.prompts import task_texts
from pipeline.embed.backbone import EmbeddingCache
from pipeline.report.pool_report import domain_column, labels_of
from pipeline.report.value import prompt_routers_markdown, targets_markdown, value_line
from pipeline.route import registry
from pipeline.route.cascade import CascadeRouter
from pipeline.route.cascade_fit import fit_cascade_router, selection_of
from pipeline.route.fit import fit_router, reward_arrays, reward_embeddings, training_split
from pipeline.route.fitted import FittedRouter
from pipeline.route.learning_rows import learning_rows, routed_traffic, routed_traffic_columns
from pipeline.route.targets import path_table
from resources.backbone import CPU_BACKEND_CHOICE, BackboneResource
from resources.pool import PoolResource
from resources.profile import ProfileResource
from resources.storage import BY_PARTITION, MATERIALISED_ONLY, StorageResource


@asset(group_name="router", io_manager_key="io_manager",
       description="Embeddings of every pool task's user text (the question as a person types it, never the "
                   "benchmark's answer-format template: pipeline.core.prompts.task_texts, what serve embeds too) by "
                   "the frozen backbone, cached by (backbone, text hash).")
def prompt_embeddings(task_pool: pd.DataFrame, backbone: BackboneResource,
                      storage: StorageResource) -> Output[pd.DataFrame]:
    tasks = task_pool
    bb = backbone.get_backbone()
    cache = EmbeddingCache(storage.path("embeddings"))
    before = len(cache.load(bb))
    t0 = time.perf_counter()
    X = cache.get_or_compute(task_texts(tasks), bb)  # its rate lines: pipeline.embed.backbone
    new = len(cache.load(bb)) - before
    df = pd.DataFrame({"task_id": tasks["task_id"], "embedding": list(X)})
    return Output(df, metadata={"rows": len(df), "dim": int(X.shape[1]), "newly_embedded": new,
                                "seconds": round(time.perf_counter() - t0, 2),
                                "backbone": bb.key, "device": str(bb.device), "backend": bb.backend,
                                "precision": bb.precision, "cache_key": bb.cache_key,
                                "cpu_backend_choice": MetadataValue.json(CPU_BACKEND_CHOICE)})


@asset(group_name="router", io_manager_key="io_manager",
       ins={"traffic": AssetIn("traffic", partition_mapping=AllPartitionMapping(),
                               metadata={BY_PARTITION: True, MATERIALISED_ONLY: True})},
       description="The explored, graded traffic requests (`traffic_rewards`) as the routers read them: split, answer "
                   "format (grader), each agent's extracted answer, and the embedding of the text `serve` embedded "
                   "(the same frozen backbone and cache); empty, no backbone loaded, without traffic.")
def traffic_tasks(traffic: dict, traffic_rewards: pd.DataFrame, backbone: BackboneResource,
                  storage: StorageResource) -> Output[pd.DataFrame]:
    calls = traffic_calls(traffic)
    calls = calls[calls["task_id"].isin(traffic_rewards["task_id"])]
    if not len(calls):
        return Output(pd.DataFrame(columns=routed_traffic_columns()), metadata={"rows": 0})
    bb = backbone.get_backbone()
    agents = list(traffic_rewards["agent_order"].iloc[0])
    out = routed_traffic(calls, agents,
                         lambda texts: EmbeddingCache(storage.path("embeddings")).get_or_compute(texts, bb))
    return Output(out, metadata={"rows": len(out), "by_split": MetadataValue.json(out["split"].value_counts()
                                                                                    .to_dict()),
                                 "backbone": bb.key, "precision": bb.precision})


@asset(group_name="router", io_manager_key="router_io_manager",
       description="Router head trained with separable CMA-ES on the static reward matrix (zero API calls), with the "
                   "explored traffic's train and validation rows where a deployment recorded some "
                   "(pipeline/route/learning_rows.py); held-out metrics (the benchmark's test rows) against best "
                   "single, kNN, random and the oracle.")
def router_head(context: AssetExecutionContext, reward_matrix: pd.DataFrame, prompt_embeddings: pd.DataFrame,
                task_pool: pd.DataFrame, traffic_rewards: pd.DataFrame, traffic_tasks: pd.DataFrame,
                profile: ProfileResource) -> Output[FittedRouter]:
    prof = profile.get()
    rewards, tasks, embeddings = learning_rows(reward_matrix, prompt_embeddings, task_pool, traffic_rewards,
                                               traffic_tasks)
    X = reward_embeddings(embeddings, rewards)
    split = training_split(rewards, tasks)
    t = rewards[["task_id"]].merge(tasks, on="task_id", how="left")
    fit = fit_router(X, rewards, split, prof.train, labels=labels_of(t, domain_column(t)), frontier=True)
    curve = pd.DataFrame(fit.curve)
    summary = {"agents": fit.agents, "best_single": fit.best_single, "knn_k": fit.knn_k, "metrics": fit.metrics,
               "extra": fit.extra, "train_config": prof.train.to_dict(),
               "n_params": getattr(fit.head, "n_params", None), "curve": fit.curve,
               "operating_points": fit.operating_points,
               "value": fit.value}
    m = fit.metrics
    context.log.info(f"held-out: head {m['head']:.4f} | best single {m['best_single']:.4f} | kNN {m['knn']:.4f} | "
                     f"oracle {m['oracle']:.4f} | random {m['random']:.4f} | OOD guard fired on "
                     f"{fit.extra['ood_fire_rate']:.1%}")
    ci = {"head": fit.extra["head_gain_ci"], "knn": fit.extra["knn_gain_ci"]}
    table = pd.DataFrame([{"policy": k, "held_out_reward": m[k],
                           "vs best single (95% paired bootstrap CI)": _gain_text(ci[k]) if k in ci else ""}
                          for k in ("head", "best_single", "knn", "random", "oracle")])
    return Output(fit.to_fitted(summary), metadata=rounded({
        "head": m["head"], "best_single": m["best_single"], "knn": m["knn"], "oracle": m["oracle"],
        "random": m["random"], "headroom_captured": m["headroom_captured"], "n_train": m["n_train"],
        "n_test": m["n_test"], "n_params": getattr(fit.head, "n_params", None),
        "traffic_rows_learned": len(rewards) - len(reward_matrix),
        "ood_fire_rate_test": fit.extra["ood_fire_rate"],
        "train_fit": fit.extra["train_fit"], "shipped": fit.extra["gate"]["shipped"],
        "head_vs_best_single": _gain_text(ci["head"]), "knn_vs_best_single": _gain_text(ci["knn"]),
        "gate": MetadataValue.json(fit.extra["gate"]),
        "shipped_router": MetadataValue.json(fit.extra["shipped"]),
        "operating_points_selection": MetadataValue.json(fit.operating_points.get("selection", {})),
        "prompt_routers": MetadataValue.md(prompt_routers_markdown(fit.extra["kinds"], fit.extra["shipped"])),
        "value_line": value_line(fit.value, "parity"),
        "targets_held_out": MetadataValue.md(targets_markdown(fit.value)),
        "operating_points_validation": MetadataValue.md(pd.DataFrame(path_table(fit.operating_points)).to_markdown(
            index=False, floatfmt=".4f")),
        "distribution": MetadataValue.json(m["distribution"]),
        "held_out": shown_table(table),
        "routing": MetadataValue.md(pd.DataFrame(fit.extra["routing"]).to_markdown(index=False, floatfmt=".3f")),
        "training_curve": MetadataValue.md(curve[[c for c in ("generation", "best_reward_so_far", "mean_train_reward",
                                                              "val_reward") if c in curve]].iloc[::5]
                                           .to_markdown(index=False, floatfmt=".4f")),
    }))


def _gain_text(ci: dict) -> str:
    return f"{ci['gain']:+.4f} [{ci['low']:+.4f}, {ci['high']:+.4f}] on {ci['n']} rows"


@asset_check(asset=router_head, description="The head beats uniform random on held-out tasks.")
def head_beats_random(router_head: FittedRouter) -> AssetCheckResult:
    m = router_head["metrics"]
    return AssetCheckResult(passed=bool(m["head"] > m["random"]),
                            metadata={"head": m["head"], "random": m["random"], "best_single": m["best_single"]})


@asset(group_name="router", io_manager_key="io_manager",
       description="The shipped router (the profile's train.router: a head by default) in the registry: stable name "
                   "<kind>-<backbone>-<hash>, manifest, weights, reference code.")
def registered_head(context: AssetExecutionContext, router_head: FittedRouter, task_pool: pd.DataFrame,
                    reward_matrix: pd.DataFrame, prompt_embeddings: pd.DataFrame, preflight: pd.DataFrame,
                    backbone: BackboneResource, pool: PoolResource, storage: StorageResource) -> Output[dict]:
    router = router_head.router
    path, entry = _register(context, router, router_head, _Home(preflight, backbone, pool, storage),
                            training={**router_head["train_config"],
                                      **({"activation": router.activation} if hasattr(router, "activation") else {})},
                            data={"task_pool": task_pool, "reward_matrix": reward_matrix,
                                  "prompt_embeddings": prompt_embeddings},
                            metrics=router_head["metrics"])
    return Output({"name": entry["name"], "path": str(path)},
                  metadata={"name": entry["name"], "path": str(path), "n_params": entry.get("n_params"),
                            "manifest": MetadataValue.json(entry)})


def entry_dir(storage: StorageResource, registered: dict):
    """A registered router's directory in this home's registry, found by its name: a registering asset's stored
    output (`path`: where it was registered) keeps working after the home was moved or copied."""
    return storage.path("registry") / registered["name"]


@dataclass(frozen=True)
class _Home:
    """Where and with what a registering asset registers: the pool's preflight (the agents the head was trained
    on), the backbone, the pool and the home's storage (its registry)."""

    preflight: pd.DataFrame
    backbone: BackboneResource
    pool: PoolResource
    storage: StorageResource


def _register(context, router, router_head: FittedRouter, home: _Home, *, training: dict,
              data: dict[str, pd.DataFrame], metrics: dict):
    """Register `router` (any kind) with the prompt router's guard and scorers, the backbone, the pool's models, the
    data versions of the frames in `data` and the prompt router's operating points: (entry directory, manifest)."""
    preflight, backbone, pool, storage = home.preflight, home.backbone, home.pool, home.storage
    bb = backbone.get_backbone()
    pool = pool_of(pool, preflight)  # the pool the head was trained on (a wider one after re-collection)
    path = registry.register_fitted(
        storage.path("registry"), router, router_head, backbone=bb.manifest_fields(router.d, backbone.model),
        models={a.name: a.model for a in pool.agents()},
        training={**training, "pool": pool.pool, "pool_kind": pool.kind},
        data_hashes={name: frame_version(df) for name, df in data.items()}, metrics=metrics)
    entry = json.loads((path / registry.MANIFEST).read_text())
    context.log.info(f"registered {entry['name']} at {path}")
    return path, entry


@asset(group_name="router", io_manager_key="router_io_manager",
       description="Cascade router fitted on the static matrix from the agents' recorded answers (zero API calls): "
                   "cheap agents asked first, their answer accepted when they agree, else a stronger agent; with and "
                   "without the prompt router's predicted success; operating points chosen on validation or "
                   "cross-fitted over train + validation (the profile's train.operating_points).")
def cascade_router(context: AssetExecutionContext, reward_matrix: pd.DataFrame, agent_answers: pd.DataFrame,
                   prompt_embeddings: pd.DataFrame, task_pool: pd.DataFrame, router_head: FittedRouter,
                   profile: ProfileResource) -> Output[FittedRouter]:
    rewards = reward_matrix
    arrays = reward_arrays(rewards, training_split(rewards, task_pool), "test")
    t = rewards[["task_id"]].merge(task_pool[["task_id", "grader"]], on="task_id", how="left")
    grading: dict = {}  # comparisons without a verdict (grading budget overrun or error): they disagree
    best = router_head["best_single"]
    agreement = Agreement(answers_matrix(agent_answers, rewards["task_id"], arrays.agents),
                          t["grader"].to_numpy().tolist(), stats=grading)  # lazy: only the pairs the plans read
    X = reward_embeddings(prompt_embeddings, rewards)
    router, fit = fit_cascade_router(arrays, agreement, X,
                                     router_head.router, router_head.companions["scorer"], best,
                                     selection=selection_of(router_head["train_config"]))
    _choose_guard_actions(fit, arrays, agreement, X, router_head, profile.get().serve.target)
    summary = {"agents": arrays.agents, "best_single": best, **fit.to_dict()}
    rows = []
    for variant, v in fit.variants.items():
        for name, tg in v.targets.items():
            rows.append({"variant": variant, "target": name, "quality": tg["quality"],
                         "x best quality": tg["quality_ratio"], "x best cost": tg["cost_ratio"],
                         "calls/query": tg["calls_per_query"], "plan": tg["plan"]})
    table = pd.DataFrame(rows)
    context.log.info(f"cascade: chosen variant {fit.chosen} (validation AIQ "
                     + ", ".join(f"{k} {v.aiq_validation:.4f}" for k, v in fit.variants.items()) + ")\n"
                     + table.to_markdown(index=False, floatfmt=".3f"))
    return Output(FittedRouter(router, summary), metadata=rounded({
        "chosen": fit.chosen, "validation_rows": fit.validation_rows, **grading,
        "selection": MetadataValue.json(fit.selection),
        **{f"aiq_validation_{k}": v.aiq_validation for k, v in fit.variants.items()},
        **{f"aiq_test_{k}": v.aiq_test for k, v in fit.variants.items()},
        "targets_held_out": md_table(table, floatfmt=".3f"),  # `|` escaped, a plan one line per answer format
    }))


def _choose_guard_actions(fit, arrays, agreement, X, router_head: FittedRouter, target: str) -> None:
    """Each variant's guard action at the serving target, chosen on the validation rows (pipeline/route/
    guard_action.py), written into its path (what the registry stores and serve reads)."""
    from pipeline.route.cascade_fit import Rows
    from pipeline.route.guard_action import choose_for_path

    va = arrays.masks["validation"]
    if router_head.guard is None or not va.any():
        return
    fired = router_head.guard.fires(X[va])
    rows = Rows(arrays.R_eff[va], arrays.C[va], agreement[va], router_head.companions["scorer"].scores(X[va]),
                agreement.graders[va])
    for v in fit.variants.values():
        action, evidence = choose_for_path(v.path, arrays.agents, v.order, rows, fired, int(router_head["best_single"]),
                                           target)
        v.path["guard_action"], v.path["guard_evidence"] = action, evidence


@asset(group_name="router", io_manager_key="io_manager",
       description="The cascade in the registry: stable name cascade-<backbone>-<hash>, manifest, its policies, the "
                   "prompt router it falls back on; each variant fitted (answers only, combined) registered too, so "
                   "`promotion` can serve any of them.")
def registered_cascade(context: AssetExecutionContext, cascade_router: FittedRouter, router_head: FittedRouter,
                       task_pool: pd.DataFrame, reward_matrix: pd.DataFrame, agent_answers: pd.DataFrame,
                       prompt_embeddings: pd.DataFrame, preflight: pd.DataFrame, backbone: BackboneResource,
                       pool: PoolResource, storage: StorageResource) -> Output[dict]:
    chosen, fallback = cascade_router["chosen"], cascade_router.router.fallback
    variants = {}
    for variant, v in cascade_router["variants"].items():  # the chosen one is the router the lineage fitted
        router = cascade_router.router if variant == chosen else CascadeRouter(fallback, v["path"], v["order"],
                                                                               cascade_router["agents"])
        path, entry = _register(context, router, router_head, _Home(preflight, backbone, pool, storage),
                                training={"variant": variant, "guard_z": cascade_router["guard_z"],
                                          "selection": cascade_router.summary.get("selection")},
                                data={"task_pool": task_pool, "reward_matrix": reward_matrix,
                                      "agent_answers": agent_answers, "prompt_embeddings": prompt_embeddings},
                                metrics={k: w["aiq_validation"] for k, w in cascade_router["variants"].items()})
        variants[variant] = {"name": entry["name"], "path": str(path), "manifest": entry}
    main = variants[chosen]
    return Output({"name": main["name"], "path": main["path"],
                   "variants": {k: {"name": v["name"], "path": v["path"]} for k, v in variants.items()}},
                  metadata={"name": main["name"], "path": main["path"],
                            "manifest": MetadataValue.json(main["manifest"]),
                            "variants": MetadataValue.json({k: v["name"] for k, v in variants.items()})})
