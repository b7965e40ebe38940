"""Cost–quality dominance, one home for every stage: `pareto` (route/frontier's frontier and hull, the cascade's
families) and `on_frontier` (whether a new agent enters a pool's frontier, collect/sampling).

A point is dominated when another is at least as good and at most as costly, one of the two strictly. The two
functions differ only on exact ties: `pareto` returns a set, so of identical points it keeps one (and with `tol` > 0
also drops a point whose quality gain over every cheaper-or-equal one is within `tol`); `on_frontier` asks about one
agent, and an agent identical to another is not dominated by it (it may join: the router can use either).
"""
from __future__ import annotations

import numpy as np


def pareto(points: np.ndarray, tol: float = 0.0) -> np.ndarray:
    """Indices of the non-dominated rows of `points` ((L, 2): cost, quality; finite), cheapest first: a point stays
    when its quality beats every cheaper-or-equal point's by more than `tol`."""
    p = np.asarray(points, dtype=np.float64)
    order = np.lexsort((-p[:, 1], p[:, 0]))  # cost ascending, quality descending within a cost
    keep, best = [], -np.inf
    for i in order:
        if p[i, 1] > best + tol:  # strictly better than every cheaper-or-equal point
            keep.append(int(i))
            best = p[i, 1]
    return np.array(keep, dtype=np.int64)


def on_frontier(quality, cost, j: int) -> bool:
    """Agent `j` (of per-agent `quality`, `cost`) is on the frontier: no other agent at least as good and at most as
    costly, one of the two strictly."""
    q, c = np.asarray(quality, float), np.asarray(cost, float)
    others = np.arange(len(q)) != j
    dominates = (q >= q[j]) & (c <= c[j]) & ((q > q[j]) | (c < c[j]))
    return not bool(np.any(dominates & others))
