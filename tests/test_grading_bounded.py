"""Grading with a budget (pipeline/collect/bounded.py): poisoned replies are "no answer" within the budget
in every place grading runs, an overrun or an exception is counted, the worker that overran is replaced, and the
linear patterns of grading.py give the same matches as the patterns they replaced."""
from __future__ import annotations

import json
import re
import time

import numpy as np
import pandas as pd
import pytest

from pipeline.collect import bounded
from pipeline.collect import grading as g
from pipeline.collect.answers import agreement
from pipeline.collect.regrade import regrade
from pipeline.core.errors import RouterLiteError

EXP3 = r"\exp(\exp(\exp(100)))"
TAN = r"\tan(\exp(\exp(20)))"
POW = "(9^{99})^{99}"


@pytest.fixture(scope="module", autouse=True)
def _pool():
    bounded.warm_up(background=False)  # the forkserver's start (seconds) is not what these tests time
    yield


def _delta(before: dict) -> dict:
    now = bounded.counts()
    return {k: now[k] - before[k] for k in now}


def test_exp_tower_overruns_within_budget_and_is_counted():
    budget = bounded.Budget(budget_ms=200)
    before = bounded.counts()
    t = time.perf_counter()
    out = bounded.agree_outcome(EXP3, "1", "math_expression", budget)
    took = time.perf_counter() - t
    assert out == bounded.Outcome(False, "overrun")
    assert took < 10  # budget + killing the worker (generous: a loaded CI machine)
    assert _delta(before)["overruns"] == 1
    # the next job gets a fresh worker and a verdict
    assert bounded.agree_outcome(r"\frac{1}{2}", "0.5", "math_expression", budget) == bounded.Outcome(True, "ok")


@pytest.mark.parametrize("text, grader", [(f"The answer is ${EXP3}$", "math_expression"),
                                          (f"The answer is ${TAN}$", "math_expression"),
                                          (f"The answer is ${POW}$", "integer")])
def test_poisoned_reply_grades_as_no_answer(text, grader):
    extracted, correct, status = bounded.grade(text, "1", grader, bounded.Budget(budget_ms=200))
    assert not correct
    if grader == "integer":  # beyond MAX_MAGNITUDE: degenerate, so "no answer" (before Python's 4,300-digit limit)
        assert (extracted, status) == (None, "ok")


def test_huge_power_is_no_answer_in_the_plain_grader():
    assert g.extract_answer(f"The answer is ${POW}$", "integer") is None  # not str()'s 4,300-digit ValueError


def test_grades_of_ordinary_replies_are_the_plain_graders():
    cases = [("The answer is 18", "18", "integer"), (r"The answer is $\frac{36}{2}$", "18", "integer"),
             (r"$\boxed{\frac{1}{2}}$", "0.5", "math_expression"), ("Answer: (C)", "C", "mcq_letter"),
             ('{"answer": "[1, 2]"}', "[1,2]", "python_literal"), ("no answer here", "3", "integer")]
    for text, gold, grader in cases:
        assert bounded.grade(text, gold, grader)[:2] == g.grade(text, gold, grader)
        assert bounded.grade(text, gold, grader)[2] == "ok"


def test_unknown_grader_is_still_the_callers_error():
    with pytest.raises(RouterLiteError, match="exact_match"):
        bounded.grade("The answer is 3", "3", "exact_match")
    with pytest.raises(RouterLiteError, match="exact_match"):
        agreement([["1", "1"]], ["exact_match"])


def test_text_cap_keeps_the_tail():
    budget = bounded.Budget(max_chars=1000)
    text = "The answer is 7. " + "x " * 5000 + "The answer is 9"
    assert bounded.extract(text, "integer", budget).value == "9"
    assert bounded.agree_outcome("1" * 1001, "1" * 1001 + " ", "integer", budget).value is False


@pytest.mark.parametrize("ms, chars", [(0, 1000), (float("nan"), 1000), (True, 1000), (100, 10), (100, 1.5)])
def test_budget_is_validated(ms, chars):
    with pytest.raises(RouterLiteError, match="grading"):
        bounded.Budget(ms, chars)


def test_collection_settings_carry_the_budget():
    from pipeline.collect.settings import CollectionSettings

    s = CollectionSettings(grading_budget_ms=50, grading_max_chars=2000)
    assert bounded.Budget.of(s) == bounded.Budget(50, 2000)
    assert s.hash() == CollectionSettings().hash()  # not answer-changing: a call log stays valid
    with pytest.raises(RouterLiteError, match="grading_budget_ms"):
        CollectionSettings(grading_budget_ms=-1)


def test_agreement_tensor_disagrees_on_overruns_and_counts_them():
    rows = [[EXP3, "1"], [TAN, "0"], [r"\frac{1}{2}", "0.5"], [f"{3}" + " " * 4994 + "x", "3" + " " * 4994 + "y"]]
    stats: dict = {}
    E = agreement(rows, ["math_expression"] * 4, bounded.Budget(budget_ms=200), stats=stats)
    assert E[:, 0, 1].tolist() == [False, False, True, False]
    assert stats["grading_overruns"] + stats["grading_errors"] >= 2


def test_regrade_logs_every_row_of_poisoned_calls():
    texts = [f"The answer is ${EXP3}$", f"The answer is ${POW}$", "The answer is 4"]
    calls = pd.DataFrame({"call_key": ["a", "b", "c"], "task_id": ["t0", "t1", "t2"], "status": "ok",
                          "response_text": texts, "extracted": None, "correct": None})
    tasks = pd.DataFrame({"task_id": ["t0", "t1", "t2"], "gold": ["1", "1", "4"],
                          "grader": ["math_expression", "integer", "integer"]})
    out, changed = regrade(calls, tasks, bounded.Budget(budget_ms=200))
    assert out["correct"].tolist() == [False, False, True] and changed == 3


def test_async_api_leaves_the_event_loop_free():
    import asyncio

    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def run():
        task = asyncio.create_task(ticker())
        out = await bounded.agree_table_async([EXP3, "1", "2"], "math_expression", bounded.Budget(budget_ms=300))
        task.cancel()
        return out

    table, bad = asyncio.run(run())
    assert bad >= 1 and table[(EXP3, "1")] is False and table[("1", "2")] is False
    assert ticks >= 5  # the loop ran while sympy spun in the worker


# ------------------------------------------------------------------------------------ the linear patterns
# the patterns grading.py used before it had a budget: quadratic on long whitespace runs, the same matches otherwise
_OLD = {
    "_LABEL_RE": re.compile(r"\banswer(?:\s+(?:is|would\s+be|should\s+be)|\s*\**\s*:)[\s*]*:?[\s*]*", re.I),
    "_BARE_LETTER_LINE_RE": re.compile(r"^(?:(?:option|choice|answer)\s*:?\s*)?[(\[]?([A-J])[)\]]?\.?$"),
    "_TRAILING_UNIT_RE": re.compile(r"(?<=[\d}\s])\s*" + g._UNITS + r"(?:\^\{?[23]\}?)?\s*$", re.I),
    "_FENCE_RE": re.compile(r"^```(?:python)?\s*|\s*```$"),
}
_ALPHABET = [" ", "  ", "\n", "*", ":", "answer", "Answer", " is ", "would be", "A", "(B)", "5", "}", "{", "cm",
             "square ", "feet", "^2", "```", "python", "x", ".", "option ", "\t"]


def _strings(rng, n: int):
    for _ in range(n):
        yield "".join(rng.choice(_ALPHABET) for _ in range(rng.integers(0, 14)))


@pytest.mark.parametrize("name", sorted(_OLD))
def test_linear_pattern_matches_like_the_old_one(name):
    new, old = getattr(g, name), _OLD[name]
    rng = np.random.default_rng(25)
    for s in _strings(rng, 4000):
        for text in (s, s.strip()):
            assert [m.span() for m in new.finditer(text)] == [m.span() for m in old.finditer(text)], (name, text)
            assert bool(new.match(text)) == bool(old.match(text)), (name, text)
            assert new.sub("", text) == old.sub("", text), (name, text)


def test_tagged_and_boxed_scans_match_the_regex_forms():
    tag = re.compile(r"<answer>(.*?)</answer>", re.I | re.S)
    rng = np.random.default_rng(7)
    parts = ["<answer>", "</answer>", "<ANSWER>", "1", " ", "\\boxed{", "}", "{", "\\boxed ", "x"]
    for _ in range(3000):
        s = "".join(rng.choice(parts) for _ in range(rng.integers(0, 12)))
        assert g._tagged(s) == tag.findall(s), s
        boxed = []
        for m in g._BOXED_RE.finditer(s):
            i = m.end()
            if s[i:i + 1] == "{":
                grp = g._brace_group(s, i)
                if grp:
                    boxed.append(grp[0])
            elif i < len(s):
                boxed.append(re.match(r"\S+", s[i:]).group(0).rstrip("$."))
        assert g._boxed_contents(s) == boxed, s


# ------------------------------------------------------------------------------------------- degenerate answers
DEGENERATE = [r"\frac{1}{0}", r"\frac{0}{0}", r"\infty", r"-\infty", r"\infty-\infty", r"0\cdot\infty", r"\log(0)",
              "(9^{99})^{99}", r"\exp(99^{99})", r"\frac{1}{0}+x"]
UNRELATED = ["42", r"\frac{1}{2}", r"\sqrt{2}", r"3\pi", "x+1", "-7", "(1,2)"]


@pytest.mark.parametrize("answer", DEGENERATE)
def test_degenerate_answer_grades_and_agrees_with_nothing(answer):
    for gold in UNRELATED:
        for text in ('{"answer": "' + answer.replace("\\", "\\\\") + '"}', rf"so \boxed{{{answer}}}"):
            assert bounded.grade(text, gold, "math_expression")[:2] == (None, False), (text, gold)
        assert not bounded.agree(answer, gold, "math_expression"), gold
        assert not bounded.agree(gold, answer, "math_expression"), gold
    assert bounded.agree_outcome(answer, answer, "math_expression") == bounded.Outcome(False, "ok")  # not itself


def test_ordinary_answers_still_agree_with_themselves_and_intervals_keep_infinite_ends():
    for answer in ["42", r"\frac{\sqrt{3}}{2}", "x+1", r"(-\infty,2)\cup(3,\infty)", r"[0,\infty)", "4*10^{100}-13"]:
        assert bounded.agree(answer, answer, "math_expression"), answer
    assert bounded.grade(r"\boxed{(-\infty, 2]}", r"(-\infty,2]", "math_expression")[1]
    assert not bounded.agree(r"(-\infty,2]", r"(\infty,2]", "math_expression")


@pytest.mark.parametrize("text, gold, grader", [
    (r"The answer is $\frac{1}{0}$", "1", "integer"),  # the number read out of 1/0
    (r"The answer is $\frac{0}{0}$", "0", "integer"),
    (r"The answer is $\log(0)$", "0", "integer"),
    (r"Tried 3 cases. \boxed{\infty}", "3", "integer"),  # the last-number fallback after an infinite answer
    (r"Tried 3 cases. \boxed{\infty}", "3", "math_expression"),
    (r"\boxed{1" + "0" * 301 + "}", "1" + "0" * 301, "integer"),  # beyond 10^300
    ('{"answer": "1e999"}', "1e400", "python_literal"),  # both overflow to inf: Python says equal
    ('{"answer": [1, 1e999]}', "[1, 2e999]", "python_literal"),
])
def test_degenerate_answer_is_no_answer_in_every_grader(text, gold, grader):
    assert bounded.grade(text, gold, grader)[:2] == (None, False)


def test_identical_degenerate_answers_do_not_agree_in_the_agreement_tensor():
    rows = [[r"\infty", r"\infty"], [r"\frac{0}{0}", r"\frac{0}{0}"], ["1e999", "1e999"], ["5", "5"]]
    E = agreement(rows, ["math_expression", "integer", "python_literal", "integer"])
    assert E[:, 0, 1].tolist() == [False, False, False, True]


def test_regrade_changes_rows_a_previous_version_graded_correct():
    texts = [r"\boxed{\frac{0}{0}}", r"The answer is $\infty$", r"\boxed{\frac{1}{0}}", "The answer is 4"]
    calls = pd.DataFrame({"call_key": list("abcd"), "task_id": ["t0", "t1", "t2", "t3"], "status": "ok",
                          "response_text": texts, "extracted": [r"\frac{0}{0}", r"\infty", "1", "4"],
                          "correct": True})  # as the version before graded them
    tasks = pd.DataFrame({"task_id": ["t0", "t1", "t2", "t3"], "gold": ["42", r"\frac{1}{2}", "1", "4"],
                          "grader": ["math_expression", "math_expression", "integer", "integer"]})
    out, changed = regrade(calls, tasks)
    assert changed == 3
    assert out["extracted"].tolist() == [None, None, None, "4"] and out["correct"].tolist() == [False] * 3 + [True]


def test_regrade_cli_reports_the_changed_degenerate_rows(tmp_path, monkeypatch, capsys):
    from cli.main import main
    from resources.storage import asset_path

    home = tmp_path / "home"
    n = 15
    tasks = pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "gold": [str(i) for i in range(n)],
                          "grader": "math_expression"})
    calls = pd.DataFrame({"call_key": [f"k{i}" for i in range(n)], "task_id": tasks["task_id"], "status": "ok",
                          "response_text": r"\boxed{\frac{0}{0}}", "extracted": r"\frac{0}{0}", "correct": True})
    for name, df in (("task_pool", tasks), ("graded_calls", calls)):
        path = asset_path(home, name, "0|zeroeval_math_l5" if name == "graded_calls" else None)
        path.parent.mkdir(parents=True)
        df.to_parquet(path)
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    assert main(["regrade"]) == 0
    assert json.loads(capsys.readouterr().out) == {"regraded": n, "changed": n}
    assert not pd.read_parquet(path)["correct"].any()
