"""Cross-fitted operating points (`train.operating_points: crossfit`): the named targets of the head's λ path and the
cascade's plans are chosen on the pooled out-of-fold outcomes over train + validation, never on the test rows, and
the same seed gives the same choice."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.route.cascade_fit import Rows, fit_cascades, selection_of
from pipeline.route.fit import fit_router
from pipeline.route.select import dev_folds
from pipeline.route.train import Selection, TrainConfig

TARGETS = ["max-quality", "parity", "quality>=0.98", "quality>=0.9"]
AGENTS = ["strong", "cheap1", "cheap2"]
CROSSFIT = Selection("crossfit", 5, 0)


def test_folds_partition_the_development_rows_and_leave_test_out():
    rng = np.random.default_rng(0)
    split = np.array(["train", "validation", "test"])[rng.integers(0, 3, 500)]
    tr, va = split == "train", split == "validation"
    folds = dev_folds(tr, va, 5, seed=3)
    held = np.array([h for h, _, _ in folds])
    assert (held.sum(axis=0) == (tr | va)).all()  # every development row held exactly once, no test row ever
    for h, t, v in folds:
        assert not (t & h).any() and not (v & h).any() and ((t | v | h) == (tr | va)).all()
    again = dev_folds(tr, va, 5, seed=3)
    assert all((a[0] == b[0]).all() for a, b in zip(folds, again))
    assert not all((a[0] == b[0]).all() for a, b in zip(folds, dev_folds(tr, va, 5, seed=4)))
    with pytest.raises(RouterLiteError, match="folds"):
        dev_folds(tr, va, 1)


def _chosen(fit) -> dict:
    return {v: {t: (x["plan"], x["val_quality"], x["val_cost_per_1k"]) for t, x in var.targets.items()}
            for v, var in fit.variants.items()}


def test_cascade_crossfit_never_reads_test_rows_and_is_deterministic(synthetic_cascade):
    R, C, E, g, masks = synthetic_cascade(1500)
    fit = fit_cascades(Rows(R, C, E, None, g), masks, 0, AGENTS, TARGETS, selection=CROSSFIT)
    assert fit.selection["method"] == "crossfit" and fit.selection["rows"] == int((masks["train"]
                                                                                   | masks["validation"]).sum())
    v = fit.variants["cascade"]
    assert v.path["selection"]["method"] == "crossfit" and v.path["n_validation"] == fit.selection["rows"]
    from pipeline.route.targets import resolve

    assert resolve("parity", v.path)["gain_high"] >= 0  # read on the pooled out-of-fold outcomes
    # permute the test rows' rewards, costs and answers: the choice is the same, only the test figures move
    te = np.flatnonzero(masks["held_out"])
    perm = np.random.default_rng(1).permutation(len(te))
    R2, C2, E2 = R.copy(), C.copy(), E.copy()
    R2[te], C2[te], E2[te] = R[te[perm]], C[te[perm]][:, ::-1], E[te[perm]]
    fit2 = fit_cascades(Rows(R2, C2, E2, None, g), masks, 0, AGENTS, TARGETS, selection=CROSSFIT)
    assert _chosen(fit2) == _chosen(fit) and fit2.variants["cascade"].path == v.path
    assert fit2.variants["cascade"].aiq_test != v.aiq_test
    assert _chosen(fit_cascades(Rows(R, C, E, None, g), masks, 0, AGENTS, TARGETS, selection=CROSSFIT)) == _chosen(fit)
    # the old single-split choice stays reachable, and says so
    single = fit_cascades(Rows(R, C, E, None, g), masks, 0, AGENTS, TARGETS, selection=Selection("validation"))
    assert single.selection["method"] == "validation"
    assert single.variants["cascade"].path["n_validation"] == int(masks["validation"].sum())


def test_selection_of_a_train_config():
    assert selection_of(TrainConfig().to_dict()) == TrainConfig().selection == Selection("crossfit", 5, 0)
    assert selection_of(None).method == "validation"  # an old lineage's train_config had no setting
    with pytest.raises(RouterLiteError, match="operating_points"):
        TrainConfig(operating_points="test").validate()
    with pytest.raises(RouterLiteError, match="folds"):
        TrainConfig(folds=1).validate()


def _world(permute_test: bool = False):
    """Cluster A: only the dear agent is right; cluster B: both are, the cheap one at 1/20 of the cost."""
    rng = np.random.default_rng(1)
    n, d = 500, 8
    cluster = rng.random(n) < 0.5
    centres = np.zeros((2, d))
    centres[0, 0], centres[1, 1] = 3, 3
    X = (centres[cluster.astype(int)] + rng.normal(0, 0.6, (n, d))).astype(np.float32)
    R = np.column_stack([rng.random(n) < 0.9, (~cluster) & (rng.random(n) < 0.85)]).astype(float)
    C = np.tile([0.02, 0.001], (n, 1))
    split = np.array(["train", "validation", "test"])[np.arange(n) % 5 % 3]
    if permute_test:
        te = np.flatnonzero(split == "test")
        R[te] = R[te[np.random.default_rng(2).permutation(len(te))]]
    names = ["dear", "cheap"]
    rewards = pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "agent_order": [names] * n,
                            "mean_reward": list(R), "mean_cost": list(C)})
    return X, rewards, pd.Series(split)


@pytest.mark.parametrize("method", ["crossfit", "validation"])
def test_head_targets_never_read_test_rows_and_are_deterministic(method):
    cfg = TrainConfig(generations=3, log_every=0, operating_points=method)
    fits = [fit_router(*_world(), cfg), fit_router(*_world(), cfg), fit_router(*_world(permute_test=True), cfg)]
    path = fits[0].operating_points
    assert path["selection"]["method"] == method
    assert path["n_validation"] == (400 if method == "crossfit" else 200)  # train + validation, or validation
    for other in fits[1:]:  # the same seed, and permuted test rewards: the same path and λ per target
        assert other.operating_points["points"] == path["points"]
        assert {k: t["lambda"] for k, t in other.value["targets"].items()} == \
            {k: t["lambda"] for k, t in fits[0].value["targets"].items()}
    assert fits[2].value["targets"]["max-quality"]["quality"] != fits[0].value["targets"]["max-quality"]["quality"] \
        or fits[2].metrics["head"] != fits[0].metrics["head"] or fits[2].value["oracle"] != fits[0].value["oracle"]
