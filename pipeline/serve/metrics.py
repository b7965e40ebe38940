"""The endpoint's Prometheus series (`GET /metrics`, text format, prometheus-client); docs/serving.md lists them.

Each chat reply is observed once, after it is answered (`ServeMetrics.observe`), from what the client itself gets:
the status, the router that answered (`X-Router-Name`), the documented `X-Router-*` / `Server-Timing` headers, and for
a cascade every call it made (`request.state.chat.answer.calls`, set by the cascade handler: agent, USD, seconds).
The client key's name is `request.state.client_key` ("" when no key names the client): the authentication code sets
it.

With `serve --workers N` the supervisor points PROMETHEUS_MULTIPROC_DIR at a temporary folder before it starts the
workers (`multiprocess_dir`): prometheus-client then keeps each process's values in files there, and `/metrics`,
whichever worker answers it, sums the counters and histograms of all of them (the router gauges: the maximum over
the live workers). Without that variable the values live in this process (one worker, tests).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import tempfile

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import values as _values

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
KEY_NAME = "client_key"  # request.state attribute set by the client-key middleware (auth.py): the `key` label
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
UPSTREAM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_UPSTREAM_DUR = re.compile(r"upstream;dur=([0-9.]+)")


def multiprocess_mode() -> bool:
    """Whether prometheus-client keeps values in PROMETHEUS_MULTIPROC_DIR files (decided when it was imported)."""
    return bool(getattr(_values.ValueClass, "_multiprocess", False))


class ServeMetrics:
    """The series of one app (a registry of its own, so apps built side by side in one process do not collide)."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("router_lite_requests", "Chat requests answered, by HTTP status, the router that "
                                "answered and the client key's name", ["status", "router", "key"], registry=r)
        self.overhead = Histogram("router_lite_decision_overhead_seconds", "The router's own time per request: "
                                  "request parsed -> agent picked (X-Router-Overhead-Ms)", ["router"],
                                  buckets=OVERHEAD_BUCKETS, registry=r)
        self.upstream = Histogram("router_lite_upstream_seconds", "An agent call: request sent -> reply read (a "
                                  "stream: -> its headers)", ["agent"], buckets=UPSTREAM_BUCKETS, registry=r)
        self.calls = Histogram("router_lite_cascade_calls_per_request", "Agent calls a cascade request made",
                               ["router"], buckets=(1, 2, 3, 4, 5, 6, 8, 12), registry=r)
        self.escalations = Histogram("router_lite_cascade_escalations_per_request", "Stages a cascade request ran "
                                     "beyond its first", ["router"], buckets=(0, 1, 2, 3, 4, 6), registry=r)
        self.cost = Counter("router_lite_cost_usd", "USD paid to the agents (usage.cost, else prices x tokens), by "
                            "agent and client key", ["agent", "key"], registry=r)
        self.overruns = Counter("router_lite_grading_overruns", "Extractions and comparisons of cascade replies "
                                "without a verdict (grading budget overrun or error)", ["router"], registry=r)
        self.served = Gauge("router_lite_router_served", "1 for the router being served, 0 for one served before",
                            ["router"], multiprocess_mode="livemax", registry=r)
        self.promoted = Gauge("router_lite_router_promoted_timestamp_seconds", "When the router was promoted (unix "
                              "s): the pointer's promoted_at, else the entry's registration time (/readyz: "
                              "promoted_source)", ["router"], multiprocess_mode="livemax", registry=r)
        self.traffic_lines = Counter("router_lite_traffic_lines", "Traffic log lines (serve --record-traffic), by "
                                     "outcome: written, failed (a write error: the request was answered), dropped "
                                     "(the writer's queue was full)", ["outcome"], registry=r)
        self.explorations = Counter("router_lite_explorations", "Requests drawn for exploration, by outcome: "
                                    "explored, capped (the day's cap reached), full (queue full), abandoned and "
                                    "cancelled (a stop)", ["outcome"], registry=r)
        self.explore_usd = Counter("router_lite_explore_usd", "USD paid for exploration calls (never charged to a "
                                   "client key)", registry=r)
        self.swaps = Counter("router_lite_router_swaps", "Promotions followed: a new router swapped in", registry=r)
        self.swap_failures = Counter("router_lite_router_swap_failures", "Pointer contents whose router failed to "
                                     "load, validate or warm (the old router kept serving)", registry=r)

    def router(self, served, previous=None) -> None:
        """`served` is now the router answering (`previous`, if any, no longer is)."""
        if previous is not None and previous.router_name != served.router_name:
            self.served.labels(previous.router_name).set(0)
        self.served.labels(served.router_name).set(1)
        self.promoted.labels(served.router_name).set(served.origin["promoted_at"])

    def refused(self, status: int, router: str, key: str) -> None:
        """A chat request the client-key middleware refused (401, 403, 429, 503) before the app saw it."""
        self.requests.labels(str(status), router, key).inc()

    def observe(self, request, resp, router: str) -> None:
        """One answered chat request (any status)."""
        h = resp.headers
        key = getattr(request.state, KEY_NAME, "") or ""
        self.requests.labels(str(resp.status_code), router, key).inc()
        overhead = _number(h.get("X-Router-Overhead-Ms"))
        if overhead is not None:
            self.overhead.labels(router).observe(overhead / 1000.0)
        chat = getattr(request.state, "chat", None)
        calls = chat.answer.calls if chat is not None else None
        if calls is None:  # prompt-only: one agent, its call timed in Server-Timing
            agent, up = h.get("X-Router-Agent"), _UPSTREAM_DUR.search(h.get("Server-Timing", ""))
            calls = [(agent, _number(h.get("X-Router-Cost-Usd")), float(up.group(1)) / 1000.0 if up else None)] \
                if agent else []
        else:
            self.calls.labels(router).observe(len(calls))
            stages = h.get("X-Router-Stage-Ms")
            if stages:
                self.escalations.labels(router).observe(stages.count(",")) # one figure per stage run
            overruns = _number(h.get("X-Router-Grading-Overruns"))
            if overruns:
                self.overruns.labels(router).inc(overruns)
        for agent, usd, seconds in calls:
            if usd is not None and math.isfinite(usd) and usd > 0:
                self.cost.labels(agent, key).inc(usd)
            if seconds is not None:
                self.upstream.labels(agent).observe(seconds)

    def render(self) -> bytes:
        """The text exposition: this app's series, or with PROMETHEUS_MULTIPROC_DIR those of every worker."""
        if multiprocess_mode():
            from prometheus_client import multiprocess

            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)
            return generate_latest(merged)
        return generate_latest(self.registry)


CONTENT_TYPE = CONTENT_TYPE_LATEST


def _number(value) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


@contextlib.contextmanager
def multiprocess_dir():
    """For a supervisor of worker processes: PROMETHEUS_MULTIPROC_DIR set to a new temporary folder while the
    workers run (they inherit it), removed afterwards. A folder the environment names already is used and kept."""
    if os.environ.get(MULTIPROC_ENV):
        yield os.environ[MULTIPROC_ENV]
        return
    path = tempfile.mkdtemp(prefix="router-lite-metrics-")
    os.environ[MULTIPROC_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)

