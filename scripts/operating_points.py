"""Single-split vs cross-fitted operating points on a materialised lineage (`router-lite run` first; zero API calls).

For the head's λ path and the cascade's plans (both variants), per named target and per selection method
(`train.operating_points`: "validation" = the one validation split, "crossfit" = pooled out-of-fold outcomes over
train + validation, `--folds` seeded folds): the chosen point, its held-out test quality as a fraction of the best
single agent's and its test cost as a fraction of that agent's cost, each with a paired 95 % bootstrap CI. Then the
**hindsight bounds**, read on the test rows, which no honest selection may use: the best test quality any point of
the fitted family reaches at <= `--cap` of the best single agent's cost, and the cheapest point of the family that
holds `--quality` of its quality; for the cascade also the wider candidate family (every combination of the answer
formats' Pareto policies, chosen on test: bench/cascade.py's `family_bound`). The selection reads no test row.

The figures are the lineage's own scoring (the head's `held_out_value`, OOD guard and ship-gate fallback included;
the cascade's `held_out_cascade`), so on the home a lineage ran, the rows of its selection method are the figures of
its reports/router_value.json: the "Beside the lineage" table checks this and names the pool (a script figure is
only comparable with a README figure of the same home and pool; `--strict` exits 1 otherwise).

    ROUTER_LITE_HOME=.router-lite python scripts/operating_points.py --strict   # demo: 4-10 min on 2 busy cores
    ROUTER_LITE_HOME=.router-lite python scripts/operating_points.py --families cascade --fold-seed 1

Prints Markdown tables; writes $ROUTER_LITE_HOME/reports/operating_points.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cli import lineage  # noqa: E402
from pipeline.route.cascade_fit import Rows, fit_cascades, ratio_ci, success_refit  # noqa: E402
from pipeline.route.fit import fit_router  # noqa: E402
from pipeline.route.targets import PathRows, operating_path, resolve  # noqa: E402
from pipeline.route.train import Selection, TrainConfig  # noqa: E402
from pipeline.route.value import PromptParts, agent_costs, pick_costs, target_picks  # noqa: E402

METHODS = ("validation", "crossfit")


def load(home: Path) -> dict:
    """The lineage's reward matrix, split, embeddings, answers' agreement, labels and train config (bench/cascade.py's
    `load`, plus what `fit_router` takes)."""
    from bench.cascade import load as load_cascade
    from pipeline.report.pool_report import domain_column, labels_of

    d = lineage.training_rows(home=str(home))
    rm, t, split = d["rewards"], d["tasks"], d["split"]
    head = lineage.load("router_head", home=str(home))
    tc = {k: tuple(v) if isinstance(v, list) else v for k, v in head["train_config"].items()
          if k in TrainConfig.__dataclass_fields__}
    agents, R, C, E, P, g, masks = load_cascade(home)
    return {"rewards": rm, "split": split, "X": d["X"],
            "labels": labels_of(t, domain_column(t)), "cfg": replace(TrainConfig(**tc), log_every=0),
            "agents": agents, "R": R, "C": C, "E": E, "P": P, "g": g, "masks": masks,
            "best": int(head["best_single"]), "scorer": head.companions["scorer"]}


def ratios(reward: np.ndarray, cost: np.ndarray, R_te: np.ndarray, C_te: np.ndarray, best: int) -> dict:
    """Test quality and cost as fractions of the best single agent's, with paired 95 % bootstrap CIs."""
    q, c = ratio_ci(reward, R_te[:, best]), ratio_ci(cost, C_te[:, best])
    return {"quality": float(reward.mean() / R_te[:, best].mean()), "quality_ci": list(q),
            "cost": float(cost.mean() / C_te[:, best].mean()), "cost_ci": list(c)}


def bound(points: np.ndarray, bq: float, bc: float, cap: float, quality: float) -> dict:
    """Hindsight on test over (cost, quality) `points`: the best quality at <= cap x the best single agent's cost, and
    the cheapest point holding `quality` x its quality (fractions of that agent's)."""
    q, c = points[:, 1] / bq, points[:, 0] / bc
    under = np.flatnonzero(c <= cap + 1e-12)
    hold = np.flatnonzero(q >= quality - 1e-12)
    return {"best_quality_under_cap": None if not len(under) else [float(q[under].max()),
                                                                    float(c[under][np.argmax(q[under])])],
            "cheapest_holding_quality": None if not len(hold) else [float(q[hold][np.argmin(c[hold])]),
                                                                     float(c[hold].min())]}


def head_family(d: dict, targets: list[str], args) -> tuple[list[dict], dict]:
    """The head's value-scorer λ path: each selection method's choice per target on test, and its test bound. The
    figures are the lineage's own (`fit.value`: pipeline.route.value.held_out_value, what router_value.json's `head`
    reports, OOD guard and ship-gate fallback included); the picks behind them give the paired CIs."""
    rows, out = [], {}
    te = d["masks"]["held_out"]
    for method in METHODS:
        cfg = replace(d["cfg"], operating_points=method, folds=args.folds, fold_seed=args.fold_seed)
        fit = fit_router(d["X"], d["rewards"], d["split"], cfg, labels=d["labels"])
        R_te, C_te, X_te, best = d["R"][te], d["C"][te], d["X"][te], fit.best_single
        picks0 = fit.guard.route(fit.head.pick(X_te), X_te, best)
        cost = agent_costs(d["C"][d["masks"]["train"]])
        for t in targets:
            parts = PromptParts(fit.head, fit.guard, fit.scorer, fit.cost_scorer, fit.operating_points, best, cost)
            picks, point = target_picks(t, parts, X_te, picks0)
            n = np.arange(len(picks))
            row = {"family": "head", "router": "head", "selection": method, "target": t,
                   "chosen": f"λ={point['lambda']:.3g}", **ratios(R_te[n, picks], C_te[n, picks], R_te, C_te, best)}
            v = fit.value["targets"][point["target"]]
            shipped = (v["quality"] / R_te[:, best].mean(), v["cost_ratio"])
            if not np.allclose((row["quality"], row["cost"]), shipped, rtol=0, atol=1e-9):
                raise RuntimeError(f"head {t} ({method}): picks give {row['quality']:.6f} / {row['cost']:.6f}, "
                                   f"held_out_value {shipped[0]:.6f} / {shipped[1]:.6f}")
            rows.append(row)
        if method == "crossfit":  # the test path of the same scorers: the family, read in hindsight
            path = operating_path(PathRows(fit.scorer.scores(X_te), picks0, R_te, C_te,
                                           pick_costs(fit.cost_scorer, X_te, cost)), cost, best, fit.agents)
            pts = np.array([(p["cost_per_1k"], p["quality"]) for p in path["points"]])
            out = bound(pts, R_te[:, best].mean(), 1000 * C_te[:, best].mean(), args.cap, args.quality)
    return rows, out


def cascade_rows(fit, targets: list[str], method: str) -> list[dict]:
    """Rows of a `fit_cascades` result: per variant and target the held-out figures of
    pipeline.route.cascade_fit.held_out_cascade, the very ones router_value.json's `cascade:<variant>` reports."""
    rows = []
    for variant, v in fit.variants.items():
        for t in targets:
            tg = v.targets[resolve(t, v.path)["target"]]
            rows.append({"family": f"cascade:{variant}" + (" ★" if variant == fit.chosen else ""),
                         "router": f"cascade:{variant}", "selection": method, "target": t, "chosen": tg["plan"],
                         "quality": tg["quality_ratio"], "quality_ci": list(tg["quality_ratio_ci"]),
                         "cost": tg["cost_ratio"], "cost_ci": list(tg["cost_ratio_ci"])})
    return rows


def cascade_family(d: dict, targets: list[str], args) -> tuple[list[dict], dict]:
    """Both cascade variants: each selection method's plan per target on test, the chosen variant, the bounds."""
    from bench.cascade import family_bound

    te, best, rows, out = d["masks"]["held_out"], d["best"], [], {}
    R_te, C_te = d["R"][te], d["C"][te]
    for method in METHODS:
        sel = Selection(method, args.folds, args.fold_seed)
        fit = fit_cascades(Rows(d["R"], d["C"], d["E"], d["P"], d["g"]), d["masks"], best, d["agents"], targets,
                           selection=sel, p_of=success_refit(d["scorer"], d["X"], d["R"]))
        rows += cascade_rows(fit, targets, method)
        if method == "crossfit":
            for variant, v in fit.variants.items():
                out[variant] = bound(np.array(v.points_test), R_te[:, best].mean(), C_te[:, best].mean(), args.cap,
                                     args.quality)
    P = d["P"] if "combined" in out else np.zeros_like(d["R"])
    out["candidate_family"] = family_bound(d["agents"], d["R"], d["C"], d["E"], P, d["g"], d["masks"], best,
                                           args.cap)
    return rows, out


def lineage_check(rows: list[dict], rv: dict, agents: list[str], tol: float = 1e-6) -> dict:
    """The script's rows beside the lineage's reports/router_value.json on the same home: the pool must be the same
    agents, and each row of the selection method the lineage ran (its `routers[...].selection.method`) must give the
    router_value figure of the same router and target (quality and cost as fractions of the best single agent's,
    within `tol`). {"pool": bool, "rows": [...], "ok": bool}: a script figure quoted beside a README figure is only
    comparable when ok."""
    shares = ((rv.get("targets") or {}).get("max-quality") or {}).get("shares") or {}
    pool = sorted(shares) == sorted(agents)
    out = []
    for r in rows:
        lr = (rv.get("routers") or {}).get(r["router"])
        method = ((lr or {}).get("selection") or {}).get("method", "validation")
        t = (lr or {}).get("targets", {}).get(r["target"])
        if lr is None or r["selection"] != method or t is None:
            continue
        lin = [t.get("quality_ratio"), t.get("cost_ratio")]
        same = None not in lin and abs(lin[0] - r["quality"]) <= tol and abs(lin[1] - r["cost"]) <= tol
        out.append({"router": r["router"], "target": r["target"], "selection": method,
                    "script": [r["quality"], r["cost"]], "lineage": lin, "match": bool(same)})
    return {"pool": pool, "lineage_agents": sorted(shares), "rows": out,
            "ok": pool and bool(out) and all(x["match"] for x in out)}


def check_markdown(check: dict) -> str:
    if not check["pool"]:
        head = (f"**The lineage's router_value.json is of another pool** ({', '.join(check['lineage_agents'])}): its "
                "figures are not comparable with these.\n\n")
    else:
        head = "" if check["ok"] else "**The script and the lineage disagree on this home.**\n\n"
    rows = [{"router": x["router"], "target": x["target"], "selection": x["selection"],
             "script quality / cost": f"{x['script'][0]:.1%} / {x['script'][1]:.0%}",
             "router_value.json": f"{x['lineage'][0]:.1%} / {x['lineage'][1]:.0%}" if None not in x["lineage"]
             else "—", "same": "yes" if x["match"] else "**no**"} for x in check["rows"]]
    return head + (pd.DataFrame(rows).to_markdown(index=False) if rows else "(no row of the lineage's method)")


def table(rows: list[dict]) -> str:
    fmt = [{"family": r["family"], "selection": r["selection"], "target": r["target"],
            "test quality × best [95 % CI]": f"{r['quality']:.1%} [{r['quality_ci'][0]:.1%}, {r['quality_ci'][1]:.1%}]",
            "test cost × best [95 % CI]": f"{r['cost']:.0%} [{r['cost_ci'][0]:.0%}, {r['cost_ci'][1]:.0%}]",
            "chosen": r["chosen"]} for r in rows]
    return pd.DataFrame(fmt).to_markdown(index=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default="head,cascade")
    ap.add_argument("--targets", default="quality>=0.98,quality>=0.95,parity")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--fold-seed", type=int, default=0)
    ap.add_argument("--cap", type=float, default=0.55, help="cost cap of the goal, x the best single agent's cost")
    ap.add_argument("--quality", type=float, default=0.98, help="quality of the goal, x the best single agent's")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 unless every row of the lineage's selection method equals router_value.json's")
    args = ap.parse_args(argv)
    home = Path(os.environ.get("ROUTER_LITE_HOME", ROOT / ".router-lite"))
    t0 = time.perf_counter()
    d = load(home)
    targets = args.targets.split(",")
    rows, bounds = [], {}
    for fam, fn in (("head", head_family), ("cascade", cascade_family)):
        if fam in args.families.split(","):
            r, bounds[fam] = fn(d, targets, args)
            rows += r
    rv_path = home / "reports" / "router_value.json"
    check = lineage_check(rows, json.loads(rv_path.read_text()), d["agents"]) if rv_path.exists() else None
    print(f"## Operating points on {home}: single split vs cross-fitted ({args.folds} folds, seed {args.fold_seed})"
          f"\n\nPool: {', '.join(d['agents'])}. Held-out test n={int(d['masks']['held_out'].sum())}; fractions of "
          f"the best single agent ({d['agents'][d['best']]}), OOD guard and ship gate included as served; ★ = the "
          f"cascade variant chosen (AIQ on the rows the path was read on).\n\n"
          + table(rows) + "\n\n## Beside the lineage (reports/router_value.json of this home)\n\n"
          + (check_markdown(check) if check else "(no router_value.json: `router-lite run` first)")
          + "\n\n## Hindsight bounds on test (no honest selection may use them)\n\n"
          + json.dumps(bounds, indent=1, default=float) + "\n")
    out = home / "reports" / "operating_points.json"
    out.write_text(json.dumps({"args": vars(args), "home": str(home), "agents": d["agents"], "rows": rows,
                               "bounds": bounds, "lineage_check": check, "seconds": time.perf_counter() - t0},
                              indent=1, default=float))
    print(f"wrote {out} ({time.perf_counter() - t0:.0f} s)")
    return 1 if args.strict and not (check and check["ok"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
