"""What the benchmark report says first: the router served (the one ★, named by the promotion after the report:
`served` of reports/router_value.json), then the best validation AIQ kind (`best_router`) at the serving target; its
asset description; its frontier plot named, not linked."""
from __future__ import annotations

import pytest

from assets.benchmark import benchmark_report
from pipeline.collect.grading import GRADER_SPECS
from pipeline.report.value import (
    ROUTER_LABELS,
    SERVED_PENDING,
    CascadeFigures,
    HeadFigures,
    ablation_markdown,
    mark_served,
    prompt_routers_markdown,
    report_headline,
    router_value,
    served_headline,
    star_line,
    with_served,
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
    return router_value("demo", "quality-dominated", HeadFigures(_value(), validation_aiq=0.8212),
                        {"head": 0.8171, "prior": 0.8216, "hull": 0.8159, "knn": 0.8124},
                        cascade=CascadeFigures(_cascade(aiq_cascade), benchmark=routed))


def test_the_report_headline_is_the_best_validation_kind_and_no_star_before_the_promotion():
    rv = _rv(0.8345)  # the cascade has the best validation AIQ
    assert rv["best_router"] == "cascade:cascade" and rv["served"] is None
    line = report_headline(rv, "quality>=0.98", {"big": "gpt-4o"})
    assert line.startswith(f"best validation AIQ: {ROUTER_LABELS['cascade:cascade']}, quality>=0.98: 0.851 (CI "
                           "0.821-0.880) at 74 % of gpt-4o's cost (best single 0.855; 99.6 % of its quality)"), line
    assert "routed benchmark (real calls) 0.851 at 73 %" in line and "validation AIQ 0.8345" in line
    assert "0.831" not in line and "94 %" not in line  # not the prompt-only head's parity point
    assert "★" not in line and "★" not in ablation_markdown(rv).split("\n\n")[1]  # no router served: no ★
    rv = _rv(0.80)
    assert rv["best_router"] == "head"
    assert report_headline(rv, "quality>=0.98").startswith(f"best validation AIQ: {ROUTER_LABELS['head']}, "
                                                           "quality>=0.98: 0.834 (CI 0.801-0.864) at 81 % of big's "
                                                           "cost")
    assert report_headline(rv, "budget=1.5").endswith("budget=1.5: not evaluated on held-out test; validation AIQ "
                                                      "0.8212")


def _served(name, kind="head", label="prompt-only (head)"):
    return {"name": name, "kind": kind, "target": "quality>=0.98", "promoted_by": "gate",
            "star": {"label": label, "target": "quality>=0.98",
                     "held_out": {"quality_ratio": 0.976, "cost_ratio": 0.81}}}


def _stars(rv, target="quality>=0.98"):
    """Every ★ the report, router_value.json and the README's tables show for `rv`."""
    report = mark_served(f"## What the router is worth\n\n**{SERVED_PENDING}**\n\n{report_headline(rv, target)}\n",
                         served_headline(rv, target))
    return report, ablation_markdown(rv), prompt_routers_markdown({"head": {"validation": 0.8, "test": 0.8,
                                                                            "test_gain": 0, "test_gain_low": 0,
                                                                            "test_gain_high": 0}},
                                                                   {"chosen": "head", "kind": "head",
                                                                    "validation": 0.8, "test": 0.8})


def test_one_star_the_router_served_even_when_validation_prefers_another():
    """After a refresh the gate may serve a router that is not the best validation AIQ kind: the ★ is the served
    one in the report's bold line, router_value.json's `served` and the README's tables, nowhere else."""
    rv = with_served(_rv(0.8345), _served("head-1"), {"head": "head-1", "cascade:cascade": "cascade-1"})
    assert rv["best_router"] == "cascade:cascade" and rv["served"]["router"] == "head"
    report, table, kinds = _stars(rv)
    bold = [x for x in report.splitlines() if x.startswith("**")]
    assert bold == [f"**★ {ROUTER_LABELS['head']}, quality>=0.98: 0.834 (CI 0.801-0.864) at 81 % of big's cost "
                    "(best single 0.855; 97.6 % of its quality); validation AIQ 0.8212**"], bold
    assert report.count("★") == 1 and "best validation AIQ: cascade (answers only)" in report
    rows = [x for x in table.splitlines() if x.startswith("| ")]
    assert [x.split("|")[1].strip() for x in rows if "★" in x] == [f"{ROUTER_LABELS['head']} ★"]
    assert "★ = the router served (head-1, promoted by gate)" in table and "best validation AIQ: cascade" in table
    assert "★" not in kinds and "head (chosen)" in kinds
    # the promotion wrote its line before: a second promotion replaces it, no second ★
    rv2 = with_served(rv, _served("cascade-1", "cascade", "cascade (answers only)"), {"cascade:cascade": "cascade-1"})
    again = mark_served(report, served_headline(rv2, "quality>=0.98"))
    assert again.count("★") == 1 and "**★ cascade (answers only), quality>=0.98: 0.851" in again


def test_the_star_of_an_earlier_runs_router_is_named_and_no_row_is_starred():
    rv = with_served(_rv(0.8345), _served("cascade-wide", "cascade", "cascade (answers only)"),
                     {"head": "head-1", "cascade:cascade": "cascade-1"})
    assert rv["served"]["router"] is None
    report, table, _ = _stars(rv)
    assert report.count("★") == 1 and "**★ cascade (answers only) cascade-wide (an earlier run's router" in report
    assert "at 81.0 % of its cost" in report
    assert not [x for x in table.splitlines() if x.startswith("| ") and "★" in x]
    assert "the router served, cascade (answers only) cascade-wide, is not one of this run's" in table


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
    rv = with_served(_rv(0.8345), _served("cascade-1", "cascade"), {"cascade:cascade": "cascade-1"})
    line = served_headline(rv, target)
    assert line.count("★") == 1 and f", {target}: " in line and line.startswith("★ ")
    assert "★" not in report_headline(_rv(0.8345), target)
