"""Attacks on served cascades (tests/fault_server.py's agents): an agent dripping a byte a second, a client that
disconnects mid-stage, bursts of simultaneous requests over the connection caps, a grader named twice, non-finite or
absurd costs reported by agents (served and collected). Each gets its documented answer: a timeout at timeout_s and
an escalation, no call after a disconnect, a status line with Retry-After for every request, finite flagged costs."""
from __future__ import annotations

import contextlib
import json
import math
import socket
import time
from pathlib import Path

import pytest
from attack_kit import RowBackbone, cascade_server, chat, fault_client_for, fault_server, graded, world_files


def test_per_call_deadline() -> None:
    """serve: an agent sends its headers then 1 byte/s: upstream_timeout at timeout_s (head, stream, cascade)"""
    import httpx
    import numpy as np

    from pipeline.collect.agents import AgentSpec
    from pipeline.route import registry
    from pipeline.serve.app import build_app
    from pipeline.serve.server import serve_in_thread
    from pipeline.serve.settings import ServeSettings

    took = {}
    with fault_server(drip_s=1.0) as fs:
        fs.always("drip")
        specs = [AgentSpec("expensive", "big-model", "test", None, 10.0, 30.0),
                 AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)]
        X = np.load(world_files().parent.parent / "X.npy")
        app = build_app(registry.load(world_files()), RowBackbone(X), specs, fault_client_for(fs),
                        ServeSettings(upstream_timeout_s=2.0))
        with serve_in_thread(app) as srv, httpx.Client(base_url=srv.base_url, timeout=8) as c:
            for mode, body in (("head", {}), ("stream", {"stream": True})):
                t = time.perf_counter()
                r = chat(c, body=body)
                took[mode] = time.perf_counter() - t
                assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_timeout", (mode, r.text[:200])
                assert took[mode] < 4.0, (mode, took[mode])
        fs.always(None)
        fs.always("drip", model="small-model")  # the cheap stage drips: it times out and escalates
        with cascade_server(fs, upstream_timeout_s=2.0) as srv, httpx.Client(base_url=srv.base_url, timeout=8) as c:
            t = time.perf_counter()
            r = graded(c)
            took["cascade"] = time.perf_counter() - t
            assert r.status_code == 200 and r.headers["x-router-agents-called"] == "cheap,expensive", \
                (r.status_code, r.text[:200])
            assert took["cascade"] < 4.0, took
    print("timeout_s 2: " + ", ".join(f"{k} {v:.1f}s" for k, v in took.items()) + \
        " (502 upstream_timeout; the cascade escalated)")


def test_disconnect_cancels_cascade() -> None:
    """serve: a client that disconnects mid-stage cancels its cascade: the expensive agent is never called"""
    import httpx

    def answer(model, prompt):
        return "I am not sure." if model == "small-model" else "The answer is (A)."

    with fault_server(answer=answer, hang_s=1.5) as fs:
        fs.always("timeout", model="small-model")  # the cheap stage takes 1.5 s and has no answer: it escalates
        with cascade_server(fs) as srv:
            body = json.dumps({"messages": [{"role": "user", "content": "row 3"}]}).encode()
            s = socket.create_connection((srv.host, srv.port), timeout=5)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Router-Grader: mcq_letter\r\n"
                      b"X-Router-Target: quality>=0.5\r\n"
                      b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                      b"\r\n\r\n" + body)
            time.sleep(0.5)  # the cheap call is in flight
            s.close()
            time.sleep(2.5)  # it would have answered, and the expensive agent been called, by now
            gone = fs.hit_counts()
            with httpx.Client(base_url=srv.base_url, timeout=10) as c:  # the same request, waited for: escalates
                r = graded(c)
    by_model = {m: n for (m, _), n in gone.items()}
    assert by_model.get("small-model") == 1 and not by_model.get("big-model"), by_model
    assert r.status_code == 200 and r.headers["x-router-agents-called"] == "cheap,expensive", r.text[:200]
    print(f"calls after the disconnect: {by_model} (a client that waits: cheap,expensive)")


def _burst(host: str, port: int, n: int, grader: str = "mcq_letter", limit_s: float = 60.0) -> list:
    """`n` simultaneous cascade requests, each on its own connection: the status line of each (None: none came)
    with its Retry-After when refused."""
    import asyncio

    body = json.dumps({"messages": [{"role": "user", "content": "row 3"}]}).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Router-Grader: {grader}\r\n"
           f"X-Router-Target: quality>=0.5\r\nContent-Type: "
           f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body

    async def one(go: asyncio.Event):
        await go.wait()
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            return None
        try:
            writer.write(req)  # a client sends its request as soon as it is connected
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            retry = next((ln.split(b":", 1)[1].strip().decode() for ln in head.split(b"\r\n")
                          if ln.lower().startswith(b"retry-after:")), None)
            return status, retry
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            return None
        finally:
            writer.close()

    async def main():
        go = asyncio.Event()
        tasks = [asyncio.ensure_future(one(go)) for _ in range(n)]
        await asyncio.sleep(0.05)
        go.set()
        return await asyncio.wait_for(asyncio.gather(*tasks), limit_s)

    return asyncio.run(main())


def _bursts(rounds: int, n: int, **settings) -> str:
    import collections

    with fault_server() as fs, cascade_server(fs, **settings) as srv:
        seen = collections.Counter()
        for _ in range(rounds):
            got = _burst(srv.host, srv.port, n)
            silent = sum(g is None for g in got)
            assert not silent, f"{silent} of {n} requests got no status line ({collections.Counter(got)})"
            for status, retry in got:
                assert status == 200 or (status in (429, 503) and retry), (status, retry)
                seen[status] += 1
    return f"{rounds} x {n}: every request answered: " + ", ".join(f"{k}: {v}" for k, v in sorted(seen.items()))


def test_burst_small() -> None:
    """serve: a burst of 120 simultaneous cascade requests from one address (idle cap 32): all answered"""
    print(_bursts(1, 120, max_idle_per_client=32))


def test_burst_over_limit() -> None:
    """serve: a burst of 120 over max_connections 48: every request a status (200, or 503/429 + Retry-After)"""
    print(_bursts(1, 120, max_connections=48, max_idle_per_client=16, reserved_connections=8))


@pytest.mark.slow
def test_burst_full() -> None:
    """serve: 3 bursts of 250 simultaneous cascade requests from one address (default caps)"""
    print(_bursts(3, 250))


def test_grader_conflict() -> None:
    """serve: router_grader '' in the body vs the X-Router-Grader header -> 400 naming both"""
    import httpx

    with fault_server() as fs, cascade_server(fs) as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for field in ("", "integer"):
            r = graded(c, body={"router_grader": field})
            msg = r.json()["error"]["message"]
            assert r.status_code == 400 and "router_grader" in msg and "X-Router-Grader" in msg, (field, r.text[:300])
        same = graded(c, body={"router_grader": "mcq_letter"})
        assert same.status_code == 200, same.text[:200]
    print(msg[:100])


def test_non_finite_cost() -> None:
    """serve: an agent's usage.cost Infinity / "inf" -> finite cost header, strict JSON, flagged"""

    import httpx

    def strict(c):
        raise ValueError(f"{c} in the reply")

    with fault_server() as fs, cascade_server(fs) as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for fault in ("cost_inf", "cost_inf_str"):
            fs.always(fault, model="small-model")
            r = graded(c)
            assert r.status_code == 200, r.text[:200]
            cost = float(r.headers["x-router-cost-usd"])
            data = json.loads(r.content, parse_constant=strict)
            assert math.isfinite(cost) and r.headers.get("x-router-cost-invalid") == "cheap", dict(r.headers)
            assert data["router"]["cost_invalid"] == ["cheap"] and math.isfinite(data["router"]["cost_usd"])
    print(f"X-Router-Cost-Usd {cost} (estimated from prices x tokens), X-Router-Cost-Invalid: cheap")


# ------------------------------------------------------------------- numbers a reply or a user hands in, checked
def _strict_json(text: str | bytes):
    def strict(c):
        raise AssertionError(f"{c} in {str(text)[:200]!r}")
    return json.loads(text, parse_constant=strict)


@contextlib.contextmanager
def _access_lines():
    """The access-log lines (logger router_lite.access) written inside the block."""
    import logging

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger, h = logging.getLogger("router_lite.access"), Keep(logging.INFO)
    level = logger.level
    logger.addHandler(h)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(h)
        logger.setLevel(level)


def test_costs_absurd_serve() -> None:
    """serve: two agents each report usage.cost 1e308 -> finite cost header, strict JSON body, SSE and access log, both
    flagged (a prompt-only reply too)"""

    import httpx

    answer = lambda model, prompt: "no idea" if model == "small-model" else "The answer is (A)."  # noqa: E731
    with fault_server(answer=answer) as fs, cascade_server(fs) as srv, _access_lines() as logged, \
            httpx.Client(base_url=srv.base_url, timeout=10) as c:
        fs.always("cost_huge")
        r, s, one = graded(c), graded(c, body={"stream": True}), chat(c)  # one: prompt-only, no grader named
    for resp in (r, s, one):
        assert resp.status_code == 200, resp.text[:200]
        cost = float(resp.headers["x-router-cost-usd"])
        flagged = "cheap,expensive" if resp is not one else one.headers["x-router-agent"]
        assert math.isfinite(cost) and resp.headers.get("x-router-cost-invalid") == flagged, dict(resp.headers)
    assert math.isfinite(_strict_json(one.content)["usage"]["cost"])
    data = _strict_json(r.content)
    assert math.isfinite(data["usage"]["cost"]) and data["router"]["cost_invalid"] == ["cheap", "expensive"], data
    events = [_strict_json(e[6:]) for e in s.text.split("\n\n") if e.startswith("data: {")]
    assert events and all(math.isfinite(e.get("usage", {}).get("cost", 0.0)) for e in events), s.text[:300]
    assert len(logged) == 3 and all(math.isfinite(_strict_json(ln)["cost_usd"]) for ln in logged), logged
    print(f"X-Router-Cost-Usd {r.headers['x-router-cost-usd']} (prices x tokens of both calls), "
            "X-Router-Cost-Invalid: cheap,expensive; a prompt-only reply flagged too")


def test_costs_absurd_collection(tmp_path: Path) -> None:
    """collection: a provider reports usage.cost 1e308; a log already holding 1e308 rows resumes under a budget"""

    import pandas as pd

    from pipeline.collect.agents import AgentSpec
    from pipeline.collect.budget import Budget, collection_state
    from pipeline.collect.call_log import CallLog
    from pipeline.collect.calls import run_collect
    from pipeline.collect.settings import CollectionSettings

    agents = [AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)]
    tasks = pd.DataFrame({"task_id": [f"t{i}" for i in range(4)], "prompt": [f"question {i}" for i in range(4)],
                          "gold": ["A"] * 4, "grader": ["mcq_letter"] * 4})
    settings = CollectionSettings(max_retries=0)
    log = CallLog(tmp_path / "calls")
    with fault_server() as fs:
        fs.always("cost_huge")
        state = lambda: collection_state([tmp_path / "calls"], tasks, agents, 1, settings.hash())  # noqa: E731
        run_collect(tasks.iloc[:2], agents, 0, log, fault_client_for(fs), settings,
                    budget=Budget(1.0, state()["spent"], settings.max_tokens))
        rows = log.read()
        assert len(rows) == 2 and (rows["cost_invalid"] == True).all(), rows.T  # noqa: E712
        assert rows["cost_usd"].map(lambda v: math.isfinite(v) and v < 1e-3).all(), rows["cost_usd"].tolist()
        old = {**log.read().iloc[0].to_dict(), "cost_usd": 1e308}  # what the unchecked code wrote
        old.pop("cost_invalid")
        (tmp_path / "calls" / "cheap.jsonl").write_text("".join(json.dumps({**old, "call_key": k}) + "\n" for k in
                                                           rows["call_key"]))
        before = state()
        assert math.isfinite(before["spent"]) and before["spent"] < 1e-3 and before["cost_invalid"] == 2, before
        budget = Budget(1.0, before["spent"], settings.max_tokens)
        out = run_collect(tasks, agents, 0, log, fault_client_for(fs), settings, budget=budget)
    after = state()
    assert not budget.stopped and after["done"] == 4 and not after["missing"], after
    assert out["cost_usd"].map(math.isfinite).all() and math.isfinite(after["spent"]), out["cost_usd"].tolist()
    print(f"rows hold the estimate, flagged cost_invalid; a 1e308 log reads as ${before['spent']:.6f}, resumed to 4/4")
