"""The cascade search reads only the agents a policy calls: `run_policy` on the restricted
matrix and the lazy `Agreement` give exactly what the whole-pool computation gives, on random matrices."""
import numpy as np
import pytest

from pipeline.collect.answers import Agreement, agreement
from pipeline.route.cascade import (
    ALONE,
    SKIPPED,
    STAGES,
    Outcome,
    agreeing_rep,
    run_policies,
    run_policy,
    shortcuts,
    uses_prediction,
)
from pipeline.route.cascade_fit import candidates, fit_plans, preference


def run_policy_full(policy, R, C, E, order, P=None) -> Outcome:
    """The former run_policy, over all K agents (the brute-force reference)."""
    n, K = R.shape
    rows = np.arange(n)
    open_ = np.ones(n, dtype=bool)
    reward, cost = np.zeros(n), np.zeros(n)
    by = np.full(n, -1, dtype=np.int64)
    stage_of = np.full(n, STAGES, dtype=np.int64)
    called = np.zeros((n, K), dtype=bool)
    if uses_prediction(policy):
        code, _ = shortcuts(policy, None if P is None else P[:, policy.lead])
        for c, j in ((ALONE, policy.lead), (SKIPPED, policy.final)):
            m = code == c
            reward[m], cost[m], by[m], stage_of[m] = R[m, j], C[m, j], j, c
            called[m, j] = True
        open_ &= code == STAGES
    for t, s in enumerate(policy.stages):
        if not open_.any():
            break
        new = np.zeros((n, K), dtype=bool)
        new[:, list(s.agents)] = True
        new &= ~called & open_[:, None]
        cost += (C * new).sum(axis=1)
        called |= new
        if s.k == 0:
            accept, rep = open_.copy(), np.full(n, s.agents[0])
        else:
            size, rep = agreeing_rep(E, called & open_[:, None], order)
            accept = open_ & (size >= s.k)
        reward[accept] = R[rows[accept], rep[accept]]
        by[accept] = rep[accept]
        stage_of[accept] = t
        open_ &= ~accept
    return Outcome(reward, cost, by, called.sum(axis=1), stage_of)


def agreement_eager(answers, graders) -> np.ndarray:
    """The former eager loop of `agreement` (unbounded grader comparisons)."""
    from pipeline.collect.grading import grader_spec

    n, K = len(answers), len(answers[0])
    E = np.zeros((n, K, K), dtype=bool)
    for i, (row, g) in enumerate(zip(answers, graders)):
        for j in range(K):
            if row[j] is None:
                continue
            E[i, j, j] = True
            for m in range(j + 1, K):
                if row[m] is not None:
                    E[i, j, m] = E[i, m, j] = bool(grader_spec(g).agree(row[j], row[m]))
    return E


def random_pool(seed: int, n: int, K: int):
    rng = np.random.default_rng(seed)
    skill = rng.uniform(0.3, 0.95, K)
    R = (rng.random((n, K)) < skill).astype(float)
    C = rng.uniform(0.1, 2.0, K)[None, :] * rng.uniform(0.5, 1.5, (n, K))
    answers = [[None if rng.random() < 0.08 else (str(i % 7) if R[i, j] else str(rng.integers(0, 4)))
                for j in range(K)] for i in range(n)]
    graders = np.array(["integer"] * n, dtype=object)
    P = np.clip(skill[None, :] + rng.normal(0, 0.2, (n, K)), 0, 1)
    return R, C, answers, graders, P


@pytest.mark.parametrize("seed,K", [(0, 4), (1, 7), (2, 9), (3, 12)])
def test_restricted_run_policy_equals_full(seed, K):
    R, C, answers, graders, P = random_pool(seed, 120, K)
    E = agreement_eager(answers, graders)
    order = preference(R)
    pols = candidates(R, C, P)
    assert len(pols) > K
    for pol in pols[:: max(1, len(pols) // 300)]:
        a, b = run_policy(pol, R, C, E, order, P), run_policy_full(pol, R, C, E, order, P)
        for f in ("reward", "answered_by", "n_calls", "stage"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), (pol, f)
        assert np.allclose(a.cost, b.cost, rtol=0, atol=1e-12), pol
        if K < 8:  # fewer than 8 columns: numpy sums them one by one, so the costs are bit-identical
            assert np.array_equal(a.cost, b.cost), pol


@pytest.mark.parametrize("seed,K", [(8, 5), (9, 11)])
def test_shared_stage_runs_equal_one_by_one(seed, K):
    """`run_policies` (the stages of policies that differ only in their prompt shortcuts run once) gives every
    candidate of the search exactly what `run_policy` gives it, on rows where the shortcuts answer and where not."""
    R, C, answers, graders, P = random_pool(seed, 150, K)
    E = agreement_eager(answers, graders)
    order = preference(R)
    pols = candidates(R, C, P)
    assert sum(p.skip_below is not None or p.accept_above is not None for p in pols) > len(pols) // 2
    shared = run_policies(pols, R, C, E, order, P)
    assert len(shared) == len(pols)
    direct = 0
    for pol, a in zip(pols, shared):
        b = run_policy(pol, R, C, E, order, P)
        for f in ("reward", "cost", "answered_by", "n_calls", "stage"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), (pol, f)
            assert getattr(a, f).dtype == getattr(b, f).dtype, (pol, f)
        direct += int((a.stage < 0).sum())
    assert direct > 0  # the shortcuts did answer rows


@pytest.mark.parametrize("seed,K", [(4, 5), (5, 10)])
def test_lazy_agreement_equals_eager(seed, K):
    _, _, answers, graders, _ = random_pool(seed, 80, K)
    E = agreement_eager(answers, graders)
    assert np.array_equal(agreement(answers, graders.tolist()), E)
    stats: dict = {}
    lazy = Agreement(answers, graders.tolist(), stats=stats)
    rng = np.random.default_rng(seed)
    m = rng.random(80) < 0.6
    view = lazy[m][np.arange(int(m.sum()))[::2]]  # a view of a view
    use = np.array(sorted(rng.choice(K, 3, replace=False)))
    assert np.array_equal(view.sub(use), E[m][::2][:, use[:, None], use[None, :]])
    assert view.shape == (len(E[m][::2]), K, K) and len(view) == view.shape[0]
    done = lazy._s["done"]
    assert done.sum() == K + 6  # the diagonal and the 3 pairs asked, both orders: nothing else compared
    assert stats["agreement_pairs"] == 3
    assert np.array_equal(lazy.full(), E)


def test_lazy_agreement_counts_unknown_grader():
    from pipeline.core.errors import RouterLiteError

    with pytest.raises(RouterLiteError, match="grader"):
        Agreement([["1", "2"]], ["no_such_grader"])


@pytest.mark.parametrize("seed,K", [(6, 6), (7, 11)])
def test_search_with_lazy_agreement_equals_brute_force(seed, K):
    """The whole search (candidates, λ sweep, per-grader groups) on the lazy tensor picks exactly the plans the
    whole tensor gives, and compares only the pairs its policies read."""
    R, C, answers, _, P = random_pool(seed, 200, K)
    graders = np.array(["integer"] * 120 + ["python_literal"] * 80, dtype=object)
    E = agreement_eager(answers, graders)
    order = preference(R)
    best = int(order[0])
    full = fit_plans(R, C, E, P, graders, order, best)
    lazy = Agreement(answers, graders.tolist())
    assert fit_plans(R, C, lazy, P, graders, order, best) == full
    assert len(full) >= 2
    if K > 8:
        assert lazy._s["done"].sum() < K * K  # pairs of two expensive agents were never compared
