"""Reading and validating an OpenAI chat-completions request: the body within its limits, the JSON, the messages
and the sampling parameters (`parse_chat_request`, a pure function: the whole 400/404 contract of a chat request
lives here; the fields are typed by the pydantic model `ChatBody`), and the OpenAI-style error every refusal is
answered with (`RequestError`, `error_response`).

A request is parsed once: `ChatRequest` is the one object carried on `request.state.chat` from the client-key
middleware (auth.py: target, worst-case price) through the handler (app.py, which records what it did in
`ChatRequest.answer`) to the reply's meter (metering.py), the metrics and the access log."""
from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from pipeline.core.prompts import routed_text
from pipeline.core.text_guard import json_problem
from pipeline.serve.settings import FORWARDED_PARAMS, SEED_RANGE, ServeSettings

MAX_MESSAGE_CHARS = 1000  # an error message sent to a client, at most
# what asks an agent for a tool call or a reply format: forwarded unchanged to the one agent that answers, never
# defaulted, and refused where a request asks a cascade to compare answers (app.py, `_request_grader`)
TOOL_PARAMS = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "functions", "function_call")


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


class Message(BaseModel):
    """One message: a string `role`; its other fields (content, name, tool calls...) are forwarded as given."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    role: str
    content: Any = None


def _int_in(lo: int, hi: int | None = None):
    return Annotated[int | None, Field(ge=lo, le=hi, strict=True)]


class ChatBody(BaseModel):
    """The fields of a chat-completions body the router reads, typed (pydantic, strict: `true` is no number and
    `1.0` no integer); `model_validate(body, context=Limits(...))` checks the server's own limits too. Any other
    field is kept as given (`model_extra`). The first error, in field order, is the client's 400 or 404
    (`_refusal`: the same messages, codes and `param` as the hand-written checks before)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    model: str | None = None
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: _int_in(1) = None
    max_completion_tokens: _int_in(1) = None
    seed: _int_in(*SEED_RANGE) = None
    temperature: Annotated[float | None, Field(ge=0.0, le=2.0)] = None
    top_p: Annotated[float | None, Field(ge=0.0, le=1.0)] = None
    stream: bool | None = None
    stream_options: dict | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    n: _int_in(1, 1) = None  # one agent answers: `true` and `1.0` equal 1 in Python, not here
    # TOOL_PARAMS: typed so a malformed one is the client's 400 here, not the agent's (a 502); forwarded as given
    tools: Annotated[list[dict], Field(min_length=1)] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict | None = None
    functions: Annotated[list[dict], Field(min_length=1)] | None = None
    function_call: str | dict | None = None

    @field_validator("model")
    @classmethod
    def _served(cls, v, info: ValidationInfo):
        lim = info.context
        if v not in (None, "", lim.router_name) and v not in lim.aliases:
            raise PydanticCustomError("model_not_found", f"The model {show(v)} does not exist: this router serves "
                                      f"`{lim.router_name}` (or leave `model` out)")
        return v

    @field_validator("messages", mode="before")
    @classmethod
    def _few_enough(cls, v, info: ValidationInfo):
        if isinstance(v, list) and len(v) > info.context.max_messages:
            raise PydanticCustomError("too_many_messages",
                                      f"too many messages: {len(v)} > {info.context.max_messages}")
        return v

    @field_validator("messages")
    @classmethod
    def _has_user_text(cls, v):
        last_user = next((m for m in reversed(v) if m.role == "user"), None)
        if last_user is None:
            raise PydanticCustomError("missing_user_message", "no user message: the router embeds the messages "
                                      "with role 'user', the last one last")
        text = _content_text(last_user.content)
        if not text or not text.strip():
            raise PydanticCustomError("missing_user_message", "the last user message has no text content")
        return v

    @field_validator("max_tokens", "max_completion_tokens")
    @classmethod
    def _capped(cls, v, info: ValidationInfo):
        if v is not None and v > info.context.max_tokens_cap:
            raise PydanticCustomError("invalid_value", "over the cap")  # worded by _refusal (the field's range)
        return v

    @property
    def user_turns(self) -> list[str]:
        """The text of each user message, in order (content parts joined; a message without text is no turn): what
        `routed_text` makes the embedded text of."""
        texts = [_content_text(m.content) for m in self.messages if m.role == "user"]
        return [t for t in texts if t is not None]

    @property
    def tool_field(self) -> str | None:
        """The first of TOOL_PARAMS the request carries (not null), or None."""
        return next((k for k in TOOL_PARAMS if getattr(self, k) is not None), None)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a body is validated against besides its types: the router served, its retired names, the server's
    limits (the validation context of `ChatBody`)."""

    router_name: str
    aliases: frozenset | tuple | set
    max_messages: int
    max_tokens_cap: int


GRADER_FIELD, GRADER_HEADER = "router_grader", "X-Router-Grader"  # a cascade compares answers with this grader


@dataclasses.dataclass
class Answer:
    """What the handler did with a chat request, as the access log, the metrics and the client-key meter read it:
    the target and answer format it ran at, the agent that answered, every agent called, what the reply cost (= its
    `usage.cost`; None: not known when the response started, as for a relayed stream, or nothing was paid) and a
    cascade's calls (agent, USD, seconds) and their replies (pipeline/serve/cascade_calls.py `Reply`: the traffic
    log's)."""

    target: str | None = None
    grader: str | None = None
    agent: str | None = None
    agents_called: list = dataclasses.field(default_factory=list)
    cost_usd: float | None = None
    ood: bool | None = None
    calls: list | None = None
    replies: list | None = None


@dataclasses.dataclass
class ChatRequest:
    """One chat request, parsed once (by the client-key middleware when the server has one, else by the handler) and
    carried on `request.state.chat` from parsing to the access log: the validated body, what is embedded and forwarded,
    the target it runs at (canonical; None until resolved) and what the handler did (`answer`)."""

    text: str  # what is embedded: `routed_text` of the user turns (the latest last, earlier ones as far as they fit)
    upstream: dict  # what is forwarded, less `model`
    stream: bool
    body: dict = dataclasses.field(default_factory=dict, repr=False)  # the whole validated body (further fields)
    target: str | None = None
    answer: Answer = dataclasses.field(default_factory=Answer)
    tool_field: str | None = None  # the first of TOOL_PARAMS it carries: one agent must answer it


def show(v: Any, limit: int = 80) -> str:
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


def _refusal(exc: ValidationError, cap: int) -> RequestError:
    """The first error of a `ChatBody` validation as the client's RequestError."""
    e = exc.errors(include_url=False)[0]
    loc, v = e["loc"], e.get("input")
    name = str(loc[0])
    if e["type"] == "model_not_found":
        return RequestError(404, e["msg"], "model_not_found", "model")
    if e["type"] in ("too_many_messages", "missing_user_message"):
        return RequestError(400, e["msg"], e["type"], "messages")
    if name == "messages":
        if len(loc) > 1:
            return RequestError(400, f"messages[{loc[1]}] must be an object with a string 'role'", "invalid_message",
                                f"messages[{loc[1]}]")
        return RequestError(400, "missing required parameter: 'messages' (a non-empty list)", "missing_messages",
                            "messages")
    what = {"model": f"a string, got {type(v).__name__}",
            "max_tokens": f"an integer in [1, {cap}] (this router's cap), got {show(v)}",
            "seed": f"a 64-bit signed integer, got {show(v)}",
            "temperature": f"a number in [0, 2], got {show(v)}", "top_p": f"a number in [0, 1], got {show(v)}",
            "stream": f"a boolean, got {show(v)}", "stream_options": "an object",
            "stop": "a string or a list of up to 4 strings", "n": "1: the router returns one agent's reply",
            "tools": "a non-empty list of tool objects", "functions": "a non-empty list of function objects",
            "tool_choice": "a string or an object", "function_call": "a string or an object",
            "response_format": "an object", "parallel_tool_calls": f"a boolean, got {show(v)}"}
    what["max_completion_tokens"] = what["max_tokens"]
    return RequestError(400, f"'{name}' must be {what[name]}", "invalid_value", name)


def parse_chat_request(body: bytes, router_name: str, settings: ServeSettings, aliases=()) -> ChatRequest:
    """Validate a chat-completions body (a pure function: the whole 400/404 contract lives here). `model` may be
    `router_name`, one of `aliases` (routers served before a promotion) or absent."""
    req = load_json_body(body, settings)
    cap = int(settings.max_tokens_cap)
    try:
        fields = ChatBody.model_validate(req, context=Limits(router_name, aliases, settings.max_messages, cap))
    except ValidationError as exc:
        raise _refusal(exc, cap) from None
    own_limit = fields.max_tokens is not None or fields.max_completion_tokens is not None
    upstream = {k: v for k, v in settings.defaults.items()
                if not (own_limit and k in ("max_tokens", "max_completion_tokens"))}
    upstream.update({k: req[k] for k in FORWARDED_PARAMS + TOOL_PARAMS if req.get(k) is not None})
    if not fields.stream:
        upstream.pop("stream_options", None)
        upstream.pop("stream", None)
    upstream["messages"] = req["messages"]  # forwarded as given
    return ChatRequest(text=routed_text(fields.user_turns, settings.routed_window), upstream=upstream,
                       stream=bool(fields.stream), body=req, tool_field=fields.tool_field)


async def read_body(request, limit: int) -> bytes:
    """A starlette request's body, refused (400) over `limit` bytes as declared or as read, or cut short."""
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


UNREAD_BODY = ("body_too_large", "invalid_request")  # refused before the body was read to its end


def error_response(err: RequestError, headers: dict | None = None):
    """`err` as the OpenAI-style JSON response the client gets. A request refused before its body was read through
    (`UNREAD_BODY`) is answered `Connection: close`: the server closes the connection after the answer instead of
    reading, and throwing away, whatever the client keeps sending (a chunked body has no end)."""
    from starlette.responses import JSONResponse

    if err.code in UNREAD_BODY:
        headers = {**(headers or {}), "Connection": "close"}
    return JSONResponse(err.body(), status_code=err.status, headers=headers)
