"""Fuzzing the router endpoint on loopback: generated request bodies never get a 5xx, every refusal is an
OpenAI-style error body, and ordinary requests sent at the same time all succeed.

The server is the real app (pipeline.serve.app.build_app) with the real MiniLM backbone (its tokenizer is where bad text
used to fail) and a registered head; the pool's agents are a local OpenAI-compatible endpoint that answers any
request, so a 5xx could only come from the router itself. Bounded: `FUZZ_EXAMPLES` examples (env
ROUTER_LITE_FUZZ_EXAMPLES), no per-example deadline (embedding time depends on the machine's load).
"""
from __future__ import annotations

import collections
import itertools
import json
import os
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.collect.agents import AgentSpec
from pipeline.core.http_server import LoopbackServer
from pipeline.route import registry
from pipeline.route.head import Head
from pipeline.route.ood import OODGuard
from pipeline.serve.app import build_app
from pipeline.serve.server import serve_in_thread
from pipeline.serve.settings import ServeSettings

pytestmark = pytest.mark.slow

BATCH_MATES = itertools.count()
FUZZ_EXAMPLES = int(os.environ.get("ROUTER_LITE_FUZZ_EXAMPLES", "300"))
AGENTS = ["fuzz_a", "fuzz_b", "fuzz_c"]
REFERENCE = [f"Question {i}: what is the derivative of x^{i} with respect to x? Options: (A) {i}x^{i - 1} (B) x"
             for i in range(2, 24)]
SPECIAL = ["\ud800", "\udfff", "\udce9", "\ud83d\ude00", "\U0001f600", "\u202e", "\u200f", "\u061c", "\u2067",
           "שלום עולם", "مرحبا بالعالم", "\x00", "\u0301\u0301\u0301", "\ufeff", "\u200b", "\r\n", "\\", '"', "𒀀",
           "ﷺ", "꙯", "\U000e0001", "\uffff"]


def fake_agent_app():
    """An OpenAI-compatible endpoint answering every chat request with one short reply (JSON or SSE)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def chat(request):
        body = await request.json()
        msg = {"role": "assistant", "content": "ok"}
        if body.get("stream"):
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                     "choices": [{"index": 0, "delta": msg, "finish_reason": "stop"}]}
            return Response(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n", media_type="text/event-stream")
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                             "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """(router server, head name): a random linear head over MiniLM with a guard fitted on REFERENCE."""
    from pipeline.embed.backbone import Backbone

    bb = Backbone(None, max_seq_length=64)
    X = bb.encode(REFERENCE)
    rng = np.random.default_rng(0)
    head = Head(rng.normal(size=(bb.dim, len(AGENTS))).astype(np.float32), np.zeros(len(AGENTS), np.float32),
                agents=AGENTS)
    guard = OODGuard(k=3).fit(X[:16], X[16:])
    path = registry.register(
        tmp_path_factory.mktemp("registry"), head, registry.PromptFit(guard, 0),
        backbone={"id": bb.model_id, "key": bb.key, "pooling": bb.pooling, "max_seq_length": bb.max_seq_length,
                  "dim": bb.dim},
        agents=[{"name": a, "model": f"model-{a}"} for a in AGENTS], training={}, data_hashes={}, metrics={})
    reg = registry.load(path)
    with LoopbackServer(fake_agent_app(), name="fake-agents") as up:
        agents = [AgentSpec(a, f"model-{a}", "openai_compatible", up.base_url, 0, 0) for a in AGENTS]

        def client_for(agent):
            return openai.AsyncOpenAI(api_key="fuzz", base_url=up.base_url, max_retries=0, timeout=30)

        app = build_app(reg, bb, agents, client_for, ServeSettings(max_body_bytes=256 * 1024, max_tokens_cap=4096))
        with serve_in_thread(app) as srv:
            yield srv, reg.name


# ------------------------------------------------------------------------------------------------- strategies
texts = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(exclude_categories=()), max_size=20),  # surrogates included
    st.lists(st.one_of(st.sampled_from(SPECIAL), st.text(max_size=8)), max_size=8).map("".join),
    st.sampled_from(REFERENCE),
    st.integers(0, 60_000).map(lambda n: "long words " * n),  # up to ~660 KB: over the body limit at the top
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                    st.floats(allow_nan=True, allow_infinity=True), texts)
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                           st.dictionaries(texts, kids, max_size=4)), max_leaves=12)
content = st.one_of(texts, st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]),
                                                           "text": st.one_of(texts, json_values)}), max_size=3),
                    json_values)
message = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "user", "system", "assistant"]),
                                                   json_values),
                                 "content": content}, optional={"name": json_values})
nested = st.integers(1, 5000).flatmap(lambda d: st.sampled_from(["[", "{\"a\":"]).map(
    lambda o: o * d + "1" * (o != "[") + ("]" if o == "[" else "}") * d))


def request_fields(head: str):
    return st.fixed_dictionaries({"messages": st.one_of(st.lists(message, min_size=1, max_size=4), json_values)},
                                 optional={
        "model": st.one_of(st.just(head), texts, json_values),
        "max_tokens": st.one_of(st.integers(-5, 1 << 80), json_values),
        "max_completion_tokens": st.one_of(st.integers(-5, 10_000), json_values),
        "seed": st.one_of(st.integers(-(1 << 70), 1 << 70), json_values),
        "temperature": st.one_of(st.floats(-1, 3), st.floats(allow_nan=True, allow_infinity=True), json_values),
        "top_p": st.one_of(st.floats(-1, 2), json_values),
        "stop": st.one_of(texts, st.lists(texts, max_size=6), json_values),
        "stream": st.one_of(st.booleans(), json_values),
        "stream_options": st.one_of(st.just({"include_usage": True}), json_values),
        "n": st.one_of(st.integers(-2, 3), json_values),
        "tools": json_values,
    })


def plausible(head: str):
    """Requests that are mostly valid, so the embedder and the agents are reached."""
    return st.fixed_dictionaries(
        {"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                                     "content": texts}), max_size=3).map(
            lambda ms: ms + [{"role": "user", "content": "q"}] if not ms else ms)},
        optional={"model": st.just(head), "max_tokens": st.integers(1, 4096), "seed": st.integers(-(1 << 63), 1 << 63),
                  "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "stream": st.booleans(),
                  "stop": st.lists(st.text(max_size=5), max_size=4)})


def bodies(head: str):
    return st.one_of(
        plausible(head).map(lambda r: json.dumps(r).encode()),
        plausible(head).map(lambda r: json.dumps(r).encode()),
        plausible(head).map(lambda r: json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")),
        request_fields(head).map(lambda r: json.dumps(r).encode()),  # surrogates as \\udXXX escapes, NaN as NaN
        request_fields(head).map(lambda r: json.dumps(r, ensure_ascii=False).encode("utf-8", "surrogatepass")),
        json_values.map(lambda v: json.dumps(v).encode()),
        nested.map(lambda s: ('{"messages":' + s + "}").encode()),
        nested.map(str.encode),
        st.binary(max_size=300),
    )


def check_response(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code == 200:
        if r.headers["content-type"].startswith("text/event-stream"):
            assert '"router"' in r.text
        else:
            assert r.json()["router"]["agent"] in AGENTS
        return
    assert 400 <= r.status_code < 500
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["code"], str)
    assert isinstance(err["type"], str) and "param" in err


class GoodTraffic:
    """Ordinary requests (new prompts, so they are embedded and batched with the fuzz's) sent in a loop."""

    def __init__(self, url: str, head: str, clients: int = 2):
        self.url, self.head, self.statuses, self._stop = url, head, [], threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, k: int) -> None:
        with httpx.Client(timeout=120) as c:
            i = 0
            while not self._stop.is_set():
                prompt = f"{REFERENCE[i % len(REFERENCE)]} (client {k}, request {i})"
                r = c.post(self.url, json={"model": self.head, "messages": [{"role": "user", "content": prompt}]})
                self.statuses.append(r.status_code if r.status_code != 200 or r.json()["choices"][0]["message"][
                    "content"] == "ok" else -1)
                i += 1

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(120)


def test_fuzzed_bodies_never_5xx_and_good_requests_unaffected(live):
    srv, head = live
    url = srv.base_url + "/chat/completions"
    seen = {"n": 0, "ok": 0}
    codes: collections.Counter = collections.Counter()
    t0 = time.perf_counter()

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(body=bodies(head))
    def fuzz(body):
        r = client.post(url, content=body, headers={"content-type": "application/json"})
        check_response(r)
        seen["n"] += 1
        seen["ok"] += r.status_code == 200
        codes[r.json()["error"]["code"] if r.status_code != 200 else "200"] += 1

    with httpx.Client(timeout=120) as client, GoodTraffic(url, head) as good:
        fuzz()
    print(f"fuzz: {seen['n']} bodies ({seen['ok']} answered 200) in {time.perf_counter() - t0:.1f}s; "
          f"{len(good.statuses)} concurrent good requests; outcomes {dict(codes.most_common())}")
    assert seen["n"] >= FUZZ_EXAMPLES * 0.9
    assert good.statuses and set(good.statuses) == {200}, sorted(set(good.statuses))


@settings(max_examples=max(10, FUZZ_EXAMPLES // 6), deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(prompts=st.lists(texts, min_size=2, max_size=8))
def test_concurrent_fuzzed_prompts_fail_alone(live, prompts):
    """Fuzzed prompts sent together with good ones (one micro-batch): every good one is answered."""
    import asyncio

    srv, head = live
    good = [f"{REFERENCE[i]} (batch mate {next(BATCH_MATES)})" for i in range(4)]  # new: embedded with the rest

    async def main():
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as c:
            return await asyncio.gather(*[c.post("/chat/completions", content=json.dumps(
                {"model": head, "messages": [{"role": "user", "content": p}]}).encode()) for p in prompts + good])

    outs = asyncio.run(asyncio.wait_for(main(), 120))
    for r in outs:
        check_response(r)
    assert [r.status_code for r in outs[len(prompts):]] == [200] * len(good)
