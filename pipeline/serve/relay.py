"""The picked agent's reply, relayed to the client: the JSON body with the `router` key added (`whole_reply`), or
its SSE stream with `router` added to the first JSON event (`relay`; never an `Infinity` or a refused `usage.cost`:
pipeline/collect/costs.py); an agent's failure as the 502 the client gets (`upstream_error`, its message scrubbed of
the client's key), and the upstream call's time in `Server-Timing` (`upstream_timing`). Every upstream call is
bounded as a whole (`within`: headers and body together, not per read: an agent trickling a byte a second is an
`upstream_timeout` at the deadline), and a request whose client disconnected cancels its upstream calls
(`unless_disconnected`)."""
from __future__ import annotations

import asyncio
import json
import math
import re
import time
from typing import Any

from pipeline.collect.agents import AgentSpec
from pipeline.collect.client import cost_invalid, scrub
from pipeline.serve.requests import RequestError, error_response

_EVENT_END = re.compile(rb"\r?\n\r?\n")
MAX_EVENT_BYTES = 1 << 20  # an SSE event held to be checked whole, at most


DISCONNECTED = 499  # the status logged for a request whose client left before its answer (nobody reads it)


def deadline_of(options: dict) -> float:
    """The `time.monotonic()` by which an upstream call started now must be over (`options["timeout"]` seconds)."""
    return time.monotonic() + float(options.get("timeout") or 180.0)


async def within(deadline: float, aw):
    """`aw` awaited until `deadline` (`time.monotonic()`); past it, cancelled and `asyncio.TimeoutError` (which
    `upstream_error` answers as `upstream_timeout`)."""
    return await asyncio.wait_for(aw, max(0.0, deadline - time.monotonic()))


def no_response(exc: BaseException) -> bool:
    """True when `exc` is a connection failure before any response head: the connection could not be opened, or it
    was closed or reset under the request, typically a pooled keep-alive connection the agent closed as it was
    reused (a race every HTTP client that keeps connections meets). Timeouts are not: their time is spent."""
    import openai

    # the SDK's own classes: its transport (httpx or httpx2, by openai version) maps timeouts to APITimeoutError
    return isinstance(exc, openai.APIConnectionError) and not isinstance(exc, openai.APITimeoutError)


async def post_chat(client: Any, payload: dict, options: dict, deadline: float, stream: bool):
    """The agent's `httpx.Response` to `POST /chat/completions` (`client` is an `openai.AsyncOpenAI` with
    max_retries=0): sent once more, within `deadline`, when the first attempt got `no_response` (as the openai SDK's
    own retries would; no reply was relayed, so the client sees one answer). Other failures (a status, a timeout)
    are the caller's 502 at once, and a reply cut short after its head is never sent again."""
    import httpx

    for attempt in (0, 1):
        try:
            return await within(deadline, client.post("/chat/completions", body=payload, cast_to=httpx.Response,
                                                      options=options, stream=stream))
        except Exception as exc:  # noqa: BLE001 - re-raised unless retried
            if attempt or not no_response(exc) or deadline - time.monotonic() <= 0:
                raise


async def unless_disconnected(request, aw):
    """The result of coroutine `aw`, run as a task while the client's connection is watched; when the client
    disconnects first the task is cancelled (with it its in-flight upstream calls, and no later stage starts) and
    the result is None. The request body must have been read already."""
    task = asyncio.ensure_future(aw)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():  # the client left (or this handler was cancelled): stop the calls
            task.cancel()
        watch.cancel()
    if task.cancelled() or not task.done():
        try:
            await task
        except asyncio.CancelledError:
            pass
        return None
    return task.result()


def upstream_error(spec: AgentSpec, client: Any, exc: BaseException) -> RequestError:
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


def upstream_timing(headers: dict, t_up: float, desc: str | None = None) -> dict:
    """`headers` with the upstream call's milliseconds since `t_up` added to Server-Timing, after the router's own."""
    up = f"upstream;dur={(time.perf_counter() - t_up) * 1000.0:.3f}" + (f';desc="{desc}"' if desc else "")
    return {**headers, "Server-Timing": f"{headers['Server-Timing']}, {up}"}


async def relay(resp, spec: AgentSpec, client: Any, info: dict, deadline: float | None = None):
    """The agent's SSE stream event by event, with `router` added to the first JSON event; an event that carries
    `usage` or a non-finite constant is rewritten (`_rewrite_event`: never `Infinity` / `NaN`, a refused `usage.cost`
    null), the others pass byte for byte; a stream still running at `deadline` ends with an `upstream_timeout` error
    event."""
    buf, injected = b"", False
    chunks = resp.aiter_bytes().__aiter__()
    try:
        while True:
            try:
                nxt = chunks.__anext__()
                chunk = await (nxt if deadline is None else within(deadline, nxt))
            except StopAsyncIteration:
                break
            buf += chunk
            while (m := _EVENT_END.search(buf)) is not None:
                event, sep, buf = buf[:m.start()], buf[m.start():m.end()], buf[m.end():]
                if not injected:
                    new = _rewrite_event(event, info)
                    injected = new is not None
                elif any(w in event for w in (b'"usage"', b"Infinity", b"NaN")):
                    new = _rewrite_event(event, None)
                else:
                    new = None
                yield (event if new is None else new) + sep
            if injected and len(buf) > MAX_EVENT_BYTES:  # no event end in sight: passed on as it comes
                yield buf
                buf = b""
        if buf:
            yield buf
    except Exception as exc:  # noqa: BLE001 - the stream broke after the headers went out
        err = upstream_error(spec, client, exc)
        yield b"data: " + json.dumps({**err.body(), "router": info}).encode() + b"\n\n"
    finally:
        await resp.aclose()


async def whole_reply(resp, spec: AgentSpec, client: Any, info: dict, headers: dict, t_up: float | None = None,
                      deadline: float | None = None, finish=None):
    """The agent's JSON reply with `router` added, or a 502 when it cannot be read (by `deadline`) or has no
    choices; `finish(data, headers)`, when given, completes the body and headers first (the app adds what was
    paid)."""
    from starlette.responses import Response

    try:
        raw = await (resp.aread() if deadline is None else within(deadline, resp.aread()))
    except Exception as exc:  # noqa: BLE001
        return error_response(upstream_error(spec, client, exc), headers)
    finally:
        await resp.aclose()
    if t_up is not None:  # the whole upstream call: request sent -> reply body read
        headers = upstream_timing(headers, t_up)
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=finite_float)  # never relay inf / NaN
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise ValueError("no choices" + (f": {str(data.get('error'))[:200]}" if isinstance(data, dict)
                                              and data.get("error") else ""))
    except ValueError as exc:
        return error_response(upstream_error(spec, client, ValueError(f"unusable reply body ({exc})")), headers)
    if finish is not None:
        headers = dict(headers)
        finish(data, headers)
    data["router"] = info
    return Response(json.dumps(data, ensure_ascii=False).encode(), status_code=200, headers=headers,
                    media_type="application/json")


def _no_constant(name: str) -> None:
    return None  # an agent's NaN / Infinity (Python's json reads them; no client does) becomes null


def finite_float(text: str) -> float | None:
    """A JSON number of an agent's reply; one past float range (1e400 reads as inf, written back as Infinity: no
    client reads it) becomes null."""
    v = float(text)
    return v if math.isfinite(v) else None


def _rewrite_event(event: bytes, router: dict | None) -> bytes | None:
    """The SSE event with `router` added to its JSON data (when given), its non-finite numbers null and a refused
    `usage.cost` (pipeline/collect/costs.py) null; None when it is not a `data: {...}` event."""
    lines = event.split(b"\n")
    for i, line in enumerate(lines):
        line = line.rstrip(b"\r")
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if not payload.startswith(b"{"):
                return None
            try:
                obj = json.loads(payload, parse_constant=_no_constant, parse_float=finite_float)
            except (ValueError, RecursionError):
                return None
            if not isinstance(obj, dict):
                return None
            if router is not None:
                obj["router"] = router
            if isinstance(obj.get("usage"), dict) and cost_invalid(obj["usage"]):
                obj["usage"]["cost"] = None
            lines[i] = b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
            return b"\n".join(lines)
    return None
