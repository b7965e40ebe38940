"""RouterBench-style replication on a suite profile: train a head on its train split, report the seed-002 table
(policy, quality, cost per example, AIQ) on its test split against every baseline."""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.report.frontier import (
    PointSet,
    aiq,
    baseline_policies,
    cost_span,
    frontier_points,
    policy_points,
    policy_table,
    router_policies,
)
from pipeline.report.suites import Profile
from pipeline.route.fit import validation_slice
from pipeline.route.knn import KnnRouter
from pipeline.route.train import TrainConfig, lambda_sweep, sweep_points, train_head


def replicate(profile: Profile, X: np.ndarray, cfg: TrainConfig | None = None) -> tuple[pd.DataFrame, dict]:
    """(table, frontier points) on the test split. X[i] embeds profile.query_text[i]."""
    train, test = profile.split == "train", profile.split == "test"
    if "validation" in set(profile.split):
        val = profile.split == "validation"
    else:
        val = train & validation_slice(profile.query_ids)
        train = train & ~val
    Q, C = profile.quality, profile.cost
    best = Q >= Q.max(axis=1, keepdims=True) - 1e-12
    head, _ = train_head(X[train], Q[train], best[train], X[val], Q[val], best[val], cfg or TrainConfig(),
                         agents=profile.models)
    knn = KnnRouter(agents=profile.models).fit(X[train], Q[train], X[val], Q[val])
    policies = baseline_policies(Q[test], C[test], Q[train | val], profile.models)
    # the head's own frontier, two ways (docs/training.md): its scores λ-swept, or one sep-CMA-ES head per λ trained
    # for realised reward − λ·cost; "trained head" is the one with the better validation AIQ, the other is shown too
    sweep = lambda_sweep(X[train], Q[train], best[train], C[train], X[val], Q[val], best[val], C[val],
                         cfg or TrainConfig(), profile.models)
    span = cost_span(Q[val], C[val])
    lam_kept = aiq(sweep_points(sweep, X[val], Q[val], C[val]), *span) >= \
        aiq(policy_points(head.scores(X[val]), Q[val], C[val]), *span)
    policies.update(router_policies({"kNN router": knn,
                                     "trained head (score sweep)" if lam_kept else "trained head": head}, X[test]))
    policies["trained head" if lam_kept else "trained head (λ-trained)"] = PointSet(
        sweep_points(sweep, X[test], Q[test], C[test]))
    table = policy_table(policies, Q[test], C[test])
    table.attrs["n_train"], table.attrs["n_test"] = int(train.sum()), int(test.sum())
    return table, frontier_points(policies, Q[test], C[test])


def table_markdown(name: str, table: pd.DataFrame) -> str:
    cmin, cmax = table.attrs.get("cost_span", [float("nan")] * 2)
    return (f"### {name} (test n={table.attrs.get('n_test')}, train n={table.attrs.get('n_train')}, "
            f"cost span ${cmin:.3g}–${cmax:.3g} per example)\n\n"
            + table.to_markdown(index=False, floatfmt=".4f") + "\n")
