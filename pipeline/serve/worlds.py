"""Both worlds behind one endpoint: a verifiable router (its tasks have gold answers: integers, expressions, literals,
letters) and an open-ended router (its replies graded by a judge: `chat`), each with its own pool, agents, clients,
settings, batcher and OOD guard, chosen per request (docs/serving.md, "Both worlds in one endpoint").

The verifiable router decides first, as it always does; its decision says whether the prompt is its own:

- a request that names an answer format (`router_grader` / `X-Router-Grader`) is answered in that format's world:
  `judge` by the open-ended router, any other by the verifiable one;
- a request that names a router (`model`) is answered by it;
- otherwise the prompt goes to the open-ended router when the verifiable router's OOD guard fired on it (it is far
  from every prompt that router was trained on) or, for a router that guesses answer formats (a cascade served
  with its training prompts' formats, pipeline/route/formats.py), when no answer format was guessed (its nearest
  training prompts disagree). Every other prompt stays with the verifiable router.

No threshold is added: the guard and the format guess are the verifiable router's own, fitted on its training split.
An open-ended prompt is embedded twice (once by each router's batcher; ~15 ms of CPU with MiniLM on OpenVINO).
"""
from __future__ import annotations

import json

from pipeline.collect.judge import JUDGE_GRADER
from pipeline.route.served import AutoFormatView
from pipeline.route.targets import request_target
from pipeline.serve.requests import GRADER_FIELD, GRADER_HEADER, ChatRequest, parse_chat_request
from pipeline.serve.served import Endpoint, ServedRouter, served_router

VERIFIABLE, OPEN_ENDED = "verifiable", "open-ended"  # the world a reply names (`router.world`, X-Router-World)
WORLD_HEADER = "X-Router-World"


def open_ended_router(registered, backbone, agents, client_for, settings, formats=None,
                      log_prompts: bool = False) -> ServedRouter:
    """The open-ended router of an endpoint, checked as any served router (`served_router`) on an endpoint of its
    own: its pool's `agents` and clients, its profile's `settings` (forwarded defaults, default target)."""
    return served_router(registered, Endpoint(backbone, agents, client_for, settings, log_prompts), formats=formats)


def serve_both(app, open_ended: ServedRouter):
    """`app` (pipeline/serve/app.py `build_app`'s, serving the verifiable router) answering open-ended prompts with
    `open_ended` too: each request is answered by one of the two, and the reply names which (`router.head`,
    `router.world`, `X-Router-Name`, `X-Router-World`). Returns `app`."""
    state = app.state
    state.open_ended = open_ended
    state.endpoint.retired.add(open_ended.router_name)  # a request naming it passes the model check; it answers it
    if state.metrics is not None:
        state.metrics.router(open_ended)
    return app


def named_format(headers, body: dict) -> str | None:
    """The answer format a request names itself (the body's field, else the header; the server's default is not
    one: it applies within the verifiable world)."""
    value = body.get(GRADER_FIELD) if isinstance(body, dict) else None
    if value is None and headers is not None:
        value = headers.get(GRADER_HEADER)
    return value if isinstance(value, str) and value.strip() else None


def named_world(open_ended: ServedRouter, headers, req: ChatRequest) -> str | None:
    """The world a request names itself: by its answer format (`judge`: open-ended, any other: verifiable), else by
    naming the open-ended router as its `model`; None: its prompt decides (`prompt_is_open_ended`)."""
    named = named_format(headers, req.body)
    if named is not None:
        return OPEN_ENDED if named == JUDGE_GRADER else VERIFIABLE
    return OPEN_ENDED if req.body.get("model") == open_ended.router_name else None


def prompt_is_open_ended(decision, view) -> bool:
    """Whether the verifiable router's `decision` by `view` gives the prompt up: its OOD guard fired, or a
    format-guessing view (`AutoFormatView`) guessed no answer format."""
    return bool(decision.ood) or (isinstance(view, AutoFormatView) and decision.format < 0)


def moved_to(req: ChatRequest, headers, served: ServedRouter) -> None:
    """`req` read again for `served`: its user turns cut to that router's backbone window, its forwarded defaults
    and target default that router's profile's (a target the client named stays). The same object: the access log,
    the metrics and the client-key meter read what the handler records on it."""
    again = parse_chat_request(json.dumps(req.body).encode(), served.router_name, served.settings,
                               served.endpoint.retired | {req.body.get("model")})
    req.text, req.upstream = again.text, again.upstream
    req.target = request_target(headers, req.body, served.settings.default_target)
