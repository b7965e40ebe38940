"""Reading and validating an OpenAI chat-completions request: the body within its limits, the JSON, the messages
and the sampling parameters (`parse_chat_request`, a pure function: the whole 400/404 contract of a chat request
lives here), and the OpenAI-style error every refusal is answered with (`RequestError`, `error_response`)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from pipeline.core.text_guard import json_problem
from pipeline.serve.settings import FORWARDED_PARAMS, SEED_RANGE, ServeSettings

MAX_MESSAGE_CHARS = 1000  # an error message sent to a client, at most


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


def _number(req: dict, name: str, lo: float, hi: float) -> None:
    v = req.get(name)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise RequestError(400, f"'{name}' must be a number in [{lo:g}, {hi:g}], got {show(v)}", "invalid_value",
                           name)


def _integer(req: dict, name: str, lo: int, hi: int, what: str) -> None:
    v = req.get(name)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
        raise RequestError(400, f"'{name}' must be {what}, got {show(v)}", "invalid_value", name)


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


def parse_chat_request(body: bytes, router_name: str, settings: ServeSettings, aliases=()) -> ChatRequest:
    """Validate a chat-completions body (a pure function: the whole 400/404 contract lives here). `model` may be
    `router_name`, one of `aliases` (routers served before a promotion) or absent."""
    req = load_json_body(body, settings)
    model = req.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, f"'model' must be a string, got {type(model).__name__}", "invalid_value", "model")
    if model not in (None, "", router_name) and model not in aliases:
        raise RequestError(404, f"The model {show(model)} does not exist: this router serves `{router_name}` "
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
        raise RequestError(400, f"'stream' must be a boolean, got {show(stream)}", "invalid_value", "stream")
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
