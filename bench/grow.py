"""Issue 29, items 3/4 (a first measurement): a new agent measured on a sample of tasks instead of all of them, on
the replay pools where the full matrix is known (`demo_wide`'s 5 new models over demo, `mmlu_pro_wide`'s 3 over
mmlu_pro).

Per pool: the profile's task pool (built as `router-lite run --upto task_pool` builds it), every agent's reply from
the replay recordings, graded with the project's graders (the full matrix); a reply's cost = list price x
ceil(characters / 4) tokens, as the replay estimates it. Per new agent:

- sample: `--fraction` of the tasks (default 0.2), stratified by source; within a source half the quota among tasks
  where the existing agents disagree (informative), half among all (random, seeded);
- estimate: scikit-learn's LogisticRegression on the sample, features = the existing agents' rewards, their mean and
  the source (one-hot), predicts the new agent's reward on the other tasks; quality estimate = (sample's rewards +
  predicted probabilities) / tasks; 95 % interval by refitting on bootstrap resamples of the sample (`--boot`);
- cost estimate: the sample's mean cost per task;
- join: the agent is on the pool's cost-quality frontier (no other agent at least as good and at most as costly, one
  of them strictly), with its full-collection figures (joins_full) and with the estimate (joins_adaptive).

Writes $ROUTER_LITE_HOME/bench/grow.json: {"pools": {POOL: {"agents": {NAME: {calls_fraction, joins_full,
joins_adaptive, quality_full, quality_estimate, ci_low, ci_high, ...}}, "aiq_full": null, "aiq_adaptive": null}}}.
NOT measured here: the router trained on the completed matrix (aiq_*: null). The refresh timing (item 6) is
bench/refresh.py's (`--refresh 5,10,20,40` runs it after; its keys in grow.json are kept).

    python bench/grow.py [--fraction 0.2] [--boot 200] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POOLS = {"demo_wide": ("demo", "demo"), "mmlu_pro_wide": ("mmlu_pro", "mmlu_pro")}  # wide pool: (profile, base pool)


def full_matrix(profile: str, wide: str):
    """(tasks, agents, rewards [tasks x agents] 0/1, costs [tasks x agents] USD) from the replay recordings."""
    from cli.forecast import profile_task_pool
    from pipeline.collect.agents import load_agents
    from pipeline.collect.grading import grade
    from pipeline.collect.replay import ReplayStore, approx_tokens
    from pipeline.profile import load_profile
    from resources.pool import default_agents_file

    prof = load_profile(profile)
    tasks = profile_task_pool(prof).reset_index(drop=True)
    agents = load_agents(default_agents_file(), wide)
    store = ReplayStore.load()
    R = np.zeros((len(tasks), len(agents)))
    C = np.zeros_like(R)
    for j, a in enumerate(agents):
        for i, t in enumerate(tasks.itertuples()):
            text = store.text_for(a.model, t.prompt) or ""
            R[i, j] = float(bool(grade(text, str(t.gold), t.grader)[1])) if text.strip() else 0.0
            C[i, j] = a.cost(approx_tokens(t.prompt), approx_tokens(text))
    return tasks, agents, R, C


def choose_sample(tasks: pd.DataFrame, base: np.ndarray, fraction: float, rng) -> np.ndarray:
    """Indices: per source `fraction` of its tasks, half where the base agents disagree, half at random."""
    chosen = []
    disagree = (base.mean(axis=1) > 0) & (base.mean(axis=1) < 1)
    for _, idx in tasks.groupby("source").indices.items():
        k = max(2, int(round(fraction * len(idx))))
        dis = idx[disagree[idx]]
        first = rng.choice(dis, size=min(len(dis), k // 2), replace=False) if len(dis) else np.array([], int)
        rest = np.setdiff1d(idx, first)
        second = rng.choice(rest, size=min(len(rest), k - len(first)), replace=False)
        chosen += list(first) + list(second)
    return np.array(sorted(chosen))


def features(tasks: pd.DataFrame, base: np.ndarray) -> np.ndarray:
    src = pd.get_dummies(tasks["source"]).to_numpy(float)
    return np.hstack([base, base.mean(axis=1, keepdims=True), src])


def estimate_quality(X: np.ndarray, y: np.ndarray, sample: np.ndarray, rng, boot: int) -> tuple[float, float, float]:
    """(estimate, 2.5 %, 97.5 %) of the new agent's mean reward over every task."""
    from sklearn.linear_model import LogisticRegression

    rest = np.setdiff1d(np.arange(len(y)), sample)

    def one(s: np.ndarray) -> float:
        ys = y[s]
        if ys.min() == ys.max():
            p_rest = np.full(len(rest), ys.mean())
        else:
            p_rest = LogisticRegression(C=1.0, max_iter=1000).fit(X[s], ys).predict_proba(X[rest])[:, 1]
        return float((y[sample].sum() + p_rest.sum()) / len(y))

    est = one(sample)
    draws = [one(rng.choice(sample, size=len(sample), replace=True)) for _ in range(boot)]
    lo, hi = np.percentile(draws, [2.5, 97.5]) if draws else (est, est)
    return est, float(lo), float(hi)


def on_frontier(q: np.ndarray, c: np.ndarray, j: int) -> bool:
    """Agent j is on the cost-quality frontier: no agent at least as good and at most as costly, one strictly."""
    return not any((q[k] >= q[j] and c[k] <= c[j] and (q[k] > q[j] or c[k] < c[j])) for k in range(len(q)) if k != j)


def measure_pool(wide: str, profile: str, base_pool: str, fraction: float, boot: int, seed: int) -> dict:
    from pipeline.collect.agents import load_agents
    from resources.pool import default_agents_file

    tasks, agents, R, C = full_matrix(profile, wide)
    base_names = {a.name for a in load_agents(default_agents_file(), base_pool)}
    b_idx = [j for j, a in enumerate(agents) if a.name in base_names]
    X = features(tasks, R[:, b_idx])
    q_full, c_full = R.mean(axis=0), C.mean(axis=0)
    out = {}
    for j, a in enumerate(agents):
        if a.name in base_names:
            continue
        rng = np.random.default_rng(seed + j)
        sample = choose_sample(tasks, R[:, b_idx], fraction, rng)
        est, lo, hi = estimate_quality(X, R[:, j], sample, rng, boot)
        cost_est = float(C[sample, j].mean())
        cols = b_idx + [j]  # the existing pool and this new agent
        q, c = q_full[cols].copy(), c_full[cols].copy()
        joins_full = on_frontier(q, c, len(cols) - 1)
        q[-1], c[-1] = est, cost_est
        per_src = {s: {"full": float(R[idx, j].mean()), "sample_n": int(np.isin(idx, sample).sum())}
                   for s, idx in tasks.groupby("source").indices.items()}
        out[a.name] = {"model": a.model, "calls_fraction": len(sample) / len(tasks), "calls": int(len(sample)),
                       "calls_full": len(tasks), "joins_full": joins_full,
                       "joins_adaptive": on_frontier(q, c, len(cols) - 1),
                       "quality_full": float(q_full[j]), "quality_estimate": est, "ci_low": lo, "ci_high": hi,
                       "in_ci": bool(lo <= q_full[j] <= hi), "cost_full": float(c_full[j]),
                       "cost_estimate": cost_est, "usd_full": float(C[:, j].sum()),
                       "usd_sample": float(C[sample, j].sum()), "per_source": per_src}
    return {"agents": out, "tasks": len(tasks), "aiq_full": None, "aiq_adaptive": None,
            "note": "aiq_*: the router on the completed matrix is not measured yet"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--boot", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--refresh", default=None, metavar="K,K,...",
                    help="also time the refresh at these pool widths (bench/refresh.py), e.g. 5,10,20,40")
    args = ap.parse_args(argv)
    from resources.storage import default_home

    t0 = time.time()
    result = {"fraction": args.fraction, "pools": {}}
    for wide, (profile, base) in POOLS.items():
        result["pools"][wide] = measure_pool(wide, profile, base, args.fraction, args.boot, args.seed)
        for name, r in result["pools"][wide]["agents"].items():
            print(f"{wide} {name}: {r['calls']}/{r['calls_full']} calls ({r['calls_fraction']:.0%}), quality full "
                  f"{r['quality_full']:.4f} est {r['quality_estimate']:.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]"
                  f"{'' if r['in_ci'] else ' MISS'}, cost/task full {r['cost_full']:.6f} est "
                  f"{r['cost_estimate']:.6f}, joins full {r['joins_full']} adaptive {r['joins_adaptive']}")
    result["seconds"] = round(time.time() - t0, 1)
    out = Path(default_home()) / "bench" / "grow.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(keep_refresh(out, result), indent=2) + "\n")
    print(f"written: {out} ({result['seconds']} s)")
    if args.refresh:
        from bench.refresh import main as refresh_main

        return refresh_main(["--k", args.refresh])
    return 0


def keep_refresh(out: Path, result: dict) -> dict:
    """`result` with the refresh timing bench/refresh.py wrote into `out` before (its keys are kept)."""
    old = json.loads(out.read_text()) if out.exists() else {}
    return {**{k: old[k] for k in ("refresh_seconds", "refresh") if k in old}, **result}


if __name__ == "__main__":
    sys.exit(main())
