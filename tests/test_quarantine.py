"""A pool grows without stopping the lineage: an agent that breaks the empty-reply rule on a
source is quarantined, with its reason, and the others go on; the rule's threshold is a profile setting; a reasoning
model's estimated cost is labelled a lower bound."""
import dataclasses
import re

import pandas as pd
import pytest

from assets.collection import empty_rate_checks
from pipeline.collect.agents import load_agents
from pipeline.collect.quality import kept_agents, quarantined
from pipeline.core.errors import RouterLiteError
from pipeline.profile import load_profile
from pipeline.report.pool_report import report_markdown


def calls(empties: dict[str, int], n: int = 100, source: str = "zeroeval_math_l5", rep: int = 0) -> pd.DataFrame:
    """n calls per agent on one source × repetition, the first `empties[agent]` of them empty."""
    rows = [{"task_id": f"{source}/{i}", "agent": a, "repetition": rep,
             "status": "empty" if i < k else "ok"} for a, k in empties.items() for i in range(n)]
    return pd.DataFrame(rows)


def test_an_agent_at_the_limit_is_quarantined_with_its_reason():
    q = quarantined(calls({"a": 4, "wide_o1_mini": 5}), 0.05)
    assert list(q) == ["wide_o1_mini"]
    assert q["wide_o1_mini"] == ("empty replies 5.0% >= 5% (collection.empty_rate_max) on zeroeval_math_l5 "
                                 "repetition 0 (5 of 100 calls)")
    assert quarantined(calls({"a": 4, "wide_o1_mini": 5}), 0.06) == {}  # the threshold decides


def test_the_rule_holds_per_source_not_over_the_pool():
    both = pd.concat([calls({"a": 0, "b": 6}), calls({"a": 0, "b": 0}, n=900, source="zeroeval_gsm8k")])
    assert (both.query("agent == 'b'")["status"] == "empty").mean() < 0.05  # under the limit over the pool
    assert list(quarantined(both, 0.05)) == ["b"] and "zeroeval_math_l5" in quarantined(both, 0.05)["b"]


def test_the_checks_warn_and_block_only_when_every_agent_breaks_the_rule():
    results = list(empty_rate_checks(calls({"a": 0, "wide_o1_mini": 6}), 0.05, ["a", "wide_o1_mini"]))
    blocking, warn = results
    assert blocking.check_name == "empty_rate_below_5pct" and blocking.passed
    assert "wide_o1_mini" in blocking.metadata["quarantined"].value
    assert warn.check_name == "no_agent_quarantined" and not warn.passed and warn.severity.value == "WARN"
    assert "wide_o1_mini: empty replies 6.0%" in warn.description
    blocking, warn = list(empty_rate_checks(calls({"a": 9, "b": 6}), 0.05, ["a", "b"]))
    assert not blocking.passed and blocking.severity.value == "ERROR" and "collection.empty_rate_max" in \
        blocking.description
    ok, fine = list(empty_rate_checks(calls({"a": 1}), 0.05, ["a"]))
    assert ok.passed and fine.passed


def test_kept_agents_refuses_to_leave_none():
    assert kept_agents(["a", "b"], {"b": "why"}, "reward matrix") == ["a"]
    with pytest.raises(RouterLiteError, match="every agent is quarantined .*a: x; b: y.*collection.empty_rate_max"):
        kept_agents(["a", "b"], {"a": "x", "b": "y"}, "reward matrix")


def test_the_threshold_is_a_profile_setting():
    prof = load_profile("demo")
    assert prof.collection.empty_rate_max == 0.05
    assert dataclasses.replace(prof.collection, empty_rate_max=0.1).empty_rate_max == 0.1
    for bad in (0, 1.5, "x", True):
        with pytest.raises(RouterLiteError, match="collection.empty_rate_max"):
            dataclasses.replace(prof.collection, empty_rate_max=bad)
    before = prof.collection.hash()  # not a call setting: the call log stays valid
    assert dataclasses.replace(prof.collection, empty_rate_max=0.2).hash() == before


def test_a_reasoning_models_estimated_cost_is_a_lower_bound():
    agents = {a.name: a for a in load_agents("config/agents.yaml", "demo_wide")}
    assert agents["wide_o1_mini"].hidden_reasoning and "lower bound" in agents["wide_o1_mini"].cost_note
    assert not any(a.hidden_reasoning for n, a in agents.items() if n != "wide_o1_mini")


def test_an_agent_file_can_say_it_itself(tmp_path):
    f = tmp_path / "agents.yaml"  # no prices file beside it: prices on the agents
    f.write_text("pools:\n  p:\n    provider: replay\n    agents:\n"
                 "      - {name: r, model: m, price_in_per_mtok: 1, price_out_per_mtok: 2, hidden_reasoning: true}\n"
                 "      - {name: s, model: n, price_in_per_mtok: 1, price_out_per_mtok: 2}\n")
    assert [a.hidden_reasoning for a in load_agents(f, "p")] == [True, False]


def test_the_pool_report_names_the_quarantine_and_the_lower_bound():
    rec = [{"group": "math", "agent": a, "n": 10, "accuracy": 0.5, "ci_low": 0.4, "ci_high": 0.6, "cost_per_1k": 1.0}
           for a in ("a", "r")]
    rep = {"verdict": {"kind": "complementary", "text": "complementary: a, r lead different domains"},
           "domain_column": "source", "n_rows": 10, "by_domain": rec, "leaders": {"math": {"tied_leaders": ["a"]}},
           "costs_estimated": True, "headroom": {"folds": 5, "n": 8, "best_single_cv": 0.5, "oracle_headroom": 0.1},
           "quarantined": {"wide_o1_mini": "empty replies 5.1% >= 5% (collection.empty_rate_max) on x"},
           "cost_lower_bound": {"r": "lower bound: hidden reasoning"}}
    md = report_markdown(rep)
    assert "- wide_o1_mini: empty replies 5.1% >= 5%" in md
    assert re.search(r"\| r +\|.*\| ≥ 1\.000 *\|", md) and re.search(r"\| a +\|.*\| 1\.000 *\|", md)
    assert "the cost of r is a lower bound: hidden reasoning" in md


def test_the_wider_pools_page_states_its_value_like_the_readme(tmp_path):
    """docs/wide_pool.md comes from the committed copy of a demo_wide run (scripts/readme.py --from-home --wide): its
    quarantine, its lower-bound costs, then the same value section as the README's."""
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "scripts"))
    import readme

    rv = json.loads((root / readme.COPY).read_text())
    rv.update(pool="demo_wide", quarantined={"wide_o1_mini": "empty replies 5.1% >= 5% (collection.empty_rate_max)"},
              cost_lower_bound={"wide_o1_mini": "lower bound: hidden reasoning"})
    page = readme.render_wide(rv)
    assert page.startswith("# The wider pool: `demo_wide`")
    assert "- `wide_o1_mini`: empty replies 5.1% >= 5% (collection.empty_rate_max)" in page
    assert "The estimated cost of `wide_o1_mini` is a lower bound: hidden reasoning" in page
    assert readme.render_value(rv, readme.WIDE_COPY).rstrip("\n") in page
    assert readme.WIDE_COPY.as_posix() in page
    (tmp_path / readme.WIDE_COPY).parent.mkdir(parents=True)
    (tmp_path / readme.WIDE_COPY).write_text(json.dumps(rv))
    for rel in (readme.TEMPLATE, readme.TRAINING, readme.COPY):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((root / rel).read_text())
    assert readme.outputs(tmp_path)[readme.WIDE_PAGE] == page  # generated once the copy is committed
