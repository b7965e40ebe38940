"""Frontier tables and plots (RouterBench, Hu et al., 2024): `policy_table` (each policy's λ=0 point and AIQ over
the common cost span), `baseline_policies` (the seed-002 baselines), `router_policies` (fitted routers as score
policies), `frontier_points` and `plot_frontier`. The math they rest on (λ routing, upper hull, AIQ, the baselines'
points; its vocabulary and the exact AIQ rule) is pipeline/route/frontier.py, re-exported here by name.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.errors import RouterLiteError
from pipeline.route.frontier import (  # noqa: F401 - the math, re-exported for the tables' callers
    DEFAULT_N_LAMBDAS,
    PointSet,
    _lambda0_point,
    _matrix,
    _points,
    _qc,
    aiq,
    cost_span,
    default_lambdas,
    individual_hull,
    individual_points,
    oracle_frontier,
    oracle_point,
    policy_points,
    prior_scores,
    random_router_points,
    route,
    route_points,
    upper_hull,
)


def router_policies(routers: Mapping[str, object], X) -> dict[str, np.ndarray]:
    """Each router's scores (n, K) on the embeddings `X`, by name: score policies for `policy_table` (λ-swept like
    any scores). Routers are anything of the protocol in pipeline/route/routers.py (a Head, a KnnRouter, a new type)."""
    from pipeline.route.routers import check_scores

    return {str(name): check_scores(router, X) for name, router in routers.items()}



# ------------------------------------------------------------------------------------------------ tables / plots
def frontier_points(policies: Mapping[str, object], quality, cost, lambdas=None) -> dict[str, np.ndarray]:
    """Each policy's operating points (L, 2), by name (input of `plot_frontier`)."""
    q, c = _qc(quality, cost)
    return {str(name): policy_points(policy, q, c, lambdas) for name, policy in policies.items()}


def policy_table(policies: Mapping[str, object], quality, cost, lambdas=None) -> pd.DataFrame:
    """One row per policy: policy, quality and cost_per_example at λ=0, aiq over the common span.

    `policies` maps a name to scores (n, K), a (cost, quality) point or a `PointSet`. The span is
    `cost_span(quality, cost)` for every row; it is kept in `df.attrs["cost_span"]` as `[c_min, c_max]`
    (JSON-safe, so the frame still writes to Parquet).
    """
    q, c = _qc(quality, cost)
    cmin, cmax = cost_span(q, c)
    rows = []
    for name, policy in policies.items():
        pts = policy_points(policy, q, c, lambdas)
        p0 = _lambda0_point(policy, pts)
        rows.append(
            {
                "policy": str(name),
                "quality": float(p0[1]),
                "cost_per_example": float(p0[0]),
                "aiq": aiq(upper_hull(pts), cmin, cmax),
            }
        )
    df = pd.DataFrame(rows, columns=["policy", "quality", "cost_per_example", "aiq"])
    df.attrs["cost_span"] = [cmin, cmax]
    return df


# the frontier table's policy names that reports read back by name (the baselines here, the routers the benchmark
# report adds: pipeline/report/benchmark.py)
HULL, RANDOM, ORACLE, PRIOR = "individual hull", "random", "oracle", "prior"


def baseline_policies(quality, cost, quality_train, models: list[str] | None = None) -> dict[str, object]:
    """The seed-002 baselines for `policy_table`: each individual model (a point), the individual hull, the uniform
    random router, the oracle (scores = true quality) and the prior heuristic (train mean quality)."""
    q, c = _qc(quality, cost)
    names = list(models) if models is not None else [f"model_{j}" for j in range(q.shape[1])]
    if len(names) != q.shape[1]:
        raise RouterLiteError(f"models lists {len(names)} names for {q.shape[1]} columns of quality")
    qt = _matrix("quality_train", quality_train)
    if qt.shape[1] != q.shape[1]:
        raise RouterLiteError(f"quality_train has {qt.shape[1]} models, quality has {q.shape[1]}")
    ind = individual_points(q, c)
    policies: dict[str, object] = {name: ind[j] for j, name in enumerate(names)}
    policies[HULL] = PointSet(upper_hull(ind))
    policies[RANDOM] = random_router_points(q, c)[0]
    policies[ORACLE] = q
    policies[PRIOR] = prior_scores(qt, q.shape[0])
    return policies


DPI = 120


def label_marks(ax, marks: Mapping[str, tuple[float, float]], star_size: float = 140) -> list:
    """A black star at each named (cost, quality) point and its name beside it, tied to it by a thin leader line.
    A name goes to the first offset (right, then left; a step further up or down each time) whose box clears the
    stars and the names placed before it, inside the axes if it can: named targets often share a point or nearly
    (parity and quality>=0.98 on a cascade). Call it once the axes are laid out (scales, tight_layout): the boxes
    are measured in display pixels."""
    from itertools import count

    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    renderer = ax.figure.canvas.get_renderer()
    r = np.sqrt(star_size) / 2 * ax.figure.dpi / 72  # a star's radius in pixels
    placed = [Bbox.from_bounds(x - r, y - r, 2 * r, 2 * r) for x, y in ax.transData.transform(list(marks.values()))]
    frame = ax.get_window_extent(renderer)
    notes = []
    for name, (mc, mq) in marks.items():
        ax.scatter([mc], [mq], marker="*", s=star_size, color="black", zorder=4)
        note = ax.annotate(name, (mc, mq), xytext=(10, 8), textcoords="offset points", fontsize=8, va="center",
                           arrowprops={"arrowstyle": "-", "lw": 0.6, "shrinkA": 0, "shrinkB": 5})
        for step in count():  # 8, -8, 20, -20, 32, ... points: finitely many boxes, so one clears them all
            dy = (8 + 12 * (step // 4)) * (1 if step % 4 < 2 else -1)
            dx = 10 if step % 2 == 0 else -10
            note.xyann = (dx, dy)
            note.set_horizontalalignment("left" if dx > 0 else "right")
            note.update_positions(renderer)
            box = Text.get_window_extent(note, renderer).padded(2)  # the name's own box, not its leader line
            framed = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if not any(box.overlaps(b) for b in placed) and (framed or step >= 40):
                break
        placed.append(box)
        notes.append(note)
    return notes


def plot_frontier(table_points: Mapping[str, object], path, title: str | None = None,
                  marks: Mapping[str, tuple[float, float]] | None = None,
                  cost_label: str = "cost per example (USD)") -> Path:
    """PNG of each policy's points and upper hull (cost on a log axis when all costs are positive); `marks` names
    single (cost, quality) points to annotate, e.g. the router's named targets (`label_marks`: names never overlap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.core.io import atomic_write

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=DPI)  # measured at the dpi it is saved at
    try:
        all_costs = [np.array([mc]) for mc, _ in (marks or {}).values()]
        colours = plt.get_cmap("tab20").colors
        for k, (name, pts) in enumerate(table_points.items()):
            p = _points(f"points of {name!r}", pts.points if isinstance(pts, PointSet) else pts)
            all_costs.append(p[:, 0])
            colour = colours[k % len(colours)]
            if len(p) == 1:
                ax.scatter(p[:, 0], p[:, 1], label=name, color=colour, zorder=3)
                continue
            h = upper_hull(p)
            ax.plot(h[:, 0], h[:, 1], marker=".", label=name, color=colour)
            ax.scatter(p[:, 0], p[:, 1], s=6, color=colour, alpha=0.35)
        if marks:  # in the data limits before the layout, though their stars are drawn after it
            ax.update_datalim([(mc, mq) for mc, mq in marks.values()])
            ax.autoscale_view()
        costs = np.concatenate(all_costs) if all_costs else np.array([1.0])
        if np.all(costs > 0):
            ax.set_xscale("log")
        ax.set_xlabel(cost_label)
        ax.set_ylabel("quality per example")
        if title:
            ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        ax.set_autoscale_on(False)  # the limits stay those the names are placed in
        label_marks(ax, marks or {})
        return atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=DPI))
    finally:
        plt.close(fig)
