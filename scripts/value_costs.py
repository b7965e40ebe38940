"""Pick-time cost: each agent's mean training cost vs a ridge prediction of its cost on the query (the cost scorer),
compared by the area under the validation λ path (AIQ over the agents' cost span); test printed for the record.

    python scripts/value_costs.py pipeline|routerbench
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import numpy as np
from router_value import value_setup

from pipeline.route.frontier import aiq, upper_hull
from pipeline.route.train import ridge_path
from pipeline.route.value import agent_costs

LAMBDAS = np.concatenate([[0], np.geomspace(1e-2, 1e5, 150)])


def cost_predictor(head, X_tr, C_tr, X_va, C_va):
    """Ridge of per-query cost on the standardised embedding, alpha by validation MSE; returns (alpha, predict)."""
    def z(A):
        return (A - head.mean) / head.std

    best = None
    for alpha, theta in ridge_path(z(X_tr), C_tr, np.logspace(0, 5, 11)):
        mse = ((z(X_va) @ theta[:-1] + theta[-1] - C_va) ** 2).mean()
        if best is None or mse < best[1]:
            best = (alpha, mse, theta)
    theta = best[2]
    return best[0], lambda A: np.maximum(z(A) @ theta[:-1] + theta[-1], 1e-9)


def lambda_path(pred, cost, R, C):
    """(λ, cost per 1k, quality, picks) along the λ sweep of argmax(pred − λ·cost)."""
    rows = np.arange(len(pred))
    out = []
    for lam in LAMBDAS:
        picks = (pred - lam * cost).argmax(1)
        out.append((lam, 1000 * C[rows, picks].mean(), R[rows, picks].mean(), picks))
    return out


def main() -> int:
    d = value_setup(sys.argv[1])
    X, C, Re, tr, va, te, ridge = d["X"], d["C"], d["Re"], d["tr"], d["va"], d["te"], d["ridge"]
    alpha, cpred = cost_predictor(d["head"], X[tr], C[tr], X[va], C[va])
    cost, bs = agent_costs(C[tr]), int(np.argmax(Re[tr].mean(axis=0)))
    print("cost ridge alpha", alpha, "val R2 per agent", 1 - ((cpred(X[va]) - C[va]) ** 2).mean(0) / C[va].var(0))
    variants = (("mean cost", np.tile(cost, (va.sum(), 1)), np.tile(cost, (te.sum(), 1))),
                ("predicted cost", cpred(X[va]), cpred(X[te])))
    for name, cost_va, cost_te in variants:
        path = lambda_path(ridge.scores(X[va]), cost_va, Re[va], C[va])
        pts = np.array([[c, q] for _, c, q, _ in path])
        cmin, cmax = 1000 * C[va].mean(0).min(), 1000 * C[va].mean(0).max()
        print(name, "val AIQ", round(aiq(upper_hull(pts), cmin, cmax), 4))
        q_best_va, c_best_te, q_best_te = Re[va][:, bs].mean(), 1000 * C[te][:, bs].mean(), Re[te][:, bs].mean()
        rows = np.arange(te.sum())
        for frac in (0.98, 0.95):
            ok = [i for i, (_, _c, q, _p) in enumerate(path) if q >= frac * q_best_va]
            i = min(ok, key=lambda i: path[i][1])
            picks = (ridge.scores(X[te]) - path[i][0] * cost_te).argmax(1)
            q, c = Re[te][rows, picks].mean(), 1000 * C[te][rows, picks].mean()
            print(f"  quality>={frac}: val q {path[i][2]:.4f} cost {path[i][1]:.3f} | test q {q:.4f} "
                  f"({q / q_best_te:.3f}) cost ratio {c / c_best_te:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
