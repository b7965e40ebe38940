"""Replay pool through the real openai clients: in-process transport and loopback HTTP server."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.collect.agents import AgentSpec
from pipeline.collect.call_log import CallLog
from pipeline.collect.calls import collect
from pipeline.collect.client import call_once
from pipeline.collect.replay import (
    REPLAY_BASE_URL,
    ReplayStore,
    approx_tokens,
    default_recordings_path,
    replay_sync_transport,
    replay_transport,
    serve,
)
from pipeline.collect.settings import CollectionSettings
from pipeline.core.errors import RouterLiteError
from pipeline.core.prompts import mcq_prompt, prompt_hash

REPO = Path(__file__).resolve().parents[1]
MODEL = "gemini-1.5-pro-002"
DEMO = ["gemini-1.5-pro-002", "Meta-Llama-3_1-70B-Instruct", "gemini-1.5-flash-002", "Mistral-7B-Instruct-v0.2",
        "mathstral-7B"]
WIDE = ["Qwen1.5-72B-Chat", "Phi-3-mini-4k-instruct", "jamba-1.5-large"]
ZEROEVAL = ["gpt-4o-2024-08-06", "claude-3-5-sonnet-20240620", "gemini-1.5-pro", "Meta-Llama-3.1-8B-Instruct",
            "deepseek-v2.5-0908", "gpt-4o-mini-2024-07-18", "o1-mini-2024-09-12", "Meta-Llama-3.1-70B-Instruct",
            "Mistral-Large-2", "Qwen2-72B-Instruct"]
# AlpacaEval's 12 models (data/alpaca_eval) and the recorded judge the replay answers judge prompts as
ALPACA = ["FuseChat-Llama-3.1-8B-Instruct", "FuseChat-Llama-3.2-3B-Instruct", "OpenHermes-2.5-Mistral-7B",
          "Qwen-14B-Chat", "claude-2", "claude-2.1", "gemma-2b-it", "gemma-7b-it", "gpt-3.5-turbo-1106",
          "gpt4_1106_preview", "humpback-llama2-70b", "vicuna-13b-v1.5", "weighted_alpaca_eval_gpt4_turbo"]


@pytest.fixture(scope="module")
def store():
    return ReplayStore.load()


@pytest.fixture(scope="module")
def recorded():
    """A few real MMLU-Pro questions (bundled task source) with the recorded text of MODEL for each."""
    rec = pd.read_parquet(default_recordings_path(), filters=[("model", "=", MODEL)])
    src = pq.read_table(REPO / "data" / "sources" / "mmlu_pro" / "test.parquet").slice(0, 400).to_pandas()
    out = []
    for r in src.itertuples():
        prompt = mcq_prompt(r.question, list(r.options))
        hit = rec[rec.prompt_hash == prompt_hash(prompt)]
        if len(hit):
            out.append({"question_id": int(r.question_id), "prompt": prompt, "gold": r.answer,
                        "text": hit.text.iloc[0]})
        if len(out) == 5:
            break
    assert len(out) == 5
    return out


def aclient(store, **kw):
    return openai.AsyncOpenAI(api_key="replay", base_url=REPLAY_BASE_URL, max_retries=0,
                              http_client=httpx.AsyncClient(transport=replay_transport(store, **kw)))


def test_store_contents(store):
    assert set(DEMO + WIDE + ZEROEVAL + ALPACA) == set(store.models())  # every bundled recording
    assert len(store) > 90_000 + 28_000
    df = pd.read_parquet(default_recordings_path())
    assert list(df.columns) == ["model", "question_id", "prompt_hash", "text"]
    assert not df.duplicated(["model", "prompt_hash"]).any()
    assert default_recordings_path().stat().st_size < 15 * 2**20


def test_recorded_prompt_returns_recorded_text_with_usage(store, recorded):
    async def run():
        c = aclient(store)
        outs = [await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": r["prompt"]}],
                                                max_tokens=4096) for r in recorded]
        await c.close()
        return outs
    for r, resp in zip(recorded, asyncio.run(run())):
        assert resp.choices[0].message.content == r["text"]
        assert resp.choices[0].finish_reason == "stop" and resp.object == "chat.completion"
        assert resp.usage.prompt_tokens == approx_tokens(r["prompt"]) > 0
        assert resp.usage.completion_tokens == approx_tokens(r["text"])
        assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
        assert resp.usage.model_extra["token_count_method"] == "ceil(characters/4)"  # the stated estimate


def test_max_tokens_truncates_with_length(store, recorded):
    long = max(recorded, key=lambda r: len(r["text"]))
    limit = max(1, approx_tokens(long["text"]) // 2)

    async def run():
        c = aclient(store)
        try:
            return await c.chat.completions.create(model=MODEL, max_tokens=limit,
                                                   messages=[{"role": "user", "content": long["prompt"]}])
        finally:
            await c.close()
    resp = asyncio.run(run())
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == limit
    assert long["text"].startswith(resp.choices[0].message.content)


def test_unknown_prompt_and_model_are_404_errors_never_wrong_answers(store, recorded, tmp_path):
    async def raw():
        c = aclient(store)
        try:
            with pytest.raises(openai.NotFoundError) as e1:
                await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "never asked"}])
            with pytest.raises(openai.NotFoundError) as e2:
                await c.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}])
            return e1.value, e2.value
        finally:
            await c.close()
    e1, e2 = asyncio.run(raw())
    assert e1.body["code"] == "prompt_not_recorded" and e2.body["code"] == "model_not_found"
    # through collect: the unknown prompt is an error row (correct None), the recorded ones are graded
    tasks = pd.DataFrame({"task_id": [f"mmlu_pro/test/{i:06d}" for i in range(3)],
                          "prompt": [recorded[0]["prompt"], "never asked", recorded[1]["prompt"]],
                          "gold": [recorded[0]["gold"], "A", recorded[1]["gold"]], "grader": "mcq_letter"})
    agent = AgentSpec("frontier_a", MODEL, "replay", None, 1.25, 5.0)
    df = asyncio.run(collect(tasks, [agent], 0, CallLog(tmp_path), lambda a: aclient(store),
                             CollectionSettings(max_retries=0)))
    assert list(df.status) == ["ok", "error", "ok"]
    err = df.iloc[1]
    assert err.error_kind == "not_found" and err.correct is None and err.extracted is None
    assert df.iloc[0].response_text == recorded[0]["text"]
    assert isinstance(df.iloc[0].correct, bool) and df.iloc[0].cost_usd > 0
    assert df.iloc[0].usage_source == "provider_estimate"  # replayed counts: costs reported as estimated


def test_streaming_through_openai_client(store, recorded):
    r = max(recorded, key=lambda r: len(r["text"]))

    async def run():
        c = aclient(store)
        try:
            stream = await c.chat.completions.create(model=MODEL, stream=True,
                                                     stream_options={"include_usage": True},
                                                     messages=[{"role": "user", "content": r["prompt"]}])
            parts, finish, usage = [], None, None
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                for ch in chunk.choices:
                    parts.append(ch.delta.content or "")
                    finish = ch.finish_reason or finish
            return "".join(parts), finish, usage
        finally:
            await c.close()
    text, finish, usage = asyncio.run(run())
    assert text == r["text"] and finish == "stop"
    assert usage.completion_tokens == approx_tokens(r["text"])


def test_loopback_server_plain_stream_models_and_errors(store, recorded):
    with serve(store) as srv:
        assert srv.base_url.startswith("http://127.0.0.1:")

        async def run():
            c = openai.AsyncOpenAI(api_key="x", base_url=srv.base_url, max_retries=0, timeout=10)
            try:
                plain = await c.chat.completions.create(model=MODEL, messages=[
                    {"role": "system", "content": "be brief"}, {"role": "user", "content": recorded[2]["prompt"]}])
                stream = await c.chat.completions.create(model=MODEL, stream=True, messages=[
                    {"role": "user", "content": recorded[3]["prompt"]}])
                text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
                models = [m.id async for m in c.models.list()]
                with pytest.raises(openai.NotFoundError):
                    await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "??"}])
                one = await call_once(c, AgentSpec("a", "jamba-1.5-large", "replay", None, 2, 8), "??",
                                      CollectionSettings(max_retries=0))
                return plain, text, models, one
            finally:
                await c.close()
        plain, text, models, one = asyncio.run(run())
    assert plain.choices[0].message.content == recorded[2]["text"] and plain.usage.prompt_tokens > 0
    assert text == recorded[3]["text"]
    assert sorted(models) == sorted(DEMO + WIDE + ZEROEVAL + ALPACA)
    assert one["status"] == "error" and one["error_kind"] == "not_found"


def test_sync_transport_with_sync_client(store, recorded):
    c = openai.OpenAI(api_key="x", base_url=REPLAY_BASE_URL, max_retries=0,
                      http_client=httpx.Client(transport=replay_sync_transport(store)))
    resp = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": recorded[4]["prompt"]}])
    assert resp.choices[0].message.content == recorded[4]["text"]
    c.close()


def test_bad_requests_are_400(store):
    t = httpx.Client(transport=replay_sync_transport(store), base_url="http://replay.invalid/v1")
    assert t.post("/chat/completions", content=b"{oops").status_code == 400
    assert t.post("/chat/completions", json={"model": MODEL}).status_code == 400
    r = t.post("/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                          "max_tokens": 0})
    assert r.status_code == 400 and json.loads(r.content)["error"]["param"] == "max_tokens"


def test_missing_recordings_and_data_override(tmp_path, monkeypatch):
    with pytest.raises(RouterLiteError, match="build_replay"):
        ReplayStore.load(tmp_path / "none.parquet")
    monkeypatch.setenv("ROUTER_LITE_DATA", str(tmp_path))
    assert default_recordings_path() == tmp_path / "replay" / "mmlu_pro_outputs.parquet"
    (tmp_path / "replay").mkdir()
    pd.DataFrame({"model": ["m"], "question_id": [1], "prompt_hash": [prompt_hash("hi")], "text": ["yo"]}).to_parquet(
        tmp_path / "replay" / "mmlu_pro_outputs.parquet")
    s = ReplayStore.load()
    assert s.models() == ["m"] and s.text_for("m", "hi") == "yo"
