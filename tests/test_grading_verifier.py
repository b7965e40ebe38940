"""Grading on a kept verifier: math answers are parsed and compared by math-verify, and the project's
policy on top holds for every answer a reply can give. Each row of the issue's lists is a case here (each failed on
the hand-written parser: identical degenerate text agreed, a number was read out of a non-integer); the property
tests generate more of the same kinds (non-finite, huge, non-integer, unicode signs, sets and matrices, functions
at poles) and check, in every grader, that none is graded correct or agrees, and that a cascade never accepts such a
pair at stage 0 (the same stage rule and grading serve's cascade runs, pipeline/serve/cascade_calls.py)."""
from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest
from attack_kit import agents_client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.collect import bounded
from pipeline.collect.agents import AgentSpec
from pipeline.collect.grading import GRADERS, answers_agree, extract_answer, grade
from pipeline.route.cascade import Policy, Stage, stage_step
from pipeline.serve.cascade_calls import run_cascade

BUDGET = bounded.Budget(budget_ms=2000)  # a loaded machine: a verdict, not an overrun, is what these tests read

# the HIGH rows: each agreed with itself (24/24 served at stage 0)
DEGENERATE = [r"\csc(0)", r"\cot(0)", r"\sec(\frac{\pi}{2})", r"\Gamma(0)", r"\zeta(1)", "(-1)!", r"\log_{1}(5)",
              r"\tilde\infty", r"\infin", r"\infty!", r"\infty i", r"\pm\infty", r"\{\infty\}",
              r"\begin{pmatrix}\infty\end{pmatrix}", "−∞", "1e309", "1e308*10", "10^{10^{10}}", "9^{9^{9}}",
              "10^{300}+1"]
# the integer grader read a number out of these (the gold it matched)
NOT_INTEGERS = [("2^{1000}", "2"), ("10^{400}", "10"), ("1e309", "1"), ("1/2", "1"), ("42i", "42"), ("0x2A", "0"),
                ("1_000_000", "1")]
# python_literal: non-finite values as Python prints them
NON_FINITE_LITERALS = ["[nan]", "float('nan')", "float('inf')", "[1, nan]", "{'a': inf}", "(float('-inf'),)"]


def _places(answer: str) -> list[str]:
    """Where a reply gives an answer: a box, a label, a JSON field, a tag, and (integers) the last number of prose."""
    return [rf"\boxed{{{answer}}}", f"The answer is {answer}", '{"answer": "' + answer.replace("\\", "\\\\") + '"}',
            f"<answer>{answer}</answer>", f"Adding it all up we get {answer}"]


@pytest.fixture(scope="module", autouse=True)
def _warm():
    bounded.warm_up(background=False)
    yield


@pytest.mark.parametrize("grader", ["math_expression", "integer"])
@pytest.mark.parametrize("value", DEGENERATE)
def test_degenerate_values_agree_with_nothing_not_even_themselves(value, grader):
    assert not answers_agree(value, value, grader)
    assert not bounded.agree(value, value, grader, BUDGET)
    for reply in _places(value)[:4]:
        assert extract_answer(reply, grader) is None, reply
        assert not bounded.grade(reply, value, grader, BUDGET)[1], reply


@pytest.mark.parametrize("value, gold", NOT_INTEGERS)
def test_no_integer_is_read_out_of_a_non_integer(value, gold):
    for reply in _places(value):
        extracted, correct, status = bounded.grade(reply, gold, "integer", BUDGET)
        assert status == "ok" and not correct and extracted != gold, (reply, extracted)
        assert grade(reply, gold, "integer") == (extracted, False)
    assert not answers_agree(value, gold, "integer") and not answers_agree(value, value, "integer")


@pytest.mark.parametrize("reply", [r"\boxed{−42}", "The answer is −42", "so the total is −42 dollars.",
                                   '{"answer": "−42"}'])
def test_unicode_minus_is_a_sign(reply):
    assert grade(reply, "-42", "integer") == ("-42", True)
    assert grade(reply, "42", "integer") == ("-42", False)
    assert answers_agree("−42", "-42", "integer") and not answers_agree("−42", "42", "integer")


@pytest.mark.parametrize("value", NON_FINITE_LITERALS)
def test_non_finite_literal_text_agrees_with_nothing(value):
    assert not answers_agree(value, value, "python_literal")
    assert not bounded.grade('{"answer": "' + value.replace("'", "\\'") + '"}', value, "python_literal", BUDGET)[1]
    assert not grade(value, value, "python_literal")[1]


@pytest.mark.parametrize("value, gold", [
    ("1,600", "1600"), ("1600", "1,600"), ("-1,234,567", "-1234567"), ("18.00", "18"), (r"\frac{36}{2}", "18"),
    ("2^{10}", "1024"), ("48g", "48"), ("6th", "6"), (r"\$25,000/year", "25000")])
def test_integers_the_strict_grammar_reads(value, gold):
    """Thousands separators (GSM8K writes them), a zero fraction, number-only arithmetic with an integer value and a
    unit glued to the digits are integers; their value is what is compared."""
    assert grade(rf"\boxed{{{value}}}", gold, "integer") == (gold.replace(",", ""), True)


@pytest.mark.parametrize("a, b", [(r"\frac{1}{2}", "0.5"), (r"(-\infty, 2]", r"(-\infty,2]"), (r"\{1,2\}", "2, 1"),
                                  ("6√2", r"6\sqrt{2}"), ("2 * sqrt(5)", r"2\sqrt5"), ("1112112₃", "1112112_3"),
                                  ("10^{300}", "10^{300}"), (r"\sin(\pi)", "0")])
def test_math_values_math_verify_finds_equal(a, b):
    assert answers_agree(a, b, "math_expression") and bounded.agree(a, b, "math_expression", BUDGET)


# --------------------------------------------------------------------------------------------- the cascade
def _cascade(grader: str, cheap: list[str]) -> int:
    """The stage a two-stage cascade (two cheap agents that must agree, then a strong one) answers at when the cheap
    agents reply `cheap`: serve's run_cascade over in-process agents."""
    specs = [AgentSpec(f"a{j}", f"m{j}", "openai", None, 1.0, 1.0) for j in range(3)]
    texts = {"m0": cheap[0], "m1": cheap[1], "m2": "The answer is 7"}
    client_for = agents_client(lambda spec, prompt: texts[spec.model])
    policy = Policy((Stage((0, 1), 2), Stage((2,), 0)))
    out = asyncio.run(run_cascade(policy, np.arange(3), specs, [client_for(s) for s in specs],
                                  {"messages": [{"role": "user", "content": "q"}]}, {"timeout": 30}, grader))
    return out.stage


@pytest.mark.parametrize("value", DEGENERATE)
def test_cascade_never_accepts_a_degenerate_pair_at_stage_0(value):
    for grader in ("math_expression", "integer"):
        assert _cascade(grader, [rf"\boxed{{{value}}}"] * 2) == 1, grader


@pytest.mark.parametrize("value, gold", NOT_INTEGERS)
def test_cascade_never_accepts_a_misread_integer_pair_at_stage_0(value, gold):
    assert _cascade("integer", [rf"\boxed{{{value}}}", rf"\boxed{{{gold}}}"]) == 1
    assert _cascade("integer", [rf"\boxed{{{value}}}"] * 2) == 1


def test_cascade_accepts_an_agreeing_pair_at_stage_0():
    """The check above can fail: equal usable answers are accepted at stage 0."""
    assert _cascade("integer", [r"\boxed{−42}", "The answer is -42"]) == 0
    assert _cascade("math_expression", [r"\boxed{\frac{1}{2}}", "The answer is 0.5"]) == 0


# ------------------------------------------------------------------------------------ generated answers
_POLES = [r"\csc(0)", r"\cot(0)", r"\sec(\frac{\pi}{2})", r"\tan(\frac{\pi}{2})", r"\Gamma(0)", r"\Gamma(-2)",
          "(-1)!", "(-3)!", r"\log(0)", r"\ln(0)", r"\log_{1}(5)", r"\frac{1}{0}", r"\frac{0}{0}", r"\frac{x}{0}"]
_INFINITIES = [r"\infty", r"-\infty", "−∞", "∞", r"\pm\infty", r"\infty!", r"\infty i", "infinity", "-inf", "NaN",
               r"\tilde\infty", r"\infin", r"\zeta(1)"]
_FINITE = ["1", "2", "x", r"\pi", r"\sqrt{2}", "0.5"]


def _containers(v: str) -> st.SearchStrategy:
    """Sets, tuples, matrices, equations and sums holding `v`: they stay degenerate."""
    return st.sampled_from([f"\\{{{v}\\}}", f"\\{{1, {v}\\}}", f"(1, 2, {v})", f"\\begin{{pmatrix}}{v}\\end{{pmatrix}}",
                            f"\\begin{{pmatrix}}1 & {v}\\\\ 0 & 1\\end{{pmatrix}}", f"x = {v}", f"{v} + 1",
                            f"2\\cdot({v})", f"[{v}, 3]"])


huge = st.one_of(
    st.tuples(st.integers(2, 99), st.integers(2, 9), st.integers(3, 9)).map(lambda t: f"{t[0]}^{{{t[1]}^{{{t[2]}}}}}"
                                                                           if t[1] ** t[2] * np.log10(t[0]) > 300
                                                                           else f"10^{{{301 + t[2]}}}"),
    st.integers(301, 5000).map(lambda n: f"10^{{{n}}}"),
    st.integers(309, 99999).map(lambda n: f"1e{n}"),
    st.integers(301, 400).map(lambda n: f"(10^{{300}}+{n})"),
    st.integers(301, 320).map(lambda n: "9" * n),
)
degenerate = st.one_of(st.sampled_from(_POLES + _INFINITIES), huge).flatmap(
    lambda v: st.one_of(st.just(v), _containers(v)))
non_integers = st.one_of(
    st.tuples(st.integers(1, 999), st.integers(2, 9)).map(lambda t: f"{t[0] * t[1] + 1}/{t[1]}"),
    st.integers(1, 999).map(lambda n: f"{n}i"),
    st.integers(1, 999).map(lambda n: f"0x{n:X}"),
    st.integers(2, 999).map(lambda n: f"{n}_000"),
    st.integers(1, 999).map(lambda n: f"{n}.5"),
    st.integers(1000, 9999).map(lambda n: f"2^{{{n}}}"),  # beyond 10^300 (2^{10} is the integer 1024)
)
signs = st.sampled_from(["", "-", "−", "+"])

_GOLDS = ["0", "1", "2", "-1", "10", "42", r"\frac{1}{2}", "x+1", "A", "[1, 2]"]


def _never_right(value: str, graders) -> None:
    """No reply giving `value` is graded right against any gold, and `value` agrees with no gold; nor with itself,
    except under python_literal, where a text that is no Python literal (`\\csc(0)`) is a string output equal to
    itself (its degenerate values are the non-finite floats, `test_generated_non_finite_literals_...`)."""
    for grader in graders:
        for reply in _places(value)[:4]:
            for gold in _GOLDS:
                assert not bounded.grade(reply, gold, grader, BUDGET)[1], (grader, reply, gold)
        if grader != "python_literal":
            assert not bounded.agree(value, value, grader, BUDGET), (grader, value)
        for gold in _GOLDS:
            assert not bounded.agree(value, gold, grader, BUDGET), (grader, value, gold)


def _stage0_accepts(grader: str, a: str, b: str) -> bool:
    """serve's stage-0 decision on two cheap replies: the same grading (grade_stage) and rule (stage_step)."""
    graded, table, _ = bounded.grade_stage({0: rf"\boxed{{{a}}}", 1: rf"\boxed{{{b}}}"}, {}, grader, BUDGET)
    answers = {k: o.value for k, o in graded.items()}
    j = stage_step(Stage((0, 1), 2), answers, 3, np.arange(3),
                   lambda x, y: table.get((str(x), str(y)), str(x) == str(y)))
    return j is not None


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(signs, degenerate)
def test_generated_degenerate_answers_are_never_right_nor_agree(sign, value):
    value = sign + value
    _never_right(value, GRADERS)
    for grader in ("math_expression", "integer"):
        assert not _stage0_accepts(grader, value, value), (grader, value)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(signs, non_integers)
def test_generated_non_integers_are_no_integer(sign, value):
    value = sign + value
    prefix = re.match(r"[-+]?\d+", value.replace("−", "-")).group(0).lstrip("+")  # what a prefix read gave
    for reply in _places(value):
        extracted, correct, _ = bounded.grade(reply, prefix, "integer", BUDGET)
        assert not correct and (extracted is None or "." in extracted), (reply, extracted)
    assert not answers_agree(value, value, "integer")
    assert not _stage0_accepts("integer", value, value), value


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(NON_FINITE_LITERALS + ["nan", "inf", "[inf]", "float('Infinity')", "{1: nan}",
                                              "complex('nan')", "[float('nan'), 1]", "math.inf"]))
def test_generated_non_finite_literals_agree_with_nothing(value):
    assert not answers_agree(value, value, "python_literal")
    assert not bounded.agree(value, value, "python_literal", BUDGET)
