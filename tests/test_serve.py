"""The router endpoint (pipeline/serve.py) on loopback, with the `openai` SDK as the client, against the replay pool.

A head is trained here in seconds: MiniLM embeddings of 100 real MMLU-Pro prompts recorded for all five mmlu_pro
models, rewards = whether each model's recorded reply is correct, a few CMA-ES generations; then registered and
loaded like any head.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket

import httpx
import numpy as np
import openai
import pandas as pd
import pytest

from pipeline import registry
from pipeline.errors import RouterLiteError
from pipeline.grading import grade
from pipeline.pool import AgentSpec
from pipeline.prompts import prompt_hash
from pipeline.replay import REPLAY_BASE_URL, ReplayStore, replay_transport
from pipeline.serve import ServeSettings, build_app, parse_chat_request, serve_in_thread
from pipeline.tasks import load_source
from resources.pool import PoolResource

pytestmark = pytest.mark.slow

N_TRAIN, N_VAL, N_TEST = 60, 20, 20
OOD_PROMPTS = [  # random characters of many scripts; everyday Japanese
    "ʘ ꙮ ⵣ ᚠᛟ 𐌰𐌱 ⣿⣀ ಠ_ಠ qzxv#@!~ 7f3e9a0c ∰∯∮ ᘛᘚ ⿰⿱ ꧁꧂ ♜♞ ⌘⌥ ╬═╬",
    "今日は天気が良いので、公園で友達とピクニックをしてお弁当を食べました。"
    "とても楽しかったです。",
]
SECRET = "sk-test-SECRET-0123456789abcdef"


@pytest.fixture(scope="module")
def pool():
    return PoolResource(kind="replay", pool="mmlu_pro")


@pytest.fixture(scope="module")
def world(pool, tmp_path_factory):
    """(registered head, backbone, demo agents, tasks frame with prompts recorded for every agent)."""
    from pipeline.embed import Backbone
    from pipeline.router import fit_router
    from pipeline.train import TrainConfig

    agents = pool.agents()
    store = pool.store()
    tasks = load_source("mmlu_pro").iloc[:400]
    keep = [all(store.text_for(a.model, p) is not None for a in agents) for p in tasks["prompt"]]
    tasks = tasks[keep].iloc[: N_TRAIN + N_VAL + N_TEST].reset_index(drop=True)
    assert len(tasks) == N_TRAIN + N_VAL + N_TEST
    tasks["split"] = ["train"] * N_TRAIN + ["validation"] * N_VAL + ["test"] * N_TEST
    names = [a.name for a in agents]
    R = np.array([[float(grade(store.text_for(a.model, t.prompt), t.gold, t.grader)[1]) for a in agents]
                  for t in tasks.itertuples()])
    rewards = pd.DataFrame({
        "task_id": tasks["task_id"], "agent_order": [names] * len(tasks), "mean_reward": list(R),
        "best_agents": [[n for n, r in zip(names, row) if r >= row.max()] for row in R],
    })
    bb = Backbone(None, max_seq_length=128)
    X = bb.encode(tasks["prompt"].tolist())
    fit = fit_router(X, rewards, tasks["split"], TrainConfig(generations=3, log_every=0))
    path = registry.register(
        tmp_path_factory.mktemp("registry"), fit.head, fit.guard, fit.best_single,
        backbone={"id": bb.model_id, "key": bb.key, "pooling": bb.pooling, "max_seq_length": bb.max_seq_length,
                  "dim": int(X.shape[1])},
        agents=[{"name": a.name, "model": a.model} for a in agents], training={"generations": 3},
        data_hashes={"test": "synthetic"}, metrics=fit.metrics)
    return registry.load(path), bb, agents, tasks


@pytest.fixture(scope="module")
def server(world, pool):
    reg, bb, agents, _ = world
    with serve_in_thread(build_app(reg, bb, agents, pool.client_for, ServeSettings())) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(api_key="unused", base_url=server.base_url, max_retries=0, timeout=60)
    yield c
    c.close()


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def recorded(pool, model: str, prompt: str) -> str:
    text = pool.store().text_for(model, prompt)
    assert text
    return text


def test_reply_is_the_picked_agents_recorded_text(world, pool, client):
    reg, _, agents, tasks = world
    models = {a.name: a.model for a in agents}
    seen = set()
    for prompt in tasks["prompt"].iloc[N_TRAIN + N_VAL:N_TRAIN + N_VAL + 6]:
        raw = client.chat.completions.with_raw_response.create(model=reg.name, messages=user(prompt))
        resp = raw.parse()
        agent, model = raw.headers["x-router-agent"], raw.headers["x-router-model"]
        assert models[agent] == model
        assert resp.choices[0].message.content == recorded(pool, model, prompt)
        assert resp.model == model  # the reply body is the agent's, unchanged but for `router`
        assert resp.model_extra["router"] == {"head": reg.name, "agent": agent, "model": model,
                                              "ood_guard": raw.headers["x-router-ood"] == "true",
                                              "target": "max-quality", "lambda": 0.0}
        assert raw.headers["x-router-head"] == reg.name
        assert float(raw.headers["x-router-overhead-ms"]) >= 0
        seen.add(agent)
    # the pick is the head's: same as embedding and routing offline
    X = world[1].encode(tasks["prompt"].iloc[N_TRAIN + N_VAL:N_TRAIN + N_VAL + 6].tolist())
    assert seen == {reg.agents[int(p)]["name"] for p in reg.route(X)[0]}


def test_model_may_be_left_out_and_params_are_forwarded(world, pool, server):
    _, _, _, tasks = world
    prompt = tasks["prompt"].iloc[N_TRAIN]
    r = httpx.post(server.base_url + "/chat/completions", json={"messages": user(prompt), "max_tokens": 5},
                   timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    full = recorded(pool, r.headers["x-router-model"], prompt)
    assert body["choices"][0]["message"]["content"] == full[:20]  # replay cuts at 4 chars x max_tokens
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["router"]["agent"] == r.headers["x-router-agent"]


def test_streaming_concatenates_to_the_same_text(world, pool, client):
    reg, _, _, tasks = world
    prompt = tasks["prompt"].iloc[N_TRAIN + 1]
    plain = client.chat.completions.create(model=reg.name, messages=user(prompt))
    raw = client.chat.completions.with_raw_response.create(model=reg.name, messages=user(prompt), stream=True,
                                                           stream_options={"include_usage": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content == recorded(pool, raw.headers["x-router-model"], prompt)
    assert chunks[0].model_extra["router"]["agent"] == raw.headers["x-router-agent"] == plain.router["agent"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_models_and_healthz(world, client, server):
    reg = world[0]
    assert [m.id for m in client.models.list().data] == [reg.name]
    assert client.models.retrieve(reg.name).id == reg.name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    h = httpx.get(server.url + "/healthz", timeout=10)
    assert h.status_code == 200 and h.json()["status"] == "ok" and h.json()["head"] == reg.name
    assert h.json()["agents"] == [a["name"] for a in reg.agents]


def _code(exc: openai.APIStatusError) -> str:
    return exc.body["code"] if isinstance(exc.body, dict) and "code" in exc.body else exc.response.json()["error"][
        "code"]


@pytest.mark.parametrize("kwargs, code", [
    (dict(messages=[]), "missing_messages"),
    (dict(messages=[{"role": "system", "content": "be brief"}]), "missing_user_message"),
    (dict(messages=[{"role": "user", "content": "   "}]), "missing_user_message"),
    (dict(messages=[{"role": "user", "content": "hi"}] * 65), "too_many_messages"),
    (dict(messages=[{"role": "user", "content": "x" * (1 << 20)}]), "body_too_large"),
    (dict(messages=[{"role": "user", "content": "hi"}], max_tokens=0), "invalid_value"),
    (dict(messages=[{"role": "user", "content": "hi"}], temperature=3), "invalid_value"),
    (dict(messages=[{"role": "user", "content": "hi"}], n=2), "invalid_value"),
])
def test_bad_requests_are_400(world, client, kwargs, code):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=world[0].name, **kwargs)
    assert ei.value.status_code == 400 and _code(ei.value) == code


def test_bad_bodies_over_raw_http(server):
    url = server.base_url + "/chat/completions"
    for content, code in [(b"{not json", "invalid_json"), (b"[1, 2]", "invalid_json"),
                          (json.dumps({"model": "x"}).encode(), "model_not_found"),
                          (json.dumps({"messages": "hi"}).encode(), "missing_messages"),
                          (json.dumps({"messages": ["hi"]}).encode(), "invalid_message")]:
        r = httpx.post(url, content=content, headers={"content-type": "application/json"}, timeout=10)
        assert r.status_code == (404 if code == "model_not_found" else 400), (content, r.text)
        assert r.json()["error"]["code"] == code and r.json()["error"]["message"]

    def chunked():  # no Content-Length: the limit applies while reading
        for _ in range(40):
            yield b"x" * 32768
    r = httpx.post(url, content=chunked(), timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "body_too_large"
    r = httpx.get(url, timeout=10)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    r = httpx.get(server.base_url + "/nothing", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="gpt-4o", messages=user("hi"))
    assert _code(ei.value) == "model_not_found"


def test_ood_guard_fires_and_routes_to_best_single(world, client):
    """Far-away prompts trip the guard -> the best single agent; the replay has no recording of them -> 502 that
    still names the picked agent (an upstream failure: no wrong answer, the agent's error passed on)."""
    reg = world[0]
    best = reg.agents[reg.best_single]
    X = world[1].encode(OOD_PROMPTS)
    assert reg.route(X)[1].all()
    for prompt in OOD_PROMPTS:
        with pytest.raises(openai.APIStatusError) as ei:
            client.chat.completions.create(model=reg.name, messages=user(prompt))
        e = ei.value
        assert e.status_code == 502 and _code(e) == "upstream_error" and "prompt_not_recorded" in e.message
        assert e.response.headers["x-router-ood"] == "true"
        assert e.response.headers["x-router-agent"] == best["name"]
        assert e.response.headers["x-router-model"] == best["model"]


def test_ood_reply_comes_from_best_single(world, pool):
    """With a replay that has a recording for the far-away prompt, the reply is the best single agent's."""
    reg, bb, agents, tasks = world
    prompt = OOD_PROMPTS[1]
    rows = [{"model": a.model, "prompt_hash": prompt_hash(prompt),
             "text": f"reply of {a.model}"} for a in agents]
    rows += [{"model": a.model, "prompt_hash": prompt_hash(p),
              "text": recorded(pool, a.model, p)} for a in agents for p in tasks["prompt"].iloc[:3]]
    store = ReplayStore.from_frame(pd.DataFrame(rows))

    def client_for(agent):
        return openai.AsyncOpenAI(api_key="replay", base_url=REPLAY_BASE_URL, max_retries=0,
                                  http_client=httpx.AsyncClient(transport=replay_transport(store)))

    best = reg.agents[reg.best_single]
    with serve_in_thread(build_app(reg, bb, agents, client_for)) as srv, \
            openai.OpenAI(api_key="x", base_url=srv.base_url, max_retries=0) as c:
        raw = c.chat.completions.with_raw_response.create(model=reg.name, messages=user(prompt))
        assert raw.parse().choices[0].message.content == f"reply of {best['model']}"
        assert raw.headers["x-router-ood"] == "true" and raw.parse().router["ood_guard"] is True
        raw = c.chat.completions.with_raw_response.create(model=reg.name, messages=user(tasks["prompt"].iloc[0]))
        assert raw.headers["x-router-ood"] == "false"  # a training prompt is in distribution


def test_upstream_failure_is_502_without_secrets(world):
    reg, bb, agents, tasks = world
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]

    def client_for(agent):
        return openai.AsyncOpenAI(api_key=SECRET, base_url=f"http://127.0.0.1:{dead}/v1", max_retries=0, timeout=5)

    with serve_in_thread(build_app(reg, bb, agents, client_for)) as srv:
        for stream in (False, True):
            r = httpx.post(srv.base_url + "/chat/completions", timeout=30,
                           json={"model": reg.name, "messages": user(tasks["prompt"].iloc[0]), "stream": stream})
            assert r.status_code == 502
            err = r.json()["error"]
            assert err["code"] == "upstream_connection" and err["type"] == "upstream_error"
            assert r.headers["x-router-agent"] in err["message"]
            assert SECRET not in r.text and "SECRET" not in str(r.headers)


def test_concurrent_requests_are_batched_and_correct(world, pool, server):
    reg, _, _, tasks = world
    prompts = tasks["prompt"].iloc[:12].tolist()

    async def run():
        async with openai.AsyncOpenAI(api_key="x", base_url=server.base_url, max_retries=0, timeout=60) as c:
            return await asyncio.gather(*[c.chat.completions.with_raw_response.create(
                model=reg.name, messages=user(p)) for p in prompts])

    outs = asyncio.run(asyncio.wait_for(run(), 60))
    for p, raw in zip(prompts, outs):
        assert raw.parse().choices[0].message.content == recorded(pool, raw.headers["x-router-model"], p)
    X = world[1].encode(prompts)
    assert [raw.headers["x-router-agent"] for raw in outs] == [reg.agents[int(i)]["name"] for i in reg.route(X)[0]]


def test_parse_chat_request_contract():
    s = ServeSettings(max_messages=3, defaults={"max_tokens": 100, "temperature": 0.1})
    r = parse_chat_request(json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                 {"type": "text", "text": "b"}]},
                                                    {"role": "assistant", "content": "c"}],
                                       "max_completion_tokens": 7, "top_p": 0.5, "tools": [1]}).encode(), "h", s)
    assert r.text == "ab" and not r.stream
    assert r.upstream == {"temperature": 0.1, "max_completion_tokens": 7, "top_p": 0.5,
                          "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                    {"type": "text", "text": "b"}]},
                                       {"role": "assistant", "content": "c"}]}
    r = parse_chat_request(b'{"model": "h", "messages": [{"role": "user", "content": "q"}], "stream": true}', "h", s)
    assert r.stream and r.upstream["stream"] is True and r.upstream["max_tokens"] == 100
    with pytest.raises(RouterLiteError):
        ServeSettings(max_messages=0)
    with pytest.raises(RouterLiteError):
        ServeSettings(defaults={"tools": []})


def test_head_agent_missing_from_pool_fails_before_serving(world, pool):
    reg, bb, agents, _ = world
    with pytest.raises(RouterLiteError, match="frontier_a"):
        build_app(reg, bb, [a for a in agents if a.name != "frontier_a"], pool.client_for)
    other = [AgentSpec(a.name, a.model, a.provider, a.base_url, 0, 0) for a in agents]

    class Boom(Exception):
        pass

    def client_for(agent):  # e.g. a missing key: raised at build time, not on the first request
        raise Boom(agent.name)

    with pytest.raises(Boom):
        build_app(reg, bb, other, client_for)


def test_cli_serve_wires_profile_pool_and_head(world, pool, monkeypatch, capsys):
    """`router-lite serve --head DIR --profile smoke`: the app it would run answers from the profile's replay pool."""
    import uvicorn

    from assets import cli

    reg, _, _, tasks = world
    captured = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: captured.update(app=app, **kw))
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # what the command sets by default: restored afterwards
    httpx_log = logging.getLogger("httpx")
    monkeypatch.setattr(httpx_log, "level", httpx_log.level)
    assert cli.main(["serve", "--head", str(reg.path), "--profile", "smoke", "--port", "0", "--device", "cpu"]) == 0
    assert captured["host"] == "127.0.0.1" and captured["port"] == 0
    assert reg.name in capsys.readouterr().err
    prompt = tasks["prompt"].iloc[N_TRAIN + N_VAL]
    with serve_in_thread(captured["app"]) as srv, \
            openai.OpenAI(api_key="x", base_url=srv.base_url, max_retries=0, timeout=60) as c:
        raw = c.chat.completions.with_raw_response.create(model=reg.name, messages=user(prompt))
        assert raw.parse().choices[0].message.content == recorded(pool, raw.headers["x-router-model"], prompt)
    assert cli.main(["serve", "--head", str(reg.path.parent / "nope")]) == 2
    assert "not a registered head" in capsys.readouterr().err
