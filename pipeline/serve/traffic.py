"""Recording served traffic, by the operator's choice (`serve --record-traffic`; docs/serving.md, "Recording
traffic"): one "request" line per request the router decided on, in the format /work notes call the traffic schema
(`v` 1: routed text, conversation hash, decision, every call with its reply, cost and latency, the client key's
name, never the key), written by the process's `TrafficWriter` (resources/traffic.py: the only code that knows the
files), and for a seeded share of them the agents the decision did not ask, asked after the reply
(pipeline/serve/explore.py).

The app calls `TrafficRecorder.after_reply` once, where the reply is known (app.py `_chat`); the line is made after
the client has the reply: a whole reply's in a background task of the response, a stream's when its last chunk has
gone. Nothing here ever fails a request: a line that cannot be made or written is one warning and a metric.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import re
import time

from pipeline.core.errors import RouterLiteError
from pipeline.serve.metering import StreamCost
from pipeline.serve.requests import _content_text

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_UPSTREAM_DUR = re.compile(r"upstream;dur=([0-9.]+)")


@dataclasses.dataclass(frozen=True)
class TrafficSettings:
    """What `serve` records and explores (its options; the profile's `serve` section gives the defaults):

    record = False
        Record each request (`--record-traffic`).
    retention_days = 30
        Days of the log kept: older day folders are deleted when a server starts and each day after.
    explore = 0.0
        Share of recorded requests (seeded by their conversation hash) whose un-asked agents are asked after the
        reply (`--explore`).
    explore_usd_per_day = None
        The exploration's cap, USD per UTC day, all workers of the home together (required when explore > 0).
    explore_seed = 0
        Seed of the exploration draw: the same requests are drawn again on a rerun.
    explore_concurrency = 4
        Exploration calls in flight per worker, at most (the profile's collection concurrency caps it).
    explore_queue = 256
        Explorations waiting per worker, at most; beyond, a drawn request is not explored (counted).
    explore_drain_s = 5.0
        On a stop, how long explorations in flight may finish; queued ones are abandoned.
    """

    record: bool = False
    retention_days: int = 30
    explore: float = 0.0
    explore_usd_per_day: float | None = None
    explore_seed: int = 0
    explore_concurrency: int = 4
    explore_queue: int = 256
    explore_drain_s: float = 5.0

    def __post_init__(self) -> None:
        if not int(self.retention_days) >= 1:
            raise RouterLiteError(f"--traffic-retention-days {self.retention_days} must be >= 1 day")
        if not 0.0 <= float(self.explore) <= 1.0:  # NaN too
            raise RouterLiteError(f"--explore {self.explore} must be a share in [0, 1]")
        if self.explore > 0 and not self.record:
            raise RouterLiteError("--explore asks the un-asked agents of recorded requests: pass --record-traffic "
                                  "too (or serve.record_traffic: true in the profile)")
        if self.explore > 0 and self.explore_usd_per_day is None:
            raise RouterLiteError("--explore needs its cap: pass --explore-usd-per-day USD (or "
                                  "serve.explore_usd_per_day in the profile)")
        if self.explore_usd_per_day is not None and not float(self.explore_usd_per_day) >= 0:
            raise RouterLiteError(f"--explore-usd-per-day {self.explore_usd_per_day} must be >= 0 USD")
        for name in ("explore_concurrency", "explore_queue"):
            if int(getattr(self, name)) < 1:
                raise RouterLiteError(f"traffic setting {name}={getattr(self, name)!r} must be >= 1")


def conversation_hash(messages: list[dict]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode("utf-8",
                                                                                          "surrogatepass")).hexdigest()


def drawn(conv_hash: str, share: float, seed: int) -> bool:
    """Whether a request is explored: a uniform draw from its conversation hash and the seed (reruns draw alike)."""
    if share <= 0:
        return False
    u = int(hashlib.sha256(f"{int(seed)}|{conv_hash}".encode()).hexdigest()[:16], 16) / float(1 << 64)
    return u < share


def recorded_messages(messages: list) -> list[dict]:
    """The messages as the log keeps them: role and text content (content parts joined)."""
    out = []
    for m in messages:
        m = m if isinstance(m, dict) else {}
        out.append({"role": str(m.get("role", "")), "content": _content_text(m.get("content")) or ""})
    return out


def stamp(now: datetime.datetime | None = None) -> tuple[str, str]:
    """(ISO-8601 UTC with milliseconds and Z, the UTC day)."""
    now = now or datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z", now.strftime("%Y-%m-%d")


def call(agent: str, model: str, reply: str | None = None, cost: float | None = None, latency_ms: float = 0.0,
         finish_reason: str | None = None, error: str | None = None) -> dict:
    """One CALL of the schema."""
    return {"agent": agent, "model": model, "reply": reply, "cost_usd": None if cost is None else float(cost),
            "latency_ms": round(float(latency_ms), 3), "finish_reason": finish_reason, "error": error}


def reply_call(r, spec, client) -> dict:
    """The CALL of a cascade stage's or an exploration's `Reply` (pipeline/serve/cascade_calls.py)."""
    from pipeline.collect.client import parse_completion
    from pipeline.serve.relay import upstream_error

    if r.data is None:
        err = upstream_error(spec, client, r.error or ValueError("no usable reply")).message
        return call(spec.name, spec.model, None, r.cost, r.latency_ms, None, err)
    try:
        fields = parse_completion(r.data)
        text, finish = fields["text"], fields["finish_reason"]
    except ValueError as exc:
        return call(spec.name, spec.model, None, r.cost, r.latency_ms, None, str(exc)[:1000])
    return call(spec.name, spec.model, text, r.cost, r.latency_ms, finish if isinstance(finish, str) else None)


def _one_call(resp, answer, spec, stream_tap=None) -> dict:
    """The CALL of a prompt-routed request: its whole reply's body (or the 502's message), or the relayed stream."""
    timing = _UPSTREAM_DUR.search(resp.headers.get("Server-Timing", ""))
    latency = float(timing.group(1)) if timing else 0.0
    if stream_tap is not None:
        return call(spec.name, spec.model, "".join(stream_tap.parts), stream_tap.cost(),
                    latency + stream_tap.elapsed_ms(), stream_tap.finish_reason, stream_tap.error)
    body = json.loads(bytes(resp.body)) if resp.body else {}
    if resp.status_code != 200:
        return call(spec.name, spec.model, None, answer.cost_usd, latency, None,
                    str((body.get("error") or {}).get("message") or f"HTTP {resp.status_code}"))
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = message.get("content") if isinstance(message.get("content"), str) else None
    return call(spec.name, spec.model, text, answer.cost_usd, latency, choice.get("finish_reason"))


def request_line(rid: str, served, chat, resp, key_name: str | None, settings: TrafficSettings,
                 stream_tap=None) -> dict:
    """The "request" line of a decided request (`chat`: its ChatRequest, `resp`: what the client got)."""
    answer = chat.answer
    ts, day = stamp()
    specs = list(served.specs)
    by_name = {s.name: (s, c) for s, c in zip(specs, served.clients)}
    if answer.replies is not None:  # a cascade: every stage's calls
        calls = [reply_call(r, specs[r.agent], served.clients[r.agent]) for r in answer.replies]
    else:
        calls = [_one_call(resp, answer, by_name[answer.agent][0], stream_tap)]
    messages = recorded_messages(chat.upstream.get("messages", []))
    conv = conversation_hash(messages)
    policy = "guard" if answer.ood else "cascade" if answer.replies is not None else served.registered.kind
    agent = answer.agent if resp.status_code == 200 else None
    return {"v": SCHEMA_VERSION, "record": "request", "request_id": rid, "ts": ts, "day": day,
            "router": served.router_name, "target": answer.target, "pool": [s.name for s in specs],
            "agent_models": {s.name: s.model for s in specs}, "routed_text": chat.text, "messages": messages,
            "conversation_hash": conv,
            "decision": {"agent": agent, "policy": policy, "ood": bool(answer.ood), "format": answer.grader},
            "calls": calls, "explore": resp.status_code == 200 and drawn(conv, settings.explore,
                                                                           settings.explore_seed),
            "key_name": key_name}


def record(app, recorder: TrafficRecorder | None):
    """`app` (build_app's) records its traffic with `recorder` (None: nothing recorded); the app."""
    app.state.traffic = recorder
    if recorder is not None:
        recorder.attach(app.state.metrics)
    return app


class StreamTap(StreamCost):
    """A relayed stream's text, finish reason and cost, read as its chunks go out (`elapsed_ms`: since the first)."""

    def __init__(self, spec, upstream: dict):
        super().__init__(spec, upstream)
        self.t0, self.t1, self.error = None, None, None

    def feed(self, chunk: bytes) -> None:
        self.t0 = self.t0 or time.perf_counter()
        self.t1 = time.perf_counter()
        super().feed(chunk)

    def elapsed_ms(self) -> float:
        return 0.0 if self.t0 is None else (self.t1 - self.t0) * 1000.0


class TrafficRecorder:
    """The app's recorder (`app.state.traffic`): `writer` (a resources.traffic.TrafficWriter) takes the lines,
    `explorer` (pipeline/serve/explore.py `Explorer`, or None) the drawn requests."""

    def __init__(self, settings: TrafficSettings, writer, explorer=None):
        self.settings, self.writer, self.explorer = settings, writer, explorer
        self.metrics = None

    def attach(self, metrics) -> None:
        """Count lines and explorations in the app's metrics (pipeline/serve/metrics.py; None: none)."""
        self.metrics = metrics
        if metrics is not None:
            self.writer.on_outcome = lambda outcome, n: metrics.traffic_lines.labels(outcome).inc(n)
        if self.explorer is not None:
            self.explorer.metrics = metrics

    def after_reply(self, request, resp, rid: str):
        """The app's hook: `resp` (returned) records its request once the client has it. Never raises."""
        try:
            chat = getattr(request.state, "chat", None)
            if chat is None or chat.answer.agent is None and not chat.answer.agents_called:
                return resp  # refused before a decision: nothing was routed
            served = request.state.served
            key = getattr(request.state, "client_key", None)
            if getattr(resp, "body_iterator", None) is not None:  # a relayed stream: recorded when it ends
                spec = next(s for s in served.specs if s.name == chat.answer.agent)
                resp.body_iterator = self._tapped(resp.body_iterator, StreamTap(spec, chat.upstream), rid, served,
                                                  chat, resp, key)
                return resp
            from starlette.background import BackgroundTask

            resp.background = BackgroundTask(self._record, rid, served, chat, resp, key, None)
        except Exception as exc:  # noqa: BLE001 - recording never fails a request
            self.writer.failed_line(exc)
        return resp

    async def _tapped(self, chunks, tap: StreamTap, rid, served, chat, resp, key):
        try:
            async for chunk in chunks:
                tap.feed(chunk)
                yield chunk
        finally:
            await self._record(rid, served, chat, resp, key, tap)

    async def _record(self, rid, served, chat, resp, key, tap) -> None:
        try:
            line = request_line(rid, served, chat, resp, key, self.settings, tap)
        except Exception as exc:  # noqa: BLE001
            self.writer.failed_line(exc)
            return
        self.writer.write(line)
        if line["explore"] and self.explorer is not None:
            self.explorer.submit(rid, served, chat.upstream, [c["agent"] for c in line["calls"]])

    async def close(self) -> None:
        """On the app's shutdown: explorations finished or abandoned (explore.py), then every line written."""
        if self.explorer is not None:
            await self.explorer.close(self.settings.explore_drain_s)
        import asyncio

        await asyncio.to_thread(self.writer.close)
