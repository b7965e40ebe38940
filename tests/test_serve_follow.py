"""A served app follows the registry pointer (pipeline/serve/follow.py), shows its metrics (pipeline/serve/metrics.py)
and its readiness (pipeline/serve/readiness.py), in process: two small heads registered in milliseconds over a
hashing backbone, agents answered by an in-process fake upstream (httpx.MockTransport), no model loaded."""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.collect.agents import AgentSpec
from pipeline.route import registry
from pipeline.route.cascade import CascadeRouter, Plan, Policy, Stage
from pipeline.route.fit import constant_head
from pipeline.route.head import Head
from pipeline.route.ood import OODGuard
from pipeline.serve.app import build_app
from pipeline.serve.follow import PointerFollower
from pipeline.serve.server import serve_in_thread
from pipeline.serve.settings import ServeSettings

DIM = 8
AGENTS = [AgentSpec(n, f"m-{n}", "test", None, 1.0, 2.0) for n in ("strong", "cheap1", "cheap2")]
NAMES = [a.name for a in AGENTS]
INTERVAL_S = 0.2


class HashBackbone:
    """A prompt's embedding from its SHA-256; `gate` (an Event) holds every encode until it is set."""

    dim, model_id, key, device = DIM, "hash-8", "hash-8", "cpu"

    def __init__(self, gate: threading.Event | None = None):
        self.gate = gate

    def encode(self, texts):
        if self.gate is not None:
            assert self.gate.wait(60)
        rows = [np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode("utf-8", "surrogatepass")).digest()[:8],
                                                     "little")).normal(size=DIM) for t in texts]
        X = np.asarray(rows, np.float32)
        return X / np.linalg.norm(X, axis=1, keepdims=True)


async def _agent(request: httpx.Request) -> httpx.Response:
    """Every agent answers "4", except cheap2 on prompts holding "differ" ("5"); prompts holding "slow" take 1.5 s."""
    body = json.loads(request.content)
    prompt, model = body["messages"][-1]["content"], body["model"]
    if "slow" in prompt:
        await asyncio.sleep(1.5)
    answer = "5" if "differ" in prompt and model == "m-cheap2" else "4"
    return httpx.Response(200, json={
        "id": "r", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"The answer is {answer}"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})


def client_for(spec):
    return openai.AsyncOpenAI(api_key="unused", base_url="http://agents.test/v1", max_retries=0,
                              http_client=httpx.AsyncClient(transport=httpx.MockTransport(_agent)))


def _guard(seed: int) -> OODGuard:
    X = HashBackbone().encode([f"train {seed} {i}" for i in range(20)])
    guard = OODGuard(k=3).fit(X, X)
    guard.threshold = 3.0  # cosine distances are <= 2: never fires, so every prompt is the router's own pick
    return guard


def _register(root, router, seed: int, agents=None):
    agents = agents or [{"name": a.name, "model": a.model} for a in AGENTS]
    return registry.register(root, router, registry.PromptFit(_guard(seed), 0),
                             backbone={"id": "hash-8", "key": "hash-8", "dim": DIM},
                             agents=agents, training={"seed": seed}, data_hashes={}, metrics={})


def _head(root, seed: int):
    rng = np.random.default_rng(seed)
    return _register(root, Head(rng.normal(size=(DIM, 3)), rng.normal(size=3), agents=NAMES), seed)


def _cascade(root, cascade_point):
    """A cascade whose only point asks cheap1 and cheap2 (both must agree), then strong."""
    def point(plan: Plan) -> dict:
        return cascade_point(plan, NAMES, 0.9, 1.0)

    path = {"kind": "cascade", "agents": NAMES, "best_single": "strong", "guard_z": 0.0, "n_validation": 100,
            "best_single_validation": {"quality": 0.9, "ci_low": 0.9, "ci_high": 0.9, "cost_per_1k": 1.0},
            "points": [point(Plan(Policy((Stage((1, 2), 2), Stage((0,))))))]}
    head = constant_head(Head(np.zeros((DIM, 3), np.float32), np.zeros(3, np.float32), agents=NAMES), 0)
    return _register(root, CascadeRouter(head, path, [0, 1, 2], NAMES), 7)


@pytest.fixture()
def routers(tmp_path):
    root = tmp_path / "registry"
    a, b = _head(root, 1), _head(root, 2)
    assert a.name != b.name
    registry.mark_latest(root, a.name, a)
    return root, a, b


def _app(root, entry, gate=None, interval_s=INTERVAL_S):
    return build_app(registry.load(entry), HashBackbone(gate), AGENTS, client_for, ServeSettings(),
                     follow=PointerFollower(root, interval_s))


def _wait(cond, timeout_s: float = 30.0):
    t = time.monotonic()
    while time.monotonic() - t < timeout_s:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _families(srv) -> dict:
    text = httpx.get(f"http://{srv.host}:{srv.port}/metrics", timeout=30).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families, name: str, sample: str | None = None, **labels) -> float:
    fam = families[name]
    hits = [s.value for s in fam.samples if s.name == (sample or name) and all(s.labels.get(k) == v
                                                                                 for k, v in labels.items())]
    return sum(hits)


def test_swap_under_concurrent_load_fails_no_request(routers, caplog):
    """16 clients keep asking while the pointer moves from A to B: replies name B within about one interval, none
    fails, and every reply (header and body) and every access-log line names the router that answered."""
    root, a, b = routers
    caplog.set_level(logging.INFO, logger="router_lite.access")
    replies: list[tuple[float, int, str | None, str | None, str | None]] = []
    with serve_in_thread(_app(root, a)) as srv:
        until = [float("inf")]

        async def client(i: int) -> None:
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as c:
                n = 0
                while time.monotonic() < until[0]:
                    n += 1
                    try:
                        r = await c.post("/chat/completions",
                                         json={"messages": [{"role": "user", "content": f"client {i} q {n}"}]})
                        head = r.json().get("router", {}).get("head") if r.status_code == 200 else None
                        replies.append((time.monotonic(), r.status_code, r.headers.get("x-router-name"), head,
                                        r.headers.get("x-request-id")))
                    except httpx.HTTPError as exc:
                        replies.append((time.monotonic(), 0, repr(exc), None, None))

        async def load() -> float:
            clients = [asyncio.create_task(client(i)) for i in range(16)]
            while len(replies) < 64:  # every client under way
                await asyncio.sleep(0.05)
            registry.mark_latest(root, b.name, b)  # the promotion
            moved = time.monotonic()
            until[0] = moved + 4.0
            await asyncio.gather(*clients)
            return moved

        moved = asyncio.run(load())
    failed = [r for r in replies if r[1] != 200]
    assert not failed, failed[:5]
    assert all(name == head for _, _, name, head, _ in replies)  # header and body agree
    before = [r for r in replies if r[0] < moved]
    assert before and all(r[2] == a.name for r in before)
    last_a = max((r[0] for r in replies if r[2] == a.name), default=moved)
    after_b = [r for r in replies if r[0] > last_a]
    assert len(after_b) > 16 and all(r[2] == b.name for r in after_b)
    print(f"all replies name B {last_a - moved:.2f} s after the pointer moved (interval {INTERVAL_S} s); "
          f"{len(replies)} replies, 0 failed")
    assert last_a - moved < INTERVAL_S + 5.0  # one interval, plus loading and warming a tiny head on a busy CPU
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "router_lite.access"]
    by_id = {r[4]: r[2] for r in replies}
    assert len(lines) == len(replies) and all(ln["router"] == by_id[ln["request_id"]] for ln in lines)


def test_a_request_finishes_on_the_router_it_started_with(routers):
    root, a, b = routers
    with serve_in_thread(_app(root, a)) as srv:
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", httpx.post(
            srv.base_url + "/chat/completions", timeout=60,
            json={"messages": [{"role": "user", "content": "slow question"}]})))
        t.start()
        time.sleep(0.3)  # the request has picked its agent and waits for it (1.5 s)
        registry.mark_latest(root, b.name, b)
        assert _wait(lambda: httpx.get(srv.base_url + "/models", timeout=10).json()["data"][0]["id"] == b.name)
        t.join(60)
        later = httpx.post(srv.base_url + "/chat/completions", timeout=60,  # the name a client pinned before
                           json={"model": a.name, "messages": [{"role": "user", "content": "another question"}]})
        never = httpx.post(srv.base_url + "/chat/completions", timeout=60,
                           json={"model": "head-other", "messages": [{"role": "user", "content": "q"}]})
    r = out["r"]
    assert r.status_code == 200 and r.headers["x-router-name"] == a.name and r.json()["router"]["head"] == a.name
    assert later.status_code == 200 and later.headers["x-router-name"] == b.name
    assert never.status_code == 404 and never.json()["error"]["code"] == "model_not_found"


def test_a_broken_candidate_never_serves_and_is_counted_once(routers, caplog):
    """The pointer names a corrupt entry, then a router whose agent the pool lacks: the old router keeps answering,
    /readyz shows the failure, each is logged and counted once however many intervals pass; a good router after
    them is swapped in."""
    root, a, b = routers
    broken = root / "broken"
    shutil.copytree(b, broken)
    (broken / "manifest.json").write_text("{not json")
    stranger = _register(root, Head(np.ones((DIM, 3)), np.zeros(3), agents=["strong", "cheap1", "nobody"]), 3,
                         agents=[{"name": n, "model": f"m-{n}"} for n in ("strong", "cheap1", "nobody")])
    caplog.set_level(logging.ERROR, logger="pipeline.serve.follow")
    with serve_in_thread(_app(root, a)) as srv:
        base = f"http://{srv.host}:{srv.port}"
        registry.mark_latest(root, "broken", broken)
        assert _wait(lambda: httpx.get(base + "/readyz", timeout=10).json()["follow"]["failures"] == 1)
        time.sleep(5 * INTERVAL_S)  # more polls of the same pointer: not tried, logged or counted again
        ready = httpx.get(base + "/readyz", timeout=10).json()
        failure = ready["follow"]["last_failure"]
        assert ready["router"] == a.name and ready["follow"]["failures"] == 1
        assert failure["current"] and failure["path"] == str(broken) and "manifest.json is corrupt" in failure["error"]
        r = httpx.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "q"}]}, timeout=60)
        assert r.status_code == 200 and r.headers["x-router-name"] == a.name
        assert _value(_families(srv), "router_lite_router_swap_failures", "router_lite_router_swap_failures_total") \
            == 1
        registry.mark_latest(root, stranger.name, stranger)
        assert _wait(lambda: httpx.get(base + "/readyz", timeout=10).json()["follow"]["failures"] == 2)
        assert "nobody" in httpx.get(base + "/readyz", timeout=10).json()["follow"]["last_failure"]["error"]
        registry.mark_latest(root, b.name, b)
        assert _wait(lambda: httpx.get(base + "/readyz", timeout=10).json()["router"] == b.name)
        fams = _families(srv)
        ready = httpx.get(base + "/readyz", timeout=10).json()
    assert not ready["follow"]["last_failure"]["current"] and ready["follow"]["swaps"] == 1
    assert _value(fams, "router_lite_router_swap_failures", "router_lite_router_swap_failures_total") == 2
    assert _value(fams, "router_lite_router_swaps", "router_lite_router_swaps_total") == 1
    logged = [r for r in caplog.records if "not swapping" in r.getMessage()]
    assert len(logged) == 2 and str(broken) in logged[0].getMessage()


def test_a_pointer_moved_while_it_is_read_is_acted_on_once(routers, monkeypatch):
    """A slow first poll: the pointer's bytes are hashed, then it moves to a broken entry before it is parsed. The
    follower must not record the failure under the old bytes' hash (it would try, log and count it again)."""
    import pipeline.serve.follow as follow

    root, a, b = routers
    broken = root / "broken"
    shutil.copytree(b, broken)
    (broken / "manifest.json").write_text("{not json")
    real, moved = follow._read_pointer, []

    def read_after_a_move(r, raw):
        if not moved:
            moved.append(registry.mark_latest(root, "broken", broken))
        return real(r, raw)

    monkeypatch.setattr(follow, "_read_pointer", read_after_a_move)
    with serve_in_thread(_app(root, a)) as srv:
        base = f"http://{srv.host}:{srv.port}"
        assert _wait(lambda: httpx.get(base + "/readyz", timeout=10).json()["follow"]["failures"] >= 1)
        time.sleep(5 * INTERVAL_S)
        ready = httpx.get(base + "/readyz", timeout=10).json()
    assert moved and ready["router"] == a.name and ready["follow"]["failures"] == 1
    assert ready["follow"]["last_failure"]["current"]


def test_readyz_is_503_until_the_backbone_router_and_grading_worker_are_warm(routers):
    root, a, _ = routers
    gate = threading.Event()
    with serve_in_thread(_app(root, a, gate)) as srv:
        base = f"http://{srv.host}:{srv.port}"
        cold = httpx.get(base + "/readyz", timeout=10)
        health = httpx.get(base + "/healthz", timeout=10)
        gate.set()
        assert _wait(lambda: httpx.get(base + "/readyz", timeout=10).status_code == 200, 90)
        warm = httpx.get(base + "/readyz", timeout=10)
    assert cold.status_code == 503 and cold.json()["status"] == "warming" and not cold.json()["warm"]["backbone"]
    assert health.status_code == 200  # liveness: the process answers
    body = warm.json()
    assert body["status"] == "ready" and body["warm"] == {"backbone": True, "router": True, "grading_worker": True}
    assert body["router"] == a.name and body["promoted_source"] == "registered"


def test_metrics_hold_every_series(tmp_path, cascade_point):
    """/metrics, parsed as Prometheus text: requests by status/router/key, overhead and upstream histograms, a
    cascade's calls and escalations per request, cost by agent and key, grading overruns, the served router and its
    promotion time (the pointer's promoted_at), swaps."""
    root = tmp_path / "registry"
    entry = _cascade(root, cascade_point)
    stamp = "2026-01-02T03:04:05Z"
    registry.mark_latest(root, entry.name, entry, promoted_at=stamp)
    with serve_in_thread(_app(root, entry)) as srv:
        ask = lambda prompt, **kw: httpx.post(srv.base_url + "/chat/completions", timeout=60,  # noqa: E731
                                              json={"messages": [{"role": "user", "content": prompt}], **kw})
        agree, differ = ask("agree", router_grader="integer"), ask("differ", router_grader="integer")
        plain, bad = ask("plain"), ask("bad", router_grader="morse")
        assert _wait(lambda: httpx.get(srv.base_url[:-3] + "/readyz", timeout=10).json()["promoted_source"]
                     == "promoted_at")
        fams = _families(srv)
    assert [r.status_code for r in (agree, differ, plain, bad)] == [200, 200, 200, 400]
    assert differ.headers["x-router-agents-called"].split(",")[-1] == "strong"
    name = entry.name
    req = "router_lite_requests_total"
    assert _value(fams, "router_lite_requests", req, status="200", router=name, key="") == 3
    assert _value(fams, "router_lite_requests", req, status="400", router=name, key="") == 1
    assert _value(fams, "router_lite_decision_overhead_seconds", "router_lite_decision_overhead_seconds_count",
                  router=name) == 3
    up = "router_lite_upstream_seconds_count"
    assert _value(fams, "router_lite_upstream_seconds", up, agent="cheap1") == 2
    assert _value(fams, "router_lite_upstream_seconds", up, agent="strong") == 2  # escalated to, and `plain`
    calls = "router_lite_cascade_calls_per_request"
    assert _value(fams, calls, calls + "_sum", router=name) == 2 + 3
    assert _value(fams, calls, calls + "_count", router=name) == 2
    esc = "router_lite_cascade_escalations_per_request"
    assert _value(fams, esc, esc + "_sum", router=name) == 1 and _value(fams, esc, esc + "_count", router=name) == 2
    paid = sum(float(r.headers["x-router-cost-usd"]) for r in (agree, differ, plain))
    cost = [s for s in fams["router_lite_cost_usd"].samples if s.name == "router_lite_cost_usd_total"]
    assert {s.labels["agent"] for s in cost} == set(NAMES) and all(s.labels["key"] == "" for s in cost)
    assert sum(s.value for s in cost) == pytest.approx(paid, rel=1e-6)
    assert _value(fams, "router_lite_grading_overruns", "router_lite_grading_overruns_total") == 0
    assert "router_lite_grading_overruns" in fams
    assert _value(fams, "router_lite_router_served", router=name) == 1
    promoted = fams["router_lite_router_promoted_timestamp_seconds"].samples
    assert [(s.labels["router"], s.value) for s in promoted] == [(name, 1767323045.0)]  # 2026-01-02T03:04:05Z
    assert _value(fams, "router_lite_router_swaps", "router_lite_router_swaps_total") == 0
    assert "router_lite_router_swap_failures" in fams


def test_a_reply_names_its_router_even_when_refused(routers):
    root, a, _ = routers
    with serve_in_thread(_app(root, a)) as srv:
        r = httpx.post(srv.base_url + "/chat/completions", json={"messages": []}, timeout=30)
    assert r.status_code == 400 and r.headers["x-router-name"] == a.name


def test_serve_settings_metrics_off_has_no_metrics_route(routers):
    root, a, _ = routers
    app = build_app(registry.load(a), HashBackbone(), AGENTS, client_for, ServeSettings(metrics=False))
    with serve_in_thread(app) as srv:
        r = httpx.get(f"http://{srv.host}:{srv.port}/metrics", timeout=30)
        ok = httpx.post(srv.base_url + "/chat/completions", json={"messages": [{"role": "user", "content": "q"}]},
                        timeout=30)
    assert r.status_code == 404 and ok.status_code == 200
