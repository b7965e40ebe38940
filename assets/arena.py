"""Lineage stage 4: RouterArena's measures of every router on the held-out test split (pipeline/report/arena.py):
optimal selection and the optimal-cost ratio from the static matrix, decision robustness under perturbed prompts
(embedded by the lineage's backbone through the embedding cache: a rerun embeds nothing) and the decision latency
per query. The fitted routers are re-run, never refitted: every registered router decides as `serve` decides
(pipeline/route/served.py: the OOD guard, the shortcuts, a cascade's answer-format guess), the prompt-only kinds as
fitted with the guard; `benchmark_report` puts the result into reports/router_value.json (`router_arena`)."""
import numpy as np
import pandas as pd
from dagster import AssetExecutionContext, MetadataValue, Output, asset

from assets.metadata import rounded
from assets.served import served_routers
from pipeline.collect.answers import Agreement, agreement_maker, answers_matrix
from pipeline.core.prompts import task_texts
from pipeline.report import arena
from pipeline.report.value import arena_markdown
from pipeline.route.decisions import CascadeRows, PromptParts, all_decisions, cascade_plans, decision_ms
from pipeline.route.fit import fitted_kinds, reward_arrays, reward_embeddings, training_split
from pipeline.route.fitted import FittedRouter
from pipeline.route.formats import format_guess
from pipeline.route.served import served_all
from pipeline.route.targets import REPORT_TARGETS
from pipeline.route.value import agent_costs
from resources.backbone import BackboneResource
from resources.storage import StorageResource

LATENCY_QUERIES = 100  # test prompts timed one by one (batch size 1, as RouterArena measures): the first 100


@asset(group_name="report", io_manager_key="io_manager",
       description="RouterArena's measures of every router kind and baseline on the held-out test split: optimal "
                   "selection (the cheapest agent that answers correctly), the optimal-cost ratio, decision "
                   "robustness under typo / case-whitespace / template perturbations of the prompt (embedded by the "
                   "backbone, cached), decision latency per query.")
def router_arena(context: AssetExecutionContext, reward_matrix: pd.DataFrame, task_pool: pd.DataFrame,
                 prompt_embeddings: pd.DataFrame, agent_answers: pd.DataFrame, router_head: FittedRouter,
                 cascade_router: FittedRouter, registered_head: dict, registered_cascade: dict,
                 backbone: BackboneResource, storage: StorageResource) -> Output[dict]:
    from pipeline.embed.backbone import EmbeddingCache

    rewards = reward_matrix
    arrays = reward_arrays(rewards, training_split(rewards, task_pool), "test")
    te, agents = arrays.masks["held_out"], arrays.agents
    U, C = arrays.R_eff[te], arrays.C[te]
    X = reward_embeddings(prompt_embeddings, rewards)[te]
    t = rewards[["task_id"]].merge(task_pool, on="task_id", how="left")[te]
    prompts, graders = task_texts(t), t["grader"].to_numpy(dtype=object)  # what serve embeds for each test row
    answers = ([a for a, keep in zip(answers_matrix(agent_answers, rewards["task_id"], agents), te) if keep],
               graders.tolist())
    rows = CascadeRows(U, C, Agreement(*answers), graders)
    companions = router_head.companions
    best = int(router_head["best_single"])
    parts = PromptParts(router_head.router, router_head.guard, companions["scorer"], companions.get("cost_scorer"),
                        router_head["operating_points"], best, agent_costs(arrays.C[arrays.masks["train"]]))
    kinds = fitted_kinds(companions)
    cascades = {f"cascade:{v}": (cascade_plans(s, agents), s["order"], v == "combined")
                for v, s in cascade_router["variants"].items()}

    bb = backbone.get_backbone()
    cache = EmbeddingCache(storage.path("embeddings"))
    routers = served_routers(storage, registered_head, registered_cascade)
    formats = format_guess(task_pool, prompt_embeddings)
    agreement_for = agreement_maker()  # one comparison cache for every answer-format guess

    def decided(X):  # the prompt-only kinds as fitted (guard included), every registered router as served
        return {**all_decisions(parts, kinds, {}, rows, X),
                **served_all(routers, X, REPORT_TARGETS, U, C, answers[0], formats, agreement_for)}

    base = decided(X)
    perturbed = {k: decided(cache.get_or_compute([arena.perturb(p, k) for p in prompts], bb))
                 for k in arena.PERTURBATIONS}  # embedded once: a rerun reads them from the cache
    ms = decision_ms(prompts[:LATENCY_QUERIES], bb.encode, parts, kinds, cascades,
                     CascadeRows(U, C, Agreement(*answers), graders))  # a fresh store: nothing compared yet
    embed = np.asarray(ms.pop("embed"))
    latency = {name: {**arena.latency(embed + np.asarray(v)), "pick": arena.latency(v), "batch_size": 1}
               for name, v in ms.items()}
    out = arena.arena_report(base, perturbed, latency, U, C, best, agents)
    out["backbone"] = {"id": bb.model_id, "backend": bb.backend, "precision": bb.precision}
    md = arena_markdown(out)
    context.log.info("\n" + md)
    return Output(out, metadata=rounded({"n_test": int(te.sum()), "table": MetadataValue.md(md),
                                         "router_arena": MetadataValue.json(out)}))
