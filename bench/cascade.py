"""Cascades on a materialised lineage (`router-lite run [--profile P]` first): the ablation (prompt-only /
cascade / combined) from reports/router_value.json, the winner's-curse guard measured (validation vs test of the
`quality>=F` point at several guard_z), and how far the goal ≥ 98 % of the best single agent at ≤ 55 % of its cost
is from the candidate family even when the plan is chosen on the test rows themselves (an upper bound, not a
router). Zero API calls. Prints tables; writes $ROUTER_LITE_HOME/bench/cascade.json.

    ROUTER_LITE_HOME=.router-lite python bench/cascade.py
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cli import lineage  # noqa: E402
from pipeline.collect.answers import agreement, answers_matrix  # noqa: E402
from pipeline.collect.rewards import effective_rewards, to_arrays  # noqa: E402
from pipeline.report.value import ablation_markdown  # noqa: E402
from pipeline.route.cascade import Plan, run_plan, run_policies  # noqa: E402
from pipeline.route.cascade_fit import Rows, candidates, fit_cascades, preference  # noqa: E402
from pipeline.route.fit import split_masks  # noqa: E402
from pipeline.route.targets import resolve  # noqa: E402


def load(home: Path):
    """The demo lineage's matrix as the cascade search takes it, read through Dagster (cli/lineage.py)."""
    d = lineage.training_rows(home=str(home))
    rm, t = d["rewards"], d["tasks"]
    agents, R, B, C = to_arrays(rm)
    E = agreement(answers_matrix(lineage.load("agent_answers", home=str(home)), rm["task_id"], agents),
                  t["grader"].tolist())
    P = lineage.load("router_head", home=str(home)).companions["scorer"].scores(d["X"])
    masks = split_masks(d["split"], "test", rm["task_id"].astype(str).tolist())
    return agents, effective_rewards(R, B), C, E, P, t["grader"].to_numpy(), masks


def guard_table(agents, R, C, E, P, g, masks, best) -> list[dict]:
    rows = []
    te = masks["held_out"]
    bq, bc = R[te, best].mean(), C[te, best].mean()
    for z in (0.0, 0.5, 1.0, 2.0):
        fit = fit_cascades(Rows(R, C, E, P, g), masks, best, agents, ["quality>=0.98"], guard_z=z)
        for variant, v in fit.variants.items():
            point = resolve("quality>=0.98", v.path)
            plan = Plan.from_dict(v.path["points"][point["index"]]["plan"], agents)
            o = run_plan(plan, R[te], C[te], E[te], np.array(v.order), None if variant == "cascade" else P[te],
                         g[te])
            rows.append({"guard_z": z, "variant": variant,
                         "validation x quality": point["quality"] / v.path["best_single_validation"]["quality"],
                         "test x quality": o.reward.mean() / bq, "test x cost": o.cost.mean() / bc})
    return rows


def family_bound(agents, R, C, E, P, g, masks, best, cap: float = 0.55) -> dict:
    """The best test quality any plan of the candidate family reaches at ≤ cap × the best single agent's test cost,
    the policy of each answer format chosen ON THE TEST ROWS (every combination of the formats' Pareto policies, not
    only the λ vertices): an upper bound on what a plan of this family can do here, not a router."""
    from pipeline.route.frontier import pareto

    te = masks["held_out"]
    order = preference(R[masks["train"]])
    bq, bc = R[te, best].mean(), C[te, best].mean()
    fronts = []
    for x in sorted(set(g[te])):
        m = te & (g == x)
        pool = candidates(R[m], C[m], P[m])
        outs = run_policies(pool, R[m], C[m], E[m], order, P[m])
        pts = np.array([(o.cost.sum(), o.reward.sum()) for o in outs])
        fronts.append(pts[pareto(pts, 1e-12)])
    n, budget = te.sum(), cap * bc * te.sum()
    best_q, best_c = 0.0, None
    combos = np.zeros((1, 2))
    for f in fronts:  # all sums of one Pareto point per format, pruned to the running Pareto front
        combos = (combos[:, None, :] + f[None, :, :]).reshape(-1, 2)
        combos = combos[pareto(combos, 1e-12)]
    ok = combos[combos[:, 0] <= budget]
    if len(ok):
        i = int(np.argmax(ok[:, 1]))
        best_q, best_c = ok[i, 1] / n, ok[i, 0] / n
    return {"cap": cap, "x_quality": best_q / bq, "x_cost": None if best_c is None else best_c / bc}


def main() -> int:
    home = Path(os.environ.get("ROUTER_LITE_HOME", ROOT / ".router-lite"))
    rv = json.loads((home / "reports" / "router_value.json").read_text())
    print(f"## {rv['profile']}: router kinds on held-out test\n\n{ablation_markdown(rv)}")
    t0 = time.perf_counter()
    agents, R, C, E, P, g, masks = load(home)
    best = agents.index(rv["best_single"]["agent"])
    guard = guard_table(agents, R, C, E, P, g, masks, best)
    print("## The winner's curse: the quality>=0.98 point chosen on validation, by guard_z\n\n"
          + pd.DataFrame(guard).to_markdown(index=False, floatfmt=".3f") + "\n")
    bound = family_bound(agents, R, C, E, P, g, masks, best)
    print(f"## Goal check: best plan of the family chosen on TEST at <= {bound['cap']:.0%} of the best single "
          f"agent's cost: {bound['x_quality']:.3f} x its quality"
          + (f" at {bound['x_cost']:.3f} x its cost" if bound["x_cost"] else "") + " (an upper bound, not a router)\n")
    out = home / "bench" / "cascade.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"profile": rv["profile"], "routers": {k: {kk: vv for kk, vv in r.items()}
                                                                    for k, r in rv["routers"].items()},
                               "guard": guard, "family_bound": bound,
                               "seconds": time.perf_counter() - t0}, indent=1, default=float))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
