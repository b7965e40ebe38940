"""Conversations and tools on the live endpoint, in front of the local OpenRouter stand-in
(pipeline/collect/standin.py): a follow-up turn is routed with the question it follows; `tools` reach the picked agent
unchanged and its `tool_calls` reach the client (non-streamed and streamed); a cascade asked to compare answers of a
tools request refuses it with one 400 naming the field, and one not asked lets one agent answer it.

The router is made here in a second: MiniLM embeddings of bare GSM8K (math) and MMLU (knowledge) questions, a linear
head that sends math to `mathy` and knowledge to `knowy`, an OOD guard fitted on them, best single `strong`."""
from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest

from pipeline.collect.agents import AgentSpec
from pipeline.collect.standin import OpenRouterStandIn, StandInServer
from pipeline.core.prompts import user_text
from pipeline.route import registry
from pipeline.route.cascade import CascadeRouter, Plan, Policy, Stage
from pipeline.route.formats import FormatGuess
from pipeline.route.head import Head
from pipeline.route.ood import OODGuard
from pipeline.serve.app import build_app
from pipeline.serve.server import serve_in_thread
from pipeline.serve.settings import ServeSettings
from pipeline.tasks.sources import load_source

pytestmark = pytest.mark.slow

NAMES = ["strong", "mathy", "knowy"]  # strong: the best single agent; cheap c1, c2 for the cascade
N_TRAIN, N_VAL, N_TEST = 40, 20, 8
FOLLOW_UP = "and now in Python?"
TOOLS = [{"type": "function", "function": {
    "name": "run_python", "description": "Run a Python snippet and return what it prints.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]
CHOICE = {"type": "function", "function": {"name": "run_python"}}


def _questions(source: str, n: int) -> list[str]:
    return [user_text(p) for p in load_source(source)["prompt"].iloc[:n]]


@pytest.fixture(scope="module")
def world(tmp_path_factory, cascade_point):
    """(prompt-only entry, cascade entry, backbone, agents, math and knowledge test questions, training embeddings)."""
    from pipeline.embed.backbone import Backbone

    n = N_TRAIN + N_VAL + N_TEST
    math, know = _questions("gsm8k", n), _questions("mmlu", n)
    bb = Backbone(None, max_seq_length=128)
    Xm, Xk = bb.encode(math), bb.encode(know)
    w = Xm[:N_TRAIN].mean(0) - Xk[:N_TRAIN].mean(0)  # math side positive
    c = float(w @ (Xm[:N_TRAIN].mean(0) + Xk[:N_TRAIN].mean(0))) / 2
    W = np.stack([np.zeros_like(w), w, -w], axis=1)
    head = Head(W, np.array([-1.0, -c, c], np.float32), agents=NAMES)  # strong never wins on its score
    train, val = np.vstack([Xm[:N_TRAIN], Xk[:N_TRAIN]]), np.vstack([Xm[N_TRAIN:-N_TEST], Xk[N_TRAIN:-N_TEST]])
    guard = OODGuard().fit(train, val)
    backbone = {"id": bb.model_id, "key": bb.key, "pooling": bb.pooling, "max_seq_length": bb.max_seq_length,
                "dim": int(train.shape[1])}
    agents = [{"name": a, "model": f"standin/{a}"} for a in NAMES]
    root = tmp_path_factory.mktemp("registry")
    prompt_only = registry.load(registry.register(root, head, registry.PromptFit(guard, 0), backbone=backbone,
                                                  agents=agents, training={}, data_hashes={}, metrics={}))
    cascade = Plan(Policy((Stage((1, 2), 2), Stage((0,)))))
    path = {"kind": "cascade", "agents": NAMES, "best_single": "strong", "guard_z": 0.0,
            "best_single_validation": {"quality": 0.8, "ci_low": 0.8, "ci_high": 0.8, "cost_per_1k": 1.0},
            "n_validation": 100, "points": [cascade_point(cascade, NAMES, 0.8, 0.3)]}
    casc = registry.load(registry.register(root, CascadeRouter(head, path, [0, 1, 2], NAMES),
                                           registry.PromptFit(guard, 0), backbone=backbone, agents=agents,
                                           training={}, data_hashes={}, metrics={}))
    return prompt_only, casc, bb, math[-N_TEST:], know[-N_TEST:], train


@pytest.fixture(scope="module")
def standin():
    si = OpenRouterStandIn([f"standin/{a}" for a in NAMES],
                           prices={f"standin/{a}": p for a, p in zip(NAMES, [(10.0, 30.0), (0.1, 0.4), (0.1, 0.4)])})
    with StandInServer(si) as srv:
        yield srv


def _specs(srv) -> list[AgentSpec]:
    prices = srv.standin.prices
    return [AgentSpec(a, f"standin/{a}", "openrouter", srv.base_url, *prices[f"standin/{a}"]) for a in NAMES]


def _serve(world, srv, which: str = "prompt", settings: ServeSettings | None = None, formats=None):
    entry = world[0] if which == "prompt" else world[1]

    def client_for(spec):
        return openai.AsyncOpenAI(api_key="sk-standin-key", base_url=srv.base_url, max_retries=0, timeout=30)

    return serve_in_thread(build_app(entry, world[2], _specs(srv), client_for, settings or ServeSettings(),
                                     formats=formats))


def _post(server, messages, **extra):
    headers = extra.pop("headers", {})
    return httpx.post(server.base_url + "/chat/completions", json={"messages": messages, **extra}, headers=headers,
                      timeout=60)


def _events(srv, since: int) -> list[dict]:
    return list(srv.standin.events)[since:]


def _conversation(question: str) -> list[dict]:
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": "Let me work through it. The answer is 42."},
            {"role": "user", "content": FOLLOW_UP}]


def test_a_follow_up_goes_where_the_question_it_follows_goes(world, standin):
    """A follow-up of a math question is routed as the math question is, one of a knowledge question as the knowledge
    question is; alone (the last user turn only, as before) the follow-up says nothing of either, so it cannot."""
    _, _, _, math, know, _ = world
    with _serve(world, standin) as server:
        def pick(messages) -> tuple[str, str]:
            r = _post(server, messages)
            assert r.status_code == 200, r.text
            return r.headers["x-router-agent"], r.headers["x-router-ood"]

        for questions, agent in ((math, "mathy"), (know, "knowy")):
            for q in questions:
                alone = pick([{"role": "user", "content": q}])
                assert alone == (agent, "false"), q  # the router tells the two apart
                assert pick(_conversation(q)) == alone, q
                # the same conversation with its turns as content parts
                parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in _conversation(q)]
                assert pick(parts) == alone, q
        follow_up_alone = pick([{"role": "user", "content": FOLLOW_UP}])
    assert follow_up_alone == ("strong", "true")  # far from every question it knows: the best single agent


def test_tools_reach_the_agent_and_its_tool_calls_reach_the_client(world, standin):
    _, _, _, math, _, _ = world
    q = math[0]
    with _serve(world, standin) as server:
        n = len(standin.standin.events)
        r = _post(server, [{"role": "user", "content": q}], tools=TOOLS, tool_choice=CHOICE,
                  parallel_tool_calls=False, response_format={"type": "text"})
        assert r.status_code == 200, r.text
        got = _events(standin, n)
        # the agent got the fields as the client sent them
        assert [e["model"] for e in got] == ["standin/mathy"] and got[0]["kind"] == "tool_call"
        assert got[0]["tools"] == TOOLS and got[0]["tool_choice"] == CHOICE
        assert got[0]["response_format"] == {"type": "text"}
        body = r.json()
        msg, choice = body["choices"][0]["message"], body["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and msg["content"] is None
        call = msg["tool_calls"][0]
        assert call["function"]["name"] == "run_python" and json.loads(call["function"]["arguments"]) == \
            {"code": q[:40]}
        assert body["router"]["agent"] == "mathy" and body["usage"]["cost"] > 0

        # streamed: the agent's stream passes through, the call reassembled by the SDK is the same
        with openai.OpenAI(api_key="x", base_url=server.base_url, max_retries=0, timeout=60) as c:
            chunks = list(c.chat.completions.create(model=world[0].name, messages=[{"role": "user", "content": q}],
                                                    tools=TOOLS, tool_choice=CHOICE, stream=True))
        assert chunks[0].model_extra["router"]["agent"] == "mathy"
        deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or []) if ch.choices]
        assert deltas[0].id == call["id"] and deltas[0].function.name == "run_python"
        assert "".join(d.function.arguments or "" for d in deltas) == call["function"]["arguments"]
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"


@pytest.mark.parametrize("field,value", [("tools", TOOLS), ("response_format", {"type": "json_object"}),
                                         ("functions", [TOOLS[0]["function"]])])
def test_a_cascade_asked_to_compare_refuses_tools_with_one_400(world, standin, field, value):
    with _serve(world, standin, "cascade") as server:
        n = len(standin.standin.events)
        r = _post(server, [{"role": "user", "content": world[3][0]}], router_grader="integer", **{field: value})
        r2 = _post(server, [{"role": "user", "content": world[3][0]}], headers={"X-Router-Grader": "integer"},
                   **{field: value})
    for resp in (r, r2):
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert (err["code"], err["param"]) == ("unsupported_parameter", field) and f"'{field}'" in err["message"]
    assert _events(standin, n) == []  # no agent was called


def test_a_cascade_not_asked_to_compare_lets_one_agent_answer_with_the_tools(world, standin):
    """The server's default format, or a format guessed from the prompt, does not apply to a tools request: one agent
    answers it (the head's pick), and gets the tools; without tools the same request runs the stages."""
    _, casc, _, math, _, train = world
    q = math[1]
    guess = FormatGuess(train, ["integer"] * len(train))  # every prompt is guessed "integer"
    for kw in ({"settings": ServeSettings(default_grader="integer")}, {"formats": guess}):
        with _serve(world, standin, "cascade", **kw) as server:
            n = len(standin.standin.events)
            plain = _post(server, [{"role": "user", "content": q}])
            assert plain.status_code == 200, plain.text
            assert len(plain.headers["x-router-agents-called"].split(",")) >= 2  # the stages ran
            n = len(standin.standin.events)
            r = _post(server, [{"role": "user", "content": q}], tools=TOOLS)
            assert r.status_code == 200, r.text
            got = _events(standin, n)
            assert [e["model"] for e in got] == ["standin/mathy"] and got[0]["tools"] == TOOLS
            assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "run_python"
            assert "x-router-grader" not in r.headers and r.headers["x-router-agent"] == "mathy"
