"""Issue 29, item 6: how the refresh (reward matrix -> registered routers) grows with the pool's width K.

On REAL recorded replies: the bundled graded ZeroEval pool (`data/zeroeval_graded/graded.parquet`, built by
`data/build/build_zeroeval_graded.py`: every ZeroEval model with a reply to all 2,840 questions of the default,
graded by the project's grader, costs ceil(chars/4) x list prices) on the `demo` profile's task pool (its questions,
splits and graders) and prompt embeddings (the profile's backbone; the embedding cache under $ROUTER_LITE_HOME). The
first 5 agents are the `demo` pool's models, the next 5 `demo_wide`'s, then the other complete models by name. No row
is invented: K larger than the models there are is capped (and said: `k_used`).

Per K, the stages the lineage runs after the collection, each timed with the same code the assets call:
- reward_matrix: pipeline.collect.rewards.reward_matrix + pipeline.collect.answers.agent_answers of the graded calls;
- router_head: pipeline.route.fit.fit_router (the prompt router kinds, the ship gate, the operating points), the
  profile's train config;
- cascade_router: pipeline.route.cascade_fit.fit_cascade_router (agreement, search, the path chosen as the profile's
  `train.operating_points` says, cross-fitted by default, as the asset does; held-out);
- registration: pipeline.route.registry.register_fitted of the shipped prompt router and of the cascade (a temporary
  registry).

Writes `refresh_seconds: {K used: s}` (and per stage, keyed by K asked, `refresh`) into
$ROUTER_LITE_HOME/bench/grow.json, keeping its other keys (bench/grow.py writes the pools). Prints the seconds side
by side, the ratio to K = 10 next to K / 10, and the slope (seconds per agent) from 10 agents up.

    python bench/refresh.py [--k 5,10,20,40] [--generations N]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GRADED = ROOT / "data" / "zeroeval_graded" / "graded.parquet"
STAGES = ("reward_matrix", "router_head", "cascade_router", "registration")


def model_order(models: list[str]) -> list[str]:
    """`demo`'s models, then `demo_wide`'s, then the others by name (the first K make the K-agent pool)."""
    from pipeline.collect.agents import load_agents
    from resources.pool import default_agents_file

    first = [a.model for a in load_agents(default_agents_file(), "demo_wide")]
    return [m for m in first if m in models] + sorted(m for m in models if m not in first)


def agent_name(model: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in model.lower()).strip("_")


def graded_calls(graded: pd.DataFrame, tasks: pd.DataFrame, models: list[str]) -> pd.DataFrame:
    """The graded-calls frame the collection writes, one repetition, for `models` on the pool's tasks."""
    g = graded[graded["model"].isin(models)].merge(tasks[["task_id", "question_id"]], on="question_id")
    return pd.DataFrame({
        "call_key": g["model"] + "|" + g["task_id"], "agent": g["model"].map(agent_name), "model": g["model"],
        "task_id": g["task_id"], "repetition": 0, "status": g["status"], "extracted": g["extracted"],
        "correct": g["correct"], "prompt_tokens": g["prompt_tokens"], "completion_tokens": g["completion_tokens"],
        "cost_usd": g["cost_usd"], "usage_source": "provider_estimate"})


class Clock:
    """Wall and process-CPU seconds per stage (the CPU seconds do not count other processes on a shared machine)."""

    def __init__(self):
        self.wall, self.cpu = {}, {}
        self.grading: dict = {}  # the cascade's Agreement stats (pairs compared, overruns)

    def start(self) -> None:
        self._w, self._c = time.perf_counter(), time.process_time()

    def stop(self, stage: str) -> None:
        self.wall[stage], self.cpu[stage] = time.perf_counter() - self._w, time.process_time() - self._c
        print(f"  {stage}: {self.wall[stage]:.1f} s (CPU {self.cpu[stage]:.1f} s)", flush=True)


def refresh(calls: pd.DataFrame, agents: list[str], models: dict[str, str], tasks: pd.DataFrame, emb: pd.DataFrame,
            prof, bb_fields, registry_root: Path, grading=None) -> Clock:
    """Wall and CPU seconds per stage of one refresh on `calls`."""
    from pipeline.collect.answers import agent_answers, answers_matrix
    from pipeline.collect.rewards import reward_matrix
    from pipeline.core.io import frame_version
    from pipeline.report.pool_report import domain_column, labels_of
    from pipeline.route import registry
    from pipeline.route.cascade_fit import fit_cascade_router, selection_of
    from pipeline.route.fit import fit_router, reward_arrays, reward_embeddings, training_split

    clock = Clock()
    clock.start()
    rewards = reward_matrix(calls, agents).rows
    answers = agent_answers(calls, agents)
    clock.stop("reward_matrix")

    clock.start()
    X = reward_embeddings(emb, rewards)
    split = training_split(rewards, tasks)
    t = rewards[["task_id"]].merge(tasks, on="task_id", how="left")
    fit = fit_router(X, rewards, split, prof.train, labels=labels_of(t, domain_column(t)), frontier=True)
    head = fit.to_fitted({"agents": fit.agents, "best_single": fit.best_single, "metrics": fit.metrics})
    clock.stop("router_head")

    clock.start()
    arrays = reward_arrays(rewards, split, "test")
    cascade, cfit = fit_cascade_router(arrays, answers_matrix(answers, rewards["task_id"], arrays.agents),
                                       t["grader"].to_numpy(), X, head.router, head.companions["scorer"],
                                       head["best_single"], grading=grading, stats=clock.grading,
                                       selection=selection_of(dataclasses.asdict(prof.train)))  # as the asset does
    clock.stop("cascade_router")
    n_pairs = len(agents) * (len(agents) - 1) // 2
    print(f"  agreement pairs compared: {clock.grading.get('agreement_pairs', 0)} of {n_pairs}", flush=True)

    clock.start()
    data = {"reward_matrix": frame_version(rewards), "agent_answers": frame_version(answers)}
    for router, training in ((head.router, {"kind": getattr(head.router, "kind", "head")}),
                             (cascade, {"variant": cfit.chosen})):
        registry.register_fitted(registry_root, router, head, backbone=bb_fields(router.d), models=models,
                                 training=training, data_hashes=data, metrics={})
    clock.stop("registration")
    for d in (clock.wall, clock.cpu):
        d["total"] = sum(d[k] for k in STAGES)
    return clock


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default="5,10,20,40", help="pool widths (comma-separated); capped at the models there are")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--generations", type=int, default=None, help="override train.generations (default: the profile's)")
    ap.add_argument("--every", type=int, default=1,
                    help="keep every N-th task of the pool (a smaller matrix for a quick run; default all)")
    ap.add_argument("--grading-budget-ms", type=float, default=None,
                    help="the agreement's grading budget (default: the profile's collection.grading_budget_ms)")
    args = ap.parse_args(argv)
    from dataclasses import replace

    from cli.forecast import profile_task_pool
    from pipeline.collect.bounded import Budget
    from pipeline.embed.backbone import EmbeddingCache
    from pipeline.profile import load_profile
    from resources.backbone import BackboneResource
    from resources.storage import default_home

    prof = load_profile(args.profile)
    if args.generations is not None:
        prof = replace(prof, train=replace(prof.train, generations=args.generations))
    grading = Budget.of(prof.collection) if args.grading_budget_ms is None else Budget(args.grading_budget_ms)
    tasks = profile_task_pool(prof).iloc[:: args.every].reset_index(drop=True)
    graded = pd.read_parquet(GRADED)
    graded = graded[graded["question_id"].isin(set(tasks["question_id"]))]
    per_model = graded.groupby("model")["question_id"].nunique()
    complete = sorted(per_model[per_model == tasks["question_id"].nunique()].index)
    order = model_order(complete)
    wanted = [int(k) for k in args.k.split(",")]
    home = Path(default_home())
    bb_res = BackboneResource()
    bb = bb_res.get_backbone()
    X = EmbeddingCache(home / "embeddings").get_or_compute(tasks["prompt"].tolist(), bb)
    emb = pd.DataFrame({"task_id": tasks["task_id"], "embedding": list(X)})
    print(f"{len(tasks)} tasks of profile {args.profile}; {len(order)} models with a reply to every one "
          f"(data/zeroeval_graded); K asked {wanted}", flush=True)
    seconds, stages, cpu, used, pairs = {}, {}, {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in wanted:
            kk = min(k, len(order))
            models = order[:kk]
            agents = [agent_name(m) for m in models]
            calls = graded_calls(graded, tasks, models)
            c = refresh(calls, agents, {agent_name(m): m for m in models}, tasks, emb, prof,
                        lambda d: bb.manifest_fields(d, bb_res.model), Path(tmp) / f"registry{k}", grading)
            seconds[str(k)], used[str(k)] = round(c.wall["total"], 2), kk
            stages[str(k)] = {n: round(v, 2) for n, v in c.wall.items()}
            cpu[str(k)] = {n: round(v, 2) for n, v in c.cpu.items()}
            pairs[str(k)] = c.grading.get("agreement_pairs", 0)
            print(f"K={k} (agents used {kk}): " + ", ".join(f"{n} {v:.1f} s" for n, v in c.wall.items())
                  + " | CPU " + ", ".join(f"{n} {v:.1f} s" for n, v in c.cpu.items()), flush=True)
    ks = list(wanted)
    base = "10" if "10" in seconds else str(ks[0])
    print("\n| K asked | K used | " + " | ".join(f"{n} s" for n in STAGES) + " | total s | total CPU s | "
          f"s / s(K={base}) | CPU / CPU(K={base}) | K / {used[base]} |")
    print("|---" * (len(STAGES) + 7) + "|")
    for k in ks:
        st, cp = stages[str(k)], cpu[str(k)]
        print(f"| {k} | {used[str(k)]} | " + " | ".join(f"{st[n]:.1f}" for n in STAGES) +
              f" | {st['total']:.1f} | {cp['total']:.1f} | {st['total'] / stages[base]['total']:.2f} | "
              f"{cp['total'] / cpu[base]['total']:.2f} | {used[str(k)] / used[base]:.2f} |")
    big = [k for k in ks if used[str(k)] > used[base]]
    slope = None
    if big:
        top = str(max(big, key=lambda k: used[str(k)]))
        dk = used[top] - used[base]
        slope = {"wall": (seconds[top] - seconds[base]) / dk,
                 "cpu": (cpu[top]["total"] - cpu[base]["total"]) / dk}
        print(f"slope from K={used[base]} to K={used[top]}: {slope['wall']:.2f} s per agent (CPU {slope['cpu']:.2f}); "
              f"s({used[top]})/s({used[base]}) = {seconds[top] / seconds[base]:.2f} (CPU "
              f"{cpu[top]['total'] / cpu[base]['total']:.2f}) vs linear {used[top] / used[base]:.2f}")
    out = home / "bench" / "grow.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(out.read_text()) if out.exists() else {}
    # keyed by the pool width measured: a K asked beyond the models there are is the capped width's figure
    doc["refresh_seconds"] = {str(used[str(k)]): seconds[str(k)] for k in ks}
    doc["refresh"] = {"k_used": used, "stages": stages, "cpu_seconds": cpu, "slope_s_per_agent": slope,
                      "agreement_pairs": pairs,  # agent pairs the cascade search compared (of K(K-1)/2)
                      "grading_budget_ms": grading.budget_ms, "train_generations": prof.train.generations,
                      "every": args.every,
                      "tasks": len(tasks),
                      "models_available": len(order), "profile": args.profile,
                      "data": "data/zeroeval_graded/graded.parquet (real ZeroEval replies, graded)",
                      "note": f"only {len(order)} models have a reply to every question: larger K is capped"
                      if any(used[str(k)] < k for k in ks) else ""}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
