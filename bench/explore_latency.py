"""Does exploration delay a client's reply? Two routers side by side in this process, one recording with
`--explore 1` (every request explored: its two un-asked agents asked after the reply), one not recording, over the
same fake agents on loopback (3 agents answering after `--delay-ms`, billing a fixed usage.cost); requests alternate
between them, one at a time, and each reply's wall time is taken at the client. Prints p50 / p95 of each and, last,
one JSON line.

    python bench/explore_latency.py [--n 200] [--delay-ms 50]
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import openai

from pipeline.collect.agents import AgentSpec
from pipeline.core.http_server import LoopbackServer
from pipeline.route import registry
from pipeline.route.head import Head
from pipeline.route.ood import OODGuard
from pipeline.serve.app import build_app
from pipeline.serve.explore import Explorer
from pipeline.serve.server import serve_in_thread
from pipeline.serve.settings import ServeSettings
from pipeline.serve.traffic import TrafficRecorder, TrafficSettings, record
from resources.traffic import ExploreSpend, TrafficWriter, days, read_day


class HashBackbone:
    """An 8-dim embedding from the prompt's SHA-256: the router's own time stays small and fixed."""

    dim, model_id, key, device = 8, "hash-8", "hash-8", "cpu"

    def encode(self, texts):
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:8], np.uint8) for t in texts]
        return np.asarray(rows, np.float32) / 255.0 + 0.01


def agents_app(delay_s: float):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat(request):
        body = await request.json()
        await asyncio.sleep(delay_s)
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                             "usage": {"prompt_tokens": 20, "completion_tokens": 5, "cost": 0.001},
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"},
                                          "finish_reason": "stop"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def router(root: Path):
    bb, names = HashBackbone(), ["a0", "a1", "a2"]
    X = bb.encode([f"p{i}" for i in range(30)])
    head = Head(np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32), np.zeros(3, np.float32),
                agents=names)
    reg = registry.load(registry.register(
        root, head, registry.PromptFit(OODGuard(k=3).fit(X, X), 0),
        backbone={"id": bb.model_id, "key": bb.key, "pooling": "mean", "max_seq_length": 128, "dim": 8},
        agents=[{"name": n, "model": f"m{i}"} for i, n in enumerate(names)], training={}, data_hashes={},
        metrics={}))
    reg.guard.threshold = float("inf")
    return reg, names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="requests to each router")
    ap.add_argument("--delay-ms", type=float, default=50.0, help="each fake agent's reply time")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="explore-latency-"))
    reg, names = router(tmp / "reg")
    with LoopbackServer(agents_app(args.delay_ms / 1000.0), name="fake-agents") as up:
        specs = [AgentSpec(n, f"m{i}", "openai_compatible", up.base_url, 1.0, 1.0) for i, n in enumerate(names)]

        def client_for(agent):
            return openai.AsyncOpenAI(api_key="x", base_url=up.base_url, max_retries=0, timeout=30)

        settings = TrafficSettings(record=True, explore=1.0, explore_usd_per_day=1e6)
        writer = TrafficWriter(tmp / "home")
        rec = TrafficRecorder(settings, writer, Explorer(settings, writer, ExploreSpend.of_home(tmp / "home"),
                                                         {"timeout": 30.0, "max_retries": 0}, 100))
        off = build_app(reg, HashBackbone(), specs, client_for, ServeSettings())
        on = record(build_app(reg, HashBackbone(), specs, client_for, ServeSettings()), rec)
        walls: dict[str, list[float]] = {"off": [], "explore": []}
        with serve_in_thread(off) as s_off, serve_in_thread(on) as s_on, httpx.Client(timeout=60) as c:
            for i in range(args.n):
                for name, srv in (("off", s_off), ("explore", s_on)):
                    t0 = time.perf_counter()
                    r = c.post(srv.base_url + "/chat/completions",
                               json={"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 8})
                    walls[name].append((time.perf_counter() - t0) * 1000.0)
                    assert r.status_code == 200, r.text
            time.sleep(1.0)
        rows = [r for d in days(tmp / "home") for r in read_day(tmp / "home", d)[0]]
    out = {"n": args.n, "delay_ms": args.delay_ms, "explored": sum(r["record"] == "exploration" for r in rows)}
    for name, w in walls.items():
        q = statistics.quantiles(w, n=20)
        out[name] = {"p50_ms": round(statistics.median(w), 2), "p95_ms": round(q[18], 2)}
        print(f"{name:<8} p50 {out[name]['p50_ms']:8.2f} ms   p95 {out[name]['p95_ms']:8.2f} ms")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
