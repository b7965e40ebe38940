"""Cost–quality frontier math, following RouterBench (Hu et al., 2024) — pure functions, no module state.

Vocabulary
- `quality[i, j]`, `cost[i, j]`: true quality (e.g. 0/1 correctness) and cost (USD) of model j on query i, (n, K).
- A *policy* gives scores `s[i, j]` (higher = better for query i). With a willingness-to-pay λ it routes query i to
  `argmax_j s[i, j] - λ·cost[i, j]` (ties → the cheaper model, then the lower index). Each λ gives one operating
  point `(mean cost, mean quality)` of the routed calls; sweeping λ gives the policy's points.
- A *point* is `(cost per example, quality per example)`; arrays of points are (L, 2), column 0 = cost.
- `upper_hull(points)` is RouterBench's non-decreasing convex hull: the upper concave envelope of the
  non-dominated points (quality strictly increasing with cost).

AIQ (RouterBench §3: `AIQ = 1/(c_max − c_min) ∫_{c_min}^{c_max} R̃(c) dc`), with R̃ the hull as a function of cost:
- between hull points: linear interpolation (the segment is reachable by mixing the two operating points);
- above the last (most expensive) hull point: flat at its quality (the hull is extended flat to c_max, as in the
  paper and in RouterBench's `evaluation/AIQ.py`);
- **below the first (cheapest) hull point: 0.** A policy cannot run at a budget lower than its cheapest operating
  point, so it earns nothing there; RouterBench's reference code does the same (its trapezoid starts at the
  first hull point). When the policy reaches the cheapest corner (its first point costs ≤ c_min, e.g. the cheapest
  individual model or any λ-swept score policy) this case does not arise — that is the case in which the cheapest
  point's quality counts from c_min on.
- hull points outside [c_min, c_max] are used through interpolation at the bounds; the integral is exact
  (piecewise linear), not sampled.
- defaults: c_min, c_max = the hull's own cost range, so a one-point hull has AIQ = its quality;
  c_max == c_min: AIQ = R̃(c_min), i.e. the best quality reachable at that cost (the max quality when all points
  share that cost).
In a table (`policy_table`) every policy shares one span: c_min = cost of the cheapest individual model,
c_max = cost of the most expensive one, so AIQs are comparable.

Baselines: individual models (`individual_points`, `individual_hull`), the uniform random router
(`random_router_points`: one point, the expectation of picking a model uniformly at random per query), the oracle
(`oracle_point`: best quality per query, ties → cheapest; `oracle_frontier`: the oracle's scores = true quality,
λ-swept), and the prior heuristic (`prior_scores`: every model's mean train quality as the score of every query).
A fitted router of any kind (pipeline/route/routers.py) enters a table as a score policy through `router_policies`
(pipeline/report/frontier.py).

This is the part a router needs (pipeline/route/fit.py, targets.py, cascade_fit.py); the tables and plots
built on it are pipeline/report/frontier.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.core.pareto import pareto as core_pareto

DEFAULT_N_LAMBDAS = 200


# ----------------------------------------------------------------------------------------------------- helpers
def _matrix(name: str, a, shape: tuple[int, int] | None = None) -> np.ndarray:
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim != 2:
        raise RouterLiteError(f"{name} must be a 2-D (queries × models) matrix, got shape {arr.shape}")
    if shape is not None and arr.shape != shape:
        raise RouterLiteError(f"{name} has shape {arr.shape}, expected {shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise RouterLiteError(f"{name} is empty (shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        raise RouterLiteError(f"{name} holds NaN or infinite values")
    return arr


def _points(name: str, pts) -> np.ndarray:
    arr = np.asarray(pts, dtype=np.float64)
    if arr.ndim == 1 and arr.shape[0] == 2:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != 2 or arr.shape[0] == 0:
        raise RouterLiteError(f"{name} must be (cost, quality) points of shape (L, 2), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise RouterLiteError(f"{name} holds NaN or infinite values")
    return arr


def _qc(quality, cost) -> tuple[np.ndarray, np.ndarray]:
    q = _matrix("quality", quality)
    c = _matrix("cost", cost, q.shape)
    return q, c


# ------------------------------------------------------------------------------------------------ routing
def default_lambdas(scores, cost, n: int = DEFAULT_N_LAMBDAS) -> np.ndarray:
    """0 plus a log grid of λ from "cost barely matters" to "only cost matters".

    The top of the grid makes the cost term outweigh any score gap for every query (so the sweep reaches the
    cheapest-per-query corner); the bottom makes it smaller than any score gap. Both ends come from the scale of
    the scores and of the per-query cost differences.
    """
    s = _matrix("scores", scores)
    c = _matrix("cost", cost, s.shape)
    if s.shape[1] < 2:
        return np.zeros(1)
    s_span = float(np.max(s.max(axis=1) - s.min(axis=1)))
    c_sorted = np.sort(c, axis=1)
    dc = np.diff(c_sorted, axis=1)
    dc_pos = dc[dc > 0]
    if dc_pos.size == 0 or s_span <= 0:
        return np.zeros(1)
    c_span = float(np.max(c_sorted[:, -1] - c_sorted[:, 0]))
    ds = np.diff(np.sort(s, axis=1), axis=1)
    ds_pos = ds[ds > 0]
    s_gap = float(ds_pos.min()) if ds_pos.size else s_span
    lo = 0.1 * s_gap / c_span
    hi = 10.0 * s_span / float(dc_pos.min())
    return np.concatenate([[0.0], np.geomspace(lo, hi, max(int(n) - 1, 1))])


def route(scores, cost, lam: float) -> np.ndarray:
    """Model index per query for one λ: argmax_j s − λ·cost, ties → cheaper model, then lower index."""
    s = _matrix("scores", scores)
    c = _matrix("cost", cost, s.shape)
    v = s - float(lam) * c
    vmax = v.max(axis=1, keepdims=True)
    tol = 1e-12 * np.maximum(1.0, np.abs(vmax))
    cand = v >= vmax - tol
    # among the tied candidates pick the cheapest (argmin keeps the lowest index among equal costs)
    masked_cost = np.where(cand, c, np.inf)
    return np.argmin(masked_cost, axis=1)


def route_points(scores, quality, cost, lambdas=None) -> np.ndarray:
    """Operating points (L, 2) = (mean cost, mean quality) of the routed calls, one per λ (in `lambdas` order).

    `lambdas=None` uses `default_lambdas(scores, cost)` (0 first, so row 0 is the policy's λ=0 point).
    """
    q, c = _qc(quality, cost)
    s = _matrix("scores", scores, q.shape)
    lams = default_lambdas(s, c) if lambdas is None else np.atleast_1d(np.asarray(lambdas, dtype=np.float64))
    if lams.size == 0 or not np.all(np.isfinite(lams)) or np.any(lams < 0):
        raise RouterLiteError(f"lambdas must be finite, non-negative and non-empty, got {lams!r}")
    rows = np.arange(q.shape[0])
    out = np.empty((lams.size, 2))
    for k, lam in enumerate(lams):
        pick = route(s, c, lam)
        out[k] = (c[rows, pick].mean(), q[rows, pick].mean())
    return out


# ------------------------------------------------------------------------------------------------ hull / AIQ
def pareto(points, tol: float = 0.0) -> np.ndarray:
    """Indices of the non-dominated (cost, quality) points, cheapest first: a point stays when its quality beats
    every cheaper-or-equal point's by more than `tol` (`pipeline.core.pareto`, after the points are checked)."""
    return core_pareto(_points("points", points), tol)


def upper_hull(points, tol: float = 0.0) -> np.ndarray:
    """Non-decreasing upper convex hull (M, 2), sorted by cost.

    Keeps a point only if no cheaper-or-equal point has at least its quality (dominated points go; `pareto`'s
    `tol`) and it lies on the upper concave envelope (points under a chord, or on it, go).
    """
    p = _points("points", points)
    front = [(x, y) for x, y in p[pareto(p, tol)]]
    hull: list[tuple[float, float]] = []
    for x, y in front:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            # drop hull[-1] if it is on or below the chord hull[-2] -> (x, y)
            if (x2 - x1) * (y - y1) - (y2 - y1) * (x - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append((x, y))
    return np.asarray(hull, dtype=np.float64)


def aiq(hull, cost_min: float | None = None, cost_max: float | None = None) -> float:
    """Average quality of the hull over [cost_min, cost_max] (see the module docstring for the exact rule)."""
    h = upper_hull(hull)  # idempotent on a hull; makes any point set valid input
    hc, hq = h[:, 0], h[:, 1]
    cmin = float(hc[0]) if cost_min is None else float(cost_min)
    cmax = float(hc[-1]) if cost_max is None else float(cost_max)
    if not (np.isfinite(cmin) and np.isfinite(cmax)) or cmax < cmin:
        raise RouterLiteError(f"AIQ cost span must satisfy cost_min <= cost_max, got [{cmin}, {cmax}]")

    def value(c: float) -> float:
        return 0.0 if c < hc[0] else float(np.interp(c, hc, hq))

    if cmax == cmin:
        return value(cmin)
    a = max(cmin, float(hc[0]))
    if a >= cmax:
        return 0.0
    inner = hc[(hc > a) & (hc < cmax)]
    xs = np.concatenate([[a], inner, [cmax]])
    ys = np.interp(xs, hc, hq)
    area = float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2.0))
    return area / (cmax - cmin)


# ------------------------------------------------------------------------------------------------ baselines
def individual_points(quality, cost) -> np.ndarray:
    """(K, 2): each model's (mean cost, mean quality) when it answers every query."""
    q, c = _qc(quality, cost)
    return np.column_stack([c.mean(axis=0), q.mean(axis=0)])


def individual_hull(quality, cost) -> np.ndarray:
    """Upper hull of the individual models (RouterBench's zero router: mixtures of two models)."""
    return upper_hull(individual_points(quality, cost))


def random_router_points(quality, cost) -> np.ndarray:
    """(1, 2): the expected point of routing every query to a model drawn uniformly at random (the centroid)."""
    return individual_points(quality, cost).mean(axis=0, keepdims=True)


def oracle_point(quality, cost) -> np.ndarray:
    """(2,): route each query to a model with the best quality (ties → the cheapest)."""
    q, c = _qc(quality, cost)
    return route_points(q, q, c, [0.0])[0]


def oracle_frontier(quality, cost, lambdas=None) -> np.ndarray:
    """(L, 2): the oracle's scores (true quality) swept over λ; row 0 is `oracle_point`."""
    q, c = _qc(quality, cost)
    return route_points(q, q, c, lambdas)


def prior_scores(quality_train, n_queries: int) -> np.ndarray:
    """(n_queries, K): every model's mean quality on the train split, the same for every query."""
    q = _matrix("quality_train", quality_train)
    if int(n_queries) < 1:
        raise RouterLiteError(f"n_queries must be >= 1, got {n_queries}")
    return np.tile(q.mean(axis=0), (int(n_queries), 1))



# ------------------------------------------------------------------------------------------------ policies
@dataclass(frozen=True)
class PointSet:
    """A policy known only by its operating points (L, 2), e.g. the individual hull. Its λ=0 point is the one with
    the best quality (ties → cheaper)."""

    points: np.ndarray


def cost_span(quality, cost) -> tuple[float, float]:
    """(c_min, c_max) = cost per example of the cheapest and of the most expensive individual model."""
    ind = individual_points(quality, cost)
    return float(ind[:, 0].min()), float(ind[:, 0].max())


def policy_points(policy, quality, cost, lambdas=None) -> np.ndarray:
    """Operating points of a policy given as scores (n, K), a point (2,), or a `PointSet` (an array shaped like
    `quality` is always read as scores)."""
    q, c = _qc(quality, cost)
    if isinstance(policy, PointSet):
        return _points("PointSet.points", policy.points)
    arr = np.asarray(policy, dtype=np.float64)
    if arr.shape == q.shape:
        return route_points(arr, q, c, lambdas)
    if arr.shape == (2,) or arr.shape == (1, 2):
        return _points("point", arr)
    raise RouterLiteError(
        f"a policy must be scores of shape {q.shape}, a (cost, quality) point or a PointSet; got shape {arr.shape}"
    )


def _lambda0_point(policy, pts: np.ndarray) -> np.ndarray:
    if isinstance(policy, PointSet):
        order = np.lexsort((pts[:, 0], -pts[:, 1]))
        return pts[order[0]]
    return pts[0]
