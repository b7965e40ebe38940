"""The pool report (pipeline/report/pool_report.py): verdicts on matrices built to be dominated or complementary."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.report.pool_report import (
    domain_column,
    label_router_picks,
    labels_of,
    leaders,
    pool_report,
    report_markdown,
)

AGENTS = ["a", "b", "c"]


def _world(complementary: bool, n: int = 900, seed: int = 0):
    rng = np.random.default_rng(seed)
    dom = np.array(["math", "code", "chat"])[np.arange(n) % 3]
    p = {"math": [0.9, 0.5, 0.4], "code": [0.85, 0.6, 0.5], "chat": [0.8, 0.6, 0.5]}
    if complementary:
        p = {"math": [0.9, 0.4, 0.4], "code": [0.4, 0.9, 0.4], "chat": [0.4, 0.4, 0.9]}
    R = np.array([[rng.random() < q for q in p[d]] for d in dom], dtype=float)
    C = np.tile([0.01, 0.002, 0.001], (n, 1))
    X = np.eye(3)[np.searchsorted(["chat", "code", "math"], dom)] + rng.normal(0, 0.05, (n, 3))
    split = np.array(["train", "train", "train", "validation", "test"], dtype=object)[np.arange(n) % 5]
    return R, C, dom, split, X.astype(np.float32)


def test_quality_dominated_pool():
    R, C, dom, split, X = _world(False)
    rep = pool_report(R, C, AGENTS, dom, split, X=X, domain_name="source")
    assert rep["verdict"]["kind"] == "quality-dominated"
    assert rep["verdict"]["text"].startswith("quality-dominated: a leads every domain")
    h = rep["headroom"]
    assert abs(h["label_router"]["gain"]) < 1e-9          # the label router picks a everywhere
    md = report_markdown(rep)
    assert md.splitlines()[0].startswith("**Pool verdict: quality-dominated")
    assert "routing can pay here on cost, not on quality" in md
    # the cost column says "(est.)" only where the costs are known to be estimates (replayed token counts)
    assert "cost $/1k |" in md.replace("cost $/1k (est.)", "") and "estimated USD" not in md
    est = pool_report(R, C, AGENTS, dom, split, X=X, domain_name="source") | {"costs_estimated": True}
    est = report_markdown(est)
    assert "cost $/1k (est.)" in est and "cost is estimated USD per 1k queries" in est


def test_complementary_pool():
    R, C, dom, split, X = _world(True)
    rep = pool_report(R, C, AGENTS, dom, split, X=X, difficulty=np.where(np.arange(len(R)) % 2, "hard", "easy"))
    assert rep["verdict"]["kind"] == "complementary"
    assert set(rep["verdict"]["agents"]) == set(AGENTS)
    assert {v["top"] for v in rep["leaders"].values()} == set(AGENTS)
    h = rep["headroom"]
    assert h["label_router"]["low"] > 0.3 and h["knn"]["low"] > 0.3     # routing pays, and CV sees it
    assert len(rep["by_difficulty"]) == 2 * len(AGENTS)
    assert "routing can pay here" not in report_markdown(rep)


def test_a_tie_is_not_a_lead():
    # b is 0.01 behind a on one domain: within the paired CI, so a and b tie there and a still "leads every domain"
    rng = np.random.default_rng(3)
    n = 400
    base = rng.random(n) < 0.7
    R = np.column_stack([base, base, rng.random(n) < 0.3]).astype(float)
    R[:4, 1] = 1 - R[:4, 1]
    lead = leaders(R, np.full(n, "x", dtype=object), AGENTS)
    assert set(lead["x"]["tied_leaders"]) == {"a", "b"}


def test_label_router_and_columns():
    R = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], float)
    g = np.array(["m", "m", "c", "c"], dtype=object)
    assert label_router_picks(R, g, np.array(["c", "m", "z"], dtype=object), fallback=0).tolist() == [1, 0, 0]
    t = pd.DataFrame({"source": ["s"] * 4, "category": ["x", "y", "x", None], "domain": ["d"] * 4})
    assert domain_column(t) == "category"
    assert labels_of(t, "category").tolist() == ["x", "y", "x", "unknown"]
    assert domain_column(t[["source"]]) is None and labels_of(t, None).tolist() == ["all"] * 4


def test_needs_training_rows():
    R, C, dom, _split, _X = _world(False, n=30)
    with pytest.raises(RouterLiteError, match="no training rows"):
        pool_report(R, C, AGENTS, dom, np.full(30, "test", dtype=object))


def test_a_cascade_pays_only_when_it_holds_the_targets_quality():
    from pipeline.report.pool_report import pays

    cheap_and_good = {"cost_ratio": 0.36, "quality_ratio": 0.99, "quality_ratio_ci": [0.97, 1.01]}
    cheap_and_bad = {"cost_ratio": 0.36, "quality_ratio": 0.571, "quality_ratio_ci": [0.50, 0.64]}  # the tutorial's
    dear = {"cost_ratio": 1.02, "quality_ratio": 1.0, "quality_ratio_ci": [1.0, 1.0]}
    assert pays(cheap_and_good, "quality>=0.98") and not pays(cheap_and_bad, "quality>=0.98")
    assert not pays(dear, "quality>=0.98") and not pays({"cost_ratio": None, "quality_ratio_ci": None}, "parity")
    assert pays(cheap_and_good, "parity") and not pays({**cheap_and_good, "quality_ratio_ci": [0.9, 0.99]}, "parity")


def test_the_cascade_verdict_is_read_off_the_lineage_fit(synthetic_cascade, monkeypatch):
    """`cascade_pays` reports the `cascade_router` fit's answers-only variant as the asset stored it (its summary):
    the same figures, its own selection named, and no second fit."""
    import pipeline.route.cascade_fit as cascade_fit
    from pipeline.report.pool_report import cascade_pays
    from pipeline.route.train import Selection

    R, C, E, g, masks = synthetic_cascade()
    agents = ["strong", "cheap1", "cheap2"]
    fit = cascade_fit.fit_cascades(cascade_fit.Rows(R, C, E, None, g), masks, 0, agents, ["quality>=0.98"],
                                   selection=Selection("crossfit", 3, 0))
    summary = {"agents": agents, "best_single": 0, **fit.to_dict()}  # what cascade_router stores
    monkeypatch.setattr(cascade_fit, "fit_cascades", lambda *a, **k: pytest.fail("the pool report fitted again"))
    got = cascade_pays(summary, int(masks["held_out"].sum()))
    want = fit.variants["cascade"].targets["quality>=0.98"]
    for k in ("quality_ratio", "quality_ratio_ci", "cost_ratio", "plan"):
        assert got[k] == want[k], k
    assert got["best_single"] == "strong" and "cross-fitted" in got["text"]
    assert cascade_pays({**summary, "variants": {}}, 10) is None  # no answers-only variant: nothing to say


def test_the_pool_report_consumes_the_cascade_fit_not_the_answers(tmp_path):
    """In the asset graph the pool report reads `cascade_router` (its lazy agreement and fit), not the agents'
    answers it would grade again pair by pair."""
    from dagster import AssetKey

    from assets.definitions import build_definitions

    graph = build_definitions(str(tmp_path), "smoke").resolve_asset_graph()
    parents = {k.to_user_string() for k in graph.get(AssetKey("pool_report")).parent_keys}
    assert "cascade_router" in parents and "agent_answers" not in parents
