"""How the refresh (reward matrix -> registered routers and the pool report) grows with the pool's width K: the
lineage's own steps, timed by the step statistics `router-lite run` collects (`run_lineage`).

Per K, a temporary home of the profile (default `demo`) whose pool is K agents of the bundled graded ZeroEval pool
(`data/zeroeval_graded/graded.parquet`: the 26 ZeroEval models with a reply to every one of the default's 2,840
questions, graded by the project's grader, costs ceil(chars/4) x list prices), named in an override file (pool
`bench_k<K>`, replay kind): the `demo` pool's models first, then `demo_wide`'s, then the others by name; K beyond the
models there are is capped and said (`k_used`). The task pool and the prompt embeddings are the lineage's own
(`--upto prompt_embeddings`; the embedding cache of $ROUTER_LITE_HOME is shared); the graded calls and the passed
pre-flight are those recorded replies, stored through the assets' IO manager (cli/lineage.py): no reply invented,
no call made. Then `run_lineage` materialises from `reward_matrix` and `agent_answers` on, up to
`registered_head`, `registered_cascade` and `pool_report`: every figure is a step of that run (checks summed apart).

Writes `refresh_seconds: {K used: s}` and `refresh` (per step, keyed by K asked) into $ROUTER_LITE_HOME/bench/
grow.json, keeping its other keys (bench/grow.py writes the pools). Prints the steps side by side, the ratio to the
smallest K next to the K ratio, and the slope (seconds per agent).

    python bench/refresh.py [--k 5,10,20,26] [--every 8] [--generations 2]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli import lineage  # noqa: E402

GRADED = ROOT / "data" / "zeroeval_graded" / "graded.parquet"
GRADED_BUILD = ROOT / "data" / "build" / "build_zeroeval_graded.py"
STEPS = ("reward_matrix", "agent_answers", "router_head", "cascade_router", "registered_head", "registered_cascade",
         "pool_report")
TARGETS = ["registered_head", "registered_cascade", "pool_report"]


def model_order(models: list[str]) -> list[str]:
    """`demo`'s models, then `demo_wide`'s, then the others by name (the first K make the K-agent pool)."""
    from pipeline.collect.agents import load_agents
    from resources.pool import default_agents_file

    first = [a.model for a in load_agents(default_agents_file(), "demo_wide")]
    return [m for m in first if m in models] + sorted(m for m in models if m not in first)


def agent_name(model: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in model.lower()).strip("_")


def list_prices() -> dict[str, tuple[float, float]]:
    """(input, output) USD per 1M tokens of every graded model: the prices its `cost_usd` was computed with."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_zeroeval_graded", GRADED_BUILD)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build.prices()


def override(models: list[str], pool: str, generations: int | None) -> dict:
    """The override file of a K-agent home: its pool (replay kind: nothing is called) and the train config."""
    price = list_prices()
    doc = {"agents": {"pools": {pool: {"description": f"{len(models)} graded ZeroEval models (bench/refresh.py)",
                                       "provider": "replay", "base_url": None,
                                       "agents": [{"name": agent_name(m), "model": m, "price_in_per_mtok": price[m][0],
                                                   "price_out_per_mtok": price[m][1]} for m in models]}}},
           "pool": {"name": pool}}
    return {**doc, "train": {"generations": generations}} if generations else doc


def graded_calls(graded: pd.DataFrame, tasks: pd.DataFrame, models: list[str]) -> pd.DataFrame:
    """The call log rows of `models` on `tasks` (task_id, question_id): each model's real graded reply."""
    g = graded[graded["model"].isin(models)].merge(tasks[["task_id", "question_id"]], on="question_id")
    return pd.DataFrame({
        "call_key": g["model"] + "|" + g["task_id"], "agent": g["model"].map(agent_name), "model": g["model"],
        "task_id": g["task_id"], "repetition": 0, "status": g["status"], "extracted": g["extracted"],
        "correct": g["correct"], "prompt_tokens": g["prompt_tokens"], "completion_tokens": g["completion_tokens"],
        "cost_usd": g["cost_usd"], "usage_source": "provider_estimate"})


def seed(defs, graded: pd.DataFrame, models: list[str], pool: str, every: int) -> int:
    """The pool's task pool (every `every`-th task), a passed pre-flight and the graded calls of `models`, stored
    through the IO managers; the number of tasks."""
    lineage.run(defs, "prompt_embeddings")  # task pool and embeddings: the lineage's own
    tasks = lineage.load("task_pool", defs=defs).iloc[::every].reset_index(drop=True)
    lineage.store(defs, "task_pool", tasks)
    lineage.store(defs, "preflight", pd.DataFrame({
        "agent": [agent_name(m) for m in models], "model": models, "provider": "replay", "passed": True,
        "reason": "ok", "pool": pool}))
    calls = graded_calls(graded, tasks, models)
    source = calls["task_id"].str.split("/", n=1).str[0]
    for pk in lineage.partitions(defs, "graded_calls"):  # "<repetition>|<source>"
        lineage.store(defs, "graded_calls", calls[source == pk.split("|", 1)[1]].reset_index(drop=True), pk)
    return len(tasks)


def refresh(k: int, models: list[str], graded: pd.DataFrame, args, tmp: Path) -> dict:
    """One K: seed a home, run the refresh through `run_lineage`; its step seconds, checks and CPU apart."""
    from pipeline.profile import load_profile
    from resources.storage import default_home

    home, pool = tmp / f"k{k}", f"bench_k{k}"
    (home / "embeddings").parent.mkdir(parents=True)
    shared = Path(default_home()).resolve() / "embeddings"
    shared.mkdir(parents=True, exist_ok=True)
    (home / "embeddings").symlink_to(shared)  # the prompts' embeddings are computed once for every K
    (tmp / f"{pool}.yaml").write_text(yaml.safe_dump(override(models, pool, args.generations)))
    os.environ["ROUTER_LITE_OVERRIDE"] = str(tmp / f"{pool}.yaml")  # the runs re-read the profile with it
    defs = lineage.definitions(load_profile(args.profile), str(home))
    n = seed(defs, graded, models, pool, args.every)
    cpu = time.process_time()
    t = lineage.run(defs, TARGETS, start=["reward_matrix", "agent_answers"])
    steps = {s: t["steps"].get(s, 0.0) for s in STEPS}
    return {"tasks": n, "steps": steps, "checks": round(sum(v for s, v in t["steps"].items() if s not in STEPS), 1),
            "total": round(sum(steps.values()), 1), "run_total": t["total_s"],
            "cpu": round(time.process_time() - cpu, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default="5,10,20,26", help="pool widths (comma-separated); capped at the models there are")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--generations", type=int, default=None, help="override train.generations (default: the profile's)")
    ap.add_argument("--every", type=int, default=1, help="keep every N-th task of the pool (default all)")
    args = ap.parse_args(argv)
    from resources.storage import default_home

    graded = pd.read_parquet(GRADED)
    per_model = graded.groupby("model")["question_id"].nunique()
    order = model_order(sorted(per_model[per_model == per_model.max()].index))
    wanted = [int(k) for k in args.k.split(",")]
    print(f"{len(order)} models with a reply to every question (data/zeroeval_graded); K asked {wanted}", flush=True)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in wanted:
            models = order[:min(k, len(order))]
            out[str(k)] = {"k_used": len(models), **refresh(k, models, graded, args, Path(tmp))}
            r = out[str(k)]
            print(f"K={k} ({r['k_used']} agents, {r['tasks']} tasks): " + ", ".join(
                f"{s} {v:.1f}" for s, v in r["steps"].items()) + f" | refresh {r['total']:.1f} s, checks "
                f"{r['checks']:.1f} s, CPU {r['cpu']:.1f} s", flush=True)
    os.environ.pop("ROUTER_LITE_OVERRIDE", None)
    base = out[str(wanted[0])]
    print("\n| K | " + " | ".join(f"{s} s" for s in STEPS) + " | refresh s | CPU s | s / s(K0) | K / K0 |")
    print("|---" * (len(STEPS) + 5) + "|")
    for r in out.values():
        print(f"| {r['k_used']} | " + " | ".join(f"{r['steps'][s]:.1f}" for s in STEPS) + f" | {r['total']:.1f} | "
              f"{r['cpu']:.1f} | {r['total'] / base['total']:.2f} | {r['k_used'] / base['k_used']:.2f} |")
    top = out[str(wanted[-1])]
    slope = ((top["total"] - base["total"]) / (top["k_used"] - base["k_used"])
             if top["k_used"] > base["k_used"] else None)
    if slope is not None:
        print(f"slope: {slope:.2f} s per agent from K={base['k_used']} to K={top['k_used']}")
    f = Path(default_home()) / "bench" / "grow.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(f.read_text()) if f.exists() else {}
    doc["refresh_seconds"] = {str(r["k_used"]): r["total"] for r in out.values()}
    doc["refresh"] = {"per_k": out, "slope_s_per_agent": slope, "profile": args.profile, "every": args.every,
                      "train_generations": args.generations, "models_available": len(order),
                      "timed_by": "run_lineage step statistics (cli/lineage.py run)",
                      "data": "data/zeroeval_graded/graded.parquet (real ZeroEval replies, graded)"}
    f.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
