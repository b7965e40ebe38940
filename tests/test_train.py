"""Trainer (planted rule, tie-aware fitness, determinism, batched objective), kNN router, OOD guard, metrics."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.collect.rewards import effective_rewards
from pipeline.core.errors import RouterLiteError
from pipeline.route.evaluate import METRIC_KEYS, held_out_metrics, routing_report
from pipeline.route.head import Head, n_params
from pipeline.route.knn import KnnRouter
from pipeline.route.ood import OODGuard
from pipeline.route.train import (
    PromptRows,
    TrainConfig,
    _Objective,
    best_single_agent,
    population_scores,
    train_head,
)


def planted(n=2400, d=16, K=4, seed=0):
    """Agent argmax(x @ A) always answers; the others answer 30 % of the time."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    star = (X @ rng.standard_normal((d, K))).argmax(1)
    R = (rng.random((n, K)) < 0.3).astype(np.float32)
    R[np.arange(n), star] = 1.0
    best = R == R.max(1, keepdims=True)
    tr, va, te = slice(0, int(0.6 * n)), slice(int(0.6 * n), int(0.8 * n)), slice(int(0.8 * n), n)
    return X, R, best, tr, va, te


@pytest.mark.parametrize("init", ["zeros", "ridge"])
def test_trainer_finds_planted_rule(init):
    X, R, best, tr, va, te = planted()
    head, curve = train_head(rows(X, R, best, tr), rows(X, R, best, va),
                             TrainConfig(init=init, generations=30, log_every=0))
    bs = best_single_agent(R[tr], best[tr])
    m = held_out_metrics(head.pick(X[te]), R[te], best[te], best_single=bs, n_train=len(R[tr]))
    assert m["head"] > m["best_single"] + 0.2, m
    assert m["headroom_captured"] > 0.5, m
    assert [c["generation"] for c in curve] == list(range(31))
    assert all(b >= a for a, b in zip([c["best_reward_so_far"] for c in curve],
                                      [c["best_reward_so_far"] for c in curve][1:]))
    if init == "ridge":
        assert "ridge_alpha" in curve[0]


def rows(X, R, best, m):
    return PromptRows(X[m], R[m], best[m])


def test_hidden_layer_trains_and_early_stopping_never_worse_than_start():
    X, R, best, tr, va, te = planted(n=1200)
    head, curve = train_head(rows(X, R, best, tr), rows(X, R, best, va),
                             TrainConfig(hidden_dim=8, generations=10, log_every=0, prune_unearned=False))
    assert head.hidden_dim == 8 and head.n_params == n_params(16, 4, 8)
    assert curve[-1]["best_val_reward"] >= curve[0]["val_reward"]
    picks_val = head.pick(X[va])
    assert np.isclose(effective_rewards(R[va], best[va])[np.arange(len(picks_val)), picks_val].mean(),
                      curve[-1]["best_val_reward"], atol=1e-6)


def test_tie_aware_fitness_hand_case():
    # row 0: agents 0 and 1 tied best (reward 0.5 each, 1 listed as best by a tolerance); row 1: agent 2 best.
    R = np.array([[0.5, 0.4, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32)
    best = np.array([[True, True, False], [False, False, True]])
    R_eff = effective_rewards(R, best)
    np.testing.assert_array_equal(R_eff, [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    Z1 = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]], dtype=np.float32)   # one-hot rows + bias column
    K = 3

    def theta(p0, p1):  # linear head routing row 0 -> p0, row 1 -> p1
        W = np.zeros((3, K))
        W[0, p0] = 1
        W[1, p1] = 1
        return W.ravel()

    obj = _Objective(Z1, R_eff, None, 0, "tanh", 0.0)
    fit, reward = obj(np.stack([theta(0, 2), theta(1, 2), theta(2, 2), theta(1, 0)]))
    np.testing.assert_allclose(reward, [0.75, 0.75, 0.5, 0.25])
    np.testing.assert_allclose(fit, reward)
    # cost-aware: reward − λ·cost
    cost = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]], dtype=np.float32)
    fit_c, _ = _Objective(Z1, R_eff, cost, 0, "tanh", 0.1)(np.stack([theta(0, 2), theta(1, 2)]))
    np.testing.assert_allclose(fit_c, [0.75 - 0.1 * 1.5, 0.75 - 0.1 * 1.0], rtol=1e-6)


def test_population_scores_match_heads():
    rng = np.random.default_rng(3)
    d, K, H, P = 5, 3, 4, 6
    Z = rng.standard_normal((9, d)).astype(np.float32)
    Z1 = np.hstack([Z, np.ones((9, 1), np.float32)])
    for hd in (0, H):
        thetas = rng.standard_normal((P, n_params(d, K, hd)))
        S = population_scores(Z1, thetas, K, hd, "tanh")
        for p in range(P):
            np.testing.assert_allclose(S[p], Head.from_vector(thetas[p], d, K, hd).scores(Z), rtol=1e-4, atol=1e-4)


def test_determinism_with_seed():
    X, R, best, tr, va, _ = planted(n=1000)
    cfg = TrainConfig(generations=8, log_every=0, init="zeros")
    h1, c1 = train_head(rows(X, R, best, tr), rows(X, R, best, va), cfg)
    h2, c2 = train_head(rows(X, R, best, tr), rows(X, R, best, va), cfg)
    np.testing.assert_array_equal(h1.to_vector(), h2.to_vector())
    assert [c["best_reward_so_far"] for c in c1] == [c["best_reward_so_far"] for c in c2]
    h3, _ = train_head(rows(X, R, best, tr), rows(X, R, best, va),
                       TrainConfig(generations=8, log_every=0, init="zeros", seed=7, early_stopping=False))
    assert not np.array_equal(h1.to_vector(), h3.to_vector())


def test_config_and_input_errors():
    X, R, best, tr, va, _ = planted(n=200)
    with pytest.raises(RouterLiteError, match="seed"):
        train_head(rows(X, R, best, tr), cfg=TrainConfig(seed=0))
    with pytest.raises(RouterLiteError, match="init"):
        train_head(rows(X, R, best, tr), cfg=TrainConfig(init="random"))
    with pytest.raises(RouterLiteError, match="cost"):
        train_head(rows(X, R, best, tr), cfg=TrainConfig(cost_lambda=0.1))
    with pytest.raises(RouterLiteError, match="cost matrix"):
        train_head(PromptRows(X[tr], R[tr], best[tr], np.ones((3, 3))), cfg=TrainConfig(cost_lambda=0.1))
    with pytest.raises(RouterLiteError, match="rows"):
        train_head(PromptRows(X[tr], R[va], best[va]))
    bad = X[tr].copy()
    bad[0, 0] = np.nan
    with pytest.raises(RouterLiteError, match="NaN"):
        train_head(PromptRows(bad, R[tr], best[tr]))


def test_knn_router_chooses_k_and_beats_best_single():
    X, R, best, tr, va, te = planted(n=3000, d=4)
    knn = KnnRouter(k_grid=(1, 5, 20, 50)).fit(X[tr], R[tr], X[va], R[va])
    assert knn.k_ in (1, 5, 20, 50) and set(knn.val_rewards_) == {1, 5, 20, 50}
    assert knn.val_rewards_[knn.k_] == max(knn.val_rewards_.values())
    S = knn.scores(X[te])
    assert S.shape == (600, 4) and S.min() >= 0 and S.max() <= 1
    bs = best_single_agent(R[tr])
    assert R[te][np.arange(600), knn.pick(X[te])].mean() > R[te][:, bs].mean() + 0.1
    assert KnnRouter().fit(X[tr], R[tr]).k_ == 100         # no k and no validation: the default k


def test_knn_exact_neighbour_scores():
    X = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], dtype=np.float32)
    R = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=np.float32)
    knn = KnnRouter(k=2).fit(X, R)
    np.testing.assert_allclose(knn.scores(np.array([[1, 0.05], [0.05, 1]])), [[1, 0], [0, 1]])



def test_knn_fit_keeps_the_hyper_parameter_and_learns_k_():
    X, R, best, tr, va, te = planted(n=600, d=4)
    searched = KnnRouter(k_grid=(1, 5, 20)).fit(X[tr], R[tr], X[va], R[va])
    assert searched.k is None and searched.k_ in (1, 5, 20)  # sklearn's convention: k as given, k_ learned
    assert searched.fit(X[tr], R[tr]).k is None and searched.k_ == 100  # a refit searches again (no validation)
    given = KnnRouter(k=7).fit(X[tr], R[tr], X[va], R[va])
    assert given.k == given.k_ == 7 and given.val_rewards_ == {}


def test_knn_reads_an_entry_written_before_k_(tmp_path):
    """A registry entry's kNN file as entries have always held it (metadata "k": the fitted k) loads with k_ set,
    and its fingerprint (the registry name's hash input) is unchanged: ["knn", k]."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 4)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    R = (rng.random((30, 2)) < 0.5).astype(np.float32)
    save_file({"X": X, "R": R}, str(tmp_path / "knn.safetensors"),
              metadata={"kind": "router-lite-knn", "k": "5", "agents": '["a", "b"]'})
    manifest = {"dim": 4, "agents": [{"name": "a", "model": "a"}, {"name": "b", "model": "b"}],
                "files": {"weights": "knn.safetensors"}, "k": 5, "router_kind": "knn"}
    knn = KnnRouter.from_files(tmp_path, manifest)
    assert knn.k == knn.k_ == 5 and knn.fingerprint()[1] == ["knn", 5]
    np.testing.assert_allclose(knn.scores(X[:3]), KnnRouter(k=5).fit(X, R).scores(X[:3]))
    (tmp_path / "again").mkdir()
    assert knn.save_files(tmp_path / "again")["k"] == 5  # written back in the same format

def test_ood_guard_fires_on_far_queries_and_falls_back():
    rng = np.random.default_rng(0)
    centre = np.zeros(8)
    centre[0] = 1
    X = centre + 0.1 * rng.standard_normal((600, 8))
    guard = OODGuard(k=5, quantile=0.99).fit(X[:400], X[400:])
    assert guard.threshold > 0
    assert guard.fire_rate(X[400:]) <= 0.02               # ~1 % of in-distribution validation rows
    far = -centre + 0.1 * rng.standard_normal((50, 8))
    assert guard.fire_rate(far) == 1.0
    picks = np.full(60, 2)
    routed = guard.route(picks, np.vstack([X[:10], far]), fallback=0)
    assert (routed[10:] == 0).all() and (routed[:10] == 2).all()
    with pytest.raises(RouterLiteError, match="not fitted"):
        OODGuard().fires(X)


def test_held_out_metrics_keys_and_values():
    R = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=np.float32)
    m = held_out_metrics(np.array([0, 1, 1, 0]), R, R == R.max(1, keepdims=True), knn_picks=np.array([0, 0, 0, 0]),
                         best_single=0, agents=["a", "b"], n_train=10)
    assert tuple(m) == METRIC_KEYS
    assert m["head"] == 0.75 and m["best_single"] == 0.5 and m["oracle"] == 0.75 and m["random"] == 0.5
    assert m["knn"] == 0.5 and m["headroom_captured"] == 1.0
    assert m["distribution"] == {"a": 0.5, "b": 0.5} and m["n_train"] == 10 and m["n_test"] == 4
    rep = routing_report(np.array([0, 1, 1, 0]), R, agents=["a", "b"], best_single=0)
    assert rep[1]["share"] == 0.5 and rep[1]["gain"] == 0.5 and rep[0]["gain"] == 0.0
    with pytest.raises(RouterLiteError, match="head picks"):
        held_out_metrics(np.array([0, 5, 1, 0]), R)


def test_prune_unearned_agent():
    from pipeline.route.train import PRUNED_BIAS, prune_unearned

    # agent 1 is picked where x > 0 but is worse there than the best single agent 0; agent 2 earns its share
    X = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 2.0], [-1.0, -1.0]], dtype=np.float32)
    R = np.array([[1, 0, 0], [1, 0, 0], [0, 0, 1], [0, 0, 1], [1, 0, 0]], dtype=np.float32)
    W = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    head = Head(W, np.array([0.5, 0.0, 0.0]))
    assert head.pick(X).tolist() == [1, 1, 2, 2, 0]
    assert prune_unearned(head, X, R, best_single=0) == [1]
    assert head.b1[1] == PRUNED_BIAS and head.pick(X).tolist() == [0, 0, 2, 2, 0]
