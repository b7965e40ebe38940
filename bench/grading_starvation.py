"""Does one answer format's poison delay the others? The cascade of the attack tests' poison rows is served in process
(`poisoned_cascade_app`: cheap_a and cheap_b asked first, k=2, else strong); N math_expression requests whose two
cheap agents answer two different sympy poisons (an exp tower, a tan of one: their comparison overruns the grading
budget) are put in flight, then 20 good `integer` requests (both cheap agents say 7: no sympy) are sent. Prints per N
the good requests' latency (p50 / p95 / max), the poisoned ones' outcome (statuses, how many escalated to strong,
overruns counted), /healthz latency meanwhile, and the grading worker processes alive after.

    python bench/grading_starvation.py [--poisoned 60,200] [--good 20] [--control]

`--control`: the same requests with good math_expression replies (the cheap agents agree, no sympy): what the load
itself costs on this machine.

The old code side by side: the same script on a copy of an older tree, e.g.
    git archive de80346 | tar -x -C /tmp/old && cp bench/grading_starvation.py /tmp/old/bench/ \
        && cp tests/attack_kit.py tests/fault_server.py /tmp/old/tests/
    python /tmp/old/bench/grading_starvation.py
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "tests")) if p not in sys.path]

from _load import pct  # noqa: E402 - bench/ is the script's directory
from attack_kit import grading_workers, poisoned_cascade_app  # noqa: E402 - tests/attack_kit.py

from pipeline.collect import bounded  # noqa: E402
from pipeline.serve.server import serve_in_thread  # noqa: E402

POISON = (r"The answer is $\exp(\exp(\exp(100)))$", r"The answer is $\tan(\exp(\exp(20)))$")


def reply_of(agent: str, grader: str, i: int) -> str:
    if agent == "strong":
        return "The answer is 1"
    if grader == "integer" or CONTROL:
        return "The answer is 7"
    return POISON[agent == "cheap_b"]  # two different poisons: their comparison needs sympy


CONTROL = False  # --control: the same load, the math_expression replies good (no sympy): what the load alone costs


async def scenario(base_url: str, health_url: str, n_poisoned: int, n_good: int) -> dict:
    limits = httpx.Limits(max_connections=n_poisoned + n_good + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as c:
        async def ask(grader: str, i: int) -> tuple[httpx.Response, float]:
            t = time.perf_counter()
            r = await c.post("/chat/completions", headers={"X-Router-Grader": grader},
                             json={"messages": [{"role": "user", "content": f"{grader} {i} row {i}"}]})
            return r, time.perf_counter() - t

        t0 = time.perf_counter()
        poisoned = [asyncio.ensure_future(ask("math_expression", i)) for i in range(n_poisoned)]
        await asyncio.sleep(1.0)  # they are in: routed, their cheap replies graded (or queued for it)
        in_flight = sum(not p.done() for p in poisoned)
        good_task = asyncio.ensure_future(asyncio.gather(*(ask("integer", 1000 + i) for i in range(n_good))))
        health: list[float] = []
        while not good_task.done() or not all(p.done() for p in poisoned):
            t = time.perf_counter()
            r = await c.get(health_url)
            assert r.status_code == 200, r.status_code
            health.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.05)
        good, bad = await good_task, await asyncio.gather(*poisoned)
    wall = time.perf_counter() - t0
    good_s = [s for _, s in good]
    overruns = sum(int(r.headers.get("x-router-grading-overruns", 0)) for r, _ in bad)
    return {
        "poisoned": n_poisoned, "poisoned_in_flight_when_good_sent": in_flight,
        "good": {"n": n_good, "status": dict(collections.Counter(r.status_code for r, _ in good)),
                 "answered_by": dict(collections.Counter(r.headers.get("x-router-agent") for r, _ in good)),
                 "p50_s": pct(good_s, 50), "p95_s": pct(good_s, 95), "max_s": max(good_s)},
        "poisoned_outcome": {"status": dict(collections.Counter(r.status_code for r, _ in bad)),
                             "escalated_to_strong": sum(r.headers.get("x-router-agent") == "strong" for r, _ in bad),
                             "overruns_counted": overruns,
                             "p50_s": pct([s for _, s in bad], 50), "max_s": max(s for _, s in bad)},
        "healthz_ms": {"polls": len(health), "p50": pct(health, 50), "p95": pct(health, 95), "max": max(health)},
        "wall_s": wall,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--poisoned", default="60,200", help="comma-separated numbers of poisoned requests in flight")
    ap.add_argument("--good", type=int, default=20)
    ap.add_argument("--control", action="store_true", help="the N math_expression requests are good too")
    a = ap.parse_args(argv)
    global CONTROL
    CONTROL = a.control
    import pipeline

    print(f"code: {Path(pipeline.__file__).parent.parent}; load average {os.getloadavg()}", flush=True)
    bounded.warm_up(background=False)  # as `router-lite serve` does at start
    tmp = Path(tempfile.mkdtemp(prefix="grading-starvation-"))
    out = []
    for n in (int(x) for x in a.poisoned.split(",")):
        # every poisoned request connected at once: room for them beside the per-address idle cap
        app = poisoned_cascade_app(tmp, reply_of, max_idle_per_client=n + a.good + 8)
        with serve_in_thread(app) as srv:
            asyncio.run(scenario(srv.base_url, srv.url + "/healthz", 1, 1))  # the first request's set-up
            got = scenario(srv.base_url, srv.url + "/healthz", n, a.good)
            res = asyncio.run(got)
        time.sleep(1.0)  # an overrun worker being killed gets its moment
        res["grading_workers_after"], res["pool_size"], res["grading_counts"] = (grading_workers(), bounded.POOL_SIZE,
                                                                                 bounded.counts())
        res["load_average_after"] = os.getloadavg()
        print(json.dumps(res), flush=True)
        out.append(res)
    print("\n| poisoned in flight | good p50 / p95 / max s | poisoned: 200 / escalated / overruns | poisoned max s "
          "| /healthz p95 / max ms | workers after |\n|---|---|---|---|---|---|")
    for r in out:
        g, p, h = r["good"], r["poisoned_outcome"], r["healthz_ms"]
        print(f"| {r['poisoned']} | {g['p50_s']:.2f} / {g['p95_s']:.2f} / {g['max_s']:.2f} | "
              f"{p['status'].get(200, 0)} / {p['escalated_to_strong']} / {p['overruns_counted']} | {p['max_s']:.1f} | "
              f"{h['p95']:.0f} / {h['max']:.0f} | {r['grading_workers_after']} (pool {r['pool_size']}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
