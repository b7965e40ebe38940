"""Agent pools, settings, request shape, preflight, PoolResource."""
from __future__ import annotations

import asyncio
import email.utils
import json
import sys
import time
from pathlib import Path

import httpx
import openai
import pandas as pd
import pytest

from pipeline.collect.agents import AgentSpec, load_agents
from pipeline.collect.call_log import CallLog
from pipeline.collect.calls import collect
from pipeline.collect.client import _retry_after_s, call_once, scrub
from pipeline.collect.preflight import preflight
from pipeline.collect.replay import default_recordings_path
from pipeline.collect.settings import CollectionSettings
from pipeline.core.errors import RouterLiteError
from pipeline.core.prompts import mcq_prompt
from pipeline.profile import CollectionConfig, from_yaml

sys.path.insert(0, str(Path(__file__).parent))
from fault_server import FaultServer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
AGENTS = REPO / "config" / "agents.yaml"


def test_pools_in_config():
    demo = load_agents(AGENTS, "demo")  # the ZeroEval default, by role
    assert [a.name for a in demo] == ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
    assert [a.model for a in demo] == ["gpt-4o-2024-08-06", "claude-3-5-sonnet-20240620", "gemini-1.5-pro",
                                       "Meta-Llama-3.1-8B-Instruct", "deepseek-v2.5-0908"]
    assert all(a.provider == "replay" and a.price_out_per_mtok > 0 for a in demo)
    wide = load_agents(AGENTS, "demo_wide")
    assert wide[:5] == demo and {a.model for a in wide[5:]} == {
        "gpt-4o-mini-2024-07-18", "o1-mini-2024-09-12", "Meta-Llama-3.1-70B-Instruct", "Mistral-Large-2",
        "Qwen2-72B-Instruct"}
    mmlu = load_agents(AGENTS, "mmlu_pro")
    assert [a.name for a in mmlu] == [a.name for a in demo]
    assert [a.model for a in mmlu] == ["gemini-1.5-pro-002", "Meta-Llama-3_1-70B-Instruct", "gemini-1.5-flash-002",
                                       "Mistral-7B-Instruct-v0.2", "mathstral-7B"]
    mmlu_wide = load_agents(AGENTS, "mmlu_pro_wide")
    assert mmlu_wide[:5] == mmlu and {a.model for a in mmlu_wide[5:]} == {"Qwen1.5-72B-Chat", "Phi-3-mini-4k-instruct",
                                                                          "jamba-1.5-large"}
    pilot = load_agents(AGENTS, "pilot")
    assert [a.model for a in pilot] == ["openai/gpt-oss-120b", "deepseek/deepseek-v4-flash-0731",
                                        "google/gemma-3-27b-it", "mistralai/mistral-nemo",
                                        "inclusionai/ling-3.0-flash"]
    assert {a.base_url for a in pilot} == {"https://openrouter.ai/api/v1"}
    assert len(load_agents(AGENTS, "pilot_wide")) == 8
    assert [a.name for a in load_agents(AGENTS, "demo", only=["open_mid", "frontier_a"])] == ["frontier_a",
                                                                                             "open_mid"]


def test_pool_errors_name_the_input(tmp_path):
    with pytest.raises(RouterLiteError, match="unknown pool 'nope'.*demo"):
        load_agents(AGENTS, "nope")
    with pytest.raises(RouterLiteError, match="unknown agent.*'ghost'"):
        load_agents(AGENTS, "demo", only=["ghost"])
    cfg = tmp_path / "agents.yaml"
    cfg.write_text("pools:\n  p:\n    provider: x\n    agents:\n      - {name: a, model: unpriced}\n")
    with pytest.raises(RouterLiteError, match="prices file not found"):
        load_agents(cfg, "p")
    (tmp_path / "prices.yaml").write_text("models:\n  other: {input: 1, output: 2}\n")
    with pytest.raises(RouterLiteError, match="no price for model 'unpriced'"):
        load_agents(cfg, "p")
    cfg.write_text("pools:\n  p:\n    provider: x\n    agents:\n      - {name: a, model: m, price_in_per_mtok: 1,"
                   " price_out_per_mtok: 2}\n      - {name: a, model: m2, price_in_per_mtok: 1, "
                   "price_out_per_mtok: 2}\n")
    with pytest.raises(RouterLiteError, match="duplicate agent"):
        load_agents(cfg, "p")
    with pytest.raises(RouterLiteError, match="not found"):
        load_agents(tmp_path / "missing.yaml", "p")


def test_settings_hash_and_the_profile_section():
    s = CollectionSettings()
    assert (s.max_tokens, s.temperature, s.top_p, s.reasoning_effort, s.timeout_s, s.max_retries, s.concurrency) == (
        4096, 0.1, 1.0, "minimal", 180.0, 3, 16)
    assert len(s.hash()) == 12 and s.hash() == CollectionSettings().hash()
    assert CollectionSettings(concurrency=64, timeout_s=5, max_retries=0).hash() == s.hash()  # transport only
    assert CollectionSettings(temperature=0.0).hash() != s.hash()
    assert CollectionSettings(max_tokens=512).hash() != s.hash()
    # a profile's `collection:` section: repetitions is no call setting (never in the hash)
    prof = from_yaml(CollectionConfig, {"repetitions": 3, "max_tokens": 4096, "concurrency": 32}, "collection")
    assert prof.concurrency == 32 and prof.hash() == s.hash()
    with pytest.raises(RouterLiteError, match="max_tokenz"):
        from_yaml(CollectionConfig, {"max_tokenz": 5}, "collection")


def test_retry_after_parsing():
    assert _retry_after_s(httpx.Headers({"retry-after": "3"})) == 3.0
    assert _retry_after_s(httpx.Headers({"retry-after-ms": "250"})) == 0.25
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= _retry_after_s(httpx.Headers({"retry-after": date})) <= 31
    assert _retry_after_s(httpx.Headers({"retry-after": "soon"})) is None
    assert _retry_after_s(httpx.Headers({})) is None


def test_scrub():
    assert scrub("key sk-abc123 in Bearer sk-abc123", ["sk-abc123"]) == "key *** in Bearer ***"
    assert scrub("Authorization: Bearer xyz-other", []) == "Authorization: Bearer ***"


def test_request_shape_reasoning_effort_and_limits():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "The answer is (B)."},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 6, "total_tokens": 17, "cost": 0.5}})

    async def run():
        c = openai.AsyncOpenAI(api_key="k", base_url="http://x.invalid/v1", max_retries=2,
                               http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
        r = await call_once(c, AgentSpec("a", "m", "p", None, 1, 1), "hello", CollectionSettings(max_tokens=321))
        await call_once(c, AgentSpec("a", "m", "p", None, 1, 1), "hi", CollectionSettings(reasoning_effort=None))
        await c.close()
        return r
    r = asyncio.run(run())
    assert "reasoning" not in seen[1]
    body = seen[0]
    assert body["reasoning"] == {"effort": "minimal"} and body["max_tokens"] == 321
    assert body["temperature"] == 0.1 and body["top_p"] == 1.0
    assert body["messages"] == [{"role": "user", "content": "hello"}] and body["model"] == "m"
    assert r["cost_usd"] == 0.5 and (r["prompt_tokens"], r["completion_tokens"]) == (11, 6)


@pytest.fixture(scope="module")
def replay_prompts():
    src = pd.read_parquet(REPO / "data" / "sources" / "mmlu_pro" / "test.parquet").head(60)
    return [mcq_prompt(q, list(o)) for q, o in zip(src.question, src.options)], list(src.answer)


def test_preflight_on_replay_pool_passes(replay_prompts):
    from resources.pool import PoolResource

    res = PoolResource(kind="replay", pool="mmlu_pro")
    agents = res.agents()
    res.check(agents)
    store = res.store()
    prompts = [p for p in replay_prompts[0] if all(store.text_for(a.model, p) for a in agents)]
    out = preflight(res.client_for, agents, prompts, CollectionSettings(max_retries=0))
    assert list(out.agent) == [a.name for a in agents]
    assert out.passed.all(), out.reason.tolist()
    assert (out.n_calls == 20).all() and (out.n_error == 0).all()


def test_preflight_fails_with_reasons():
    agent = AgentSpec("a1", "m1", "local", None, 1, 1)
    with FaultServer() as srv:
        def cf(a):
            return openai.AsyncOpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
        srv.always("empty")
        empty = preflight(cf, [agent], ["p1", "p2"], CollectionSettings(max_retries=0))
        srv.always("no_usage")
        nousage = preflight(cf, [agent], ["p1"], CollectionSettings(max_retries=0))
        srv.always("not_found")
        missing = preflight(cf, [agent], ["p1"], CollectionSettings(max_retries=0))
    assert not empty.passed[0] and "empty-rate 100%" in empty.reason[0]
    assert not nousage.passed[0] and "usage" in nousage.reason[0]
    assert not missing.passed[0] and "not_found: 20" in missing.reason[0]
    with pytest.raises(RouterLiteError, match="prompt"):
        preflight(cf, [agent], [], CollectionSettings())


def test_pool_resource_kinds(monkeypatch, tmp_path):
    from resources.pool import PoolResource

    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    pilot = PoolResource(kind="openrouter", pool="pilot")
    agents = pilot.agents()
    with pytest.raises(RouterLiteError, match="OPENROUTER_API_KEY"):
        pilot.check()
    with pytest.raises(RouterLiteError, match="OPENROUTER_API_KEY"):  # before any call is made
        asyncio.run(collect(pd.DataFrame({"task_id": ["t/1"], "prompt": ["p"], "gold": ["A"],
                                          "grader": ["mcq_letter"]}), agents, 0, CallLog(tmp_path),
                            pilot.client_for, CollectionSettings()))
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-env")
    c = pilot.client_for(agents[0])
    assert c.max_retries == 0 and str(c.base_url).startswith("https://openrouter.ai/api/v1")
    with pytest.raises(RouterLiteError, match="base_url"):
        PoolResource(kind="openai_compatible").check()
    with pytest.raises(RouterLiteError, match="unknown pool kind 'grpc'"):
        PoolResource(kind="grpc").check()
    with pytest.raises(RouterLiteError, match="no replay recordings"):
        PoolResource(kind="replay", pool="pilot").check(agents)
    assert PoolResource(kind="replay").client_for(agents[0]).max_retries == 0


def test_collect_mmlu_pro_pool_on_replay_matches_grading(replay_prompts, tmp_path):
    from pipeline.collect.grading import grade
    from resources.pool import PoolResource

    res = PoolResource(kind="replay", pool="mmlu_pro")
    agents = res.agents()
    prompts, golds = replay_prompts
    tasks = pd.DataFrame({"task_id": [f"mmlu_pro/test/{i:06d}" for i in range(20)], "prompt": prompts[:20],
                          "gold": golds[:20], "grader": "mcq_letter"})
    df = asyncio.run(collect(tasks, agents, 1, CallLog(tmp_path), res.client_for, CollectionSettings()))
    assert len(df) == 100 and (df.repetition == 1).all()
    store = res.store()
    for r in df.itertuples():
        text = store.text_for(r.model, tasks.set_index("task_id").prompt[r.task_id])
        if text is None:
            assert r.status == "error" and r.correct is None
        else:
            assert r.response_text == text
            assert (r.extracted, r.correct) == grade(text, tasks.set_index("task_id").gold[r.task_id], "mcq_letter")
    assert default_recordings_path().exists()


def test_openrouter_style_200_error_body_is_retried():
    bodies = [{"error": {"code": 502, "message": "upstream provider error"}},
              {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "(C)"}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 1}}]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=bodies.pop(0))

    async def run():
        c = openai.AsyncOpenAI(api_key="k", base_url="http://x.invalid/v1", max_retries=0,
                               http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
        try:
            return await call_once(c, AgentSpec("a", "m", "p", None, 1, 1), "q",
                                   CollectionSettings(backoff_base_s=0.01))
        finally:
            await c.close()
    r = asyncio.run(run())
    assert r["status"] == "ok" and r["attempts"] == 2 and r["response_text"] == "(C)"


def test_sharded_transport_spreads_and_releases():
    from resources.pool import ShardedTransport, http_client

    agent = AgentSpec("a1", "m1", "local", None, 1, 1)
    with FaultServer(latency_s=0.02) as srv:
        srv.script("reset", times=3)

        async def run():
            http = http_client(10.0, max_connections=64)
            c = openai.AsyncOpenAI(base_url=srv.base_url, api_key="k", max_retries=0, http_client=http)
            try:
                rs = await asyncio.gather(*[call_once(c, agent, f"p{i}", CollectionSettings(
                    max_retries=2, backoff_base_s=0.01)) for i in range(60)])
                return rs, list(http._transport._load), len(http._transport._shards)
            finally:
                await c.close()
        rs, load, shards = asyncio.run(run())
    assert isinstance(ShardedTransport(2, 2), httpx.AsyncBaseTransport)
    assert shards == 4 and load == [0] * 4  # every slot given back, failures included
    assert all(r["status"] == "ok" for r in rs)


def test_collect_rejects_bad_task_frames(tmp_path):
    agent = AgentSpec("a1", "m1", "local", None, 1, 1)
    base = {"task_id": ["t/1", "t/2"], "prompt": ["p", "q"], "gold": ["A", "B"], "grader": ["mcq_letter"] * 2}
    for change, match in [({"task_id": ["t/1", "t/1"]}, "duplicate task_id.*t/1"),
                          ({"prompt": ["p", None]}, "without a prompt.*t/2"),
                          ({"grader": ["mcq_letter", "vibes"]}, "unknown grader.*vibes")]:
        with pytest.raises(RouterLiteError, match=match):
            asyncio.run(collect(pd.DataFrame({**base, **change}), [agent], 0, CallLog(tmp_path), lambda a: None))
    with pytest.raises(RouterLiteError, match="lacks column.*gold"):
        asyncio.run(collect(pd.DataFrame({"task_id": ["t"], "prompt": ["p"], "grader": ["mcq_letter"]}), [agent], 0,
                            CallLog(tmp_path), lambda a: None))
