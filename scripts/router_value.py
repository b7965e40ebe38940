"""Item-4 experiments and the value tables outside Dagster: the head vs the per-domain label router and kNN, and
the operating points, on the pipeline's own matrix (ROUTER_LITE_HOME after `router-lite run`) or on RouterBench.

Levers (TrainConfig settings) are compared on VALIDATION (the head's validation reward before the ship gate); the
test numbers of every lever are printed too, but the lever to ship is the one with the best validation reward.

    python scripts/router_value.py --data pipeline [--levers]     # the current profile's reward matrix
    python scripts/router_value.py --data routerbench [--levers]  # the bundled RouterBench suite
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.report.value import targets_markdown, value_line
from pipeline.route.fit import fit_router
from pipeline.route.train import TrainConfig

LEVERS = {
    "baseline (ridge start, hard fitness)": {},
    "l2 trust region 1": {"l2": 1.0},
    "l2 trust region 10": {"l2": 10.0},
    "soft fitness": {"fitness": "soft"},
    "soft fitness + l2 10": {"fitness": "soft", "l2": 10.0},
    "ridge start only (0 generations)": {"generations": 0},
    "ship gate at 0.9 confidence": {"ship_confidence": 0.9},
}


def pipeline_data():
    from cli import lineage
    from pipeline.report.pool_report import domain_column, labels_of

    d = lineage.training_rows()
    return d["X"], d["rewards"], d["split"], labels_of(d["tasks"], domain_column(d["tasks"])), "pipeline"


def routerbench_data():
    from pipeline.embed.backbone import Backbone, EmbeddingCache
    from pipeline.report.suites import build_suite
    from resources.storage import default_home

    s = build_suite("routerbench")
    X = EmbeddingCache(Path(default_home()) / "embeddings").get_or_compute(
        s.query_text, Backbone("sentence-transformers/all-MiniLM-L6-v2", max_seq_length=256))
    rewards = pd.DataFrame({"task_id": s.query_ids, "agent_order": [s.models] * len(s.query_ids),
                            "mean_reward": list(s.quality), "mean_cost": list(s.cost)})
    return X, rewards, pd.Series(s.split), np.asarray(s.meta["per_query"]["eval_name"], dtype=object), "routerbench"


def value_setup(data: str):
    """What the value scripts share: the data, its train/validation/test masks, effective rewards, the ridge-start
    head and the value scorer fitted on train (alpha chosen on validation)."""
    from pipeline.route.fit import reward_arrays
    from pipeline.route.train import PromptRows, train_head
    from pipeline.route.value import fit_value_scorer

    X, rewards, split, labels, name = pipeline_data() if data == "pipeline" else routerbench_data()
    arrays = reward_arrays(rewards, split, "test")
    agents, R, B, C, m = arrays.agents, arrays.R, arrays.B, arrays.C, arrays.masks
    tr, va, te = m["train"], m["validation"], m["held_out"]
    Re = arrays.R_eff
    head, _ = train_head(PromptRows(X[tr], R[tr], B[tr]), PromptRows(X[va], R[va], B[va]),
                         TrainConfig(generations=0, log_every=0))
    ridge, info = fit_value_scorer(head, X[tr], Re[tr], X[va], Re[va])
    return dict(X=X, rewards=rewards, labels=labels, name=name, agents=agents, R=R, B=B, C=C, Re=Re,
                tr=tr, va=va, te=te, head=head, ridge=ridge, info=info)


def ci(c: dict) -> str:
    return f"{c['gain']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", choices=["pipeline", "routerbench"], default="pipeline")
    ap.add_argument("--levers", action="store_true", help="compare the training levers (chosen on validation)")
    ap.add_argument("--generations", type=int, default=60)
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    ap.add_argument("--only", default=None, help="run only the levers whose name contains this text")
    args = ap.parse_args()
    X, rewards, split, labels, name = pipeline_data() if args.data == "pipeline" else routerbench_data()
    rows = []
    levers = LEVERS if args.levers else {"default": {}}
    if args.only:
        levers = {k: v for k, v in levers.items() if args.only in k}
    for lever, kw in levers.items():
        cfg = TrainConfig(**{"generations": args.generations, "log_every": 0, **kw})
        fit = fit_router(X, rewards, split, cfg, labels=labels)
        v, g = fit.value, fit.extra["gate"]
        row = {"lever": lever, "val_head_trained": g.get("head_validation"),
               "val_best_single": g.get("best_single_validation"),
               "shipped": g["shipped"], "test_head": fit.metrics["head"],
               "test_best_single": fit.metrics["best_single"],
               "test_knn": fit.metrics["knn"], "test_label_router": v.get("label_router", {}).get("quality"),
               "oracle": fit.metrics["oracle"], "head-label (95% CI)": ci(v["label_router"]["head_minus_label_router"]),
               "head-knn (95% CI)": ci(v["head_minus_knn"]), "head-best (95% CI)": ci(fit.extra["head_gain_ci"]),
               "train_fit": fit.extra["train_fit"]}
        rows.append(row)
        print(f"\n### {name}: {lever}\n", flush=True)
        print(json.dumps(row, indent=1, default=str))
        print(targets_markdown(v))
        print(value_line(v, "parity"), "|", value_line(v, "quality>=0.98"))
        print("label router per domain:", v["label_router"]["picks_per_domain"])
        curve = pd.DataFrame(fit.curve)
        print(curve[["generation", "mean_train_reward", "val_reward"]].iloc[::10].to_string(index=False))
    print("\n" + pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4f"))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
