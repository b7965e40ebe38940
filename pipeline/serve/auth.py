"""Client keys, budgets, rates and allowed targets in front of the router app (`guard_clients`), as an ASGI middleware
so the handlers of app.py stay as they are.

For every path under /v1/ (`/healthz` and any other path stay open) a server with keys wants `Authorization: Bearer
<key>`: none or an unknown one is a 401 `invalid_api_key`. For `POST /v1/chat/completions` it then reads the body
(up to the server's `max_body_bytes`, and hands the same bytes on) and parses it once: the `ChatRequest`
(pipeline/serve/requests.py) and the router it was priced on go to the app on `request.state` (`chat`, `served`),
which answers that same request without parsing it again (a request the app refuses is passed on untouched: it calls
no agent); then it

- checks the operating point the request will run at (`router_target` field, `X-Router-Target` header, else the
  server's default) against the key's `targets` and the server's `allowed_targets`: 403 `target_not_allowed` naming
  the allowed ones; a request that names no target while the server's default is not among the key's runs at the
  key's first target (the header is set for it);
- with a ledger (resources/ledger.py): reserves the request's worst case (pipeline/serve/spend.py) or answers 429
  `budget_exceeded` / `rate_limit_exceeded` with `Retry-After`; after the response it settles the reservation with
  what the reply cost (metering.py): what the app recorded in `ChatRequest.answer` (= the body's `usage.cost` = the
  `X-Router-Cost-Usd` header), or, for a streamed prompt-routed reply, the stream's own `usage` priced as the app
  prices replies (`reply_usage`). A request whose client left (499) or that failed inside the router is charged its
  worst case: its calls may have been paid. Settlements are recorded in the ledger's thread, those that gather
  while it is busy in one transaction; one the ledger cannot take is kept in the home's journal and written, once,
  when it answers again (resources/ledger.py). Every keyed request asks the ledger, a key without budget or rate
  too: while it cannot be reached each is refused with 503 `ledger_unavailable`, never served unmetered.

The access log line of a request names its key (`key`); a refused request gets a line of its own. A key is never
logged: only its name.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import time
import uuid
from datetime import UTC, datetime

from pipeline.core.errors import RouterLiteError
from pipeline.route.targets import TARGET_FIELD, TARGET_HEADER, parse_target, request_target
from pipeline.serve import spend
from pipeline.serve.metering import ReplyMeter
from pipeline.serve.requests import RequestError, error_response, parse_chat_request

log = logging.getLogger(__name__)
access_log = logging.getLogger("router_lite.access")
CHAT_PATH = "/v1/chat/completions"
MAX_BOUNDS = 64  # targets whose price bounds are kept


def guard_clients(app, keyring=None, ledger=None, allowed_targets=()):
    """`app` (build_app's) behind client keys (`keyring`: pipeline.serve.keys.Keyring) whose spend and rate go to
    `ledger` (resources.ledger.SpendLedger; owned by the guard from now on: closed when the app shuts down), and/or
    with the targets any client may ask for restricted to `allowed_targets` (canonical names). Nothing to guard:
    `app` unchanged."""
    allowed = tuple(allowed_targets or ())
    if keyring is None and not allowed:
        return app
    if keyring is not None and ledger is None:
        raise RouterLiteError("client keys need a spend ledger")
    default = parse_target(app.state.settings.default_target).name
    if allowed and default not in allowed:
        raise RouterLiteError(f"the server's default target {default} is not among --allowed-targets "
                              f"({', '.join(allowed)}): pass --target with one of them")
    app.add_middleware(ClientGuard, keyring=keyring, ledger=ledger, allowed=allowed)
    return app


def budget_warnings(app, keyring, allowed_targets=()) -> list[str]:
    """A startup line for each key whose budget is below the worst case of a default request (the shortest messages,
    no max_tokens: the server's default, at the key's default target): every such request would be refused."""
    state = app.state
    served, settings = state.served, state.settings
    tokens = spend.request_tokens({"messages": [{"role": "user", "content": ""}], **settings.defaults},
                                  settings.max_tokens_cap)
    lines = []
    for key in keyring.keys if keyring is not None else ():
        if key.budget_usd is None:
            continue
        allowed = [t for t in key.targets if not allowed_targets or t in allowed_targets] or list(allowed_targets)
        target = parse_target(settings.default_target).name
        target = target if not allowed or target in allowed else allowed[0]
        bounds = spend.price_bounds(served.registered, served.specs, target)
        need = spend.worst_case_usd(bounds, *tokens)
        if need > key.budget_usd + spend.EPS_USD:
            fits = spend.affordable_completion_tokens(bounds, tokens[0], key.budget_usd)
            lines.append(f"router-lite serve: warning: key {key.name!r} has a budget of {key.budget_text()}, below "
                         f"the worst case of a request without max_tokens at its default target {target} "
                         f"(${need:.6f} for up to {tokens[1]} completion tokens): such requests are refused (402 "
                         f"request_over_budget); its clients must send max_tokens of at most {fits}, or raise its "
                         "budget_usd")
    return lines


class ClientGuard:
    """The ASGI middleware of `guard_clients` (module doc)."""

    def __init__(self, app, keyring, ledger, allowed: tuple[str, ...]):
        self.app, self.keyring, self.ledger, self.allowed = app, keyring, ledger, allowed
        # the ledger's calls block (a transaction, another process's lock): one thread of its own, off the event loop
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="router-ledger") if ledger else None
        self.bounds: dict = {}
        self.unsettled: collections.deque = collections.deque()  # (key, reservation, USD, bucket end) to record
        self.flushing = False  # a flush of `unsettled` is queued in the ledger's thread

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, self._closing(send))
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        key = None
        if self.keyring is not None:
            key = self.keyring.find(_bearer(scope))
            if key is None:
                return await _refuse(scope, receive, send, None, RequestError(
                    401, "Incorrect or missing API key: send `Authorization: Bearer <key>`", "invalid_api_key"),
                    {"WWW-Authenticate": "Bearer"})
            scope.setdefault("state", {})["client_key"] = key.name
        if scope["path"] != CHAT_PATH or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        await self._chat(scope, receive, send, key)

    async def _chat(self, scope, receive, send, key):
        state = scope["app"].state
        served, settings = state.served, state.settings  # the router now served: read once, handed to the app
        body, receive = await _buffered(scope, receive, settings.max_body_bytes)
        try:
            req = parse_chat_request(body, served.router_name, settings, state.endpoint.retired) \
                if body is not None else None
            named = request_target(_Headers(scope), req.body) if req is not None else None
        except (RequestError, RouterLiteError):
            req = None
        if req is None:  # the app refuses it the same way, and calls no agent
            return await self.app(scope, receive, send)
        target = self._target(scope, req, named, key, state)
        if isinstance(target, RequestError):
            return await _refuse(scope, receive, send, key, target)
        # parsed once: the app answers this same request (`request.state.chat`) on this same router
        scope.setdefault("state", {}).update(chat=req, served=served)
        if key is None:
            return await self.app(scope, receive, send)
        bounds, tokens = self._bounds(served, target), spend.request_tokens(req.upstream, settings.max_tokens_cap)
        if state.open_ended is not None:  # both worlds (pipeline/serve/worlds.py): either router may answer it
            bounds = bounds + self._bounds(state.open_ended, target)
        need = spend.worst_case_usd(bounds, *tokens)
        whole = spend.over_whole_budget(key, bounds, *tokens)
        if whole is not None:  # no retry fits it: 402, as OpenRouter answers it (a 429 is retried by the SDKs)
            return await _refuse(scope, receive, send, key, RequestError(402, whole, "request_over_budget",
                                                                         "max_tokens", type_="insufficient_quota"))
        admitted = await self._admit(key, need, state)
        if isinstance(admitted, tuple):  # (the error, its headers)
            return await _refuse(scope, receive, send, key, *admitted)
        meter = ReplyMeter(send, scope["state"], req)  # the router that answers: its agents price a relayed stream
        try:
            await self.app(scope, receive, meter.send)
        finally:
            # settled in the ledger's thread after the reply went out, not awaited: the next request on this
            # connection does not wait for it. Settlements that gather meanwhile go in one transaction (`_flush`);
            # the reservation holds the worst case until it lands, and shutdown waits for it.
            now = time.time()
            self.unsettled.append((key.name, admitted, meter.cost(need), spend.bucket_end(now, key.window_s)))
            if not self.flushing:
                self.flushing = True
                self.pool.submit(self._flush)

    def _target(self, scope, req, named: str | None, key, state):
        """The canonical target the request runs at, or the 403 to answer; sets the key's default when the request
        names none and the server's default is not the key's. `req.target`: the target the app runs it at (None:
        the served router's default point)."""
        configured = state.settings.default_target
        server_default = parse_target(configured).name
        allowed = [t for t in (key.targets if key is not None else ()) if not self.allowed or t in self.allowed] \
            or list(self.allowed)
        target = named or server_default
        req.target = named or (server_default if configured is not None else None)
        if not allowed or target in allowed:
            return target
        if named is None and req.body.get(TARGET_FIELD) is None:  # names none: the key's first target
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != TARGET_HEADER.lower().encode()]
            scope["headers"].append((TARGET_HEADER.lower().encode(), allowed[0].encode()))
            req.target = allowed[0]
            return allowed[0]
        whose = f"key {key.name!r}" if key is not None and key.targets else "this server"
        return RequestError(403, f"target {target} is not allowed for {whose}; allowed: {', '.join(allowed)}",
                            "target_not_allowed", TARGET_FIELD)

    def _bounds(self, served, target: str):
        key = (served.router_name, target)  # the router's name too: a server that swaps its router gets new bounds
        hit = self.bounds.get(key)
        if hit is None:
            hit = spend.price_bounds(served.registered, served.specs, target)
            if len(self.bounds) < MAX_BOUNDS:
                self.bounds[key] = hit
        return hit

    async def _admit(self, key, need: float, state):
        """The reservation id, or (the 429 or 503 to answer, its headers). Every keyed request asks the ledger, a
        key without limits too: one that cannot be reached refuses it rather than let its spend go unrecorded."""
        now = time.time()
        expires = now + _longest_request_s(state)
        since = (now - key.window_s, now - spend.RPM_WINDOW_S)

        def decide(spent, held, hits):
            return spend.admission(key, spend.KeyUsage(spent, sum(usd for _, usd in held), hits, held), need, now)

        loop = asyncio.get_running_loop()
        try:
            done = self.ledger.admit_now(key.name, need, now, expires, since, decide)  # uncontended: no thread hop
            rid, refusal = done if done is not None else await loop.run_in_executor(
                self.pool, self.ledger.admit, key.name, need, now, expires, since, decide)
        except Exception as exc:  # noqa: BLE001 - no ledger, no spending: the request is refused, not let through
            log.error("spend ledger failed for key %s: %s: %s", key.name, type(exc).__name__, exc)
            return RequestError(503, "the spend ledger is unavailable; retry later", "ledger_unavailable",
                                type_="server_error"), {"Retry-After": "5"}
        if refusal is None:
            return rid
        return RequestError(429, f"{refusal.message}; retry in {refusal.retry_after_s} s", refusal.code,
                            type_="insufficient_quota" if refusal.code == "budget_exceeded" else "rate_limit_error"), \
            {"Retry-After": str(refusal.retry_after_s)}

    def _flush(self) -> None:
        """In the ledger's thread: every settlement gathered so far, in one transaction."""
        self.flushing = False  # first: a settlement added from now on queues another flush
        batch = []
        while self.unsettled:
            batch.append(self.unsettled.popleft())
        try:
            self.ledger.settle_many(batch)
        except spend.LedgerOutage as exc:  # kept in the home's journal, written when the ledger answers again
            log.error("%s", exc)
        except Exception as exc:  # noqa: BLE001 - not even kept: logged with the figures, to be entered by hand
            for name, _, cost, _ in batch:
                log.error("spend ledger: could not record $%.8f for key %s: %s: %s", cost, name,
                          type(exc).__name__, exc)

    def _closing(self, send):
        async def closing(message):
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed") and self.pool:
                self.pool.shutdown(wait=True)
                self.ledger.close()
            await send(message)

        return closing


def _longest_request_s(state) -> float:
    """How long a request may hold its reservation: every stage of the longest plan at the upstream deadline, the
    one retry of a dropped connection, and a minute more."""
    stages = 1
    registered = state.served.registered
    router = registered.router
    for point in (getattr(router, "path", None) or {}).get("points", []) if getattr(
            registered, "needs_grader", False) else ():
        plan = point.get("plan") or {}
        for pol in [plan.get("default") or {}, *(plan.get("by_grader") or {}).values()]:
            stages = max(stages, len(pol.get("stages") or ()))
    return (stages + 1) * float(state.settings.upstream_timeout_s) + 60.0


class _Headers:
    """The request's headers as `request_target` reads them (`get`, case-insensitive), from the ASGI scope."""

    def __init__(self, scope):
        self.scope = scope

    def get(self, name: str, default=None):
        want = name.lower().encode()
        for k, v in self.scope["headers"]:
            if k.lower() == want:
                return v.decode("latin-1")
        return default


def _bearer(scope) -> str | None:
    value = _Headers(scope).get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


async def _buffered(scope, receive, limit: int):
    """(the whole request body, or None when it is over `limit` or the client left, and a `receive` that hands the
    app the same messages again, then the connection's own)."""
    declared = _Headers(scope).get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        return None, receive
    got, size = [], 0
    while True:
        message = await receive()
        got.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if not message.get("more_body", False) or size > limit:
            break
    last = got[-1]
    whole = last["type"] == "http.request" and not last.get("more_body", False) and size <= limit
    body = b"".join(m.get("body", b"") for m in got if m["type"] == "http.request") if whole else None
    pending = iter(got)

    async def again():
        for message in pending:
            return message
        return await receive()

    return body, again


async def _refuse(scope, receive, send, key, err: RequestError, headers: dict | None = None) -> None:
    """Answer `err` (OpenAI-shaped), count it in the metrics and log one access line naming the key (never the key
    itself)."""
    rid = uuid.uuid4().hex
    state = scope["app"].state
    resp = error_response(err, {**(headers or {}), "X-Request-Id": rid, "X-Router-Name": state.served.router_name})
    if getattr(state, "metrics", None) is not None:
        state.metrics.refused(err.status, state.served.router_name, key.name if key is not None else "")
    if access_log.isEnabledFor(logging.INFO):
        access_log.info(json.dumps({"ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
                                    "request_id": rid, "router": state.served.router_name, "key": key and key.name,
                                    "path": scope["path"], "status": err.status, "error": err.code}))
    await resp(scope, receive, send)
