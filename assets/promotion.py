"""Lineage stage 5: promotion, the one writer of the served pointer registry/latest.json (a deployment asset).

Downstream of the registered routers and the benchmark report: it picks the run's candidate at the profile's
`serve.target` on cross-fitted rows, gates it against the promoted router on held-out rows and, when it passes,
re-points latest.json and appends the history (pipeline/report/promotion.py says the rules; pipeline/route/pointer.py
the files). A refused candidate leaves the pointer as it was; the verdict, its evidence and the history are the
asset's metadata. `router-lite promote NAME` / `router-lite rollback` are the operator's override.
"""
import numpy as np
import pandas as pd
from dagster import AssetExecutionContext, AssetKey, MetadataValue, Output, asset

from assets.benchmark import head_validation_aiq
from assets.metadata import md_table, rounded
from assets.router import entry_dir
from pipeline.collect.answers import Agreement, answers_matrix
from pipeline.collect.rewards import replied_rows
from pipeline.report import promotion as gate_rules
from pipeline.report.value import mark_served_reports, star_line
from pipeline.route import pointer, registry
from pipeline.route.fit import reward_arrays, reward_embeddings, training_split
from pipeline.route.fitted import FittedRouter
from pipeline.route.formats import format_guess
from pipeline.route.learning_rows import HELD_OUT_SPLITS, learning_rows, traffic_answers
from pipeline.route.targets import parse_target
from resources.profile import ProfileResource
from resources.storage import StorageResource

HISTORY_SHOWN = 20  # latest lines of the history in the UI


def held_out(reward_matrix: pd.DataFrame, task_pool: pd.DataFrame, prompt_embeddings: pd.DataFrame,
             agent_answers: pd.DataFrame, best_single: int, formats=None) -> gate_rules.HeldOut:
    """The run's held-out test rows, as the value report scores them (effective rewards, OOD tasks apart; a cascade
    decides with the answer-format guess serve has: `formats`, else the one of these tasks)."""
    arrays = reward_arrays(reward_matrix, training_split(reward_matrix, task_pool), "test")
    te = arrays.masks["held_out"]
    ids = reward_matrix["task_id"].astype(str).to_numpy()[te]
    pool = reward_matrix[["task_id"]].merge(task_pool[["task_id", "grader", "source"]], on="task_id", how="left")
    if "source" in reward_matrix:  # reward rows that carry their source (the traffic rows) say it themselves
        pool["source"] = reward_matrix["source"].reset_index(drop=True).fillna(pool["source"])
    return gate_rules.HeldOut(list(ids), reward_embeddings(prompt_embeddings, reward_matrix)[te], arrays.R_eff[te],
                              arrays.C[te], answers_matrix(agent_answers, reward_matrix["task_id"][te],
                                                           arrays.agents),
                              pool["grader"].to_numpy(dtype=object)[te], list(arrays.agents), best_single,
                              formats or format_guess(task_pool, prompt_embeddings),  # decided as serve decides
                              pool["source"].fillna("").astype(str).to_numpy()[te],  # traffic rows apart
                              replied_rows(reward_matrix)[te])  # the traffic rows every agent replied to


def held_out_with_traffic(reward_matrix: pd.DataFrame, task_pool: pd.DataFrame, prompt_embeddings: pd.DataFrame,
                          agent_answers: pd.DataFrame, best_single: int, traffic: tuple) -> gate_rules.HeldOut:
    """The benchmark's test rows and the explored traffic's (`traffic`: traffic_rewards, traffic_tasks), their
    answer format guessed from the benchmark's tasks only."""
    traffic_rewards, traffic_tasks = traffic
    rewards, tasks, embeddings = learning_rows(reward_matrix, prompt_embeddings, task_pool, traffic_rewards,
                                               traffic_tasks, splits=HELD_OUT_SPLITS)
    return held_out(rewards, tasks, embeddings, traffic_answers(agent_answers, traffic_tasks), best_single,
                    formats=format_guess(task_pool, prompt_embeddings))


def history_table(root) -> MetadataValue:
    rows = [{"at": r.get("at"), "action": r.get("action"), "by": r.get("by"), "router": r.get("name"),
             "kind": r.get("kind"), "target": r.get("target"), "previous": (r.get("previous") or {}).get("name"),
             "reason": r.get("reason")} for r in pointer.history(root)[-HISTORY_SHOWN:]]
    return md_table(pd.DataFrame(rows, columns=["at", "action", "by", "router", "kind", "target", "previous",
                                                "reason"]))


@asset(group_name="registry", io_manager_key="io_manager", deps=[AssetKey("benchmark_report")],
       description="The router `serve` follows (registry/latest.json, written by this asset only): the run's router "
                   "chosen at the serving target on cross-fitted rows, promoted only when a gate passes: its "
                   "held-out value against the promoted router's on the same benchmark test rows (paired CI: not "
                   "worse beyond noise, not dearer), or on its own evidence when they cannot be paired; and on the "
                   "held-out traffic rows every agent replied to (paired CI; a candidate worse there is refused, "
                   "fewer than 30 rows do not block). History: registry/promotions.jsonl.")
def promotion(context: AssetExecutionContext, registered_head: dict, registered_cascade: dict,
              router_head: FittedRouter, cascade_router: FittedRouter, reward_matrix: pd.DataFrame,
              task_pool: pd.DataFrame, prompt_embeddings: pd.DataFrame, agent_answers: pd.DataFrame,
              traffic_rewards: pd.DataFrame, traffic_tasks: pd.DataFrame, profile: ProfileResource,
              storage: StorageResource) -> Output[dict]:
    root = storage.path("registry")
    target = parse_target(profile.get().serve.target).name
    entries = {"head": registered_head,
               **{f"cascade:{v}": e for v, e in (registered_cascade.get("variants")
                                                 or {cascade_router["chosen"]: registered_cascade}).items()}}
    dirs = {k: entry_dir(storage, e) for k, e in entries.items()}
    regs = {k: registry.load(d) for k, d in dirs.items()}
    figures = gate_rules.candidate_figures(regs, target)
    key, rule = gate_rules.choose(figures, target)
    reg = regs[key]
    rows = held_out_with_traffic(reward_matrix, task_pool, prompt_embeddings, agent_answers,
                                 router_head["best_single"], (traffic_rewards, traffic_tasks))
    reward, cost = gate_rules.held_out_outcome(reg, target, rows, Agreement(rows.answers, rows.graders.tolist()))
    ev = gate_rules.evidence(reg.name, key, target, rows, reward, cost)
    aiq = {"head": head_validation_aiq(router_head, reward_matrix, training_split(reward_matrix, task_pool)),
           **{f"cascade:{v}": w["aiq_validation"] for v, w in cascade_router["variants"].items()}}
    candidate = gate_rules.star(key, reg, target, figures[key], ev["held_out"], aiq.get(key))
    entry = {"name": reg.name, "path": str(dirs[key]), "kind": reg.kind, "target": target,
             "head": {"name": registered_head["name"], "path": str(dirs["head"])},
             "star": {**candidate, "rule": rule}}
    action, verdict = gate_rules.decide(root, entry, ev, rows)
    served = registry.latest_entry(root)
    mark_served_reports(storage.path("reports"), served, {k: r.name for k, r in regs.items()}, target,
                        {a["name"]: a["model"] for a in reg.agents})  # the one ★: the router served
    for line in gate_rules.verdict_lines(verdict, action):  # what it would replace, how judged, why
        context.log.info(f"promotion: {line}")
    context.log.info(f"promotion: candidate chosen by {rule}; served now: {served['name'] if served else 'none'}")
    candidates = pd.DataFrame([{"router": k + (" (candidate)" if k == key else ""), "name": regs[k].name,
                                "cross-fitted quality": f["quality"], "quality ratio": f["quality_ratio"],
                                "cost per 1k": f["cost_per_1k"], "cost ratio": f["cost_ratio"]}
                               for k, f in figures.items()])
    return Output({"action": action, "candidate": reg.name, "router": key, "served": served and served["name"],
                   "target": target, "verdict": gate_rules.verdict_summary(verdict)},
                  metadata=rounded({  # one headline: the router served now (the ★), whatever the verdict
                      "headline": star_line(served["star"], served["name"]) if served and served.get("star")
                      else f"served: {served['name'] if served else 'none'}",
                      "action": action, "candidate": reg.name, "candidate_router": key,
                      "served": served["name"] if served else "", "target": target, "choice_rule": rule,
                      "replaces": verdict.get("replaces") or "", "dearer": bool(verdict.get("dearer")),
                      "gate_passed": bool(verdict["passed"]), "gate_mode": verdict["mode"],
                      "gate_rule": verdict["rule"] or "", "gate_reason": verdict["reason"],
                      # each kind of evidence on a line of its own, and side by side in a table
                      "gate_benchmark": verdict["benchmark_reason"], "gate_traffic": verdict["traffic"]["reason"],
                      "gate_traffic_rows": verdict["traffic"]["n"], "gate_traffic_rule": verdict["traffic"]["rule"],
                      "gate_evidence": md_table(pd.DataFrame(gate_rules.evidence_rows(verdict)), floatfmt=".4f"),
                      "candidates": md_table(candidates, floatfmt=".4f"),
                      "verdict": MetadataValue.json(_jsonable(verdict)),
                      "history": history_table(root)}))


def _jsonable(d):
    """numpy scalars as plain numbers (MetadataValue.json)."""
    if isinstance(d, dict):
        return {k: _jsonable(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_jsonable(v) for v in d]
    return d.item() if isinstance(d, np.generic) else d
