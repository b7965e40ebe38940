"""RouterBench-style replication on a suite profile: train a head on its train split, report the seed-002 table
(policy, quality, cost per example, AIQ) on its test split against every baseline; `summary_markdown` puts the suites'
tables into one report."""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from pipeline.core.progress import heartbeat
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
from pipeline.route.cluster import ClusterRouter
from pipeline.route.fit import validation_slice
from pipeline.route.knn import KnnRouter
from pipeline.route.train import PromptRows, TrainConfig, lambda_sweep, sweep_points, train_head

log = logging.getLogger(__name__)


@heartbeat("replication", log)
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
    rows = PromptRows(X, Q, best, C)
    head, _ = train_head(rows.take(train), rows.take(val), cfg or TrainConfig(), profile.models)
    knn = KnnRouter(agents=profile.models).fit(X[train], Q[train], X[val], Q[val])
    cluster = ClusterRouter(agents=profile.models).fit(X[train], Q[train], X[val], Q[val], best[train], best[val])
    policies = baseline_policies(Q[test], C[test], Q[train | val], profile.models)
    labels = profile.meta.get("per_query", {}).get("eval_name")
    if labels is not None:  # the per-source label router (knows each query's eval; fitted on train), λ-swept alike
        labels = np.asarray(labels, dtype=object)
        policies["label router (per source)"] = label_scores(Q[train], labels[train], labels[test])
    # the head's own frontier, two ways (docs/training.md): its scores λ-swept, or one sep-CMA-ES head per λ trained
    # for realised reward − λ·cost; "trained head" is the one with the better validation AIQ, the other is shown too
    sweep = lambda_sweep(rows.take(train), rows.take(val), cfg or TrainConfig(), profile.models)
    span = cost_span(Q[val], C[val])
    lam_kept = aiq(sweep_points(sweep, X[val], Q[val], C[val]), *span) >= \
        aiq(policy_points(head.scores(X[val]), Q[val], C[val]), *span)
    policies.update(router_policies({"kNN router": knn, "cluster router": cluster,
                                     "trained head (score sweep)" if lam_kept else "trained head": head}, X[test]))
    policies["trained head" if lam_kept else "trained head (λ-trained)"] = PointSet(
        sweep_points(sweep, X[test], Q[test], C[test]))
    # the shipped prompt router: the kind with the best validation AIQ (pipeline/route/select.py's choice, scored the
    # way this table scores: AIQ); the test rows choose nothing
    val_aiq = {"trained head": aiq(sweep_points(sweep, X[val], Q[val], C[val]) if lam_kept
                                   else policy_points(head.scores(X[val]), Q[val], C[val]), *span),
               "kNN router": aiq(policy_points(knn.scores(X[val]), Q[val], C[val]), *span),
               "cluster router": aiq(policy_points(cluster.scores(X[val]), Q[val], C[val]), *span)}
    chosen = max(val_aiq, key=lambda k: (val_aiq[k], -list(val_aiq).index(k)))
    policies[f"shipped prompt router ({chosen}, by validation AIQ)"] = policies[chosen]
    table = policy_table(policies, Q[test], C[test])
    table.attrs["n_train"], table.attrs["n_test"] = int(train.sum()), int(test.sum())
    table.attrs["validation_aiq"] = val_aiq
    return table, frontier_points(policies, Q[test], C[test])


def label_scores(Q_train: np.ndarray, labels_train: np.ndarray, labels_apply: np.ndarray) -> np.ndarray:
    """(n, K) scores of the per-source label router: each source's mean training quality per model (a source unseen
    on train: the all-rows mean)."""
    means = {g: Q_train[labels_train == g].mean(axis=0) for g in set(labels_train.tolist())}
    glob = Q_train.mean(axis=0)
    return np.array([means.get(g, glob) for g in labels_apply.tolist()])


def table_markdown(name: str, table: pd.DataFrame) -> str:
    cmin, cmax = table.attrs.get("cost_span", [float("nan")] * 2)
    return (f"### {name} (test n={table.attrs.get('n_test')}, train n={table.attrs.get('n_train')}, "
            f"cost span ${cmin:.3g}–${cmax:.3g} per example)\n\n"
            + table.to_markdown(index=False, floatfmt=".4f") + "\n")


SUMMARY_TITLE = "## RouterBench-style replication"


def summary_markdown(tables: dict[str, pd.DataFrame]) -> str:
    """The combined replication report: each suite's table (`table_markdown`), in the order of `tables` (suite ->
    its replication table)."""
    return SUMMARY_TITLE + "\n\n" + "\n".join(table_markdown(suite, t) for suite, t in tables.items())
