"""Numbers a provider or a user hands in are checked: a provider's usage.cost must be plausible (finite, >= 0, at most
MAX_CALL_USD) or its estimate is used, flagged; a call log already holding an absurd cost still resumes under a
budget; price tables hold prices; cascade.json's nesting is bounded before it is parsed. The attack tests
(tests/test_attack_cascade.py, test_attack_registry.py, test_attack_inputs.py, test_attack_server.py) drive the
same through serve and the CLI."""
import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipeline.collect.agents import AgentSpec, load_prices
from pipeline.collect.budget import Budget, collection_state
from pipeline.collect.call_log import CallLog, call_key
from pipeline.collect.client import cost_invalid, usage_cost
from pipeline.collect.settings import CollectionSettings
from pipeline.core.errors import RouterLiteError
from pipeline.core.text_guard import json_text_depth

sys.path.insert(0, str(Path(__file__).parent))
from fault_server import FaultServer  # noqa: E402

AGENT = AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)


@pytest.mark.parametrize("cost", [1e308, float("inf"), float("nan"), "inf", -0.5, 1000.01, "1e400"])
def test_an_implausible_provider_cost_is_refused_and_flagged_a_plausible_one_kept(cost):
    assert usage_cost({"cost": cost}) is None and cost_invalid({"cost": cost})
    for fine in (0, 0.0123, "0.5", 1000.0):  # up to MAX_CALL_USD
        assert usage_cost({"cost": fine}) == float(fine) and not cost_invalid({"cost": fine})
    assert usage_cost({}) is None and not cost_invalid({})  # not reported: estimated, not flagged


def _tasks(n: int) -> pd.DataFrame:
    return pd.DataFrame({"task_id": [f"t{i}" for i in range(n)], "prompt": [f"question {i}" for i in range(n)],
                         "gold": ["A"] * n, "grader": ["mcq_letter"] * n})


def test_a_collection_whose_log_holds_a_1e308_cost_resumes_under_its_budget(tmp_path):
    """Rows as the unchecked code wrote them (a provider's 1e308 stored as cost_usd): the budget reads each as its
    estimate (prices x tokens), not inf, so a rerun under a $1 budget makes the calls still missing."""
    import openai

    from pipeline.collect.calls import run_collect

    settings = CollectionSettings(max_retries=0)
    tasks, sh = _tasks(4), settings.hash()
    (tmp_path / "calls").mkdir()
    (tmp_path / "calls" / "cheap.jsonl").write_text("".join(json.dumps({
        "call_key": call_key("cheap", f"t{i}", 0, sh), "agent": "cheap", "model": "small-model", "task_id": f"t{i}",
        "repetition": 0, "settings_hash": sh, "status": "ok", "response_text": "The answer is (A).",
        "extracted": "A", "correct": True, "prompt_tokens": 1000, "completion_tokens": 1000, "cost_usd": 1e308,
        "usage_source": "provider"}) + "\n" for i in range(2)))
    state = collection_state([tmp_path / "calls"], tasks, [AGENT], 1, sh)
    assert state["spent"] == pytest.approx(2 * AGENT.cost(1000, 1000)) and state["cost_invalid"] == 2
    budget = Budget(1.0, state["spent"], settings.max_tokens)
    with FaultServer() as fs:
        client_for = lambda a: openai.AsyncOpenAI(api_key="k", base_url=fs.base_url, max_retries=0)  # noqa: E731
        out = run_collect(tasks, [AGENT], 0, CallLog(tmp_path / "calls"), client_for, settings, budget=budget)
    after = collection_state([tmp_path / "calls"], tasks, [AGENT], 1, sh)
    assert not budget.stopped and after["done"] == 4 and not after["missing"]
    assert len(out) == 4 and out["cost_usd"].map(lambda v: math.isfinite(v) and v < 1.0).all()


def test_a_provider_cost_of_1e308_is_logged_as_the_estimate_flagged(tmp_path):
    import openai

    from pipeline.collect.calls import run_collect

    settings = CollectionSettings(max_retries=0)
    with FaultServer() as fs:
        fs.always("cost_huge")
        client_for = lambda a: openai.AsyncOpenAI(api_key="k", base_url=fs.base_url, max_retries=0)  # noqa: E731
        run_collect(_tasks(2), [AGENT], 0, CallLog(tmp_path), client_for, settings,
                    budget=Budget(1.0, 0.0, settings.max_tokens))
    rows = [json.loads(line) for line in (tmp_path / "cheap.jsonl").read_text().splitlines()]
    assert [r["cost_invalid"] for r in rows] == [True, True]
    assert all(r["cost_usd"] == pytest.approx(AGENT.cost(r["prompt_tokens"], r["completion_tokens"])) for r in rows)


@pytest.mark.parametrize("bad", ["-2.5", ".nan", ".inf", "-.inf"])
def test_a_price_table_with_a_price_that_is_no_price_is_one_line_naming_the_field(tmp_path, bad):
    f = tmp_path / "prices.yaml"
    f.write_text(f"models:\n  good: {{input: 1.0, output: 2.0}}\n  m/x: {{input: 1.0, output: {bad}}}\n")
    with pytest.raises(RouterLiteError) as exc:
        load_prices(f)
    assert str(exc.value).startswith(f"{f}: models.m/x.output must be a number of USD per million tokens")


def test_json_depth_is_counted_on_the_text_strings_skipped():
    assert json_text_depth('{"a": "[[[[{{", "b": [1, {"c": "]\\"]"}]}') == 3
    assert json_text_depth("[" * 100_000 + "]" * 100_000) == 100_000


def test_a_relayed_stream_never_passes_on_infinity_or_a_refused_cost():
    """The agent's SSE stream (a prompt-only reply with stream=true) is relayed event by event: the events that carry
    usage or a non-finite constant are rewritten, the others pass byte for byte, split across reads or not."""
    import asyncio

    from pipeline.serve.relay import relay

    events = [b'data: {"id":"c","choices":[{"delta":{"content":"NaN is 1e308"}}]}\n\n',
              b'data: {"id":"c","choices":[{"delta":{"content":"B"}}]}\n\n',
              b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"cost":1e308,'
              b'"cost_details":{"upstream":Infinity},"x":1e400}}\n\n',
              b"data: [DONE]\n\n"]
    raw = b"".join(events)

    class Resp:
        async def aiter_bytes(self):
            for i in range(0, len(raw), 7):  # torn events
                yield raw[i:i + 7]

        async def aclose(self):
            pass

    async def run():
        return b"".join([c async for c in relay(Resp(), AGENT, None, {"head": "h"})])

    out = asyncio.run(run()).decode()
    got = [e for e in out.split("\n\n") if e]

    def strict(c):
        raise AssertionError(f"{c} relayed")

    first, second, usage = (json.loads(e[6:], parse_constant=strict) for e in got[:3])
    assert first["router"] == {"head": "h"} and first["choices"][0]["delta"]["content"] == "NaN is 1e308"
    assert got[1] + "\n\n" == events[1].decode() and got[3] == "data: [DONE]"  # untouched
    assert usage["usage"]["cost"] is None and usage["usage"]["cost_details"]["upstream"] is None
    assert usage["usage"]["x"] is None and usage["usage"]["prompt_tokens"] == 3
