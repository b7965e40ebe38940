"""What the benchmark report says first: one headline, the ★ router's (reports/router_value.json `best_router`) at
the serving target; its asset description; its frontier plot named, not linked."""
from __future__ import annotations

import pytest

from assets.benchmark import benchmark_report
from pipeline.collect.grading import GRADER_SPECS
from pipeline.report.value import (
    ROUTER_LABELS,
    CascadeFigures,
    HeadFigures,
    report_headline,
    router_value,
    star_line,
)


def _target(q, lo, hi, cost, ratio, **extra):
    return {"quality": q, "ci_low": lo, "ci_high": hi, "cost_per_1k": cost, "cost_ratio": ratio, "lambda": 1.0,
            "shares": {"big": 1.0}, "gain": q - 0.855, "gain_low": -0.05, "gain_high": 0.0, **extra}


def _value():
    """The prompt-only head's held-out value report (its parity point was the old headline: 0.831 at 94 %)."""
    return {"targets": {"max-quality": _target(0.8545, 0.827, 0.884, 2.4628, 1.0),
                        "parity": _target(0.8306, 0.797, 0.860, 2.3072, 0.9368),
                        "quality>=0.98": _target(0.8343, 0.801, 0.864, 1.9957, 0.8103)},
            "best_single": {"agent": "big", "quality": 0.8545, "cost_per_1k": 2.4628}, "apgr": 0.6, "cpt50": 0.2,
            "cpt80": 0.6, "oracle": {"quality": 0.91, "cost_per_1k": 0.4}, "n_test": 543, "weak": "small"}


def _cascade(aiq_validation):
    t = _target(0.8508, 0.821, 0.880, 1.8185, 0.7384, quality_ratio=0.9957, quality_ratio_ci=[0.977, 1.013],
                calls_per_query=2.08, plan="ask small; else big")
    return {"chosen": "cascade", "variants": {"cascade": {"aiq_validation": aiq_validation, "aiq_test": 0.8362,
                                                          "targets": {"quality>=0.98": t, "parity": t}}}}


def _rv(aiq_cascade):
    routed = {"quality>=0.98": {"n": 543, "accuracy": 0.8508, "cost_per_1k": 1.81, "calls_per_query": 2.07}}
    return router_value("demo", "quality-dominated", HeadFigures(_value(), validation_aiq=0.8212), {"head": 0.8171},
                        cascade=CascadeFigures(_cascade(aiq_cascade), benchmark=routed))


def test_the_headline_is_the_star_routers_at_the_serving_target():
    rv = _rv(0.8345)  # the cascade has the best validation AIQ: it is the ★
    assert rv["best_router"] == "cascade:cascade"
    line = report_headline(rv, "quality>=0.98", {"big": "gpt-4o"})
    assert line.startswith(f"★ {ROUTER_LABELS['cascade:cascade']}, quality>=0.98: 0.851 (CI 0.821-0.880) at 74 % "
                           "of gpt-4o's cost (best single 0.855; 99.6 % of its quality)"), line
    assert "routed benchmark (real calls) 0.851 at 73 %" in line and "validation AIQ 0.8345" in line
    assert "0.831" not in line and "94 %" not in line  # not the prompt-only head's parity point
    # the ★ follows best_router: the head when it has the best validation AIQ, at the same serving target
    rv = _rv(0.80)
    assert rv["best_router"] == "head"
    assert report_headline(rv, "quality>=0.98").startswith(f"★ {ROUTER_LABELS['head']}, quality>=0.98: 0.834 "
                                                           "(CI 0.801-0.864) at 81 % of big's cost")
    assert report_headline(rv, "budget=1.5").endswith("budget=1.5: not evaluated on held-out test; validation AIQ "
                                                      "0.8212")


def test_the_promotion_headline_says_what_is_served_on_held_out_test():
    star = {"label": "cascade (answers only)", "kind": "cascade", "target": "quality>=0.98",
            "validation": {"quality_ratio": 0.9903, "cost_ratio": 0.6698},
            "held_out": {"quality_ratio": 0.9957, "cost_ratio": 0.7384}}
    assert star_line(star, "cascade-x") == ("cascade (answers only) ★, cascade cascade-x, target quality>=0.98: "
                                            "held-out test 99.6 % of the best single agent's quality at 73.8 % of "
                                            "its cost (validation 99.0 % at 67.0 %)")


def test_the_description_says_replies_are_graded_by_their_answer_format():
    text = benchmark_report.descriptions_by_key[benchmark_report.key]
    assert "letter extracted" not in text and "answer format" in text
    formats = {"mcq_letter": "letter", "integer": "integer", "math_expression": "math expression",
               "python_literal": "Python literal"}
    assert set(formats) <= set(GRADER_SPECS)
    for name, words in formats.items():
        assert words in text, name
    assert "★" in text and "best_router" in text


@pytest.mark.parametrize("target", ["quality>=0.98", "parity"])
def test_one_star_headline_per_target(target):
    rv = _rv(0.8345)
    line = report_headline(rv, target)
    assert line.count("★") == 1 and f", {target}: " in line
