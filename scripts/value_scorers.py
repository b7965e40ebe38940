"""Which predictor should the cost-aware operating points use? Ridge (alpha by validation MSE), kNN (k by
validation pick reward), and their mean, compared by the area under the validation λ path (AIQ over the agents'
cost span, RouterBench rule) — chosen on validation; the test figures per named target are printed for each.

    python scripts/value_scorers.py --data pipeline|routerbench
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from router_value import value_setup

from pipeline.route.frontier import aiq, upper_hull
from pipeline.route.knn import KnnRouter
from pipeline.route.targets import (
    REPORT_TARGETS,
    PathRows,
    cost_aware_pick,
    hull_agents,
    operating_path,
    point_stats,
    resolve,
)
from pipeline.route.value import agent_costs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", choices=["pipeline", "routerbench"], default="pipeline")
    args = ap.parse_args()
    d = value_setup(args.data)
    X, name, agents, C, Re = d["X"], d["name"], d["agents"], d["C"], d["Re"]
    tr, va, te, ridge, info = d["tr"], d["va"], d["te"], d["ridge"], d["info"]
    knn = KnnRouter().fit(X[tr], Re[tr], X[va], Re[va])
    cost = agent_costs(C[tr])
    best = int(np.argmax(Re[tr].mean(axis=0)))
    cmin, cmax = 1000 * C[va].mean(axis=0).min(), 1000 * C[va].mean(axis=0).max()
    preds = {"ridge": (ridge.scores(X[va]), ridge.scores(X[te])), "knn": (knn.scores(X[va]), knn.scores(X[te]))}
    preds["mean(ridge, knn)"] = tuple((a + b) / 2 for a, b in zip(preds["ridge"], preds["knn"]))
    hull = hull_agents(Re[tr].mean(axis=0), cost)
    print("hull agents (train):", [a for a, h in zip(agents, hull) if h])
    for k in list(preds):
        preds[k + ", hull agents"] = preds[k]
    rows = []
    print(f"{name}: ridge alpha {info['alpha']}, knn k {knn.k_}; best single {agents[best]}; "
          f"test best single {Re[te][:, best].mean():.4f} at {1000 * C[te][:, best].mean():.4f}/1k")
    for pname, (pv, pt) in preds.items():
        allowed = hull if pname.endswith("hull agents") else None
        path = operating_path(PathRows(pv, np.full(int(va.sum()), best), Re[va], C[va]), cost, best, agents,
                              allowed=allowed)
        pts = np.array([[p["cost_per_1k"], p["quality"]] for p in path["points"]])
        val_aiq = aiq(upper_hull(pts), cmin, cmax)
        for t in REPORT_TARGETS[1:]:
            r = resolve(t, path)
            picks = (cost_aware_pick(pt, cost, r["lambda"], allowed) if r["lambda"] > 0
                     else np.full(int(te.sum()), best))
            s = point_stats(picks, Re[te], C[te], best, agents)
            rows.append({"scorer": pname, "val_aiq": val_aiq, "target": t, "lambda": r["lambda"],
                         "val_q": r["quality"], "val_cost": r["cost_per_1k"], "test_q": s["quality"],
                         "test_gain": f"{s['gain']:+.3f} [{s['gain_low']:+.3f}, {s['gain_high']:+.3f}]",
                         "test_cost_ratio": s["cost_per_1k"] / (1000 * C[te][:, best].mean())})
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
