"""The router as an OpenAI-compatible HTTP endpoint (starlette; no Dagster).

`build_app(registered, backbone, agents, client_for, settings)` returns an ASGI app:

- `POST /v1/chat/completions`: validate the request, embed the text of the **last user message** with the frozen
  backbone, let the registered head pick one agent (the OOD guard sends far-away queries to the best single agent;
  the head is any router kind of pipeline/route/routers.py, picked through the registry's `route`),
  forward the request's messages and sampling parameters to that agent's model through its `openai.AsyncOpenAI`
  client, and return the agent's **real reply body** with one key added, `"router": {"head", "agent", "model",
  "ood_guard"}`. `model` in the body stays the agent's model (the one that wrote the reply); the head's name is in
  `router.head`. Response headers: `X-Router-Head`, `X-Router-Agent`, `X-Router-Model`, `X-Router-OOD`
  (`true`/`false`), `X-Router-Overhead-Ms` (request parsed -> agent picked: validation + embedding, queueing for
  the embedder included, + pick; the agent's own latency excluded), and `Server-Timing: router;dur=<that>,
  upstream;dur=<ms>` (the agent's call: request sent -> reply read; with `stream=true`, -> its headers).
  `stream=true` passes the agent's SSE stream through byte for byte, except that the first JSON chunk gets the
  same `"router"` key; the headers carry the pick too.
- `GET /v1/models` (and `/v1/models/{id}`): one model, the registered head's name.
- `GET /healthz`: `{"status": "ok", "head", "agents", "backbone", "device"}`.

Errors are OpenAI-style `{"error": {"message", "type", "param", "code"}}`:
400 malformed JSON / not an object / nested deeper than `max_json_depth` / a string that is not valid text (a lone
UTF-16 surrogate) / missing or empty `messages` / a malformed message / more than `max_messages` messages / no
user message with text / body over `max_body_bytes` / a bad sampling parameter (`max_tokens` over
`max_tokens_cap`, a `seed` outside 64 bits, ...) / text the embedder refuses;
404 a `model` other than the head's name (absent is fine) or an unknown path; 405 a wrong method;
502 the picked agent failed (HTTP error, timeout, connection, unusable body; message scrubbed of the client's key,
the router headers still name the agent); 500 an unexpected router failure.

Forwarded to the agent: `messages` as given, and of the request's parameters only `max_tokens`,
`max_completion_tokens`, `temperature`, `top_p`, `stop`, `seed`, `stream`, `stream_options`; `settings.defaults`
fills those the request leaves out (the CLI uses the profile's collection settings, so agents answer as they did
when their rewards were measured). Any other request field is ignored. No retries: the client decides.

Embedding runs in one worker thread, never on the event loop, through a micro-batcher: the first new prompt waits
at most `batch_wait_ms` for others (or until `max_batch` are queued), requests that arrive while the worker is busy
join the next batch, and a batch that fails is retried prompt by prompt so only the culprit's request fails. Each
prompt is cut by characters before tokenising (pipeline/core/text_guard.py), so a 1 MB prompt costs what a long normal
one does. Connections: a request head must arrive within `header_timeout_s`, its body within `body_timeout_s`, at
most `max_connections` are open at once (pipeline/core/http_server.py). An LRU of recent prompts
(`embed_cache_size`, keyed by a SHA-256 of the text) keeps their routing decision: a repeated prompt is not
re-embedded (the head and guard are fixed, so the decision is what its embedding would give).

`serve_in_thread(app)` runs the app under uvicorn on a loopback port in a daemon thread (tests, benchmarks);
`router-lite serve` (cli/main.py) runs it in the foreground. There is no authentication: bind to loopback or
put a proxy in front.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipeline.collect.agents import AgentSpec
from pipeline.collect.client import scrub
from pipeline.core.errors import RouterLiteError
from pipeline.core.http_server import LoopbackServer, guarded_h11
from pipeline.core.text_guard import json_problem
from pipeline.route.targets import TARGET_FIELD, TARGET_HEADER, request_target

log = logging.getLogger(__name__)

FORWARDED_PARAMS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "stream",
                    "stream_options")
MODEL_OWNER = "router-lite"
MAX_MESSAGE_CHARS = 1000  # an error message sent to a client, at most
MAX_TARGETS = 16  # target names whose head view is kept (LRU; the server's default is never evicted)
GRADER_FIELD, GRADER_HEADER = "router_grader", "X-Router-Grader"  # a cascade compares answers with this grader
MAX_CASCADE_VIEWS = 64  # (target, grader) views of a cascade kept; more are made per request, not cached


# ------------------------------------------------------------------------------------------------------ settings
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)  # a signed 64-bit integer, as providers take it


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    max_body_bytes: int = 1 << 20  # 1 MiB
    max_messages: int = 64
    max_json_depth: int = 32  # nesting of the request body (messages with content parts need 5)
    max_tokens_cap: int = 32768  # the largest max_tokens / max_completion_tokens forwarded (the CLI: the profile's)
    embed_cache_size: int = 1024  # prompts whose routing decision is kept (0 = no cache)
    max_batch: int = 32  # prompts per embedding batch (1 = every request embedded alone: the unbatched path)
    batch_wait_ms: float = 2.0  # how long the first request of a batch waits for others (0 = no wait)
    upstream_timeout_s: float = 180.0
    header_timeout_s: float = 10.0  # a connection's request head must arrive within this (slowloris)
    body_timeout_s: float = 30.0  # ... and its body within this of the head
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    max_connections: int = 1024  # connections open at once; beyond: the oldest idle one is closed, else 503
    max_idle_per_client: int = 128  # connections waiting for a request head per client address (oldest closed)
    reserved_connections: int = 64  # slots idle connections never take: kept for requests with a complete head
    max_head_bytes: int = 16 * 1024  # request line + headers; more -> 431
    defaults: dict = dataclasses.field(default_factory=dict)  # forwarded params used when a request omits them
    default_target: str | None = None  # operating point when a request names none (pipeline/route/targets.py)
    default_grader: str | None = None  # a cascade's answer format when a request names none (None: prompt-only)

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_messages", "max_batch", "max_json_depth", "max_tokens_cap",
                     "max_connections", "max_idle_per_client", "max_head_bytes"):
            if int(getattr(self, name)) < 1:
                raise RouterLiteError(f"serve setting {name}={getattr(self, name)!r} must be >= 1")
        for name in ("embed_cache_size", "reserved_connections"):
            if int(getattr(self, name)) < 0:
                raise RouterLiteError(f"serve setting {name}={getattr(self, name)!r} must be >= 0")
        if not 0 <= float(self.batch_wait_ms) <= 1000:
            raise RouterLiteError(f"serve setting batch_wait_ms={self.batch_wait_ms!r} must lie in [0, 1000]")
        for name in ("upstream_timeout_s", "header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if float(getattr(self, name)) <= 0:
                raise RouterLiteError(f"serve setting {name}={getattr(self, name)!r} must be > 0")
        unknown = sorted(set(self.defaults) - set(FORWARDED_PARAMS) - {"reasoning"})
        if unknown:
            raise RouterLiteError(f"serve defaults {unknown} are not forwarded parameters; known: "
                                  f"{', '.join(FORWARDED_PARAMS + ('reasoning',))}")

    @classmethod
    def from_collection(cls, collection, **kw) -> ServeSettings:
        """Defaults from a `pipeline.collect.settings.CollectionSettings` (max_tokens, temperature, top_p, reasoning
        effort, timeout): agents answer under the settings their rewards were measured with."""
        defaults = {"max_tokens": int(collection.max_tokens), "temperature": collection.temperature,
                    "top_p": collection.top_p}
        if collection.reasoning_effort:
            defaults["reasoning"] = {"effort": collection.reasoning_effort}
        kw.setdefault("upstream_timeout_s", float(collection.timeout_s))
        kw.setdefault("max_tokens_cap", int(collection.max_tokens))
        return cls(defaults=defaults, **kw)

    def uvicorn_options(self) -> dict:
        """uvicorn.Config / uvicorn.run keyword arguments enforcing the connection limits."""
        return {"http": guarded_h11(self.header_timeout_s, self.body_timeout_s, self.max_connections,
                                    max_idle_per_client=self.max_idle_per_client,
                                    reserved=min(self.reserved_connections, self.max_connections - 1),
                                    max_head_bytes=self.max_head_bytes),
                "timeout_keep_alive": self.keep_alive_s, "h11_max_incomplete_event_size": self.max_head_bytes + 1}


# ------------------------------------------------------------------------------------------------------- errors
class RequestError(Exception):
    """An error answered to the client as OpenAI-style JSON."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 type_: str = "invalid_request_error"):
        if len(message) > MAX_MESSAGE_CHARS:  # the last guard: every echoed value is cut where it is rendered
            message = message[:MAX_MESSAGE_CHARS] + "..."
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = status, message, code, param, type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    text: str  # what is embedded: the text of the last user message
    upstream: dict  # what is forwarded, less `model`
    stream: bool
    body: dict = dataclasses.field(default_factory=dict, repr=False)  # the whole validated body (further fields)


def _show(v: Any, limit: int = 80) -> str:
    """A client's value in an error message: repr (escapes control characters and surrogates), cut."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        parts = [p for p in parts if isinstance(p, str)]
        return "".join(parts) if parts else None
    return None


def _number(req: dict, name: str, lo: float, hi: float) -> None:
    v = req.get(name)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise RequestError(400, f"'{name}' must be a number in [{lo:g}, {hi:g}], got {_show(v)}", "invalid_value",
                           name)


def _integer(req: dict, name: str, lo: int, hi: int, what: str) -> None:
    v = req.get(name)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
        raise RequestError(400, f"'{name}' must be {what}, got {_show(v)}", "invalid_value", name)


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")  # NaN / Infinity: Python's json accepts them, providers do not


def load_json_body(body: bytes, settings: ServeSettings) -> dict:
    """The body as a JSON object, within the depth limit and holding only valid text; else a 400."""
    try:
        req = json.loads(body, parse_constant=_not_json)
    except RecursionError:  # deeper than the interpreter's stack allows: far over max_json_depth
        raise RequestError(400, f"request body is JSON nested deeper than {settings.max_json_depth} levels",
                           "json_too_deep") from None
    except (ValueError, UnicodeDecodeError):
        raise RequestError(400, "request body is not valid JSON", "invalid_json") from None
    if not isinstance(req, dict):
        raise RequestError(400, "request body must be a JSON object", "invalid_json")
    problem = json_problem(req, settings.max_json_depth)
    if problem is not None:
        path, reason = problem[0][:200], problem[1]
        code = "json_too_deep" if reason.startswith("JSON nested") else "invalid_text"
        raise RequestError(400, f"{path}: {reason}", code, path)
    return req


def parse_chat_request(body: bytes, head_name: str, settings: ServeSettings) -> ChatRequest:
    """Validate a chat-completions body (a pure function: the whole 400/404 contract lives here)."""
    req = load_json_body(body, settings)
    model = req.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, f"'model' must be a string, got {type(model).__name__}", "invalid_value", "model")
    if model not in (None, "", head_name):
        raise RequestError(404, f"The model {_show(model)} does not exist: this router serves `{head_name}` "
                                "(or leave `model` out)", "model_not_found", "model")
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "missing required parameter: 'messages' (a non-empty list)", "missing_messages",
                           "messages")
    if len(messages) > settings.max_messages:
        raise RequestError(400, f"too many messages: {len(messages)} > {settings.max_messages}", "too_many_messages",
                           "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(400, f"messages[{i}] must be an object with a string 'role'", "invalid_message",
                               f"messages[{i}]")
    last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
    if last_user is None:
        raise RequestError(400, "no user message: the router embeds the last message with role 'user'",
                           "missing_user_message", "messages")
    text = _content_text(last_user.get("content"))
    if not text or not text.strip():
        raise RequestError(400, "the last user message has no text content", "missing_user_message", "messages")
    cap = int(settings.max_tokens_cap)
    for name in ("max_tokens", "max_completion_tokens"):
        _integer(req, name, 1, cap, f"an integer in [1, {cap}] (this router's cap)")
    _integer(req, "seed", *SEED_RANGE, "a 64-bit signed integer")
    _number(req, "temperature", 0.0, 2.0)
    _number(req, "top_p", 0.0, 1.0)
    stream = req.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(400, f"'stream' must be a boolean, got {_show(stream)}", "invalid_value", "stream")
    so = req.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise RequestError(400, "'stream_options' must be an object", "invalid_value", "stream_options")
    stop = req.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and len(stop) <= 4
                                                           and all(isinstance(s, str) for s in stop))):
        raise RequestError(400, "'stop' must be a string or a list of up to 4 strings", "invalid_value", "stop")
    n = req.get("n")
    if n is not None and (type(n) is not int or n != 1):  # `true` and `1.0` equal 1 in Python: not here
        raise RequestError(400, "'n' must be 1: the router returns one agent's reply", "invalid_value", "n")
    own_limit = req.get("max_tokens") is not None or req.get("max_completion_tokens") is not None
    upstream = {k: v for k, v in settings.defaults.items()
                if not (own_limit and k in ("max_tokens", "max_completion_tokens"))}
    upstream.update({k: req[k] for k in FORWARDED_PARAMS if req.get(k) is not None})
    if not stream:
        upstream.pop("stream_options", None)
        upstream.pop("stream", None)
    upstream["messages"] = messages
    return ChatRequest(text=text, upstream=upstream, stream=bool(stream), body=req)


# ------------------------------------------------------------------------------------------------------- router
@dataclasses.dataclass(frozen=True)
class Decision:
    index: int  # into the head's agent order
    ood: bool
    cached: bool


class DecisionBatcher:
    """Embed-and-pick through a micro-batcher: one worker thread, batches of up to `max_batch` distinct prompts
    collected for at most `batch_wait_ms`, an LRU of decisions (one per app).

    Every operating point shares it: a request may name its own head view (`decide(text, head, tag)`); a prompt is
    embedded once per batch whatever the targets asking for it, and each target's view picks from that embedding.

    The wait applies only while other requests are `arriving` (counted by the app from the start of a request
    until it asks for its decision): a lone client never waits for a batch that nobody else will join.

    A batch that fails is retried prompt by prompt (in the worker thread), so one bad prompt fails only its own
    request. Each waiter gets the decision for its own text (matched by text, not by position).
    """

    def __init__(self, registered, backbone, settings: ServeSettings):
        self.registered, self.backbone, self.settings = registered, backbone, settings
        self._cache: collections.OrderedDict[bytes, tuple[int, bool]] = collections.OrderedDict()
        self._pending: list[tuple[bytes, str, Any, asyncio.Future]] = []
        self._worker: asyncio.Task | None = None
        self._joined: asyncio.Event | None = None  # set whenever a prompt is queued
        self.arriving = 0  # requests being read or validated (the app counts them): they may join the next batch
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="router-embed")
        self.batches: collections.Counter[int] = collections.Counter()  # batch size -> count (tests, benchmarks)

    def embed_isolated(self, texts: Sequence[str]) -> dict[str, np.ndarray | Exception]:
        """Blocking: text -> embedding row; when the batch fails, each text is retried alone so only culprits fail."""
        try:
            return dict(zip(texts, self.backbone.encode(list(texts)), strict=True))
        except Exception as exc:  # noqa: BLE001 - find the culprit(s) below
            if len(texts) == 1:
                return {texts[0]: exc}
            log.warning("embedding a batch of %d prompts failed (%s): retrying them one by one", len(texts),
                        type(exc).__name__)
        out: dict[str, np.ndarray | Exception] = {}
        for t in texts:
            try:
                out[t] = self.backbone.encode([t])[0]
            except Exception as exc:  # noqa: BLE001 - this prompt's own failure
                out[t] = exc
        return out

    def route_isolated(self, asks: Sequence[tuple[str, Any]]) -> list[tuple[int, bool] | Exception]:
        """Blocking: one outcome per (text, head view): distinct texts embedded once, each view picks (after its
        OOD guard) for the rows that asked it."""
        rows = self.embed_isolated(list(dict.fromkeys(t for t, _ in asks)))
        out: list[tuple[int, bool] | Exception] = [rows[t] if isinstance(rows[t], Exception) else None for t, _ in asks]
        by_head: dict[int, list[int]] = {}
        for i, (_, head) in enumerate(asks):
            if out[i] is None:
                by_head.setdefault(id(head), []).append(i)
        for idx in by_head.values():
            head = asks[idx[0]][1]
            try:
                picks, fired = head.route(np.stack([rows[asks[i][0]] for i in idx]))
                for i, p, f in zip(idx, picks, fired, strict=True):
                    out[i] = (int(p), bool(f))
            except Exception as exc:  # noqa: BLE001 - this view's failure, not the other targets'
                for i in idx:
                    out[i] = exc
        return out

    async def decide(self, text: str, head=None, tag: str = "") -> Decision:
        """The pick for `text` by `head` (a view of the head at one operating point; default: the DecisionBatcher's
        own), cached under `tag` + text (the tag names the operating point)."""
        head = self.registered if head is None else head
        key = hashlib.sha256(tag.encode() + b"\0" + text.encode("utf-8", "surrogatepass")).digest()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return Decision(hit[0], hit[1], True)
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((key, text, head, fut))
        if self._joined is None:
            self._joined = asyncio.Event()
        self._joined.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        idx, ood = await fut
        return Decision(idx, ood, False)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        wait_s = float(self.settings.batch_wait_ms) / 1000.0
        while self._pending:
            deadline = loop.time() + wait_s
            # let requests that are being read join, for at most wait_s
            while len(self._pending) < self.settings.max_batch and self.arriving > 0 and loop.time() < deadline:
                self._joined.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._joined.wait(), deadline - loop.time())
            batch = self._pending[: self.settings.max_batch]
            del self._pending[: len(batch)]
            live = [item for item in batch if not item[3].done()]
            if not live:
                continue
            self.batches[len({text for _, text, _, _ in live})] += 1  # batch size = distinct texts embedded
            asks = [(text, head) for _, text, head, _ in live]
            try:
                outcomes = await loop.run_in_executor(self._executor, self.route_isolated, asks)
            except Exception as exc:  # noqa: BLE001 - the executor itself failed (shut down): everyone's failure
                outcomes = [exc] * len(live)
            for (key, _, _, fut), out in zip(live, outcomes, strict=True):
                if fut.done():
                    continue
                if isinstance(out, BaseException):
                    fut.set_exception(out)
                else:
                    self._remember(key, out)
                    fut.set_result(out)

    def _remember(self, key: bytes, value: tuple[int, bool]) -> None:
        size = self.settings.embed_cache_size
        if size <= 0:
            return
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > size:
            self._cache.popitem(last=False)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------------------------------------- app
def resolve_agents(registered, agents: Sequence[AgentSpec]) -> list[AgentSpec]:
    """The pool's AgentSpec for each of the head's agents, in the head's order (the pool says which model to
    call); an agent of the head missing from the pool -> RouterLiteError naming it."""
    by_name = {a.name: a for a in agents}
    missing = [a["name"] for a in registered.agents if a["name"] not in by_name]
    if missing:
        raise RouterLiteError(f"head {registered.name} routes to agent(s) {missing} that the pool lacks; pool "
                              f"agents: {', '.join(sorted(by_name)) or '(none)'}")
    out = []
    for a in registered.agents:
        spec = by_name[a["name"]]
        if a.get("model") not in (None, a["name"], spec.model):
            log.warning("head %s: agent %s was trained on model %s but the pool calls %s", registered.name,
                        a["name"], a.get("model"), spec.model)
        out.append(spec)
    return out


def _error_response(err: RequestError, headers: dict | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse(err.body(), status_code=err.status, headers=headers)


async def _read_body(request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise RequestError(400, f"request body of {int(declared)} bytes is over the limit of {limit} bytes",
                                   "body_too_large")
        except ValueError:
            raise RequestError(400, "invalid Content-Length header", "invalid_request") from None
    from starlette.requests import ClientDisconnect

    buf = bytearray()
    try:
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > limit:
                raise RequestError(400, f"request body is over the limit of {limit} bytes", "body_too_large")
    except ClientDisconnect:
        # gone, or closed by the body read timeout (pipeline/core/http_server.py): no one reads this
        raise RequestError(400, "the client disconnected before sending the whole body", "incomplete_body") from None
    return bytes(buf)


_EVENT_END = re.compile(rb"\r?\n\r?\n")


def _inject_router(event: bytes, router: dict) -> bytes | None:
    """The SSE event with `router` added to its JSON data, or None when it is not a `data: {...}` event."""
    lines = event.split(b"\n")
    for i, line in enumerate(lines):
        line = line.rstrip(b"\r")
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if not payload.startswith(b"{"):
                return None
            try:
                obj = json.loads(payload)
            except ValueError:
                return None
            if not isinstance(obj, dict):
                return None
            obj["router"] = router
            lines[i] = b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
            return b"\n".join(lines)
    return None


def build_app(registered, backbone, agents: Sequence[AgentSpec], client_for: Callable[[AgentSpec], Any],
              settings: ServeSettings | None = None):
    """A starlette app serving `registered` (a `pipeline.route.registry.RegisteredRouter`) with `backbone` (a
    `pipeline.route.embed.Backbone` of the head's model, pooling and max_seq_length), calling the pool `agents` through
    `client_for(agent) -> openai.AsyncOpenAI` (called once per agent, here, so a missing key fails before serving;
    the clients are closed when the app shuts down). The handlers below are module-level and read what they
    serve from `request.app.state`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    settings = settings or ServeSettings()
    _check_backbone(registered, backbone)
    specs = resolve_agents(registered, agents)
    clients = [client_for(a) for a in specs]
    default_point = registered.resolve_target(settings.default_target) if hasattr(registered, "resolve_target") \
        else {"target": "max-quality", "lambda": 0.0}
    router = DecisionBatcher(registered.at(settings.default_target) if hasattr(registered, "at") else registered,
                             backbone, settings)
    routes = [
        Route("/healthz", _healthz, methods=["GET"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/v1/models/{model:path}", _model_one, methods=["GET"]),
        Route("/v1/chat/completions", _chat, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _not_found}, lifespan=_lifespan)
    state = app.state
    state.registered, state.backbone, state.settings = registered, backbone, settings
    state.specs, state.clients = specs, clients
    state.router, state.default_point = router, default_point
    # the head's view at each operating point a request asks for (made on first use); one DecisionBatcher embeds for all
    state.views = collections.OrderedDict({default_point["target"]: (router.registered, default_point)})
    state.cascade_views = {}
    if settings.default_grader is not None and getattr(registered, "kind", "head") == "cascade":
        registered.cascade_at(settings.default_target, settings.default_grader)  # a bad default fails before serving
    state.head_name = registered.name
    state.model_obj = {"id": registered.name, "object": "model", "created": 0, "owned_by": MODEL_OWNER}
    state.upstream_opts = {"timeout": float(settings.upstream_timeout_s), "max_retries": 0}
    return app


def _check_backbone(registered, backbone) -> None:
    """Refuse a backbone of the wrong width; warn when it is not the one the head was trained on."""
    dim = int(registered.manifest.get("dim", registered.router.d))
    if int(getattr(backbone, "dim", dim)) != dim:
        raise RouterLiteError(f"backbone {getattr(backbone, 'model_id', backbone)!r} embeds {backbone.dim} dims but "
                              f"head {registered.name} takes {dim}")
    want_key = (registered.manifest.get("backbone") or {}).get("key")
    if want_key and getattr(backbone, "key", want_key) != want_key:
        log.warning("head %s was trained on backbone %s; serving with %s", registered.name, want_key, backbone.key)


def _view_for(state, target: str | None):
    """(head view, point) of operating point `target` (None: the default), made on first use and kept in an LRU
    of MAX_TARGETS names: every target resolves, however many distinct ones clients send (a view is a resolved
    point of the head's stored path, cheap to make again)."""
    default = state.default_point["target"]
    name = default if target is None else target
    views = state.views
    if name in views:
        views.move_to_end(name)
        return views[name]
    view = state.registered.at(name)
    views[name] = (view, view.point)
    while len(views) > MAX_TARGETS:
        del views[next(k for k in views if k != default)]
    return views[name]


def _request_grader(state, headers, body: dict) -> str | None:
    """The answer format a request names (`router_grader` field, else the `X-Router-Grader` header, else the
    server's default) when the served router is a cascade; None: prompt-only routing."""
    if getattr(state.registered, "kind", "head") != "cascade":
        return None
    value = body.get(GRADER_FIELD) if isinstance(body, dict) else None
    if value is not None and not isinstance(value, str):
        raise RequestError(400, f"'{GRADER_FIELD}' must be a string, got {type(value).__name__}", "invalid_grader",
                           GRADER_FIELD)
    if value is None:
        value = headers.get(GRADER_HEADER) if headers is not None else None
    value = value if value and str(value).strip() else state.settings.default_grader
    if value is None:
        return None
    from pipeline.collect.grading import GRADERS

    if value not in GRADERS:
        raise RequestError(400, f"unknown grader {_show(value)}; known: {', '.join(GRADERS)}", "invalid_grader",
                           GRADER_FIELD)
    return value


def _cascade_view_for(state, target: str | None, grader: str):
    """(cascade view, point) for (target, grader), kept for the first MAX_CASCADE_VIEWS pairs, then made per
    request (a client cannot fill a table that named targets need)."""
    key = (target, grader)
    hit = state.cascade_views.get(key)
    if hit is None:
        try:
            view = state.registered.cascade_at(target, grader)
        except RouterLiteError as exc:
            raise RequestError(400, str(exc), "invalid_target", TARGET_FIELD) from None
        hit = (view, view.point)
        if len(state.cascade_views) < MAX_CASCADE_VIEWS:
            state.cascade_views[key] = hit
    return hit


async def _healthz(request):
    from starlette.responses import JSONResponse

    state = request.app.state
    return JSONResponse({"status": "ok", "head": state.head_name, "agents": [a.name for a in state.specs],
                         "backbone": getattr(state.backbone, "model_id", str(state.backbone)),
                         "device": getattr(state.backbone, "device", "")})


async def _models(request):
    from starlette.responses import JSONResponse

    return JSONResponse({"object": "list", "data": [request.app.state.model_obj]})


async def _model_one(request):
    from starlette.responses import JSONResponse

    state = request.app.state
    if request.path_params["model"] != state.head_name:
        return _error_response(RequestError(404, f"The model {_show(request.path_params['model'])} does not exist",
                                            "model_not_found", "model"))
    return JSONResponse(state.model_obj)


def _upstream_error(spec: AgentSpec, client: Any, exc: BaseException) -> RequestError:
    """The 502 for agent `spec` failing with `exc`, its message scrubbed of the client's key."""
    import httpx
    import openai

    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        up_code = body.get("code") or body.get("type")
        up_msg = body.get("message") if isinstance(body.get("message"), str) else exc.message
        detail = f"HTTP {exc.status_code}" + (f" {up_code}" if isinstance(up_code, str) else "") + f": {up_msg}"
        code = "upstream_error"
    elif isinstance(exc, (openai.APITimeoutError, httpx.TimeoutException, asyncio.TimeoutError)):
        detail, code = "timed out", "upstream_timeout"
    elif isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
        detail, code = f"connection failed ({type(exc).__name__})", "upstream_connection"
    else:
        detail, code = f"{type(exc).__name__}: {exc}", "upstream_error"
    msg = scrub(f"agent {spec.name} (model {spec.model}) failed: {detail}", [getattr(client, "api_key", None)])
    return RequestError(502, msg[:1000], code, type_="upstream_error")


async def _route(request, state):
    """(request, decision, point, t0) for a chat request, or the error response to send instead."""
    router = state.router
    settings = state.settings
    t0 = time.perf_counter()
    try:
        router.arriving += 1  # the micro-batcher may wait a moment for this request
        try:
            body = await _read_body(request, settings.max_body_bytes)
            t0 = time.perf_counter()
            req = parse_chat_request(body, state.head_name, settings)
            try:
                target = request_target(request.headers, req.body, settings.default_target)
            except RouterLiteError as exc:
                raise RequestError(400, str(exc), "invalid_target", TARGET_FIELD) from None
            grader = _request_grader(state, request.headers, req.body)
            if grader is not None:  # a cascade entry and an answer format: the cascade's view of this target
                view, point = _cascade_view_for(state, target, grader)
                point = {**point, "cascade": view}
            else:
                try:
                    view, point = _view_for(state, target)
                except RouterLiteError as exc:
                    raise RequestError(400, str(exc), "invalid_target", TARGET_FIELD) from None
        finally:
            router.arriving -= 1
        tag = point["target"] if getattr(view, "grader", None) is None else f"cascade|{point['target']}|{view.grader}"
        decision = await router.decide(req.text, view, tag)
    except RequestError as err:
        return _error_response(err)
    except RouterLiteError as exc:  # the embedder refused this text (the others of its batch went on)
        return _error_response(RequestError(400, f"the last user message cannot be embedded: {exc}",
                                            "invalid_text", "messages"))
    except Exception as exc:  # noqa: BLE001 - the embedder failed: a router error, not the client's
        log.exception("routing failed")
        return _error_response(RequestError(500, f"routing failed: {type(exc).__name__}", "router_error",
                                            type_="server_error"))
    return req, decision, point, t0


async def _chat(request):
    import httpx
    from starlette.responses import StreamingResponse

    state = request.app.state
    routed = await _route(request, state)
    if not isinstance(routed, tuple):
        return routed
    req, decision, point, t0 = routed
    if "cascade" in point:  # a cascade's view: run its stages, or the agent a prompt shortcut chose, alone
        return await _cascade_chat(state, req, decision, point, t0)
    spec, client = state.specs[decision.index], state.clients[decision.index]
    overhead_ms = (time.perf_counter() - t0) * 1000.0
    head_name = state.head_name
    info = {"head": head_name, "agent": spec.name, "model": spec.model, "ood_guard": decision.ood,
            "target": point["target"], "lambda": point["lambda"]}
    headers = {"X-Router-Head": head_name, "X-Router-Agent": spec.name, "X-Router-Model": spec.model,
               "X-Router-OOD": "true" if decision.ood else "false", TARGET_HEADER: point["target"],
               "X-Router-Overhead-Ms": f"{overhead_ms:.3f}", "Server-Timing": f"router;dur={overhead_ms:.3f}"}
    payload = {"model": spec.model, **req.upstream}
    t_up = time.perf_counter()
    try:
        resp = await client.post("/chat/completions", body=payload, cast_to=httpx.Response,
                                 options=state.upstream_opts, stream=True)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every agent failure is a 502
        return _error_response(_upstream_error(spec, client, exc), _upstream_timing(headers, t_up, "failed"))
    ctype = resp.headers.get("content-type", "")
    if req.stream and ctype.startswith("text/event-stream"):  # the headers go out before the stream: time to them
        return StreamingResponse(_relay(resp, spec, client, info), status_code=200,
                                 headers={**_upstream_timing(headers, t_up, "headers"), "Cache-Control": "no-cache"},
                                 media_type="text/event-stream")
    return await _whole_reply(resp, spec, client, info, headers, t_up)


def _upstream_timing(headers: dict, t_up: float, desc: str | None = None) -> dict:
    """`headers` with the upstream call's milliseconds since `t_up` added to Server-Timing, after the router's own."""
    up = f"upstream;dur={(time.perf_counter() - t_up) * 1000.0:.3f}" + (f';desc="{desc}"' if desc else "")
    return {**headers, "Server-Timing": f"{headers['Server-Timing']}, {up}"}


async def _cascade_chat(state, req, decision, point, t0):
    """A cascade request: the stages of the view's policy (or one agent, when a prompt shortcut or the OOD guard
    chose it); headers list every agent called and the summed cost; the accepted reply is returned (streamed as
    SSE when the request streams)."""
    from starlette.responses import Response

    from pipeline.route.cascade import Policy, Stage
    from pipeline.serve.cascade_calls import run_cascade, sse_of

    reg, view = state.registered, point["cascade"]
    policy, grader = view.policy, view.grader
    if decision.index >= 0:  # one agent, without a check
        policy = Policy((Stage((decision.index,)),))
    overhead_ms = (time.perf_counter() - t0) * 1000.0
    result = await run_cascade(policy, reg.router.order, state.specs, state.clients, req.upstream, state.upstream_opts,
                               grader)
    names = [state.specs[j].name for j in result.called]
    head_name = state.head_name
    headers = {"X-Router-Head": head_name, "X-Router-Agents-Called": ",".join(names),
               "X-Router-Cost-Usd": f"{result.cost:.8f}", "X-Router-Cascade-Stage": str(result.stage),
               "X-Router-OOD": "true" if decision.ood else "false", TARGET_HEADER: point["target"],
               GRADER_HEADER: grader, "X-Router-Overhead-Ms": f"{overhead_ms:.3f}",
               "X-Router-Stage-Ms": ",".join(f"{w:.1f}" for w in result.stage_ms),
               "Server-Timing": f"router;dur={overhead_ms:.3f}, "
                                + ", ".join(f"stage{i};dur={w:.1f}" for i, w in enumerate(result.stage_ms))}
    if result.accepted is None:
        last = result.replies[-1]
        spec = state.specs[last.agent]
        return _error_response(_upstream_error(spec, state.clients[last.agent], last.error or
                                               ValueError("no usable reply")), headers)
    spec = state.specs[result.accepted.agent]
    headers.update({"X-Router-Agent": spec.name, "X-Router-Model": spec.model})
    info = {"head": head_name, "agent": spec.name, "model": spec.model, "ood_guard": decision.ood,
            "target": point["target"], "grader": grader, "agents_called": names, "cost_usd": result.cost,
            "stage": result.stage}
    data = dict(result.accepted.data)
    if req.stream:
        return Response(sse_of(data, info), status_code=200, headers={**headers, "Cache-Control": "no-cache"},
                        media_type="text/event-stream")
    data["router"] = info
    return Response(json.dumps(data, ensure_ascii=False).encode(), status_code=200, headers=headers,
                    media_type="application/json")


async def _relay(resp, spec: AgentSpec, client: Any, info: dict):
    """The agent's SSE stream byte for byte, with `router` added to the first JSON event."""
    buf, injected = b"", False
    try:
        async for chunk in resp.aiter_bytes():
            if injected:
                yield chunk
                continue
            buf += chunk
            while not injected:
                m = _EVENT_END.search(buf)
                if m is None:
                    break
                event, sep, buf = buf[:m.start()], buf[m.start():m.end()], buf[m.end():]
                new = _inject_router(event, info)
                injected = new is not None
                yield (new if injected else event) + sep
            if injected and buf:
                yield buf
                buf = b""
        if buf:
            yield buf
    except Exception as exc:  # noqa: BLE001 - the stream broke after the headers went out
        err = _upstream_error(spec, client, exc)
        yield b"data: " + json.dumps({**err.body(), "router": info}).encode() + b"\n\n"
    finally:
        await resp.aclose()


async def _whole_reply(resp, spec: AgentSpec, client: Any, info: dict, headers: dict, t_up: float | None = None):
    """The agent's JSON reply with `router` added, or a 502 when it cannot be read or has no choices."""
    from starlette.responses import Response

    try:
        raw = await resp.aread()
    except Exception as exc:  # noqa: BLE001
        return _error_response(_upstream_error(spec, client, exc), headers)
    finally:
        await resp.aclose()
    if t_up is not None:  # the whole upstream call: request sent -> reply body read
        headers = _upstream_timing(headers, t_up)
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise ValueError("no choices" + (f": {str(data.get('error'))[:200]}" if isinstance(data, dict)
                                              and data.get("error") else ""))
    except ValueError as exc:
        return _error_response(_upstream_error(spec, client, ValueError(f"unusable reply body ({exc})")), headers)
    data["router"] = info
    return Response(json.dumps(data, ensure_ascii=False).encode(), status_code=200, headers=headers,
                    media_type="application/json")


async def _not_found(request, exc):
    code = "method_not_allowed" if exc.status_code == 405 else "unknown_url"
    return _error_response(RequestError(exc.status_code, f"{request.method} {_show(request.url.path)}: {exc.detail}",
                                        code))


@contextlib.asynccontextmanager
async def _lifespan(app):
    """Close the agents' clients and the router's embedding worker when the app shuts down."""
    try:
        yield
    finally:
        for c in app.state.clients:
            try:
                await c.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        app.state.router.close()


# ------------------------------------------------------------------------------------------------------- server
def return_big_buffers_to_the_os(threshold_bytes: int = 256 * 1024) -> bool:
    """Make glibc serve allocations over `threshold_bytes` with mmap, always (best effort; Linux glibc only).

    glibc raises its mmap threshold each time such a block is freed, after which 1 MB request bodies and their
    copies (parsed JSON, the forwarded payload) come from the heap and the process keeps the memory: 64 concurrent
    1 MB requests left RSS +240 MB. A fixed threshold unmaps each big buffer when it is freed. True when set."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, int(threshold_bytes)))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False


class RouterServer(LoopbackServer):
    """The router app on uvicorn in a daemon thread (lifespan on: clients closed at stop), with the connection
    limits of the app's `ServeSettings`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0):
        settings = getattr(getattr(app, "state", None), "settings", None) or ServeSettings()
        super().__init__(app, host, port, lifespan="on", name="router-server", start_timeout_s=start_timeout_s,
                         **settings.uvicorn_options())


def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0) -> RouterServer:
    """Run `app` on (host, port) in a background thread; port 0 picks a free one."""
    return RouterServer(app, host, port)
