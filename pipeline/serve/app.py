"""The router as an OpenAI-compatible HTTP endpoint (starlette; no Dagster).

`build_app(registered, backbone, agents, client_for, settings)` returns an ASGI app:

- `POST /v1/chat/completions`: validate the request, embed its **user turns** (`routed_text`: the latest last,
  earlier ones as far as they fit the backbone's window; docs/serving.md, "Request") with the frozen backbone, let
  the registered router pick one agent (the OOD guard sends far-away queries to the best single agent;
  the router is any kind of pipeline/route/routers.py, picked through the registry's `route`),
  forward the request's messages and sampling parameters to that agent's model through its `openai.AsyncOpenAI`
  client, and return the agent's **real reply body** with one key added, `"router": {"head", "agent", "model",
  "ood_guard"}`. `model` in the body stays the agent's model (the one that wrote the reply); the router's name is in
  `router.head` (the key keeps its first name). Response headers: `X-Router-Head`, `X-Router-Agent`,
  `X-Router-Model`, `X-Router-OOD` (`true`/`false`), `X-Router-Overhead-Ms` (request parsed -> agent picked:
  validation + embedding, queueing for the embedder included, + pick; the agent's own latency excluded), and
  `Server-Timing: router;dur=<that>, upstream;dur=<ms>` (the agent's call: request sent -> reply read; with
  `stream=true`, -> its headers).
  `stream=true` passes the agent's SSE stream through byte for byte, except that the first JSON chunk gets the
  same `"router"` key; the headers carry the pick too.
  Every 200 reply's `usage` carries `cost` (USD, OpenRouter's field) equal to the header `X-Router-Cost-Usd`; a
  cascade's `usage` sums the tokens of every call it made. A request that names no answer format, served by a cascade
  built with `formats`, takes the format its nearest training prompts have (`AutoFormatView`). One JSON access-log
  line per request (logger `router_lite.access`, `_log_access`; the prompt only with `log_prompts`), and the header
  `X-Request-Id` naming it. A request is parsed once, into the `ChatRequest` on `request.state.chat` (by the
  client-key middleware when there is one); the handler records what it did in `ChatRequest.answer`, which the
  access log, the metrics and the spend meter read.
- `GET /v1/models` (and `/v1/models/{id}`): one model, the registered router's name.
- `GET /healthz`: `{"status": "ok", "head", "agents", "backbone", "device"}` (liveness).
- `GET /readyz`: 503 until the backbone, the router and the grading worker are warm, then 200, with a JSON body
  naming what is warm, the router served and what following the pointer did (pipeline/serve/readiness.py).
- `GET /metrics` (unless `settings.metrics` is off): the Prometheus series (pipeline/serve/metrics.py), observed once
  per chat reply; the client key's name for the `key` label is `request.state.client_key` ("" when unset).

The router is one immutable `ServedRouter` (pipeline/serve/served.py) in `app.state.served`; a chat request takes it
once when it arrives and reads everything from it, so with `follow` (a `PointerFollower`, pipeline/serve/follow.py:
it swaps in the router `registry/latest.json` names, loaded, checked and warmed first) a request finishes on the
router it started with. Every chat reply carries `X-Router-Name`, the router that answered; the access log and the
metrics name the same one.

Errors are OpenAI-style `{"error": {"message", "type", "param", "code"}}`:
400 malformed JSON / not an object / nested deeper than `max_json_depth` / a string that is not valid text (a lone
UTF-16 surrogate) / missing or empty `messages` / a malformed message / more than `max_messages` messages / no
user message with text / body over `max_body_bytes` / a bad sampling parameter (`max_tokens` over
`max_tokens_cap`, a `seed` outside 64 bits, ...) / text the embedder refuses;
404 a `model` other than the router's name (absent is fine) or an unknown path; 405 a wrong method;
502 the picked agent failed (HTTP error, timeout, connection, unusable body; message scrubbed of the client's key,
the router headers still name the agent); 500 an unexpected router failure.

Forwarded to the agent: `messages` as given, and of the request's parameters only `max_tokens`,
`max_completion_tokens`, `temperature`, `top_p`, `stop`, `seed`, `stream`, `stream_options`; `settings.defaults`
fills those the request leaves out (the CLI uses the profile's collection settings, so agents answer as they did
when their rewards were measured); `tools`, `tool_choice`, `parallel_tool_calls`, `response_format`, `functions`,
`function_call` unchanged, to one agent (a cascade runs no stages for them: `_request_grader`). Any other request
field is ignored. No retries: the client decides.

Embedding runs in one worker thread, never on the event loop, through a micro-batcher: the first new prompt waits
at most `batch_wait_ms` for others (or until `max_batch` are queued), requests that arrive while the worker is busy
join the next batch, and a batch that fails is retried prompt by prompt so only the culprit's request fails. Each
prompt is cut by characters before tokenising (pipeline/core/text_guard.py), so a 1 MB prompt costs what a long normal
one does. Connections: a request head must arrive within `header_timeout_s`, its body within `body_timeout_s`, at
most `max_connections` are open at once (pipeline/core/http_server.py). An LRU of recent prompts
(`embed_cache_size`, keyed by a SHA-256 of the text) keeps their routing decision: a repeated prompt is not
re-embedded (the router and guard are fixed, so the decision is what its embedding would give).

`serve_in_thread(app)` runs the app under uvicorn on a loopback port in a daemon thread (tests, benchmarks);
`router-lite serve` (cli/main.py) runs it in the foreground. Client keys, their budgets and rates, and the targets
clients may ask for are a middleware around this app (auth.py, `guard_clients`; `serve --api-keys FILE`): without
it the endpoint answers every client, so `serve` refuses to listen beyond loopback without keys unless told
`--allow-unauthenticated`. With keys, the access log line names the request's key (`key`: its name, never the key).

The endpoint by job, in pipeline/serve/: settings.py (`ServeSettings`), requests.py (reading and validating a
request: `parse_chat_request`, `RequestError`), batching.py (the micro-batched decisions: `DecisionBatcher`),
relay.py (the agent's reply or stream back to the client, its failures as 502s), cascade_calls.py (a cascade's
stages on one request), keys.py / spend.py / auth.py / metering.py (client keys, budgets and rates), server.py
(`serve_in_thread`, `RouterServer`), served.py (the router a request is answered by), follow.py (following the
registry pointer), metrics.py and readiness.py (`/metrics`, `/readyz`); this module builds the app and holds its
request handlers.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pipeline.collect.agents import AgentSpec
from pipeline.collect.client import cost_invalid, reply_usage
from pipeline.core.errors import RouterLiteError
from pipeline.route.served import AutoFormatView, auto_view
from pipeline.route.targets import TARGET_FIELD, TARGET_HEADER, request_target
from pipeline.serve.relay import (
    DISCONNECTED,
    deadline_of,
    post_chat,
    relay,
    unless_disconnected,
    upstream_error,
    upstream_timing,
    whole_reply,
)
from pipeline.serve.requests import (
    GRADER_FIELD,
    GRADER_HEADER,
    Answer,
    RequestError,
    error_response,
    parse_chat_request,
    read_body,
    show,
)
from pipeline.serve.served import Endpoint, decision_tag, served_router
from pipeline.serve.settings import ServeSettings
from pipeline.serve.worlds import OPEN_ENDED, VERIFIABLE, WORLD_HEADER, moved_to, named_world, prompt_is_open_ended

log = logging.getLogger(__name__)
access_log = logging.getLogger("router_lite.access")  # one JSON line per chat request (`_log_access`)

_OPEN_ENDED = object()  # `_route`'s answer to a request that names the open-ended world (pipeline/serve/worlds.py)


def build_app(registered, backbone, agents: Sequence[AgentSpec], client_for: Callable[[AgentSpec], Any],
              settings: ServeSettings | None = None, *, formats=None, log_prompts: bool = False, follow=None):
    """A starlette app serving `registered` (a `pipeline.route.registry.RegisteredRouter`) with `backbone` (a
    `pipeline.embed.backbone.Backbone` of the router's model, pooling and max_seq_length), calling the pool `agents`
    through `client_for(agent) -> openai.AsyncOpenAI` (called once per agent, here, so a missing key fails before
    serving; the clients are closed when the app shuts down). The handlers below are module-level and read what they
    serve from `request.app.state`: the router from `state.served` (a `ServedRouter`, taken once per request).

    `formats` (a `pipeline.route.formats.FormatGuess` over the router's training prompts): a cascade guesses the
    answer format of a request that names none from it (else such a request is routed prompt-only).
    `log_prompts`: the access log (logger `router_lite.access`, one JSON line per request) carries the prompt.
    `follow` (a `pipeline.serve.follow.PointerFollower`): the app swaps in the router the registry's pointer names
    whenever it changes (started and stopped with the app). Traffic is recorded once `pipeline.serve.traffic.record`
    gave the app a recorder (`state.traffic`; docs/serving.md, "Recording traffic"), closed with the app.
    Both worlds: pipeline/serve/worlds.py `serve_both(app, open_ended)` adds the open-ended router
    (`state.open_ended`, None until then)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    from pipeline.serve.metrics import ServeMetrics
    from pipeline.serve.readiness import Readiness

    settings = settings or ServeSettings()
    window = getattr(backbone, "max_seq_length", None)  # what the backbone embeds of a conversation's user turns
    if isinstance(window, int) and window != settings.routed_window:
        settings = dataclasses.replace(settings, routed_window=window)
    endpoint = Endpoint(backbone, agents, client_for, settings, log_prompts)
    served = served_router(registered, endpoint, formats=formats)
    routes = [
        Route("/healthz", _healthz, methods=["GET"]),
        Route("/readyz", _readyz, methods=["GET"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/v1/models/{model:path}", _model_one, methods=["GET"]),
        Route("/v1/chat/completions", _chat, methods=["POST"]),
    ]
    if settings.metrics:
        routes.append(Route("/metrics", _metrics, methods=["GET"]))
    app = Starlette(routes=routes, exception_handlers={HTTPException: _not_found}, lifespan=_lifespan)
    state = app.state
    state.endpoint, state.served, state.follower, state.readiness = endpoint, served, follow, Readiness()
    state.open_ended = None  # the open-ended world's router (pipeline/serve/worlds.py `serve_both`)
    state.settings = settings  # the server's connection limits (pipeline/serve/server.py RouterServer)
    state.metrics = ServeMetrics() if settings.metrics else None
    if state.metrics is not None:
        state.metrics.router(served)
    state.traffic = None  # pipeline/serve/traffic.py `record`
    return app


def _view_for(state, target: str | None):
    """(router view, point) of operating point `target` (None: the default), from the router's view cache."""
    name = state.default_point["target"] if target is None else target

    def make():
        view = state.registered.at(name)
        return view, view.point

    return state.views.get(name, make)


def _request_grader(state, headers, body: dict, tool_field: str | None = None) -> str | None:
    """The answer format a request names (`router_grader` field, else the `X-Router-Grader` header, else the
    server's default) when the served router is a cascade (it `needs_grader`); None: prompt-only routing. Field and
    header both given and different (an empty field included) -> 400 naming both. A request carrying `tool_field`
    (requests.py TOOL_PARAMS) is answered by one agent: a cascade compares answers, and a tool call or a reply in
    the client's format is none it can compare, so naming a format with it is a 400 naming the field, and the
    server's default format does not apply to it."""
    if not getattr(state.registered, "needs_grader", False):
        return None
    value = body.get(GRADER_FIELD) if isinstance(body, dict) else None
    if value is not None and not isinstance(value, str):
        raise RequestError(400, f"'{GRADER_FIELD}' must be a string, got {type(value).__name__}", "invalid_grader",
                           GRADER_FIELD)
    header = headers.get(GRADER_HEADER) if headers is not None else None
    if value is not None and header is not None and value != header:  # neither silently wins
        raise RequestError(400, f"the body's '{GRADER_FIELD}' {show(value)} and the {GRADER_HEADER} header "
                                f"{show(header)} disagree: send one, or the same in both", "conflicting_grader",
                           GRADER_FIELD)
    if value is None:
        value = header
    if tool_field is not None:
        if value and str(value).strip():
            raise RequestError(400, f"'{tool_field}' cannot be honoured by a cascade comparing answers (the request "
                                    f"names the answer format {show(value)}): a tool call or a reply in a format of "
                                    f"your own is no answer it can compare; leave out '{GRADER_FIELD}' and "
                                    f"{GRADER_HEADER} to have one agent, picked on the prompt, answer it",
                               "unsupported_parameter", tool_field)
        return None
    value = value if value and str(value).strip() else state.settings.default_grader
    if value is None:
        return None
    from pipeline.collect.grading import GRADERS

    if value not in GRADERS:
        raise RequestError(400, f"unknown grader {show(value)}; known: {', '.join(GRADERS)}", "invalid_grader",
                           GRADER_FIELD)
    return value


def _cascade_view_for(state, target: str | None, grader: str):
    """(cascade view, point) for (target, grader), from the router's view cache."""
    def make():
        try:
            view = state.registered.cascade_at(target, grader)
        except RouterLiteError as exc:
            raise RequestError(400, str(exc), "invalid_target", TARGET_FIELD) from None
        return view, view.point

    return state.cascade_views.get((target, grader), make)


def _head_view_for(state, target: str | None):
    """(view, point) of the prompt router at `target`; a fallback head without operating points: max-quality."""
    try:
        return _view_for(state, target)
    except RouterLiteError:
        return _view_for(state, "max-quality")


def _auto_view_for(state, target: str | None) -> AutoFormatView:
    """A cascade's view for requests that name no answer format (pipeline/route/served.py `AutoFormatView`: the
    one the held-out figures are measured with), made of the router's cached views."""
    def make():
        try:
            return auto_view(state.registered, state.formats, target, lambda t: _head_view_for(state, t),
                             lambda t, g: _cascade_view_for(state, t, g))
        except RouterLiteError as exc:
            raise RequestError(400, str(exc), "invalid_target", TARGET_FIELD) from None

    return state.auto_views.get(target or state.default_point["target"], make)


def _count_paid(data: dict, headers: dict, spec: AgentSpec, upstream: dict, info: dict) -> None:
    """A prompt-only reply: `usage.cost` (OpenRouter's field; estimated when the agent did not report it), the
    header `X-Router-Cost-Usd` and `router.cost_usd` with the same value, `usage.calls` = 1 (a cascade's reply has
    the same fields: one client code path for every router kind)."""
    paid = reply_usage(spec, upstream, data)
    headers["X-Router-Cost-Usd"] = f"{paid['cost']:.8f}"
    usage = dict(data["usage"]) if isinstance(data.get("usage"), dict) else {}
    if cost_invalid(usage):  # refused (not finite, < 0 or absurd): the estimate replaces it, as in a cascade
        headers["X-Router-Cost-Invalid"] = spec.name
    usage["prompt_tokens"], usage["completion_tokens"] = paid["prompt_tokens"], paid["completion_tokens"]
    if not isinstance(usage.get("total_tokens"), int) or isinstance(usage.get("total_tokens"), bool):
        usage["total_tokens"] = paid["prompt_tokens"] + paid["completion_tokens"]
    usage["cost"] = info["cost_usd"] = float(headers["X-Router-Cost-Usd"])
    usage["calls"] = 1
    data["usage"] = usage


def _summed_usage(result, cost_header: str) -> dict:
    """A cascade reply's `usage`: the tokens of every call it made (as each was priced), summed, and `cost` =
    `X-Router-Cost-Usd`."""
    paid = [r.tokens for r in result.replies if r.data is not None]
    pt, ct = sum(p for p, _ in paid), sum(c for _, c in paid)
    return {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct, "cost": float(cost_header),
            "calls": len(result.replies)}


def _log_access(request, resp, rid: str, t_start: float) -> None:
    """One JSON line (logger `router_lite.access`): when it was written (`ts`, ISO 8601 UTC), request id, router,
    target, answer format, agents called, the agent that answered, cost, latency (to the response headers, for a
    stream), status; the prompt only when the server was started with `log_prompts`. Read from the request's
    `ChatRequest` (`request.state.chat`: what the handler did), not from the response's headers."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    state = getattr(request.state, "served", None) or request.app.state.served  # who answered
    chat = getattr(request.state, "chat", None)
    a = chat.answer if chat is not None else Answer()
    line = {"ts": datetime.now(UTC).isoformat(timespec="milliseconds"), "request_id": rid,
            "router": state.router_name, "target": a.target, "grader": a.grader,
            "agents_called": list(a.agents_called), "agent": a.agent, "cost_usd": a.cost_usd,
            "latency_ms": round((time.perf_counter() - t_start) * 1000.0, 3), "status": resp.status_code,
            "ood": a.ood, "stream": resp.media_type == "text/event-stream"}
    key = getattr(request.state, "client_key", None)  # set by the client-key middleware (auth.py)
    if key is not None:
        line["key"] = key
    if state.log_prompts:
        line["prompt"] = chat.text if chat is not None else None
    access_log.info(json.dumps(line, ensure_ascii=False))


async def _healthz(request):
    from starlette.responses import JSONResponse

    state = request.app.state.served
    body = {"status": "ok", "head": state.router_name, "agents": [a.name for a in state.specs],
            "backbone": getattr(state.backbone, "model_id", str(state.backbone)),
            "device": getattr(state.backbone, "device", "")}
    other = request.app.state.open_ended
    if other is not None:
        body["open_ended"] = {"head": other.router_name, "agents": [a.name for a in other.specs]}
    return JSONResponse(body)


async def _models(request):
    from starlette.responses import JSONResponse

    return JSONResponse({"object": "list", "data": [s.model_obj for s in _routers(request.app.state)]})


def _routers(app_state) -> list:
    """The routers the app answers with: the served one, and the open-ended one when there is one."""
    return [app_state.served] + ([app_state.open_ended] if app_state.open_ended is not None else [])


async def _model_one(request):
    from starlette.responses import JSONResponse

    found = [s for s in _routers(request.app.state) if s.router_name == request.path_params["model"]]
    if not found:
        return error_response(RequestError(404, f"The model {show(request.path_params['model'])} does not exist",
                                           "model_not_found", "model"))
    return JSONResponse(found[0].model_obj)


async def _route(request, state):
    """(request, decision, view, point, t0) for a chat request, or the error response to send instead (`view`: the
    router view that decided; a cascade's view when the request named an answer format)."""
    batcher = state.batcher
    settings = state.settings
    t0 = time.perf_counter()
    try:
        batcher.arriving += 1  # the micro-batcher may wait a moment for this request
        try:
            req = getattr(request.state, "chat", None)  # parsed already by the client-key middleware (auth.py)
            if req is None:
                body = await read_body(request, settings.max_body_bytes)
                t0 = time.perf_counter()
                req = parse_chat_request(body, state.router_name, settings, state.endpoint.retired)
                try:
                    req.target = request_target(request.headers, req.body, settings.default_target)
                except RouterLiteError as exc:
                    raise RequestError(400, str(exc), "invalid_target", TARGET_FIELD) from None
                request.state.chat = req
            other = request.app.state.open_ended
            if other is not None and state is not other and named_world(other, request.headers, req) == OPEN_ENDED:
                return _OPEN_ENDED  # the request names the open-ended world: the verifiable router does not decide
            target = req.target
            grader = _request_grader(state, request.headers, req.body, req.tool_field)
            if grader is not None:  # a cascade entry and an answer format: the cascade's view of this target
                view, point = _cascade_view_for(state, target, grader)
            elif state.formats is not None:  # a cascade, no format named: guessed from the nearest training prompts
                view = _auto_view_for(state, target)
                point = view.point
                if req.tool_field is not None:  # one agent answers: the pick of a prompt without a guessed format
                    view = view.head_view
            else:
                try:
                    view, point = _view_for(state, target)
                except RouterLiteError as exc:
                    raise RequestError(400, str(exc), "invalid_target", TARGET_FIELD) from None
        finally:
            batcher.arriving -= 1
        tag = getattr(view, "tag", None) or (point["target"] if getattr(view, "grader", None) is None
                                              else f"cascade|{point['target']}|{view.grader}")
        decision = await batcher.decide(req.text, view, decision_tag(state, tag))
    except RequestError as err:
        return error_response(err)
    except RouterLiteError as exc:  # the embedder refused this text (the others of its batch went on)
        return error_response(RequestError(400, f"the user turns cannot be embedded: {exc}",
                                           "invalid_text", "messages"))
    except Exception as exc:  # noqa: BLE001 - the embedder failed: a router error, not the client's
        log.exception("routing failed")
        return error_response(RequestError(500, f"routing failed: {type(exc).__name__}", "router_error",
                                           type_="server_error"))
    return req, decision, view, point, t0


async def _chat(request):
    """A chat request: routed and answered by `_answer` on the router served when it arrived (taken once: a swap
    meanwhile does not change it), then one JSON line in the access log and the metrics."""
    t_start = time.perf_counter()
    rid = uuid.uuid4().hex
    # the router the client-key middleware priced the request on, else the one served now
    served = request.state.served = getattr(request.state, "served", None) or request.app.state.served
    resp = await _answer(request)
    served = request.state.served  # the router that answered (the open-ended one, when it took the request)
    resp.headers["X-Request-Id"] = rid
    if "X-Router-Name" not in resp.headers:
        resp.headers["X-Router-Name"] = served.router_name
    if request.app.state.open_ended is not None:
        resp.headers[WORLD_HEADER] = OPEN_ENDED if served is request.app.state.open_ended else VERIFIABLE
    _log_access(request, resp, rid, t_start)
    if request.app.state.traffic is not None:  # recorded once the client has the reply (pipeline/serve/traffic.py)
        resp = request.app.state.traffic.after_reply(request, resp, rid)
    if request.app.state.metrics is not None:
        request.app.state.metrics.observe(request, resp, served.router_name)
    return resp


async def _answer(request):
    from starlette.responses import StreamingResponse

    state = request.state.served
    routed = await _route(request, state)
    if _gives_up(request, state, routed):  # both worlds: the open-ended router answers (pipeline/serve/worlds.py)
        first_t0 = routed[4] if isinstance(routed, tuple) else None
        state = request.state.served = request.app.state.open_ended
        try:
            moved_to(request.state.chat, request.headers, state)
        except (RequestError, RouterLiteError) as exc:  # the open-ended router's own limits or targets
            return error_response(exc if isinstance(exc, RequestError) else
                                  RequestError(400, str(exc), "invalid_target", TARGET_FIELD))
        routed = await _route(request, state)
        if isinstance(routed, tuple) and first_t0 is not None:  # the overhead counts both routers' decisions
            routed = (*routed[:4], first_t0)
    if not isinstance(routed, tuple):
        return routed
    req, decision, view, point, t0 = routed
    if isinstance(view, AutoFormatView):  # the guessed format's cascade view, or prompt-only when none was guessed
        view, point = view.resolved(decision.format)
    if getattr(view, "grader", None) is not None:  # a cascade's view: its stages, or the agent a shortcut chose, alone
        return await _cascade_chat(state, req, decision, view, point, t0, request)
    spec, client = state.specs[decision.index], state.clients[decision.index]
    overhead_ms = (time.perf_counter() - t0) * 1000.0
    name = state.router_name
    answer = req.answer
    answer.agent, answer.agents_called = spec.name, [spec.name]
    answer.ood, answer.target = decision.ood, point["target"]
    # the shape of a cascade's `router` key: the agents called (one) and their cost (filled once the reply is read;
    # a stream's first chunk goes out before, so there it stays null and `usage.cost` of the stream carries it)
    info = {"head": name, "agent": spec.name, "model": spec.model, "ood_guard": decision.ood,
            "target": point["target"], "lambda": point["lambda"], "agents_called": [spec.name], "cost_usd": None,
            **_world(request, state)}
    headers = {"X-Router-Head": name, "X-Router-Agent": spec.name, "X-Router-Model": spec.model,
               "X-Router-OOD": "true" if decision.ood else "false", TARGET_HEADER: point["target"],
               "X-Router-Overhead-Ms": f"{overhead_ms:.3f}", "Server-Timing": f"router;dur={overhead_ms:.3f}"}
    payload = {"model": spec.model, **req.upstream}
    t_up, deadline = time.perf_counter(), deadline_of(state.upstream_opts)  # the whole call: head and body
    try:  # a client that leaves before the agent's response head cancels the call (as a cascade's stages)
        resp = await unless_disconnected(request, post_chat(client, payload, state.upstream_opts, deadline,
                                                            stream=True))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every agent failure is a 502
        return error_response(upstream_error(spec, client, exc), upstream_timing(headers, t_up, "failed"))
    if resp is None:
        return _gone()
    ctype = resp.headers.get("content-type", "")
    if req.stream and ctype.startswith("text/event-stream"):  # the headers go out before the stream: time to them
        return StreamingResponse(relay(resp, spec, client, info, deadline), status_code=200,
                                 headers={**upstream_timing(headers, t_up, "headers"), "Cache-Control": "no-cache"},
                                 media_type="text/event-stream")
    reply = await unless_disconnected(request, whole_reply(
        resp, spec, client, info, headers, t_up, deadline,
        finish=lambda data, hdrs: _count_paid(data, hdrs, spec, req.upstream, info)))
    answer.cost_usd = info["cost_usd"]  # = usage.cost (None: the reply was refused)
    if reply is None:
        await resp.aclose()
    return _gone() if reply is None else reply


def _gives_up(request, state, routed) -> bool:
    """Whether the verifiable router gives a request up to the open-ended router: the request names that world
    (`_route` answered `_OPEN_ENDED`), or it names neither world and the verifiable router's decision gives its
    prompt up (worlds.py `prompt_is_open_ended`)."""
    if routed is _OPEN_ENDED:
        return True
    other = request.app.state.open_ended
    if other is None or state is other or not isinstance(routed, tuple):
        return False
    req, decision, view = routed[:3]
    return named_world(other, request.headers, req) is None and prompt_is_open_ended(decision, view)


def _world(request, state) -> dict:
    """`{"world": ...}` of a reply's `router` key on an endpoint serving both worlds (pipeline/serve/worlds.py), else
    nothing."""
    other = request.app.state.open_ended
    return {} if other is None else {"world": OPEN_ENDED if state is other else VERIFIABLE}


def _gone():
    """The answer to a request whose client disconnected (its upstream calls were cancelled; nobody reads it)."""
    return error_response(RequestError(DISCONNECTED, "the client disconnected; the request's calls were cancelled",
                                       "client_disconnected"))


async def _cascade_chat(state, req, decision, view, point, t0, request):
    """A cascade request: the stages of the view's policy (or one agent, when a prompt shortcut or the OOD guard
    chose it); headers list every agent called and the summed cost; the accepted reply is returned (streamed as
    SSE when the request streams)."""
    from starlette.responses import Response

    from pipeline.route.cascade import policy_for
    from pipeline.serve.cascade_calls import run_cascade, sse_of

    reg, grader = state.registered, view.grader
    policy = policy_for(view.policy, decision.index)  # one agent without a check, when a shortcut chose one
    overhead_ms = (time.perf_counter() - t0) * 1000.0
    result = await unless_disconnected(request, run_cascade(policy, reg.router.order, state.specs, state.clients,
                                                            req.upstream, state.upstream_opts, grader))
    if result is None:  # the client left: its stage calls were cancelled and no escalation started
        return _gone()
    names = [state.specs[j].name for j in result.called]
    answer = req.answer
    answer.calls = [(state.specs[r.agent].name, r.cost, r.latency_ms / 1000.0) for r in result.replies]
    answer.replies = result.replies
    answer.agents_called, answer.ood, answer.target, answer.grader = names, decision.ood, point["target"], grader
    name = state.router_name
    headers = {"X-Router-Head": name, "X-Router-Agents-Called": ",".join(names),
               "X-Router-Cost-Usd": f"{result.cost:.8f}", "X-Router-Cascade-Stage": str(result.stage),
               "X-Router-OOD": "true" if decision.ood else "false", TARGET_HEADER: point["target"],
               GRADER_HEADER: grader, "X-Router-Overhead-Ms": f"{overhead_ms:.3f}",
               "X-Router-Stage-Ms": ",".join(f"{w:.1f}" for w in result.stage_ms),
               "X-Router-Grading-Overruns": str(result.grading_overruns),  # replies graded as "no answer"
               "Server-Timing": f"router;dur={overhead_ms:.3f}, "
                                + ", ".join(f"stage{i};dur={w:.1f}" for i, w in enumerate(result.stage_ms))}
    if point.get("guessed"):
        headers["X-Router-Grader-Source"] = "guessed"
    answer.cost_usd = float(headers["X-Router-Cost-Usd"])  # = usage.cost; a failed cascade's calls were paid too
    invalid = [state.specs[r.agent].name for r in result.replies if r.cost_invalid]
    if invalid:  # their usage.cost was refused (not finite, < 0 or absurd): estimated from prices x tokens instead
        headers["X-Router-Cost-Invalid"] = ",".join(invalid)
    if result.accepted is None:
        last = result.replies[-1]
        spec = state.specs[last.agent]
        return error_response(upstream_error(spec, state.clients[last.agent], last.error or
                                             ValueError("no usable reply")), headers)
    spec = state.specs[result.accepted.agent]
    answer.agent = spec.name
    headers.update({"X-Router-Agent": spec.name, "X-Router-Model": spec.model})
    info = {"head": name, "agent": spec.name, "model": spec.model, "ood_guard": decision.ood,
            "target": point["target"], "grader": grader, "grader_guessed": bool(point.get("guessed")),
            "agents_called": names, "cost_usd": result.cost, "stage": result.stage,
            **({"cost_invalid": invalid} if invalid else {}), **_world(request, state)}
    data = dict(result.accepted.data)
    data["usage"] = _summed_usage(result, headers["X-Router-Cost-Usd"])
    if req.stream:
        return Response(sse_of(data, info), status_code=200, headers={**headers, "Cache-Control": "no-cache"},
                        media_type="text/event-stream")
    data["router"] = info
    return Response(json.dumps(data, ensure_ascii=False).encode(), status_code=200, headers=headers,
                    media_type="application/json")


async def _not_found(request, exc):
    code = "method_not_allowed" if exc.status_code == 405 else "unknown_url"
    return error_response(RequestError(exc.status_code, f"{request.method} {show(request.url.path)}: {exc.detail}",
                                       code))


async def _readyz(request):
    from starlette.responses import JSONResponse

    from pipeline.serve.drain import draining

    state, stopping = request.app.state, draining(request)  # a server that stops is not ready (pipeline/serve/drain.py)
    return JSONResponse(state.readiness.body(state.served, state.follower, stopping),
                        200 if state.readiness.ready and not stopping else 503)


async def _metrics(request):
    from starlette.responses import Response

    from pipeline.serve.metrics import CONTENT_TYPE

    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


@contextlib.asynccontextmanager
async def _lifespan(app):
    """Warm up (`/readyz`) and follow the registry's pointer in the background while the app runs; close the agents'
    clients and the embedding worker when it shuts down."""
    from pipeline.serve.readiness import warm_up

    state = app.state
    tasks = [asyncio.create_task(warm_up(app))]
    if state.follower is not None:
        tasks.append(asyncio.create_task(state.follower.run(app)))
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if state.traffic is not None:  # explorations still use the agents' clients
            await state.traffic.close()
        for served in _routers(state):
            for c in served.endpoint.clients.values():
                try:
                    await c.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
            served.endpoint.batcher.close()
