"""Benchmark: one batched matrix product per generation vs a per-candidate Python loop.

    .venv/bin/python bench/train.py [--n 36000 --d 384 --K 11 --generations 60]

Synthetic data (planted rule: agent argmax(x @ A) answers, others 30 %), linear head, sep-CMA-ES from zeros with the
same seed for both variants, so both see the same candidates and must report the same rewards. Prints, side by
side: seconds per generation (whole ask/evaluate/tell, and the fitness evaluation alone), total seconds, peak
traced memory of one population's fitness evaluation (tracemalloc: numpy allocations are traced) and the ratio
loop / vectorised; then the process's peak RSS (resource.getrusage).
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.route.head import n_params  # noqa: E402
from pipeline.route.train import _Objective  # noqa: E402


def data(n: int, d: int, K: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    star = (X @ rng.standard_normal((d, K))).argmax(1)
    R = (rng.random((n, K)) < 0.3).astype(np.float32)
    R[np.arange(n), star] = 1.0
    return np.hstack([X, np.ones((n, 1), np.float32)]), R


def loop_objective(Z1: np.ndarray, R: np.ndarray, K: int):
    """The naive way: one matrix product and argmax per candidate, in a Python loop."""
    rows = np.arange(len(R))

    def f(thetas: np.ndarray) -> np.ndarray:
        out = np.empty(len(thetas))
        for p, theta in enumerate(thetas):
            pick = (Z1 @ theta.astype(np.float32).reshape(-1, K)).argmax(axis=1)
            out[p] = R[rows, pick].mean()
        return out
    return f


def run(objective, x0: np.ndarray, generations: int, seed: int, trace_generations: int = 2) -> dict:
    """Time `generations` ask/evaluate/tell rounds untraced; then peak traced memory over a few more rounds
    (tracemalloc slows Python allocations, so it is kept out of the timing)."""
    import cma

    es = cma.CMAEvolutionStrategy(x0, 0.5, {"CMA_diagonal": True, "seed": seed, "verbose": -9})
    t_obj, best, t0 = 0.0, -np.inf, time.perf_counter()
    for _ in range(generations):
        thetas = np.asarray(es.ask())
        t = time.perf_counter()
        fit = objective(thetas)
        t_obj += time.perf_counter() - t
        es.tell(list(thetas), list(-fit))
        best = max(best, float(fit.max()))
    total = time.perf_counter() - t0
    thetas = np.asarray(es.ask())
    tracemalloc.start()
    for _ in range(trace_generations):
        objective(thetas)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"s_per_gen": total / generations, "fitness_s_per_gen": t_obj / generations, "total_s": total,
            "fitness_peak_mib": peak / 2**20, "best_reward": best, "popsize": es.popsize}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=36_000)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--K", type=int, default=11)
    ap.add_argument("--generations", type=int, default=60)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args(argv)
    Z1, R = data(a.n, a.d, a.K)
    x0 = np.zeros(n_params(a.d, a.K))
    obj = _Objective(Z1, R, None, 0, "tanh", 0.0)
    vec = run(lambda th: obj(th)[0], x0, a.generations, a.seed)
    loop = run(loop_objective(Z1, R, a.K), x0, a.generations, a.seed)
    print(f"data {a.n} x {a.d} x {a.K}, {x0.size} params, popsize {vec['popsize']}, {a.generations} generations")
    print(f"{'':22s}{'vectorised':>12s}{'loop':>12s}{'loop/vec':>10s}")
    for key, fmt in [("s_per_gen", "{:12.3f}"), ("fitness_s_per_gen", "{:12.3f}"), ("total_s", "{:12.1f}"),
                     ("fitness_peak_mib", "{:12.1f}"), ("best_reward", "{:12.4f}")]:
        ratio = loop[key] / vec[key] if vec[key] else float("nan")
        print(f"{key:22s}" + fmt.format(vec[key]) + fmt.format(loop[key]) + f"{ratio:10.2f}")
    same = abs(vec["best_reward"] - loop["best_reward"]) < 1e-6
    print(f"same best reward in both variants: {same}")
    print(f"peak RSS of the process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
