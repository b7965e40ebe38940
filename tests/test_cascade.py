"""The cascade router (pipeline/route/cascade.py, cascade_fit.py): answers, agreement, scoring a policy exactly on
the static matrix, fitting per answer format with the validation guard, the router kind through the registry, and the
live executor agreeing with the static score."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.collect.answers import agent_answers, agreement, majority
from pipeline.collect.grading import answers_agree
from pipeline.core.errors import RouterLiteError
from pipeline.route import registry
from pipeline.route.cascade import CascadeRouter, Plan, Policy, Stage, execute, run_plan, run_policy
from pipeline.route.cascade_fit import Rows, cascade_path, fit_cascades
from pipeline.route.fit import constant_head
from pipeline.route.head import Head
from pipeline.route.ood import OODGuard


@pytest.mark.parametrize("a, b, grader, same", [
    ("\\frac{1}{2}", "0.5", "math_expression", True),
    ("0.5", "\\frac{1}{2}", "math_expression", True),
    ("x^2", "x^3", "math_expression", False),
    ("42", "42.0", "integer", True),
    ("42", "41", "integer", False),
    ("B", "B", "mcq_letter", True),
    ("B", "C", "mcq_letter", False),
    ("[1, 2]", "[1,2]", "python_literal", True),
    ("'abc'", "abc", "python_literal", True),
    (None, "42", "integer", False),
    ("42", None, "integer", False),
    ("  ", "  ", "integer", False),
])
def test_answers_agree_is_the_graders_symmetric_equivalence(a, b, grader, same):
    assert answers_agree(a, b, grader) is same
    assert answers_agree(b, a, grader) is same


def test_majority_records_ties_and_no_answers():
    assert majority(["4", "4", "5"]) == ("4", 2, False)
    assert majority(["5", "4"]) == ("5", 1, True)  # a tie: the earliest repetition's answer, recorded as a tie
    assert majority([None, None, "4"]) == (None, 2, False)  # no answer is a vote too
    assert majority([]) == (None, 0, False)


def test_agent_answers_from_graded_calls():
    calls = pd.DataFrame([
        {"task_id": "t1", "agent": "a", "repetition": 0, "status": "ok", "extracted": "4"},
        {"task_id": "t1", "agent": "a", "repetition": 1, "status": "ok", "extracted": "4"},
        {"task_id": "t1", "agent": "a", "repetition": 2, "status": "error", "extracted": None},  # never votes
        {"task_id": "t1", "agent": "b", "repetition": 0, "status": "empty", "extracted": None},
        {"task_id": "t1", "agent": "b", "repetition": 1, "status": "ok", "extracted": "5"},
    ])
    out = agent_answers(calls, ["a", "b"]).iloc[0]
    assert out["answers"] == ["4", None]  # b: one empty, one "5": a tie, the first repetition (no answer) wins
    assert out["answer_tie"] == [False, True] and out["no_answer"] == [0, 1] and out["answer_votes"] == [2, 1]


def _matrix():
    """4 agents: 0 strong and dear, 1 and 2 cheap, 3 mid. Rows 0-3: both cheap agents right and agreeing; rows 4-5:
    they disagree (one right); rows 6-7: they agree on a wrong answer."""
    answers = [["4", "4", "4", "4"]] * 4 + [["7", "7", "8", "7"]] * 2 + [["9", "1", "1", "9"]] * 2
    R = np.array([[1, 1, 1, 1]] * 4 + [[1, 1, 0, 1]] * 2 + [[1, 0, 0, 1]] * 2, dtype=float)
    C = np.tile([1.0, 0.01, 0.02, 0.1], (8, 1))
    E = agreement(answers, ["integer"] * 8)
    return R, C, E


def test_run_policy_scores_every_call_made():
    R, C, E = _matrix()
    order = np.array([0, 3, 1, 2])
    p = Policy((Stage((1, 2), k=2), Stage((0,))))
    o = run_policy(p, R, C, E, order)
    # rows 0-3 and 6-7 accepted at stage 0 (agent 1, preferred over 2); rows 4-5 escalate to agent 0
    assert o.stage.tolist() == [0, 0, 0, 0, 1, 1, 0, 0]
    assert o.answered_by.tolist() == [1, 1, 1, 1, 0, 0, 1, 1]
    assert o.reward.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert np.allclose(o.cost, [0.03] * 4 + [1.03] * 2 + [0.03] * 2)  # escalated rows pay for the cheap calls too
    assert o.n_calls.tolist() == [2, 2, 2, 2, 3, 3, 2, 2]
    # a second check: agent 3 joins when they disagree; accept when 2 of the 3 agree (rows 4-5: 1 and 3 agree)
    o2 = run_policy(Policy((Stage((1, 2), 2), Stage((3,), 2), Stage((0,)))), R, C, E, order)
    assert o2.answered_by.tolist()[4:6] == [3, 3] and np.allclose(o2.cost[4:6], 0.13)


def test_prompt_shortcuts_skip_and_accept_alone():
    R, C, E = _matrix()
    P = np.zeros((8, 4))
    P[:, 1] = [0.9, 0.9, 0.5, 0.5, 0.5, 0.5, 0.1, 0.1]
    p = Policy((Stage((1, 2), 2), Stage((0,))), skip_below=0.2, accept_above=0.8)
    o = run_policy(p, R, C, E, np.array([0, 3, 1, 2]), P)
    assert o.stage.tolist() == [-1, -1, 0, 0, 1, 1, -2, -2]
    assert o.answered_by.tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert o.reward.sum() == 8 and np.allclose(o.cost[[0, 6]], [0.01, 1.0])
    with pytest.raises(RouterLiteError, match="predictions"):
        run_policy(p, R, C, E, np.array([0, 3, 1, 2]), None)


@pytest.mark.parametrize("bad", [
    {"stages": [{"agents": ["a", "b"], "k": 2}]},  # the last stage must be one agent, unconditional
    {"stages": [{"agents": ["zz"], "k": 0}]},
    {"stages": [{"agents": ["a"], "k": "2"}]},
    {"stages": [{"agents": ["a"], "k": 0}], "skip_below": "x"},
    {"nope": 1},
])
def test_bad_policies_are_one_error(bad):
    with pytest.raises(RouterLiteError):
        Policy.from_dict(bad, ["a", "b"])


def test_fit_learns_a_cascade_per_answer_format(synthetic_cascade):
    R, C, E, g, masks = synthetic_cascade()
    fit = fit_cascades(Rows(R, C, E, None, g), masks, 0, ["strong", "cheap1", "cheap2"], ["max-quality", "parity",
                                                                                          "quality>=0.98"])
    v = fit.variants["cascade"]
    t = v.targets["parity"]
    # on integers the cheap pair's agreement is trusted; on math the strong agent answers: quality kept, cost cut
    assert t["quality_ratio"] > 0.97 and t["cost_ratio"] < 0.75, t
    assert "integer: ask cheap1 + cheap2" in t["plan"]
    mq = v.targets["max-quality"]
    assert mq["quality"] >= R[masks["held_out"], 0].mean() - 1e-12  # never below the best single agent here
    assert "combined" not in fit.variants and fit.chosen == "cascade"  # no prompt predictions given


def test_quality_target_guard_demands_a_margin(synthetic_cascade):
    """The guard (`guard_z`): a quality target must hold by z standard errors of the paired difference."""
    R, C, E, g, masks = synthetic_cascade()
    plans = [Plan(Policy((Stage((0,)),))), Plan(Policy((Stage((1, 2), 2), Stage((0,)))))]
    va = masks["validation"]
    order = np.array([0, 1, 2])
    loose = cascade_path(plans, Rows(R, C, E, None, g).take(va), order, 0, ["s", "c1", "c2"], guard_z=0.0)
    from pipeline.route.targets import resolve

    cheap = next(p for p in loose["points"] if "c1" in json.dumps(p["plan"]))
    f = cheap["quality"] / loose["best_single_validation"]["quality"] - 1e-6  # passes exactly without a guard
    assert resolve(f"quality>={f}", loose)["cost_per_1k"] == pytest.approx(cheap["cost_per_1k"])
    strict = dict(loose, guard_z=3.0)
    assert resolve(f"quality>={f}", strict)["cost_per_1k"] > cheap["cost_per_1k"]


def test_router_kind_round_trips_through_the_registry(tmp_path, synthetic_cascade):
    R, C, E, g, masks = synthetic_cascade(600)
    agents = ["strong", "cheap1", "cheap2"]
    fit = fit_cascades(Rows(R, C, E, None, g), masks, 0, agents, ["parity"])
    v = fit.variants["cascade"]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 8)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    head = constant_head(Head(np.zeros((8, 3), np.float32), np.zeros(3, np.float32), agents=agents), 0)
    router = CascadeRouter(head, v.path, v.order, agents)
    kw = dict(backbone={"id": "test/bb", "key": "k", "dim": 8}, agents=[{"name": a, "model": a} for a in agents],
              training={}, data_hashes={}, metrics={})
    path = registry.register(tmp_path, router, registry.PromptFit(OODGuard().fit(X, X), 0), **kw)
    assert path.name.startswith("cascade-bb-") and (path / "reference.py").is_file()
    assert registry.register(tmp_path, router, registry.PromptFit(OODGuard().fit(X, X), 0),
                             **kw) == path  # same content, same name
    reg = registry.load(path)
    assert reg.kind == "cascade" and reg.router.plan("parity") == router.plan("parity")
    view = reg.cascade_at("parity", "integer")
    assert view.policy == router.plan("parity").for_grader("integer")
    with pytest.raises(RouterLiteError, match="unknown grader"):
        reg.cascade_at("parity", "morse")
    doc = json.loads((path / "cascade.json").read_text())
    doc["path"]["points"][0]["plan"]["default"]["stages"][0]["agents"] = ["nobody"]
    (path / "cascade.json").write_text(json.dumps(doc))
    with pytest.raises(RouterLiteError, match="cascade.json"):
        registry.load(path)
    (path / "cascade.json").write_text("{not json")
    with pytest.raises(RouterLiteError, match="corrupt"):
        registry.load(path)


def test_live_execution_equals_the_static_score(synthetic_cascade):
    """`execute` (what the routed benchmark and, call by call, the server do) makes exactly the calls the static
    score counts, and returns the same rewards."""
    R, C, E, g, masks = synthetic_cascade(300)
    answers = [["1" if E[i, 0, 0] else None] for i in range(len(R))]  # placeholder: answers rebuilt below
    rng = np.random.default_rng(1)
    answers = [[str(rng.integers(0, 3)) for _ in range(3)] for _ in range(len(R))]
    E = agreement(answers, g.tolist())
    plan = Plan(Policy((Stage((1,)),)), (("integer", Policy((Stage((1, 2), 2), Stage((0,))))),))
    order = np.array([0, 1, 2])
    static = run_plan(plan, R, C, E, order, None, g)
    asked = []

    def ask(j, rows):
        asked.extend((j, i) for i in rows)
        return {i: (answers[i][j], R[i, j], C[i, j]) for i in rows}

    live = execute([plan.for_grader(x) for x in g], np.full(len(R), -1), order, ask,
                   lambda i, a, b: answers_agree(a, b, g[i]))
    assert np.array_equal(live.reward, static.reward) and np.allclose(live.cost, static.cost)
    assert np.array_equal(live.answered_by, static.answered_by)
    assert len(asked) == int(static.n_calls.sum()) == len(set(asked))  # no call made twice
