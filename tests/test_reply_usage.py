"""One pricing rule for relayed replies (pipeline.collect.client.reply_usage): the head's and the cascade's."""
import math

from pipeline.collect.agents import AgentSpec
from pipeline.collect.client import reply_usage

AGENT = AgentSpec(name="a", model="m/a", provider="replay", base_url=None,
                  price_in_per_mtok=1.0, price_out_per_mtok=2.0)
UPSTREAM = {"messages": [{"role": "user", "content": "x" * 40}]}


def _reply(text="y" * 8, **usage):
    return {"choices": [{"message": {"content": text}, "finish_reason": "stop"}], "usage": usage}


def test_reported_cost_wins_and_tokens_come_from_usage():
    out = reply_usage(AGENT, UPSTREAM, _reply(prompt_tokens=7, completion_tokens=3, cost=0.5))
    assert out == {"prompt_tokens": 7, "completion_tokens": 3, "cost": 0.5}


def test_missing_usage_is_estimated_from_characters_at_list_prices():
    out = reply_usage(AGENT, UPSTREAM, _reply())
    assert (out["prompt_tokens"], out["completion_tokens"]) == (10, 2)  # ceil(chars / 4)
    assert math.isclose(out["cost"], (10 * 1.0 + 2 * 2.0) / 1e6)


def test_a_non_finite_or_negative_cost_is_replaced_by_the_estimate():
    for bad in (float("inf"), float("nan"), -1.0, "Infinity", True):
        out = reply_usage(AGENT, UPSTREAM, _reply(prompt_tokens=10, completion_tokens=2, cost=bad))
        assert math.isclose(out["cost"], (10 * 1.0 + 2 * 2.0) / 1e6), bad


def test_the_given_text_counts_when_usage_has_no_completion_tokens():
    out = reply_usage(AGENT, UPSTREAM, {"choices": []}, text="z" * 12)
    assert out["completion_tokens"] == 3
