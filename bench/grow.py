"""A new agent measured on a sample of tasks instead of all of them, on the replay pools where
the full matrix is known (`demo_wide`'s 5 new models over demo, `mmlu_pro_wide`'s 3 over mmlu_pro).

Per pool: the profile's task pool (`router-lite run --upto task_pool`, through cli/lineage.py), every agent's reply from
the replay recordings, graded with the project's graders (the full matrix); a reply's cost = list price x
ceil(characters / 4) tokens, as the replay estimates it; one reply per task (a replay repetition replays it: the
calls of a profile with 3 repetitions scale by 3, the fractions and dollars saved in proportion). Per new agent,
with the collection's own functions (`pipeline.collect.sampling`, the setting `collection.new_agent_sample`):

- sample: `choose_sample` (`--fraction` of each source's tasks, strategy `--strategy`, seeded by agent and source);
- estimate: `estimate_agent` with each model of `--models` (logistic with the prompt embedding's 16 principal
  components, logistic without them, IRT factorisation); the first is the reported one, the others are compared
  (absolute error against the full matrix, interval hit) under `models`;
- join: `frontier_decision` against the existing agents' full figures (joins_adaptive) and the full-matrix figure
  (joins_full);
- the completed matrix, as the default `complete: joiners` leaves it: the agents that may join (`collect_rest`)
  collected in full, the others' sampled rewards + the estimate's probabilities elsewhere; a kNN router
  (pipeline.route.knn, k chosen on validation) trained on the train rows of the full matrix (aiq_full) and of the
  completed one (aiq_adaptive), both scored by the test AIQ of the *full* matrix's test rows (the same split: the
  task pool's `test`, out-of-distribution rows left out, as the lineage does). `aiq_imputed_all` is the stricter
  variant where no agent is completed (every unsampled cell imputed); calls and dollars saved are given for both.

Writes $ROUTER_LITE_HOME/bench/grow.json: {"pools": {POOL: {"agents": {NAME: {calls_fraction, joins_full,
joins_adaptive, quality_full, quality_estimate, ci_low, ci_high, ...}}, "aiq_full", "aiq_adaptive", ...}}}; keys it
does not write (e.g. bench/refresh.py's `refresh_seconds`) are kept; the
refresh timing (item 6) is bench/refresh.py's (`--refresh 5,10,20,26` runs it after).

    python bench/grow.py [--fraction 0.2] [--strategy disagreement] [--boot 200] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli import lineage  # noqa: E402

FIXED_K = (100, 400)  # besides k chosen on validation, both routers with these k (the choice's noise left out)
POOLS = {"demo_wide": ("demo", "demo"), "mmlu_pro_wide": ("mmlu_pro", "mmlu_pro")}  # wide pool: (profile, base pool)


def task_pool(profile: str):
    """The profile's task pool as the lineage builds it (`--upto task_pool`, in a temporary home)."""
    with tempfile.TemporaryDirectory() as tmp:
        defs = lineage.definitions(profile, tmp)
        lineage.run(defs, "task_pool")
        return lineage.load("task_pool", defs=defs).reset_index(drop=True)


def full_matrix(tasks, agents):
    """(rewards [tasks x agents] 0/1, costs [tasks x agents] USD) from the replay recordings."""
    from pipeline.collect.grading import grade
    from pipeline.collect.replay import ReplayStore, approx_tokens

    store = ReplayStore.load()
    R = np.zeros((len(tasks), len(agents)))
    C = np.zeros_like(R)
    for j, a in enumerate(agents):
        for i, t in enumerate(tasks.itertuples()):
            text = store.text_for(a.model, t.prompt) or ""
            R[i, j] = float(bool(grade(text, str(t.gold), t.grader)[1])) if text.strip() else 0.0
            C[i, j] = a.cost(approx_tokens(t.prompt), approx_tokens(text))
    return R, C


def cached_matrix(profile: str, wide: str):
    """(tasks, agents, R, C, the prompts' embeddings), the matrices kept in $ROUTER_LITE_HOME/bench/grow-<pool>.npz
    (grading every reply takes a while); the embeddings by the profile's backbone through the home's cache."""
    from pipeline.collect.agents import load_agents
    from pipeline.embed.backbone import EmbeddingCache
    from resources.pool import default_agents_file
    from resources.storage import default_home

    tasks, agents = task_pool(profile), load_agents(default_agents_file(), wide)
    ids, names = tasks["task_id"].astype(str).tolist(), [a.name for a in agents]
    cache = Path(default_home()) / "bench" / f"grow-{wide}.npz"
    if cache.exists():
        z = np.load(cache, allow_pickle=False)
        if list(z["task_ids"]) == ids and list(z["agents"]) == names:
            return tasks, agents, z["R"], z["C"], z["X"]
    R, C = full_matrix(tasks, agents)
    bb = lineage.definitions(profile).resources["backbone"].get_backbone()
    X = EmbeddingCache(Path(default_home()) / "embeddings").get_or_compute(tasks["prompt"].tolist(), bb)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, task_ids=np.array(ids, dtype=str), agents=np.array(names, dtype=str), R=R, C=C, X=X)
    return tasks, agents, R, C, X


def router_aiq(X: np.ndarray, R_train_val: np.ndarray, R_true: np.ndarray, C_true: np.ndarray, split: np.ndarray,
               k: int | None = None) -> tuple[float, int]:
    """Test AIQ of a kNN router trained on `R_train_val`'s train rows (k on its validation rows), scored on the test
    rows of the true matrix."""
    from pipeline.route.frontier import aiq, cost_span, policy_points
    from pipeline.route.knn import KnnRouter

    tr, va, te = split == "train", split == "validation", split == "test"
    router = KnnRouter(k=k).fit(X[tr], R_train_val[tr], X[va], R_train_val[va])
    pts = policy_points(router.scores(X[te]), R_true[te], C_true[te])
    return float(aiq(pts, *cost_span(R_true[te], C_true[te]))), int(router.k_)


def measure_pool(wide: str, profile: str, base_pool: str, fraction: float, strategy: str, models: list[str],
                 boot: int, seed: int) -> dict:
    from pipeline.collect.agents import load_agents
    from pipeline.collect.sampling import (
        Existing,
        choose_sample,
        embedding_features,
        estimate_agent,
        frontier_decision,
    )
    from pipeline.core.pareto import on_frontier
    from pipeline.profile import load_profile
    from resources.pool import default_agents_file

    prof = load_profile(profile)
    reps = prof.repetitions
    tasks, agents, R, C, E = cached_matrix(profile, wide)
    base_names = {a.name for a in load_agents(default_agents_file(), base_pool)}
    b_idx = [j for j, a in enumerate(agents) if a.name in base_names]
    sources = tasks["source"].astype(str).to_numpy()
    task_ids = tasks["task_id"].astype(str).to_numpy()
    emb = embedding_features(E)
    q_full, c_full = R.mean(axis=0), C.mean(axis=0)
    R_ad = R.copy()
    imputed = np.zeros_like(R, dtype=bool)
    out = {}
    for j, a in enumerate(agents):
        if a.name in base_names:
            continue
        sample = choose_sample(task_ids, sources, R[:, b_idx], fraction, strategy, seed, a.name)
        y = np.full(len(tasks), np.nan)
        yc = np.full(len(tasks), np.nan)
        y[sample], yc[sample] = R[sample, j], C[sample, j]  # the estimate sees the sample's cells only
        compared = {}
        for m in models:
            name, use_emb = (m[:-4], False) if m.endswith("-raw") else (m, True)
            t0 = time.time()
            e = estimate_agent(Existing(R[:, b_idx], C[:, b_idx], sources, emb if use_emb else None), y, yc, sample,
                               model=name, boot=boot, seed=seed)
            compared[m] = {"estimate": e.quality, "ci_low": e.ci_low, "ci_high": e.ci_high,
                           "abs_error": abs(e.quality - float(q_full[j])),
                           "in_ci": bool(e.ci_low <= q_full[j] <= e.ci_high),
                           "brier_unsampled": float(np.mean((e.p_task - R[:, j])[np.setdiff1d(
                               np.arange(len(tasks)), sample)] ** 2)),
                           "seconds": round(time.time() - t0, 2), "_est": e}
        est = compared[models[0]].pop("_est")
        for v in compared.values():
            v.pop("_est", None)
        dec = frontier_decision(q_full[b_idx], c_full[b_idx], est)
        cols = b_idx + [j]
        joins_full = on_frontier(q_full[cols], c_full[cols], len(cols) - 1)
        R_ad[:, j] = est.p_task
        imputed[:, j] = ~np.isin(np.arange(len(tasks)), sample)
        per_src = {s: {**v, "full": float(R[sources == s, j].mean()),
                       "in_ci": bool(v["ci_low"] <= R[sources == s, j].mean() <= v["ci_high"])}
                   for s, v in est.per_source.items()}
        out[a.name] = {"model": a.model, "calls_fraction": len(sample) / len(tasks), "calls": int(len(sample)) * reps,
                       "calls_full": len(tasks) * reps, "joins_full": joins_full, "joins_adaptive": dec["joins"],
                       "join_share": dec["join_share"], "collect_rest": dec["may_join"],
                       "quality_full": float(q_full[j]), "quality_estimate": est.quality, "ci_low": est.ci_low,
                       "ci_high": est.ci_high, "in_ci": bool(est.ci_low <= q_full[j] <= est.ci_high),
                       "cost_full": float(c_full[j]), "cost_estimate": est.cost,
                       "usd_full": float(C[:, j].sum()) * reps, "usd_sample": float(C[sample, j].sum()) * reps,
                       "per_source": per_src, "models": compared, "pool_agents": len(cols)}
    split = tasks["split"].astype(str).to_numpy()
    if "ood" in tasks.columns:
        split = np.where(tasks["ood"].fillna(False).astype(bool), "ood", split)
    rest = [j for j, a in enumerate(agents) if a.name in out and out[a.name]["collect_rest"]]
    R_rest = R_ad.copy()
    R_rest[:, rest] = R[:, rest]  # the default policy (complete: joiners): the agents that may join collected in full
    (aiq_full, k_full), (aiq_ad, k_ad) = router_aiq(E, R, R, C, split), router_aiq(E, R_rest, R, C, split)
    aiq_all, k_all = router_aiq(E, R_ad, R, C, split)
    fixed = {str(k): {"aiq_full": router_aiq(E, R, R, C, split, k)[0],
                      "aiq_adaptive": router_aiq(E, R_rest, R, C, split, k)[0],
                      "aiq_imputed_all": router_aiq(E, R_ad, R, C, split, k)[0]} for k in FIXED_K}
    for r in out.values():  # what the default policy calls and pays: the sample, then the rest for joiners
        r["calls_made"] = r["calls_full"] if r["collect_rest"] else r["calls"]
        r["usd_made"] = r["usd_full"] if r["collect_rest"] else r["usd_sample"]
    saved = {"calls_saved": int(sum(r["calls_full"] - r["calls_made"] for r in out.values())),
             "usd_saved": float(sum(r["usd_full"] - r["usd_made"] for r in out.values())),
             "calls_saved_imputed_all": int(sum(r["calls_full"] - r["calls"] for r in out.values())),
             "usd_saved_imputed_all": float(sum(r["usd_full"] - r["usd_sample"] for r in out.values()))}
    return {"agents": out, "tasks": len(tasks), "repetitions": reps, "router": "knn",
            # aiq_adaptive: the default `complete: joiners` (the flow: measure on the sample, decide, collect
            # the rest only for agents that may join); aiq_imputed_all: no agent completed, every unsampled cell
            # imputed (the stricter variant, also reported)
            "aiq_full": aiq_full, "aiq_adaptive": aiq_ad, "aiq_gap": aiq_ad - aiq_full,
            "aiq_imputed_all": aiq_all, "aiq_gap_imputed_all": aiq_all - aiq_full,
            "knn_k": {"full": k_full, "adaptive": k_ad, "imputed_all": k_all}, "aiq_fixed_k": fixed,
            "completed_agents": [agents[j].name for j in rest],
            "calls_new_made": int(sum(r["calls_made"] for r in out.values())),
            "calls_new_full": int(sum(r["calls_full"] for r in out.values())),
            "imputed_cells": int(imputed[:, [j for j in range(len(agents)) if j not in rest]].sum()) * reps,
            "imputed_cells_imputed_all": int(imputed.sum()) * reps, **saved,
            "test_rows": int((split == "test").sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--strategy", default="disagreement")
    ap.add_argument("--models", default="logistic,logistic-raw,irt",
                    help="estimators compared, the first reported (NAME-raw: without the prompt embedding)")
    ap.add_argument("--boot", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pools", default=",".join(POOLS))
    ap.add_argument("--refresh", default=None, metavar="K,K,...",
                    help="also time the refresh at these pool widths (bench/refresh.py), e.g. 5,10,20,26")
    args = ap.parse_args(argv)
    from resources.storage import default_home

    t0 = time.time()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    out = Path(default_home()) / "bench" / "grow.json"
    result = json.loads(out.read_text()) if out.exists() else {}  # keys another bench writes are kept
    result.update({"fraction": args.fraction, "strategy": args.strategy, "models": models, "seed": args.seed})
    result.setdefault("pools", {})
    for wide in [p for p in args.pools.split(",") if p]:
        profile, base = POOLS[wide]
        r = measure_pool(wide, profile, base, args.fraction, args.strategy, models, args.boot, args.seed)
        result["pools"][wide] = r  # a pool measured again replaces its figures (no stale key survives)
        for name, a in r["agents"].items():
            print(f"{wide} {name}: {a['calls']}/{a['calls_full']} calls ({a['calls_fraction']:.1%}), quality full "
                  f"{a['quality_full']:.4f} est {a['quality_estimate']:.4f} [{a['ci_low']:.4f}, {a['ci_high']:.4f}]"
                  f"{'' if a['in_ci'] else ' MISS'}, cost/task full {a['cost_full']:.6f} est "
                  f"{a['cost_estimate']:.6f}, joins full {a['joins_full']} adaptive {a['joins_adaptive']} "
                  f"(share {a['join_share']:.2f}), USD {a['usd_sample']:.4f} of {a['usd_full']:.4f}; "
                  + ", ".join(f"{m} err {v['abs_error']:.4f}{'' if v['in_ci'] else ' MISS'}"
                              for m, v in a["models"].items()))
        print(f"{wide}: test AIQ (kNN) full {r['aiq_full']:.4f}; adaptive (sample, decide, complete "
              f"{len(r['completed_agents'])} may-join agents) {r['aiq_adaptive']:.4f} (gap {r['aiq_gap']:+.4f}); "
              f"every unsampled cell imputed {r['aiq_imputed_all']:.4f} (gap {r['aiq_gap_imputed_all']:+.4f}); "
              f"k {r['knn_k']}; "
              + "".join(f"k={k}: full {v['aiq_full']:.4f} adaptive {v['aiq_adaptive']:.4f} imputed-all "
                        f"{v['aiq_imputed_all']:.4f}; " for k, v in r["aiq_fixed_k"].items())
              + f"new-agent calls {r['calls_new_made']} of {r['calls_new_full']}: saved {r['calls_saved']} calls, "
              f"USD {r['usd_saved']:.4f} (imputing all: {r['calls_saved_imputed_all']}, "
              f"USD {r['usd_saved_imputed_all']:.4f}); {r['imputed_cells']} cells imputed")
    result["seconds"] = round(time.time() - t0, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)
    print(f"written: {out} ({result['seconds']} s)")
    if args.refresh:
        from bench.refresh import main as refresh_main

        return refresh_main(["--k", args.refresh])
    return 0


if __name__ == "__main__":
    sys.exit(main())
