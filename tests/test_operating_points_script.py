"""scripts/operating_points.py scores what the lineage ships: on a small synthetic lineage (a head fitted as the
`router_head` asset fits it, cascades as `cascade_router` does, reports/router_value.json built by the report's own
function) every row of the lineage's selection method equals router_value.json's figure, and the check says so when
it does not (another pool, another figure)."""
from __future__ import annotations

import copy
import importlib.util
from argparse import Namespace
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.report.value import CascadeFigures, HeadFigures, router_value
from pipeline.route.cascade_fit import Rows, fit_cascades, selection_of
from pipeline.route.fit import fit_router
from pipeline.route.targets import REPORT_TARGETS
from pipeline.route.train import TrainConfig

_spec = importlib.util.spec_from_file_location("operating_points",
                                               Path(__file__).resolve().parents[1] / "scripts" / "operating_points.py")
op = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(op)

AGENTS = ["strong", "cheap1", "cheap2"]
TARGETS = ["quality>=0.98", "quality>=0.95", "parity"]


def _lineage(synthetic_cascade):
    R, C, E, g, masks = synthetic_cascade(1200, seed=3)
    n = len(R)
    rng = np.random.default_rng(0)
    X = (rng.normal(0, 1, (n, 8)) + R[:, [1]] * 1.5).astype(np.float32)  # the cheap agents' success is visible
    split = pd.Series(np.select([masks["train"], masks["validation"]], ["train", "validation"], "test"))
    rewards = pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "agent_order": [AGENTS] * n,
                            "mean_reward": list(R), "mean_cost": list(C)})
    cfg = TrainConfig(generations=3, log_every=0)  # the default selection: cross-fitted
    head = fit_router(X, rewards, split, cfg)
    cascade = fit_cascades(Rows(R, C, E, None, g), masks, head.best_single, AGENTS, REPORT_TARGETS,
                           selection=selection_of(cfg.to_dict()))
    rv = router_value("demo", None, HeadFigures(head.value, selection=head.operating_points["selection"]), {},
                      cascade=CascadeFigures(cascade.to_dict()))
    d = {"X": X, "rewards": rewards, "split": split, "labels": None, "cfg": cfg, "agents": AGENTS, "R": R, "C": C,
         "E": E, "P": None, "g": g, "masks": masks, "best": head.best_single, "scorer": None}
    return d, rv


def test_the_script_scores_what_router_value_reports(synthetic_cascade):
    d, rv = _lineage(synthetic_cascade)
    args = Namespace(folds=5, fold_seed=0, cap=0.55, quality=0.98)
    rows = op.head_family(d, TARGETS, args)[0] + op.cascade_family(d, TARGETS, args)[0]
    assert {r["selection"] for r in rows} == {"validation", "crossfit"}
    check = op.lineage_check(rows, rv, AGENTS)
    assert check["pool"] and check["ok"], check
    # every target of both routers, on the lineage's (cross-fitted) selection
    assert sorted((x["router"], x["target"]) for x in check["rows"]) == \
        sorted((r, t) for r in ("head", "cascade:cascade") for t in TARGETS)
    assert {x["selection"] for x in check["rows"]} == {"crossfit"}
    cascade = [r for r in rows if r["router"] == "cascade:cascade"]
    assert all(r["cost_ci"][0] <= r["cost"] <= r["cost_ci"][1] for r in cascade)

    # another figure, or another pool: the check says the figures are not comparable
    other = copy.deepcopy(rv)
    other["routers"]["cascade:cascade"]["targets"]["quality>=0.98"]["cost_ratio"] += 0.05
    bad = op.lineage_check(rows, other, AGENTS)
    assert not bad["ok"] and [x["target"] for x in bad["rows"] if not x["match"]] == ["quality>=0.98"]
    assert "disagree" in op.check_markdown(bad)
    wide = op.lineage_check(rows, rv, [*AGENTS, "wide_gpt4o_mini"])
    assert not wide["pool"] and not wide["ok"] and "another pool" in op.check_markdown(wide)
    # a lineage of the single split is checked on the script's validation rows
    single = copy.deepcopy(rv)
    for r in single["routers"].values():
        r["selection"] = {"method": "validation"}
    assert {x["selection"] for x in op.lineage_check(rows, single, AGENTS)["rows"]} == {"validation"}
