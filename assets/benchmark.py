"""Lineage stage 4: the benchmark report (routed benchmark with real replies + cost–quality frontier), the
RouterBench-style replication per suite and its summary over every suite."""
import base64
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from dagster import (
    AssetExecutionContext,
    AssetIn,
    Config,
    MetadataValue,
    Output,
    StaticPartitionsDefinition,
    asset,
)
from pydantic import Field

from assets.collection import passed_agents, pool_of
from assets.metadata import rounded
from assets.router import entry_dir
from assets.served import served_figures_of
from pipeline.collect.call_log import CallLog
from pipeline.collect.calls import run_collect
from pipeline.collect.rewards import cost_basis, costs_estimated, to_arrays
from pipeline.collect.sampling import imputed_cells
from pipeline.core.errors import RouterLiteError
from pipeline.core.io import atomic_write_json, atomic_write_text
from pipeline.core.prompts import task_texts
from pipeline.embed.backbone import EmbeddingCache
from pipeline.profile import BENCHMARK_SUITES
from pipeline.report.benchmark import (
    CASCADE_POLICY_NAMES,
    CASCADE_TARGETS,
    HEAD,
    HEAD_LAMBDA,
    HEAD_POINTS,
    HEAD_SCORE_SWEEP,
    KNN,
    benchmark_from_tasks,
    cascade_benchmark,
    cascade_line,
    head_aiq,
    load_benchmark,
    report_markdown,
    score,
    variant_markdown,
)
from pipeline.report.frontier import (
    HULL,
    PRIOR,
    PointSet,
    baseline_policies,
    cost_span,
    frontier_points,
    plot_frontier,
    policy_table,
    router_policies,
)
from pipeline.report.phrasing import phrasing_markdown
from pipeline.report.replication import replicate, summary_markdown, table_markdown
from pipeline.report.suites import build_suite
from pipeline.report.value import (
    ROUTER_LABELS,
    SERVED_PENDING,
    CascadeFigures,
    HeadFigures,
    ablation_markdown,
    arena_markdown,
    report_headline,
    router_value,
    targets_markdown,
    with_held_out_served,
)
from pipeline.route import registry
from pipeline.route.cascade_fit import path_aiq
from pipeline.route.fit import fitted_knn, reward_embeddings, training_split
from pipeline.route.fitted import FittedRouter
from pipeline.route.targets import parse_target
from resources.backbone import BackboneResource
from resources.pool import PoolResource
from resources.profile import ProfileResource
from resources.storage import BY_PARTITION, StorageResource

SUITES = list(BENCHMARK_SUITES)  # the last two: the active profile's own matrix


def suite_partitions_for(suites=()) -> StaticPartitionsDefinition:
    """The replication suites of a profile (`benchmark.suites`; () = every suite)."""
    return StaticPartitionsDefinition(list(suites) or SUITES)


def _png_markdown(path: Path) -> MetadataValue:
    """A PNG inlined in Markdown metadata, so the Dagster UI shows the plot."""
    data = base64.b64encode(path.read_bytes()).decode()
    return MetadataValue.md(f"![{path.name}](data:image/png;base64,{data})")


def _variants(prof, tasks: pd.DataFrame) -> dict[str, pd.DataFrame]:
    test = tasks[tasks["split"] == "test"]
    out = {"test": benchmark_from_tasks(test[~test["ood"]])}
    if test["ood"].any():
        out["ood"] = benchmark_from_tasks(test[test["ood"]])
    if prof.benchmark.file:
        out["file"] = load_benchmark(prof.benchmark.file)
    return out


def _frontier(rewards: pd.DataFrame, split: pd.Series, X: np.ndarray, reg, knn,
              cascade: dict | None = None, sweep: dict | None = None):
    """The frontier table on the held-out test split and each policy's points (plotted once the ★ is known); `knn`:
    the kNN baseline `router_head` fitted (on the train rows, k chosen on validation), not fitted again here."""
    agents, R, _, C = to_arrays(rewards)
    tr, te = (split == "train").to_numpy(), (split == "test").to_numpy()
    policies = baseline_policies(R[te], C[te], R[tr], agents)
    # the head's own frontier, two ways (docs/training.md): its scores λ-swept, or one sep-CMA-ES head per λ
    # (pipeline.route.train.lambda_sweep); "trained head" is the one better on validation, the other is shown too
    lam_kept = bool(sweep) and sweep.get("kept", "lambda-trained") == "lambda-trained"
    policies.update(router_policies({KNN: knn,
                                     HEAD_SCORE_SWEEP if lam_kept else HEAD: reg.router}, X[te]))
    if sweep:
        policies[HEAD if lam_kept else HEAD_LAMBDA] = PointSet(np.array(sweep["points_test"]))
    if reg.scorer is not None and reg.operating_points:  # what the router does at each stored λ (guard included)
        rows = np.arange(int(te.sum()))
        pts = []
        for p in reg.operating_points["points"]:
            picks, _ = reg.route(X[te], None if p["lambda"] == 0 else f"lambda={p['lambda']!r}")
            pts.append((C[te][rows, picks].mean(), R[te][rows, picks].mean()))
        policies[HEAD_POINTS] = PointSet(np.array(pts))
    for variant, v in (cascade or {}).get("variants", {}).items():  # each cascade plan of the train frontier, on test
        policies[CASCADE_POLICY_NAMES[variant]] = PointSet(np.array(v["points_test"]))
    table = policy_table(policies, R[te], C[te])
    table.attrs["n_train"], table.attrs["n_test"] = int(tr.sum()), int(te.sum())
    return table, frontier_points(policies, R[te], C[te])


def _plot(points: dict, rv: dict, png: Path, estimated: bool) -> Path:
    """The frontier plot, the named targets of the best validation AIQ router marked (router_value.json's
    `best_router`; drawn before the promotion names the router served, so not called the ★)."""
    best = rv["best_router"]
    marks = {name: (t["cost_per_1k"] / 1000.0, t["quality"]) for name, t in rv["routers"][best]["targets"].items()}
    return plot_frontier(points, png, title=f"Cost–quality frontier (held-out test); marked: "
                                            f"{ROUTER_LABELS.get(best, best)} at its named targets", marks=marks,
                         cost_label="estimated cost per example (USD)" if estimated else "cost per example (USD)")


@dataclass
class _Routed:
    """What the routed benchmarks gave: Markdown lines (prompt router, cascade), per-question frames, summaries per
    variant (and target, for the cascade), whether the test variant's costs are estimates."""

    md: list = field(default_factory=list)
    cascade_md: list = field(default_factory=list)
    per_question: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    cascade_meta: dict = field(default_factory=dict)
    estimated: bool = False


@dataclass(frozen=True)
class _UnderTest:
    """The registered routers the routed benchmark calls through: the prompt router `head` at `target`, the
    cascade `cascade` at each of its targets."""

    head: object
    target: str
    cascade: object


def _routed(prof, task_pool: pd.DataFrame, routers: _UnderTest, specs: list, pool: PoolResource,
            backbone: BackboneResource, storage: StorageResource) -> _Routed:
    """One loop over the benchmark variants, each embedded once: the prompt router at its target picks one agent
    per question, which is really called; the cascade at each of its targets makes every stage's calls (its
    own call log: a call one target made is not made again for another). Every reply is scored."""
    reg, target, regc = routers.head, routers.target, routers.cascade
    agents = [a.name for a in specs]
    bb = backbone.get_backbone()
    cache = EmbeddingCache(storage.path("embeddings"))
    reports = storage.path("reports")
    cascade_targets = list(dict.fromkeys([regc.router.resolve(t)["target"]  # the serving target: the headline's
                                          for t in (target, *CASCADE_TARGETS, prof.serve.target)]))
    out = _Routed()
    for variant, bench in _variants(prof, task_pool).items():
        X = cache.get_or_compute(task_texts(bench), bb)  # the user text, as serve embeds it
        picks, fired = reg.route(X, target)
        log = CallLog(storage.path("calls", pool.kind, "benchmark", variant))
        calls = run_collect(bench.rename(columns={"id": "task_id"}), specs, 0, log, pool.client_for, prof.collection)
        res = score(bench, picks, fired, calls, agents)
        if variant == "test":  # replayed token counts are estimates
            out.estimated = costs_estimated(calls)
        res["per_question"].to_csv(reports / f"benchmark_{variant}.csv", index=False)
        out.md += variant_markdown(variant, res, cost_basis(calls) if variant == "test" else None)
        out.meta[variant] = res["summary"]
        out.per_question.append(res["per_question"].assign(variant=variant))
        log = CallLog(storage.path("calls", pool.kind, "benchmark_cascade", variant))

        def collect(j, rows, log=log):
            return run_collect(rows.rename(columns={"id": "task_id"}), _judged_with(rows, specs, j, prof), 0, log,
                               pool.client_for, prof.collection)

        for t in cascade_targets:
            res = cascade_benchmark(bench, X, lambda g, t=t: regc.cascade_at(t, g), collect, regc.router.order, agents)
            name = regc.router.resolve(t)["target"]
            res["per_question"].to_csv(reports / f"benchmark_cascade_{variant}_{_slug(name)}.csv", index=False)
            out.cascade_md.append(cascade_line(variant, name, res["summary"]))
            out.cascade_meta.setdefault(variant, {})[name] = res["summary"]
    return out


def _embedded_by(bb) -> dict:
    """What embedded the prompts, as it really ran (after any backend fallback)."""
    return {"id": bb.model_id, "backend": bb.backend, "precision": bb.precision}


def _slug(target: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in target)


class BenchmarkConfig(Config):
    """Run config of `benchmark_report` (launchpad: `ops: {benchmark_report: {config: {target: parity}}}`;
    `router-lite run --target`)."""

    target: str = Field(default="", description="Operating point of the routed benchmark: max-quality, parity, "
                                                 "quality>=F, budget=USD per 1k queries, lambda=L; empty: the "
                                                 "profile's benchmark.target.")


def _passed_specs(pool, preflight: pd.DataFrame, reg) -> list:
    """The pool's specs of the router's agents (in its order); an agent that did not pass preflight -> one error."""
    specs = {a.name: a for a in passed_agents(pool, preflight)}
    agents = [a["name"] for a in reg.agents]
    missing = [a for a in agents if a not in specs]
    if missing:
        raise RouterLiteError(f"head {reg.name} routes to {missing}, which are not in the passed pool agents")
    return [specs[a] for a in agents]


def head_validation_aiq(router_head: FittedRouter, rewards: pd.DataFrame, split: pd.Series) -> float:
    """The prompt router's AIQ on the rows its λ path was read on (cross-fitted train + validation, or validation)."""
    _, R, _, C = to_arrays(rewards)
    sel = router_head["operating_points"].get("selection") or {}
    va = split.isin(["train", "validation"] if sel.get("method") == "crossfit" else ["validation"]).to_numpy()
    span_va = cost_span(R[va], C[va]) if va.any() else cost_span(R, C)
    return path_aiq(router_head["operating_points"], span_va)


@dataclass(frozen=True)
class _Fits:
    """The lineage's matrix and fits the report reads: reward rows, task pool, prompt embeddings, the prompt
    router's fit and the cascade's fit summary."""

    rewards: pd.DataFrame
    task_pool: pd.DataFrame
    prompt_embeddings: pd.DataFrame
    router_head: FittedRouter
    cascade: dict


def _router_value(prof, fits: _Fits, reg, verdict: str, routed: _Routed, bb, png: Path, arena: dict | None = None):
    """The frontier on the held-out test split and reports/router_value.json's content: (frontier table, AIQ by
    policy, router value)."""
    rewards, router_head = fits.rewards, fits.router_head
    split = training_split(rewards, fits.task_pool)
    table, points = _frontier(rewards, split, reward_embeddings(fits.prompt_embeddings, rewards), reg,
                              fitted_knn(router_head), fits.cascade, router_head["extra"].get("head_sweep"))
    aiq = dict(zip(table["policy"], table["aiq"]))
    sel = router_head["operating_points"].get("selection") or {}
    head = HeadFigures(router_head["value"], head_validation_aiq(router_head, rewards, split), sel or None,
                       router_head["extra"].get("kinds"), router_head["extra"].get("shipped"))
    cascade = CascadeFigures(fits.cascade, {v: aiq.get(n) for v, n in CASCADE_POLICY_NAMES.items()},
                             routed.cascade_meta.get("test"))
    rv = router_value(prof.name, verdict, head, head_aiq(aiq), cascade, _embedded_by(bb), imputed_cells(rewards),
                      arena)
    return table, _plot(points, rv, png, routed.estimated), aiq, rv


def arena_lines(rv: dict) -> list[str]:
    """The report's RouterArena section (none when the measures are missing)."""
    a = rv.get("router_arena")
    return ["### RouterArena's measures (held-out test)", "", arena_markdown(a), ""] if a else []


def phrasing_lines(rv: dict) -> list[str]:
    """The report's section on how users phrase a question, for the ★ router (none when not measured)."""
    ph = (rv.get("phrasings") or {}).get("routers", {}).get(rv["best_router"])
    if not ph:
        return []
    label = ROUTER_LABELS.get(rv["best_router"], rv["best_router"])  # the ★ is named by the promotion, after this
    return ["### How users phrase a question (the best validation AIQ router, as served)", "",
            phrasing_markdown({**rv["phrasings"], **ph}, f"{label}, "), ""]


def imputed_lines(rv: dict) -> list[str]:
    """The report's note on imputed reward cells (none for a fully collected matrix)."""
    n = rv.get("imputed_cells") or 0
    return [f"Trained on a partly imputed reward matrix: {n:,} cells of new agents asked on a sample were estimated "
            "(reward_matrix column `imputed`, reports/new_agents.json).", ""] if n else []


STAR_NOTE = ("★ = the router served (the registry's pointer): the `promotion` asset, after this report, writes it in "
             "the bold line above and in `served` of reports/router_value.json, the only ★ of the report; the line "
             "under it is the router kind with the best validation AIQ (`best_router`), at the profile's serving "
             "target (`serve.target`), on held-out test.")


@asset(group_name="report", io_manager_key="io_manager",
       description="Headline: the router kind with the best validation AIQ (reports/router_value.json "
                   "`best_router`) at the serving target on held-out test; the ★ (the router served) is the "
                   "promotion's, written into the report after it. Routed benchmarks on the held-out test split and an "
                   "out-of-distribution variant, every reply really called through the pool and graded by its "
                   "task's answer format (option letter, integer, math expression, Python literal, …): the "
                   "prompt-only head at the run's target, the cascade at its targets (every stage's calls). Then "
                   "the router kinds side by side and the RouterBench cost–quality frontier with AIQ against every "
                   "baseline.")
def benchmark_report(context: AssetExecutionContext, config: BenchmarkConfig, reward_matrix: pd.DataFrame,
                     task_pool: pd.DataFrame, prompt_embeddings: pd.DataFrame, router_head: FittedRouter,
                     preflight: pd.DataFrame, pool_report: dict, registered_head: dict, cascade_router: FittedRouter,
                     registered_cascade: dict, router_arena: dict, served_decisions: pd.DataFrame, phrasings: dict,
                     profile: ProfileResource, pool: PoolResource, backbone: BackboneResource,
                     storage: StorageResource) -> Output[pd.DataFrame]:
    prof = profile.get()
    reg = registry.load(entry_dir(storage, registered_head))
    regc = registry.load(entry_dir(storage, registered_cascade))
    pool = pool_of(pool, preflight)  # the pool the head was trained on
    pool.require_key("benchmark_report")  # it calls the routed agents
    reports = storage.path("reports")
    target = config.target or prof.benchmark.target
    point = reg.resolve_target(target)  # a bad target fails before any call
    routed = _routed(prof, task_pool, _UnderTest(reg, target, regc), _passed_specs(pool, preflight, reg), pool,
                     backbone, storage)
    verdict = pool_report["verdict"]["text"]
    fits = _Fits(reward_matrix, task_pool, prompt_embeddings, router_head, cascade_router.summary)
    table, png, aiq, rv = _router_value(prof, fits, reg, verdict, routed, backbone.get_backbone(),
                                        reports / f"frontier_{prof.name}.png", router_arena)
    served = served_figures_of(reward_matrix, task_pool, int(router_head["best_single"]), served_decisions)
    rv = with_held_out_served(rv, served, phrasings)
    atomic_write_json(rv, reports / "router_value.json")
    value = router_head["value"]
    serving = parse_target(prof.serve.target).name
    headline = report_headline(rv, serving, {a["name"]: a["model"] for a in reg.agents})
    text = report_markdown(
        prof.name, reg.name, point, routed.md, regc.name, routed.cascade_md,
        [f"## What the router is worth ({prof.name}, held-out test n={value['n_test']}"
         f"{'; costs estimated' if routed.estimated else ''})", "", f"**{SERVED_PENDING}**", "", headline, "",
         STAR_NOTE, "",
         f"Pool verdict: {verdict}", "", "### Router kinds side by side (prompt-only / cascade / combined)", "",
         ablation_markdown(rv), "", "### The prompt-only head's operating points", "", targets_markdown(value), "",
         *imputed_lines(rv), *phrasing_lines(rv), *arena_lines(rv)],
        ["## Cost–quality frontier on the held-out test split (RouterBench methodology; marked: the best validation "
         "AIQ router's named targets)", "", table_markdown(prof.name, table),
         f"Frontier plot: `{png}` (in the Dagster UI: this asset's `frontier_plot` entry).", ""])
    atomic_write_text(text, reports / "benchmark_report.md")
    atomic_write_json({"variants": routed.meta, "frontier": table.to_dict("records")},
                      reports / "benchmark_report.json")
    context.log.info("\n" + text)
    return Output(pd.concat(routed.per_question, ignore_index=True), metadata=rounded({
        "headline": headline, "best_router": rv["best_router"], "serving_target": serving,
        "pool_verdict": verdict or "",
        "router_value": MetadataValue.json(rv), "head_targets": MetadataValue.md(targets_markdown(value)),
        "apgr": rv["apgr"], "cpt50": rv["cpt50"], "cpt80": rv["cpt80"],
        "report": MetadataValue.md(text), "frontier_plot": _png_markdown(png),
        **{f"head_{v}_accuracy": s["accuracy"] for v, s in routed.meta.items()},
        "aiq_trained_head": aiq.get(HEAD, aiq.get(HEAD_SCORE_SWEEP)), "aiq_prior": aiq.get(PRIOR),
        "aiq_individual_hull": aiq.get(HULL), "report_dir": str(reports),
    }))


def _routerbench_replication(context: AssetExecutionContext, reward_matrix: pd.DataFrame, task_pool: pd.DataFrame,
                            profile: ProfileResource, backbone: BackboneResource,
                            storage: StorageResource) -> Output[pd.DataFrame]:
    suite = context.partition_key
    if suite == "routerbench":
        prof_suite = build_suite("routerbench")
    else:
        rewards, tasks = reward_matrix, task_pool
        agents, _, _, C = to_arrays(rewards)
        prices = dict(zip(agents, C.mean(axis=0)))  # list price per question (config/prices.yaml × tokens)
        prof_suite = build_suite(suite, rewards=rewards, tasks=tasks, prices=prices)
    X = EmbeddingCache(storage.path("embeddings")).get_or_compute(prof_suite.query_text, backbone.get_backbone())
    table, points = replicate(prof_suite, X, profile.get().train)
    reports = storage.path("reports")
    png = plot_frontier(points, reports / f"replication_{suite}.png", title=f"{suite}: cost–quality frontier")
    md = table_markdown(suite, table)
    atomic_write_text(md, reports / f"replication_{suite}.md")
    table.to_csv(reports / f"replication_{suite}.csv", index=False)
    atomic_write_json({"suite": suite, "table": table.to_dict("records"), **table.attrs},
                      reports / f"replication_{suite}.json")
    context.log.info("\n" + md)
    aiq = dict(zip(table["policy"], table["aiq"]))
    return Output(table, metadata={"table": MetadataValue.md(md), "frontier_plot": _png_markdown(png),
                                   "aiq_trained_head": aiq["trained head"], "aiq_prior": aiq["prior"],
                                   "aiq_individual_hull": aiq["individual hull"], "aiq_oracle": aiq["oracle"]})


def routerbench_replication_asset(partitions_def: StaticPartitionsDefinition):
    """`routerbench_replication`, one partition per suite of `partitions_def` (the profile's, from the definitions
    factory)."""
    return asset(name="routerbench_replication", partitions_def=partitions_def, group_name="report",
                 io_manager_key="io_manager",
                 description="Seed-002 replication per suite: a head trained on the suite's train split; policy, "
                             "quality, cost per example and AIQ on its test split, with a frontier plot "
                             "(reports/replication_<suite>.*; `routerbench_summary` combines the suites)."
                 )(_routerbench_replication)


@asset(group_name="report", io_manager_key="io_manager",
       ins={"replications": AssetIn("routerbench_replication", metadata={BY_PARTITION: True})},
       description="The RouterBench-style replication in one report: every suite partition's table of "
                   "`routerbench_replication` (the profile's suites, in its order), written to "
                   "reports/routerbench_replication.md; the trained head's AIQ per suite.")
def routerbench_summary(context: AssetExecutionContext, replications: dict[str, pd.DataFrame],
                        storage: StorageResource) -> Output[dict]:
    text = summary_markdown(replications)
    path = atomic_write_text(text, storage.path("reports") / "routerbench_replication.md")
    aiq = {suite: float(t.set_index("policy").loc["trained head", "aiq"]) for suite, t in replications.items()}
    context.log.info("\n" + text)
    return Output({"suites": list(replications), "aiq_trained_head": aiq, "path": str(path)},
                  metadata=rounded({"table": MetadataValue.md(text), "suites": len(replications),
                                    **{f"aiq_trained_head_{suite}": v for suite, v in aiq.items()},
                                    "path": MetadataValue.path(str(path))}))


def _judged_with(rows: pd.DataFrame, specs: list, j: int, prof) -> list:
    """The agents a cascade stage asks: agent `j`, and before it the judge's reference agent where the rows are
    judge-graded (a reply is judged against the reference's reply to the same prompt; its cost is grading's, not
    the route's: `cascade_benchmark` scores agent `j`'s call only)."""
    ref = getattr(prof.collection.judge, "reference", None)
    if "grader" not in rows or not (rows["grader"] == "judge").any() or ref in (None, specs[j].name):
        return [specs[j]]
    return [s for s in specs if s.name == ref] + [specs[j]]
