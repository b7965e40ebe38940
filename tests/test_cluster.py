"""The coarse cluster router (pipeline/route/cluster.py), the choice among prompt router kinds on validation
(pipeline/route/select.py) and the trainer's guard against the winner's curse of early stopping."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.route import registry
from pipeline.route.cluster import MAX_ITER, N_INIT, ClusterRouter, kmeans, one_standard_error
from pipeline.route.fit import fit_router
from pipeline.route.kinds import router_class
from pipeline.route.ood import OODGuard
from pipeline.route.select import candidate_kinds, select_router
from pipeline.route.train import PromptRows, TrainConfig, train_head

AGENTS = ["a", "b", "c"]


def blobs(n=1500, d=12, seed=0, noise=0.35):
    """Three well-separated groups of prompts; agent g leads group g (0.8 vs 0.4); rows shuffled, split 60/20/20."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((3, d)) * 3
    g = rng.integers(0, 3, n)
    X = (centres[g] + noise * rng.standard_normal((n, d)) * 3).astype(np.float32)
    P = np.full((n, 3), 0.4)
    P[np.arange(n), g] = 0.8
    R = (rng.random((n, 3)) < P).astype(np.float32)
    split = np.array(["train"] * int(0.6 * n) + ["validation"] * int(0.2 * n) + ["test"] * (n - int(0.8 * n)))
    return X, R, g, split


def frame(R):
    n = len(R)
    return pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "agent_order": [AGENTS] * n,
                         "mean_reward": list(R), "mean_cost": list(np.tile([1e-3, 2e-3, 3e-3], (n, 1)))})


def test_kmeans_recovers_separated_groups_and_is_deterministic():
    X, _, g, _ = blobs(noise=0.1)
    C, labels = kmeans(X / np.linalg.norm(X, axis=1, keepdims=True), 3, seed=0)
    assert C.shape == (3, X.shape[1])
    # every true group lands in one cluster
    assert all(len(set(labels[g == j].tolist())) == 1 for j in range(3)) and len(set(labels.tolist())) == 3
    assert np.array_equal(kmeans(X, 3, seed=0)[1], kmeans(X, 3, seed=0)[1])


def test_kmeans_is_scikit_learns_seeded_kmeans():
    from sklearn.cluster import KMeans, kmeans_plusplus

    X, _, _, _ = blobs(n=400, noise=0.5)
    C, labels = kmeans(X, 4, seed=7)
    start = kmeans_plusplus(X.astype(np.float32), 4, random_state=7, n_local_trials=1)[0]
    ref = KMeans(n_clusters=4, init=start, n_init=N_INIT, max_iter=MAX_ITER, random_state=7).fit(X.astype(np.float32))
    assert np.array_equal(labels, ref.labels_) and np.allclose(C, ref.cluster_centers_)
    assert not np.array_equal(kmeans(X, 4, seed=8)[0], C)  # the seed is the random_state


def test_one_standard_error_takes_the_smallest_k_within_the_paired_noise_of_the_best():
    rng = np.random.default_rng(0)
    base = rng.random(400)
    oof = {2: base - 0.002, 8: base, 64: base - 0.2}
    assert one_standard_error(oof) == 8  # a gap with no paired noise at all is beyond one standard error
    noise = rng.standard_normal(400)
    oof[2] = base + 0.05 * (noise - noise.mean()) - 0.002  # paired SE ~0.0025 covers the 0.002 gap
    assert one_standard_error(oof) == 2
    oof[64] = base + 0.01  # a better k moves the bar: 2 and 8 are now too far below it
    assert one_standard_error(oof) == 64


def test_the_k_search_runs_its_kmeans_on_one_thread(monkeypatch):
    """Hundreds of small k-means fits: on a few shared cores BLAS / OpenMP threads spin more than they compute."""
    from threadpoolctl import threadpool_info

    import pipeline.route.cluster as cluster

    threads, fit = [], cluster.kmeans

    def counting(*a, **kw):
        threads.append(max([p["num_threads"] for p in threadpool_info()] or [1]))
        return fit(*a, **kw)

    monkeypatch.setattr(cluster, "kmeans", counting)
    X, R, _, split = blobs(n=600)
    tr = split == "train"
    ClusterRouter(agents=AGENTS, k_grid=(2, 3)).fit(X[tr], R[tr])
    assert len(threads) == 2 * 5 + 1 and set(threads) == {1}


def test_cluster_router_chooses_k_by_cross_validation_on_train_and_beats_the_best_single_agent():
    X, R, _, split = blobs()
    tr, va, te = (split == s for s in ("train", "validation", "test"))
    r = ClusterRouter(agents=AGENTS).fit(X[tr], R[tr], X[va], R[va])
    assert r.k_ in r.cv_rewards_ and r.cv_rewards_[r.k_] >= max(r.cv_rewards_.values()) - 0.02  # one-SE rule
    assert r.k_ == min(k for k in r.cv_rewards_ if r.cv_rewards_[k] >= r.cv_rewards_[r.k_])  # the smallest such k
    assert all(k * r.min_cluster <= tr.sum() for k in r.cv_rewards_)  # no k with clusters of a handful of rows
    assert r.k_ == 3  # the planted groups
    rows = np.arange(int(va.sum()))
    assert r.val_reward_ == pytest.approx(R[va][rows, r.pick(X[va])].mean())  # validation: a clean hold-out
    # the validation rows do not move k: same fit without them
    assert ClusterRouter(agents=AGENTS).fit(X[tr], R[tr]).k_ == r.k_
    best = int(R[tr].mean(0).argmax())
    rows = np.arange(int(te.sum()))
    assert R[te][rows, r.pick(X[te])].mean() > R[te][:, best].mean() + 0.2
    assert ClusterRouter(k=5).fit(X[tr], R[tr], X[va], R[va]).k_ == 5
    assert ClusterRouter(min_cluster=10_000).fit(X[tr], R[tr]).k_ == 8  # no k fits the rows: the default
    with pytest.raises(RouterLiteError, match="k must be >= 1"):
        ClusterRouter(k=0)
    with pytest.raises(RouterLiteError, match="do not match"):
        ClusterRouter().fit(X[:10], R[:9])


def test_cluster_router_registers_loads_and_refuses_a_corrupt_file(tmp_path):
    X, R, _, split = blobs(n=600)
    tr, va = split == "train", split == "validation"
    r = ClusterRouter(agents=AGENTS).fit(X[tr], R[tr], X[va], R[va])
    assert router_class("cluster") is ClusterRouter
    guard = OODGuard(k=5).fit(X[tr], X[va])
    path = registry.register(tmp_path, r, registry.PromptFit(guard, 0),
                             backbone={"id": "toy/embedder", "dim": X.shape[1]},
                             agents=[{"name": a, "model": a} for a in AGENTS], training={}, data_hashes={},
                             metrics={})
    assert path.name.startswith("cluster-")
    reg = registry.load(path)
    assert reg.kind == "cluster" and np.array_equal(reg.router.pick(X), r.pick(X))
    assert not list(path.glob("*.pkl")) and (path / "cluster.safetensors").is_file()
    (path / "cluster.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(RouterLiteError, match="cluster.safetensors"):
        registry.load(path)


def test_the_choice_reads_validation_only_and_every_kind_is_reported():
    X, R, _, split = blobs()
    cfg = TrainConfig(generations=5, log_every=0)
    fit = fit_router(X, frame(R), pd.Series(split), cfg)
    kinds = fit.extra["kinds"]
    assert list(kinds) == candidate_kinds() and {"head", "knn", "cluster"} <= set(kinds)
    chosen = fit.extra["shipped"]["chosen"]
    assert kinds[chosen]["crossfit"] == max(k["crossfit"] for k in kinds.values())  # the default: cross-fitted
    assert fit.extra["shipped"] == {"kind": chosen, "chosen": chosen, "selection": "crossfit",
                                    "validation": pytest.approx(kinds[chosen]["validation"]),
                                    "test": pytest.approx(fit.metrics["head"])}
    assert fit.head.kind == chosen and fit.extra["gate"]["router"] == chosen
    # scrambling the test rows' rewards changes the test figures, never the choice
    te = split == "test"
    R2 = R.copy()
    R2[te] = R2[te][:, ::-1]
    fit2 = fit_router(X, frame(R2), pd.Series(split), cfg)
    assert fit2.extra["shipped"]["chosen"] == chosen
    assert {k: (v["validation"], v["crossfit"]) for k, v in fit2.extra["kinds"].items()} == \
        {k: (v["validation"], v["crossfit"]) for k, v in kinds.items()}
    by_val = fit_router(X, frame(R), pd.Series(split), TrainConfig(generations=5, log_every=0, select="validation"))
    chosen_val = by_val.extra["shipped"]["chosen"]
    assert by_val.extra["kinds"][chosen_val]["validation"] == max(k["validation"] for k in kinds.values())
    assert "crossfit" not in by_val.extra["kinds"]["head"] and by_val.extra["shipped"]["selection"] == "validation"
    # a named kind ships that kind (the others are still reported)
    named = fit_router(X, frame(R), pd.Series(split), TrainConfig(generations=5, log_every=0, router="cluster"))
    assert named.extra["gate"]["router"] == "cluster" and set(named.extra["kinds"]) == set(kinds)
    with pytest.raises(RouterLiteError, match="unknown router kind 'forest'"):
        fit_router(X, frame(R), pd.Series(split), TrainConfig(generations=1, log_every=0, router="forest"))


def test_select_router_ties_go_to_the_earlier_kind():
    class Const:
        def __init__(self, j):
            self.j = j

        def pick(self, X):
            return np.full(len(X), self.j)

    U = np.array([[1, 1, 0], [0, 0, 1]], np.float32)
    X = np.zeros((2, 1))
    assert select_router({"head": Const(0), "knn": Const(1), "cluster": Const(2)}, X, U)[0] == "head"
    assert select_router({"head": Const(0), "knn": Const(1)}, None, None) == ("head", {})


def test_the_guard_keeps_the_start_unless_a_sample_gains_beyond_noise():
    """Pure noise: no sample can truly beat the ridge start, so any kept sample is the winner's curse."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((900, 24)).astype(np.float32)
    R = (rng.random((900, 4)) < 0.5).astype(np.float32)
    tr, va = slice(0, 600), slice(600, 900)
    kept = {}
    for conf in (0.0, 0.9):
        _, curve = train_head(PromptRows(X[tr], R[tr]), PromptRows(X[va], R[va]),
                              TrainConfig(generations=40, log_every=0, keep_confidence=conf, prune_unearned=False))
        kept[conf] = [c["generation"] for c in curve[1:] if c.get("kept")]
        assert all("val_gain_low" in c for c in curve[1:] if "kept" in c)
    assert kept[0.0] and not kept[0.9]  # the old rule keeps noise; the guard does not
    with pytest.raises(RouterLiteError, match="keep_confidence"):
        TrainConfig(keep_confidence=1.0).validate()


def test_the_replication_reports_every_prompt_kind_and_ships_the_best_by_validation_aiq():
    from pipeline.report.replication import replicate
    from pipeline.report.suites import Profile

    X, R, g, split = blobs(n=900)
    split = np.where(split == "validation", "train", split)  # the replication carves its own validation slice
    prof = Profile("toy", AGENTS, [f"q{i}" for i in range(len(X))], [f"t{i}" for i in range(len(X))], R,
                   np.tile([1e-3, 2e-3, 3e-3], (len(X), 1)), split,
                   meta={"per_query": {"eval_name": [f"e{j}" for j in g]}})
    table, _ = replicate(prof, X, TrainConfig(generations=2, log_every=0))
    t = table.set_index("policy")
    val = table.attrs["validation_aiq"]
    assert set(val) == {"trained head", "kNN router", "cluster router"} and "label router (per source)" in t.index
    shipped = [p for p in t.index if p.startswith("shipped prompt router")]
    chosen = max(val, key=val.get)
    assert shipped == [f"shipped prompt router ({chosen}, by validation AIQ)"]
    assert t.loc[shipped[0], "aiq"] == pytest.approx(t.loc[chosen, "aiq"])  # the chosen kind's own row
