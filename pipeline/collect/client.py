"""One logical call to one agent (`call_once`), with retries; never raises for provider or transport failures (they
become `status="error"` fields with an `error_kind`). No network of its own: it is handed an `openai.AsyncOpenAI`
client (resources/pool.py makes them). The client's `api_key` is scrubbed from every error message recorded or
logged (`scrub`)."""
from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import re
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from pipeline.collect.agents import AgentSpec
from pipeline.collect.costs import plausible_tokens, plausible_usd
from pipeline.collect.grading import is_empty
from pipeline.collect.replay import approx_tokens
from pipeline.collect.settings import CollectionSettings
from pipeline.core.secrets import mask

log = logging.getLogger(__name__)

# error kinds recorded in the call log
RETRYABLE_KINDS = {"rate_limit", "server_error", "timeout", "connection", "bad_response"}
ERROR_KINDS = RETRYABLE_KINDS | {"not_found", "auth", "payment", "bad_request", "client_error"}


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove secrets (and any bearer token) from a message that will be recorded or logged."""
    text = mask(text, secrets)  # any case, and any run of 8+ characters of the key (pipeline/core/secrets.py)
    return re.sub(r"(?i)(bearer\s+)[^\s'\"]+", r"\1***", text)


def _retry_after_s(headers: Any) -> float | None:
    """Seconds from `retry-after-ms`, or `Retry-After` as seconds or an HTTP date; None if absent/invalid."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = str(value).strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _classify(exc: BaseException) -> tuple[str, float | None]:
    """(error_kind, retry_after_s) of an exception raised by the openai client."""
    import httpx
    import openai

    if isinstance(exc, (asyncio.TimeoutError, openai.APITimeoutError, httpx.TimeoutException)):
        return "timeout", None
    if isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
        return "connection", None
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        ra = _retry_after_s(getattr(exc.response, "headers", None))
        if code == 429:
            return "rate_limit", ra
        if code >= 500 or code in (408, 409, 425):
            return ("timeout" if code == 408 else "server_error"), ra
        if code in (401, 403):
            return "auth", None
        if code == 402:
            return "payment", None
        if code == 404:
            return "not_found", None
        if code in (400, 413, 422):
            return "bad_request", None
        return "client_error", None
    return "bad_response", None  # APIResponseValidationError, undecodable JSON, unexpected shapes


def usage_int(usage: dict, name: str) -> int | None:
    return plausible_tokens(usage.get(name))


def usage_cost(usage: dict) -> float | None:
    """The provider's `usage.cost` in USD when plausible (pipeline/collect/costs.py); None when absent or refused
    (negative, NaN, infinite, over MAX_CALL_USD, not a number: `cost_invalid` tells the two apart)."""
    return plausible_usd(usage.get("cost"))


def cost_invalid(usage: dict) -> bool:
    """The provider reported a `usage.cost` that `usage_cost` refuses (the estimate replaces it, flagged)."""
    return usage.get("cost") is not None and usage_cost(usage) is None


def reply_usage(agent: AgentSpec, upstream: dict, data: dict, text: str | None = None) -> dict:
    """What one agent reply cost: its `usage` tokens, estimated from characters (ceil(chars / 4)) where usage lacks
    them, and OpenRouter's `usage.cost` when reported and plausible (`usage_cost`), else the agent's list prices x
    those tokens. The one pricing rule for everything that relays replies (the head's and the cascade's replies in
    `serve`). Estimated, a request's tool definitions count as prompt, a reply's tool calls as completion (a
    provider bills both)."""
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    pt, ct = usage_int(usage, "prompt_tokens"), usage_int(usage, "completion_tokens")
    if pt is None:
        pt = approx_tokens(" ".join(str(m.get("content", "")) for m in upstream.get("messages", [])
                                    if isinstance(m, dict)))
        defs = [upstream[k] for k in ("tools", "functions") if upstream.get(k)]
        pt += approx_tokens(json.dumps(defs)) if defs else 0
    if ct is None:
        if text is None:
            try:
                text = parse_completion(data)["text"]
            except ValueError:
                text = None
        calls = _tool_calls(data)
        ct = approx_tokens(text or "") + (approx_tokens(json.dumps(calls)) if calls else 0)
    cost = usage_cost(usage)
    if cost is None:
        cost = agent.cost(pt, ct)
    return {"prompt_tokens": pt, "completion_tokens": ct, "cost": float(cost)}


def _tool_calls(data: dict) -> list:
    """The tool calls (`tool_calls`, or a legacy `function_call`) of a chat.completion's first message, or []."""
    choices = data.get("choices")
    msg = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
        else None
    if not isinstance(msg, dict):
        return []
    calls = msg.get("tool_calls") if isinstance(msg.get("tool_calls"), list) else []
    return calls + ([msg["function_call"]] if msg.get("function_call") else [])


def parse_completion(data: Any) -> dict:
    """Fields of a chat.completion JSON body; raises ValueError when it is not a usable completion
    (no choices - e.g. OpenRouter's 200 with an `error` object -, no message, non-text content)."""
    if not isinstance(data, dict):
        raise ValueError(f"completion body is {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        err = data.get("error")
        raise ValueError(f"completion without choices{': ' + str(err)[:200] if err else ''}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ValueError("completion choice without message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError(f"message content is {type(content).__name__}, not text")
    usage = data.get("usage")
    return {"text": content, "finish_reason": choice.get("finish_reason"),
            "usage": usage if isinstance(usage, dict) else {}, "logprobs": choice.get("logprobs")}


def _backoff(settings: CollectionSettings, attempt: int) -> float:
    base = min(settings.backoff_max_s, settings.backoff_base_s * (2 ** attempt))
    return base * (0.5 + random.random() / 2)  # jitter against synchronised retries


async def call_once(client: Any, agent: AgentSpec, prompt: str, settings: CollectionSettings,
                    extra: dict[str, Any] | None = None) -> dict:
    """One logical call (first attempt + up to `settings.max_retries` retries).

    Retries on rate_limit, server_error, timeout, connection and bad_response, waiting Retry-After when the
    provider sends one (seconds or HTTP date; more than `max_retry_after_s` is not waited: the call ends as
    rate_limit), else exponential backoff with jitter. Returns the call fields:
    status (ok | empty | error), error_kind, error_message (secrets scrubbed), response_text, finish_reason,
    prompt_tokens, completion_tokens, usage_source ("provider" | "provider_estimate" = the provider's counts made by a
    stated estimate, e.g. the replay's ceil(characters/4) | "estimated" = approx_tokens of the texts here),
    cost_usd (the provider's `usage.cost` when given and plausible, e.g. OpenRouter; else agent prices x tokens, and
    then `cost_invalid: True` when the provider's was refused: `usage_cost`),
    latency_ms (of the last attempt), attempts, model, and `logprobs` (the choice's, None when not returned).
    Tokens and cost are None for errors. `extra`: more request fields (the judge's `logprobs`, `top_logprobs`).
    """
    import httpx

    secrets = [getattr(client, "api_key", None)]
    body = {**_request_body(agent, prompt, settings), **(extra or {})}
    # max_retries=0 per request: our loop owns retries.
    options = {"timeout": settings.timeout_s, "max_retries": 0}
    attempts = 0
    latency_ms = 0.0
    kind, message = "bad_response", ""
    while True:
        attempts += 1
        t0 = time.perf_counter()
        retry_after: float | None = None
        try:
            async with asyncio.timeout(settings.timeout_s + 5.0):  # belt and braces over the SDK timeout
                resp = await client.post("/chat/completions", body=body, cast_to=httpx.Response, options=options)
                try:
                    raw = await resp.aread()
                finally:
                    await resp.aclose()
            latency_ms = (time.perf_counter() - t0) * 1000.0
            fields = parse_completion(json.loads(raw))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every provider/transport failure becomes an error row
            latency_ms = (time.perf_counter() - t0) * 1000.0
            kind, retry_after = _classify(exc)
            message = scrub(f"{type(exc).__name__}: {exc}", secrets)[:500]
        else:
            return _answered_row(agent, prompt, fields, latency_ms, attempts)
        retryable = kind in RETRYABLE_KINDS and attempts <= settings.max_retries
        if retryable and retry_after is not None and retry_after > settings.max_retry_after_s:
            message += f" (Retry-After {retry_after:.0f}s > {settings.max_retry_after_s:.0f}s: not waited)"
            retryable = False
        if not retryable:
            return _error_row(agent, kind, message, latency_ms, attempts)
        delay = retry_after if retry_after is not None else _backoff(settings, attempts - 1)
        log.debug("agent %s: %s on attempt %d, retrying in %.2fs", agent.name, kind, attempts, delay)
        await asyncio.sleep(delay)


def _request_body(agent: AgentSpec, prompt: str, settings: CollectionSettings) -> dict[str, Any]:
    """The body `client.chat.completions.create(..., extra_body={"reasoning": {"effort": ...}})` would send.

    call_once posts it through the client's documented low-level `post` (same auth, headers, base_url,
    status-error mapping) and reads the reply as JSON: this skips the SDK's per-call TypedDict transform and model
    construction (~25 % of the client CPU per call) and lets odd bodies (200 + `error`, missing usage, extra
    `usage.cost`) be judged as data."""
    body: dict[str, Any] = {
        "model": agent.model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": int(settings.max_tokens), "temperature": settings.temperature, "top_p": settings.top_p,
    }
    if settings.reasoning_effort:
        body["reasoning"] = {"effort": settings.reasoning_effort}
    return body


def _answered_row(agent: AgentSpec, prompt: str, fields: dict, latency_ms: float, attempts: int) -> dict:
    """The call fields of an answered call: tokens from the provider's usage (else estimated), cost from
    `usage.cost` (else the agent's prices)."""
    text = fields["text"]
    usage = fields["usage"]
    pt, ct = usage_int(usage, "prompt_tokens"), usage_int(usage, "completion_tokens")
    source = "provider_estimate" if usage.get("token_count_method") else "provider"  # replay: estimates
    if pt is None or ct is None:
        source = "estimated"
        pt = approx_tokens(prompt) if pt is None else pt
        ct = approx_tokens(text) if ct is None else ct
    cost = usage_cost(usage)
    if cost is None:
        cost = agent.cost(pt, ct)
    flag = {"cost_invalid": True} if cost_invalid(usage) else {}  # the provider's cost refused: estimated
    return {
        **flag, "model": agent.model, "status": "empty" if is_empty(text) else "ok", "error_kind": "",
        "error_message": "", "response_text": text or "", "finish_reason": fields["finish_reason"] or "",
        "prompt_tokens": pt, "completion_tokens": ct, "usage_source": source, "cost_usd": float(cost),
        "latency_ms": round(latency_ms, 1), "attempts": attempts, "logprobs": fields.get("logprobs"),
    }


def _error_row(agent: AgentSpec, kind: str, message: str, latency_ms: float, attempts: int) -> dict:
    return {
        "model": agent.model, "status": "error", "error_kind": kind, "error_message": message,
        "response_text": None, "finish_reason": "", "prompt_tokens": None, "completion_tokens": None,
        "usage_source": "", "cost_usd": None, "latency_ms": round(latency_ms, 1), "attempts": attempts,
    }
