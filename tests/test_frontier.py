"""RouterBench methodology: λ routing, non-decreasing upper hull, AIQ, baselines — hand-computed cases."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.report import frontier as F


def _random_profile(seed: int = 0, n: int = 200, k: int = 5):
    rng = np.random.default_rng(seed)
    skill = np.linspace(0.3, 0.9, k)
    quality = (rng.random((n, k)) < skill).astype(float)
    cost = np.exp(np.linspace(-9, -5, k))[None, :] * rng.uniform(0.5, 1.5, size=(n, k))
    return quality, cost


# ---------------------------------------------------------------------------------------------- hull / AIQ
def test_one_point():
    pts = np.array([[0.002, 0.7]])
    assert np.array_equal(F.upper_hull(pts), pts)
    assert F.aiq(pts) == pytest.approx(0.7)
    # a one-point policy at the cheapest cost of the span keeps its quality over the whole span
    assert F.aiq(pts, 0.002, 0.01) == pytest.approx(0.7)
    # ...and earns nothing for budgets below its cost: (0.01 - 0.006) / (0.01 - 0.002) of 0.7
    assert F.aiq(np.array([[0.006, 0.7]]), 0.002, 0.01) == pytest.approx(0.7 * 0.5)


def test_two_models_equal_costs():
    quality = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 1.0]])  # model 0: 0.5, model 1: 0.75
    cost = np.full((4, 2), 0.01)
    hull = F.individual_hull(quality, cost)
    assert hull.shape == (1, 2)
    assert hull[0] == pytest.approx([0.01, 0.75])
    cmin, cmax = F.cost_span(quality, cost)
    assert cmin == cmax == pytest.approx(0.01)
    assert F.aiq(hull, cmin, cmax) == pytest.approx(0.75)
    # equal-cost span with several points: AIQ = the best quality
    assert F.aiq(np.array([[1.0, 0.2], [1.0, 0.6]]), 1.0, 1.0) == pytest.approx(0.6)


def test_ties_route_to_cheaper_model():
    quality = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    cost = np.array([[3.0, 1.0, 2.0], [3.0, 5.0, 2.0]])
    scores = np.ones_like(quality)  # every model tied for every query
    assert list(F.route(scores, cost, 0.0)) == [1, 2]
    # oracle: query 0 ties models 0 and 1 (both correct) -> model 1 (cost 1); query 1 ties 1 and 2 -> model 2 (cost 2)
    assert F.oracle_point(quality, cost) == pytest.approx([1.5, 1.0])
    # equal scores and equal costs: lowest index
    assert list(F.route(np.ones((1, 3)), np.ones((1, 3)), 0.0)) == [0]


def test_dominated_points_excluded_from_hull():
    pts = np.array([[1.0, 0.5], [2.0, 0.4], [3.0, 0.9], [4.0, 0.9], [2.0, 0.6]])
    # (2, 0.4): dominated by (1, 0.5); (4, 0.9): no better than (3, 0.9); (2, 0.6): under the chord (1,.5)-(3,.9)
    assert F.upper_hull(pts).tolist() == [[1.0, 0.5], [3.0, 0.9]]
    # a point above the chord stays; collinear points go
    assert F.upper_hull(np.array([[1.0, 0.5], [2.0, 0.8], [3.0, 0.9]])).tolist() == [[1.0, 0.5], [2.0, 0.8], [3.0, 0.9]]
    assert F.upper_hull(np.array([[1.0, 0.5], [2.0, 0.7], [3.0, 0.9]])).tolist() == [[1.0, 0.5], [3.0, 0.9]]
    # quality never decreases along the hull
    q, c = _random_profile(3)
    h = F.upper_hull(F.route_points(np.random.default_rng(1).random(q.shape), q, c))
    assert np.all(np.diff(h[:, 0]) > 0) and np.all(np.diff(h[:, 1]) > 0)


def test_aiq_three_point_hull_by_hand():
    hull = np.array([[1.0, 0.5], [2.0, 0.8], [4.0, 0.9]])
    # [1,2]: (0.5+0.8)/2 = 0.65; [2,4]: 2*(0.8+0.9)/2 = 1.7; [4,5] flat: 0.9 -> 3.25 over a span of 4
    assert F.aiq(hull, 1.0, 5.0) == pytest.approx(3.25 / 4)
    # own span [1, 4]: 2.35 / 3
    assert F.aiq(hull) == pytest.approx(2.35 / 3)
    # budgets below the cheapest point earn nothing: span [0, 5] -> 3.25 / 5
    assert F.aiq(hull, 0.0, 5.0) == pytest.approx(3.25 / 5)
    # span inside the hull: [1.5, 3] -> [1.5,2]: 0.5*(0.65+0.8)/2 = 0.3625; [2,3]: (0.8+0.85)/2 = 0.825
    assert F.aiq(hull, 1.5, 3.0) == pytest.approx((0.3625 + 0.825) / 1.5)
    with pytest.raises(RouterLiteError, match="cost_min <= cost_max"):
        F.aiq(hull, 3.0, 1.0)


def test_more_points_never_lower_aiq():
    rng = np.random.default_rng(7)
    pts = rng.random((12, 2))
    base = F.aiq(pts[:6], 0.0, 1.0)
    assert F.aiq(pts, 0.0, 1.0) >= base - 1e-12


# ---------------------------------------------------------------------------------------------- routing / baselines
def test_route_points_lambda_sweep_reaches_both_corners():
    q, c = _random_profile(1)
    scores = np.random.default_rng(2).random(q.shape)
    pts = F.route_points(scores, q, c)
    rows = np.arange(q.shape[0])
    top = scores.argmax(axis=1)
    cheapest = c.argmin(axis=1)
    assert pts[0] == pytest.approx([c[rows, top].mean(), q[rows, top].mean()])
    assert pts[-1] == pytest.approx([c[rows, cheapest].mean(), q[rows, cheapest].mean()])
    assert np.all(np.diff(pts[:, 0]) <= 1e-15)  # cost never increases with λ
    with pytest.raises(RouterLiteError):
        F.route_points(scores, q, c, [-1.0])
    with pytest.raises(RouterLiteError, match="shape"):
        F.route_points(scores[:, :2], q, c)


def test_oracle_beats_every_individual():
    q, c = _random_profile(4)
    ind = F.individual_points(q, c)
    orc = F.oracle_point(q, c)
    assert np.all(orc[1] >= ind[:, 1])
    assert orc[1] == pytest.approx(q.max(axis=1).mean())
    cmin, cmax = F.cost_span(q, c)
    assert F.aiq(F.upper_hull(F.oracle_frontier(q, c)), cmin, cmax) >= F.aiq(F.individual_hull(q, c), cmin, cmax)
    table = F.policy_table(F.baseline_policies(q, c, q[:50], [f"m{j}" for j in range(q.shape[1])]), q, c)
    by = table.set_index("policy")
    assert (by.loc["oracle", "quality"] >= by["quality"]).all()
    assert (by.loc["oracle", "aiq"] >= by["aiq"]).all()


def test_baselines_by_hand():
    quality = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    cost = np.array([[1.0, 3.0], [1.0, 3.0], [1.0, 3.0], [1.0, 3.0]])
    assert F.individual_points(quality, cost).tolist() == [[1.0, 0.5], [3.0, 0.75]]
    assert F.random_router_points(quality, cost).tolist() == [[2.0, 0.625]]
    prior = F.prior_scores(np.array([[1.0, 0.0], [0.0, 0.0]]), 3)
    assert prior.tolist() == [[0.5, 0.0]] * 3
    table = F.policy_table({"cheap": [1.0, 0.5], "random": F.random_router_points(quality, cost)[0]}, quality, cost)
    assert table.columns.tolist() == ["policy", "quality", "cost_per_example", "aiq"]
    assert table.attrs["cost_span"] == [1.0, 3.0]
    assert table["aiq"].tolist() == pytest.approx([0.5, 0.625 * 0.5])


def test_determinism(tmp_path):
    q, c = _random_profile(5)
    scores = np.random.default_rng(6).random(q.shape)
    a = F.route_points(scores, q, c)
    b = F.route_points(scores.copy(), q.copy(), c.copy())
    assert np.array_equal(a, b)
    pol = F.baseline_policies(q, c, q[:40], None)
    t1, t2 = F.policy_table(pol, q, c), F.policy_table(pol, q, c)
    assert t1.equals(t2)
    out = F.plot_frontier(F.frontier_points(pol, q, c), tmp_path / "frontier.png", title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# the demo's named targets, which labelled the old plot on top of each other: the prompt-only head's (quality>=0.98
# and quality>=0.95 close) and the answers-only cascade's (parity and quality>=0.98 on the same point)
HEAD_MARKS = {"max-quality": (2.463e-3, 0.8545), "parity": (2.307e-3, 0.8306), "quality>=0.95": (1.040e-3, 0.8066),
              "quality>=0.98": (1.996e-3, 0.8343)}  # the order router_head.json stores them in
CASCADE_MARKS = {"max-quality": (2.463e-3, 0.8545), "parity": (1.818e-3, 0.8508), "quality>=0.98": (1.818e-3, 0.8508),
                 "quality>=0.95": (7.3e-4, 0.8140)}


@pytest.mark.parametrize("marks", [HEAD_MARKS, CASCADE_MARKS, {f"t{i}": (1e-3 * (1 + i / 50), 0.8 + i / 500)
                                                               for i in range(6)}], ids=["head", "cascade", "six"])
def test_named_target_labels_do_not_overlap(tmp_path, monkeypatch, marks):
    import matplotlib.pyplot as plt
    from matplotlib.text import Annotation, Text

    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure plot_frontier drew to measure its labels
    pol = {"frontier_a": [2.463e-3, 0.8545], "frontier_b": [3.15e-3, 0.8158], "open_mid": [8.1e-5, 0.5783],
           "open_cheap_reasoning": [7e-5, 0.7551],  # the demo's axes: 6e-5 to 3e-3 USD, quality 0.58 to 0.91
           "oracle": F.PointSet(np.array([[6e-5, 0.62], [1e-4, 0.83], [4e-4, 0.9116]])),
           "router": F.PointSet(np.array([[9e-5, 0.75], [5e-4, 0.80], [1.5e-3, 0.84], [2.463e-3, 0.8545]]))}
    F.plot_frontier(pol, tmp_path / "frontier.png", marks=marks)
    (fig,) = figures
    try:
        renderer = fig.canvas.get_renderer()
        notes = [t for t in fig.axes[0].texts if isinstance(t, Annotation)]
        assert sorted(n.get_text() for n in notes) == sorted(marks)
        boxes = {n.get_text(): Text.get_window_extent(n, renderer) for n in notes}
        for a in boxes:
            for b in boxes:
                assert a == b or not boxes[a].overlaps(boxes[b]), (a, b, boxes[a], boxes[b])
    finally:
        close(fig)
