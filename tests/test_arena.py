"""RouterArena's measures (pipeline/report/arena.py) on hand-made matrices, the perturbations, and the decisions the
lineage scores them on (pipeline/route/decisions.py): the fitted routers re-run give the value report's figures."""
import numpy as np
import pandas as pd
import pytest

from pipeline.report import arena

# 4 queries, 3 agents (costs 1, 2, 4 per query): q0 all correct, q1 agents 1 and 2, q2 only agent 2, q3 none
R = np.array([[1, 1, 1], [0, 1, 1], [0, 0, 1], [0, 0, 0]], dtype=float)
C = np.tile([1.0, 2.0, 4.0], (4, 1))
ROWS = np.arange(4)


def test_cheapest_correct_router_scores_one():
    picks = np.array([0, 1, 2, 0])  # q3 is unanswerable: whatever it picks does not count
    m = arena.optimality(picks, C[ROWS, picks], R, C)
    assert m["optimal_selection"] == 1.0 and m["optimal_cost_ratio"] == 1.0 and m["optimal_cost_ratio_all"] == 1.0
    assert m["n_answerable"] == 3


def test_dearest_correct_router_scores_zero_where_a_cheaper_agent_is_correct():
    picks = np.array([2, 2, 2, 2])
    m = arena.optimality(picks, C[ROWS, picks], R, C)
    assert m["optimal_selection"] == pytest.approx(1 / 3)  # only q2, where agent 2 is the one correct agent
    assert m["optimal_cost_ratio"] == pytest.approx((1 + 2 + 4) / 12)
    only_cheaper = np.array([0, 1])  # the queries where a cheaper agent is correct
    assert arena.optimality(picks[only_cheaper], C[only_cheaper, 2], R[only_cheaper], C[only_cheaper])[
        "optimal_selection"] == 0.0


def test_wrong_picks_count_against_selection_but_not_in_the_cost_ratio():
    picks = np.array([0, 0, 0, 0])  # right on q0 only
    m = arena.optimality(picks, C[ROWS, picks], R, C)
    assert m["optimal_selection"] == pytest.approx(1 / 3)
    assert m["optimal_cost_ratio"] == 1.0  # RouterArena: only the rows the router answered correctly
    assert m["optimal_cost_ratio_all"] == pytest.approx((1 + 2 + 4) / 3)  # a cheap wrong pick lifts it above 1


def test_a_cascade_pays_every_call_it_made():
    by = np.array([0, 1, 2, 0])
    m = arena.optimality(by, np.array([3.0, 3.0, 7.0, 7.0]), R, C)  # answered like the optimum, paid more
    assert m["optimal_selection"] == 1.0 and m["optimal_cost_ratio"] == pytest.approx(7 / 13)


def test_ties_and_fractional_rewards():
    Rf = np.array([[0.5, 0.5, 0.25], [0.2, 0.0, 0.0]])
    Cf = np.array([[2.0, 2.0, 1.0], [1.0, 1.0, 1.0]])
    ok = arena.correct_mask(Rf)
    assert ok.tolist() == [[True, True, False], [True, False, False]]  # the row's best reward, not any credit
    assert arena.optimal_mask(Rf, Cf).tolist() == [[True, True, False], [True, False, False]]  # cost tie: both
    for j in (0, 1):
        assert arena.optimality(np.array([j, 0]), Cf[[0, 1], [j, 0]], Rf, Cf)["optimal_selection"] == 1.0
    assert arena.optimality(np.array([2, 0]), np.array([1.0, 1.0]), Rf, Cf)["optimal_selection"] == 0.5


def test_the_oracle_takes_the_cheapest_of_the_best_agents_even_in_float32():
    U = np.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]], dtype=np.float32)
    Cs = np.array([[0.002, 0.001, 0.0005], [0.001, 0.003, 0.002], [0.001, 0.002, 0.003]])
    picks = arena.oracle_picks(U, Cs)
    assert picks.tolist() == [1, 2, 0]
    assert arena.optimality(picks, Cs[np.arange(3), picks], U, Cs)["optimal_selection"] == 1.0


def test_random_is_the_mean_of_the_constant_routers():
    m = arena.random_optimality(R, C)
    consts = [arena.optimality(np.full(4, j), C[:, j], R, C) for j in range(3)]
    assert m["optimal_selection"] == pytest.approx(np.mean([c["optimal_selection"] for c in consts]))
    # a ratio of expected sums over the rows each agent answers correctly: agent 0 on q0, 1 on q0-q1, 2 on q0-q2
    assert m["optimal_cost_ratio"] == pytest.approx((1 + (1 + 2) + (1 + 2 + 4)) / (1 + (2 + 2) + (4 + 4 + 4)))


def test_perturbations_are_seeded_and_deterministic():
    p = "What is the derivative of sin(x) with respect to x? Answer with one expression only."
    for kind in arena.PERTURBATIONS:
        once, again = arena.perturb(p, kind), arena.perturb(p, kind)
        assert once == again and once != p
    assert arena.perturb(p, "template") == f"Question: {p}\nPlease answer."
    typo = arena.perturb(p, "typos")
    assert sorted(typo) == sorted(p) and len(typo) == len(p)  # letters swapped, none lost
    assert any(arena.perturb(p, "typos", seed) != typo for seed in range(1, 6))  # the seed matters
    cw = arena.perturb(p, "case_whitespace")
    assert cw.lower().split() == p.lower().split()  # only case and whitespace changed
    with pytest.raises(ValueError, match="unknown perturbation"):
        arena.perturb(p, "shuffle")


def test_robustness_counts_every_perturbation():
    base = np.array([0, 1, 2, 2])
    r = arena.robustness(base, {"a": np.array([0, 1, 2, 2]), "b": np.array([0, 2, 2, 2])})
    assert r["robustness"] == 0.75 and r["robustness_pairs"] == pytest.approx(7 / 8)
    assert r["by_perturbation"] == {"a": 1.0, "b": 0.75}
    two = np.array([[0, 1], [1, 1]])  # a cascade: (stage, answering agent)
    assert arena.robustness(two, {"a": np.array([[0, 1], [0, 1]])})["robustness"] == 0.5


def test_latency_percentiles():
    lat = arena.latency(np.arange(1, 101, dtype=float))
    assert lat["p50"] == pytest.approx(50.5) and lat["p95"] == pytest.approx(95.05) and lat["n"] == 100


def test_report_entry_and_table():
    """The `router_arena` entry: per router and target the measures, baselines that ignore the prompt stable by
    construction, the oracle (cheapest among the best) optimal everywhere; its Markdown table."""
    from pipeline.report.value import HeadFigures, arena_markdown, router_value

    picks = np.array([0, 1, 1, 0])
    base = {"routers": {"head": {"max-quality": picks}}, "prompt_routers": {"knn": {"max-quality": picks}},
            "outcomes": {}}
    flipped = {"routers": {"head": {"max-quality": np.array([0, 1, 2, 0])}},
               "prompt_routers": {"knn": {"max-quality": picks}}, "outcomes": {}}
    ms = {"head": {"p50": 3.0, "p95": 5.0, "n": 4, "batch_size": 1, "pick": {"p50": 0.1, "p95": 0.2, "n": 4}}}
    out = arena.arena_report(base, {"typos": flipped}, ms, R, C, 2, ["a", "b", "c"])
    head = out["routers"]["head"]
    assert head["max-quality"]["robustness"] == 0.75 and head["decision_ms"]["p50"] == 3.0
    assert head["max-quality"]["optimal_selection"] == pytest.approx(2 / 3)
    assert out["prompt_routers"]["knn"]["max-quality"]["robustness"] == 1.0
    assert out["baselines"]["oracle"]["optimal_selection"] == 1.0
    assert out["baselines"]["best_single"]["agent"] == "c" and out["baselines"]["best_single"]["robustness"] == 1.0
    assert out["perturbations"]["seed"] == arena.SEED and set(out["perturbations"]["set"]) == set(arena.PERTURBATIONS)
    table = arena_markdown(out)
    assert "prompt-only (head) at max-quality | 66.7%" in table and "3.0 / 5.0" in table and "0.10 / 0.20" in table
    assert head["max-quality"]["quality"] == pytest.approx(np.mean(R[ROWS, picks]))
    value = {"targets": {"max-quality": {"quality": 1.0, "ci_low": 1, "ci_high": 1, "cost_per_1k": 1.0,
                                         "cost_ratio": 1.0, "lambda": 0.0, "shares": {}, "gain": 0.0,
                                         "gain_low": 0.0, "gain_high": 0.0}},
             "best_single": {"agent": "c", "quality": 1.0, "cost_per_1k": 1.0}, "apgr": None, "cpt50": None,
             "cpt80": None, "oracle": {"quality": 1.0}, "n_test": 4}
    assert router_value("demo", None, HeadFigures(value), {}, arena=out)["router_arena"] is out


def _world():
    from pipeline.route.fit import fit_router
    from pipeline.route.train import TrainConfig

    rng = np.random.default_rng(1)
    n, d = 450, 8
    cluster = rng.random(n) < 0.5
    X = (np.where(cluster[:, None], 3.0, -3.0) * np.eye(d)[0] + rng.normal(0, 0.5, (n, d))).astype(np.float32)
    Rw = np.column_stack([np.ones(n), (~cluster).astype(float)])
    Cw = np.tile([0.02, 0.001], (n, 1))
    names = ["expensive", "cheap"]
    rewards = pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "agent_order": [names] * n,
                            "mean_reward": list(Rw), "mean_cost": list(Cw)})
    split = pd.Series(np.array(["train", "validation", "test"])[np.arange(n) % 5 % 3])
    fit = fit_router(X, rewards, split, TrainConfig(generations=2, log_every=0, ship_gate=False))
    te, tr = (split == "test").to_numpy(), (split == "train").to_numpy()
    return fit, X[te], Rw[te], Cw[tr]


def test_the_decisions_rerun_the_fitted_routers(tmp_path):
    """The head's picks at each target and each prompt kind's give the value report's figures; the fitted kinds
    travel with the FittedRouter (saved and loaded as the lineage passes it on)."""
    from pipeline.route.decisions import PromptParts, head_decisions, kind_decisions
    from pipeline.route.fit import fitted_kinds
    from pipeline.route.fitted import FittedRouter
    from pipeline.route.value import agent_costs

    fit, X_te, U, C_train = _world()
    loaded = FittedRouter.load(fit.to_fitted().save(tmp_path / "fitted"))
    kinds = fitted_kinds(loaded.companions)
    assert set(kinds) == set(fit.extra["kinds"])
    parts = PromptParts(loaded.router, loaded.guard, loaded.companions["scorer"], loaded.companions.get("cost_scorer"),
                        loaded["operating_points"], fit.best_single, agent_costs(C_train))
    rows = np.arange(len(U))
    for target, picks in head_decisions(parts, X_te).items():
        assert U[rows, picks].mean() == pytest.approx(fit.value["targets"][target]["quality"])
    for k, picks in kind_decisions(kinds, loaded.guard, fit.best_single, X_te).items():
        assert U[rows, picks].mean() == pytest.approx(fit.extra["kinds"][k]["test"])
