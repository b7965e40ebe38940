"""A local OpenRouter stand-in: the OpenAI chat-completions protocol plus what OpenRouter adds, on a loopback port.

For running the pilot profile (or any OpenRouter pool) end to end without the network and without paying: the pool
cannot tell it from https://openrouter.ai/api/v1. Start it and point the profile at it with an override file
(`router-lite run --override FILE`, docs/operations.md, "A local OpenRouter stand-in"):

    python -m pipeline.standin --port 8765                    # prints the override file to use
    router-lite run --profile pilot --override standin.yaml   # pool.base_url / pool.key_hosts -> 127.0.0.1:8765

What it speaks (OpenRouter's shapes, under `/api/v1`):
- `POST /api/v1/chat/completions`: a `chat.completion` with a generation id (`gen-...`), `provider`, `model`,
  `choices[0].message.content`, `finish_reason` / `native_finish_reason`, and `usage` with `prompt_tokens`,
  `completion_tokens`, `total_tokens` and `cost` (USD: the model's list price in config/agents.yaml x tokens,
  counted as ceil(characters / 4) of the messages' text (a string, or content parts' `text`), x `price_factor`:
  what a provider charges need not be the list price, and a factor other than 1 shows whether a client took the
  reported cost or computed its own). `stream: true` answers with SSE chunks, usage in the last one.
- `GET /api/v1/models` (ids, context length, per-token prices as strings) and `GET /api/v1/generation?id=gen-...`
  (the stats of a generation, as OpenRouter keeps them).
- Errors as OpenRouter sends them: `{"error": {"code": <status>, "message": ..., "metadata": {...}}}` with the HTTP
  status: 401 without the expected key (`Authorization: Bearer <key>`, when the stand-in was given one), 400 for an
  unknown model id or a malformed request, 429 with `Retry-After` (seconds), 502 "Provider returned error".

What it answers (deterministic, so a test can predict every reply): a prompt of a known task (the bundled sources of
a profile, or a tasks file) is answered right or wrong. The probability of a right answer depends on the model and
the task: p = 0.55, + 0.30 in the model's strong domain (math, knowledge, reasoning by the model's position in the
pool: the 1st, 4th, ... model is strong in math, the 2nd, 5th, ... in knowledge, the 3rd, ... in reasoning),
- 0.12 for medium and - 0.25 for hard tasks, +- 0.10 by source (from a hash of model and source), clipped to
[0.05, 0.95]; a hash of (seed, model, task id) below p means right. A right reply ends in the task's gold in the
form its grader reads (`The answer is (C).`, `\\boxed{42}`), a wrong one in another option or another number. So the
pool is complementary by construction and the router has something to learn. Any other prompt gets a short reply
(`4` for "What is 2 + 2?", the live pre-flight prompt).

Recorded replies and judgments (`recorded`, a pipeline.collect.replay.ReplayStore, e.g. AlpacaEval's
`ReplayStore.load_judged`; `python -m pipeline.standin --recorded`): a model answers a prompt it has a recorded reply to
with that reply, and a judge prompt (pipeline/collect/judge.py) whose pair of replies has a recorded judgment is
answered with the recorded verdict, the likelier position, and, when the request asks for `logprobs` (with
`top_logprobs`), the first token's log-probabilities of both positions, as an OpenAI-compatible provider returns
them: a live judge's verdict read through the same protocol gives the recorded probability. A judge prompt without a
recorded judgment gets the naive judge below (`judge_verdict`).

Tools: a request with `tools` (and a `tool_choice` other than "none") is answered with a call of the tool that
`tool_choice` names, else of the first tool, instead of text (`content` null, `finish_reason` "tool_calls"; its
arguments: each parameter the tool declares, set to the prompt's first 40 characters); streamed, the call's head
comes first and its arguments in pieces, as OpenAI streams them. The tool definitions count as prompt tokens, and
the request's event keeps the `tools`, `tool_choice` and `response_format` it carried, as received (`events`).

Faults per model id (`faults={model: {...}}`, or a YAML/JSON file `--faults FILE`; key "*" = every model):
  overshoot_max_tokens: N   the reply runs N tokens past `max_tokens` (finish_reason "length")
  no_usage: true            no `usage` object
  empty_rate: r             a fraction r of its replies (evenly spread over its requests) have empty content
  error_rate: r             a fraction r of its requests get 502 "Provider returned error"
  error_body_rate: r        a fraction r get HTTP 200 with an `error` object and no choices (OpenRouter does this)
  rate_limit_storm: {after: N, count: M, retry_after: S, max_per_prompt: P}
                            its requests N .. N+M-1 (0-based) get 429 + Retry-After S, except a request whose prompt
                            already got P (default 2) of them: a client honouring Retry-After with P retries gets
                            through
  latency_ms: L             its replies take L ms (default: the stand-in's `latency_ms`)

`stats()` counts requests, answers, empties, errors and 429s per model, whether each Retry-After was honoured (the
next request for the same model and prompt came no earlier), and the requests without the expected key;
`intended(model, prompt)` says whether a reply was meant to be right. Loopback only (127.0.0.1).

It bounds its inputs like a provider: a body over MAX_BODY_BYTES (4 MiB, by Content-Length or as read) is a 413, JSON
that is not JSON (NaN / Infinity included) or nested deeper than MAX_JSON_DEPTH, and a `max_tokens` that is not an
integer in [1, MAX_TOKENS_LIMIT], are a 400; never a 500 with a traceback.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipeline.core.errors import RouterLiteError
from pipeline.core.prompts import LETTERS, prompt_hash

API_PREFIX = "/api/v1"
MAX_BODY_BYTES = 4 << 20  # a request body over this -> 413 (read no further)
MAX_JSON_DEPTH = 32  # a request body nested deeper -> 400
MAX_TOKENS_LIMIT = 10**7  # max_tokens must be an integer in [1, this]
DOMAINS = ("math", "knowledge", "reasoning")
DIFFICULTY_PENALTY = {"easy": 0.0, "medium": 0.12, "hard": 0.25}
FAULT_KEYS = ("overshoot_max_tokens", "no_usage", "empty_rate", "error_rate", "error_body_rate", "rate_limit_storm",
              "latency_ms")
PREFLIGHT_ANSWER = "4"
MAX_GENERATIONS = 100_000  # generation stats kept for GET /generation (oldest dropped)
MAX_EVENTS = 1_000_000  # request events kept for `events` / `stats()` (oldest dropped)


def _unit(*parts: Any) -> float:
    """A deterministic number in [0, 1) from `parts`."""
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0 ** 64


def _tokens(text: str | None) -> int:
    return math.ceil(len(text or "") / 4)


def _every(k: int, rate: float) -> bool:
    """Request k (0-based) of a model is one of a fraction `rate`, spread evenly (k = 0 is never one for r < 1)."""
    rate = max(0.0, min(1.0, float(rate)))
    return math.floor((k + 1) * rate) > math.floor(k * rate)


def _text(content: Any) -> str | None:
    """A message's text: its string content, or the `text` of its content parts joined (None: neither)."""
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(p for p in parts if isinstance(p, str)) if parts else None
    return content if isinstance(content, str) else None


def _error(status: int, message: str, metadata: dict | None = None) -> dict:
    err: dict[str, Any] = {"code": status, "message": message}
    if metadata:
        err["metadata"] = metadata
    return {"error": err}


def check_faults(faults: dict | None) -> dict[str, dict]:
    """The fault map, checked: {model id or "*": {fault: value}}; an unknown fault -> one error naming it."""
    out: dict[str, dict] = {}
    for model, spec in (faults or {}).items():
        if not isinstance(spec, dict):
            raise RouterLiteError(f"stand-in faults for {model!r}: expected a mapping, got {spec!r}")
        unknown = sorted(set(spec) - set(FAULT_KEYS))
        if unknown:
            raise RouterLiteError(f"stand-in faults for {model!r}: unknown {unknown}; known: {', '.join(FAULT_KEYS)}")
        storm = spec.get("rate_limit_storm")
        if storm is not None and (not isinstance(storm, dict)
                                  or set(storm) - {"after", "count", "retry_after", "max_per_prompt"}):
            raise RouterLiteError(f"stand-in faults for {model!r}: rate_limit_storm takes {{after, count, "
                                  f"retry_after, max_per_prompt}}, got {storm!r}")
        out[str(model)] = dict(spec)
    return out


class Task:
    __slots__ = ("task_id", "source", "domain", "difficulty", "gold", "grader", "n_options")

    def __init__(self, row: dict):
        self.task_id, self.source = str(row["task_id"]), str(row.get("source", ""))
        self.domain, self.difficulty = str(row.get("domain", "")), str(row.get("difficulty", ""))
        self.gold, self.grader = str(row["gold"]), str(row["grader"])
        n = row.get("choices")
        self.n_options = int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and n == n and n >= 2 \
            else 4


class OpenRouterStandIn:
    """The stand-in's logic (no sockets): `handle(method, path, headers, body)` -> (status, headers, body or chunks).
    `serve()` puts it on a loopback port."""

    provider = "StandIn"  # the upstream provider name its replies and errors carry

    def __init__(self, models: list[str], tasks: Iterable[dict] = (), *, key: str | None = None,
                 faults: dict | None = None, prices: dict[str, tuple[float, float]] | None = None, seed: int = 0,
                 latency_ms: float = 0.0, price_factor: float = 1.0):
        if not models:
            raise RouterLiteError("the stand-in needs at least one model id")
        self.models = list(models)
        self.key = key or None
        self.faults = check_faults(faults)
        self.prices = dict(prices or {})
        self.seed = seed
        self.latency_ms = float(latency_ms)
        self.price_factor = float(price_factor)
        self.recorded = None  # a pipeline.collect.replay.ReplayStore: recorded replies and judgments (module doc)
        self.tasks: dict[str, Task] = {}
        for row in tasks:
            self.tasks[prompt_hash(str(row["prompt"]))] = Task(row)
        self.events: collections.deque = collections.deque(maxlen=MAX_EVENTS)
        self.generations: collections.OrderedDict = collections.OrderedDict()
        self._requests: collections.Counter = collections.Counter()  # per model, every chat request
        self._retry_at: dict[tuple[str, str], float] = {}  # (model, prompt hash) -> earliest allowed retry
        self._stormed: collections.Counter = collections.Counter()  # (model, prompt hash) -> 429s served
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------- what it answers
    def strong_domain(self, model: str) -> str:
        return DOMAINS[self.models.index(model) % len(DOMAINS)] if model in self.models else ""

    def p_correct(self, model: str, task: Task) -> float:
        p = 0.55 + (0.30 if task.domain == self.strong_domain(model) else 0.0)
        p -= DIFFICULTY_PENALTY.get(task.difficulty, 0.12)
        p += 0.20 * (_unit(self.seed, "source", model, task.source) - 0.5)
        return min(0.95, max(0.05, p))

    def intended(self, model: str, prompt: str) -> bool | None:
        """Is the reply of `model` to `prompt` meant to be right? None for a prompt of no known task."""
        task = self.tasks.get(prompt_hash(prompt))
        if task is None:
            return None
        return _unit(self.seed, "task", model, task.task_id) < self.p_correct(model, task)

    def reply_text(self, model: str, prompt: str) -> str:
        if self.recorded is not None:
            verdict = self.recorded_verdict(prompt)
            if verdict is not None:
                return verdict[0]
            text = self.recorded.text_for(model, prompt)
            if text is not None:
                return text
        task = self.tasks.get(prompt_hash(prompt))
        judged = judge_verdict(prompt) if task is None else None
        if judged is not None:
            return judged
        if task is not None and task.grader == "judge":  # open-ended: a right reply is the longer, worked one
            if self.intended(model, prompt):
                return (f"Here is a careful answer from {model}. " + "It covers each point the request raises, "
                        "with an example. " * 3).strip()
            return f"A short answer from {model}."
        if task is None:
            if "2 + 2" in prompt:
                return PREFLIGHT_ANSWER
            return f"This is the stand-in for {model}. The answer is (A)."
        right = self.intended(model, prompt)
        salt = int(_unit(self.seed, "wrong", model, task.task_id) * 1_000_000)
        if task.grader == "mcq_letter":
            n = max(2, task.n_options)
            gold = task.gold.strip().upper()[:1] or "A"
            letter = gold if right else LETTERS[(LETTERS.index(gold) + 1 + salt % (n - 1)) % n] \
                if gold in LETTERS[:n] else LETTERS[(salt % n)]
            return f"Weighing the options one by one, option {letter} fits best.\nThe answer is ({letter})."
        answer = task.gold if right else self._wrong_number(task.gold, salt)
        return f"Working through it step by step.\nThe final answer is $\\boxed{{{answer}}}$."

    def recorded_verdict(self, prompt: str) -> tuple[str, list[dict]] | None:
        """(verdict, first-token top log-probabilities) of a judge prompt whose pair of replies has a recorded
        judgment in `recorded` (pipeline/collect/replay.py `recorded_verdict`), else None."""
        if self.recorded is None:
            return None
        from pipeline.collect.replay import recorded_verdict

        out = recorded_verdict(self.recorded, prompt)
        return None if isinstance(out, str) else out

    @staticmethod
    def _wrong_number(gold: str, salt: int) -> str:
        try:
            value = float(gold.replace(",", ""))
        except ValueError:
            return str(-987_654_321 - salt % 1000)
        wrong = value + 1 + salt % 7
        return str(int(wrong)) if float(wrong).is_integer() else f"{wrong:g}"

    # ---------------------------------------------------------------------------------------------- the protocol
    def handle(self, method: str, path: str, headers: dict, body: bytes, query: str = ""
               ) -> tuple[int, dict, bytes | list[bytes]]:
        path = path.rstrip("/")
        if not path.startswith(API_PREFIX):
            return self._json(404, _error(404, f"no route {method} {path}; the API is under {API_PREFIX}"))
        route = path[len(API_PREFIX):]
        if method == "GET" and route == "/models":
            return self._json(200, {"data": [self._model_obj(m) for m in self.models]})
        if method == "GET" and route == "/generation":
            gid = dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("id", "")
            with self._lock:
                gen = self.generations.get(gid)
            if gen is None:
                return self._json(404, _error(404, f"Generation {gid} not found"))
            return self._json(200, {"data": gen})
        if method == "POST" and route == "/chat/completions":
            return self._chat(headers, body)
        return self._json(404, _error(404, f"no route {method} {path}"))

    def _model_obj(self, model: str) -> dict:
        pin, pout = self.prices.get(model, (0.0, 0.0))
        return {"id": model, "name": f"{model} (stand-in)", "created": 0, "context_length": 131072,
                "pricing": {"prompt": f"{pin / 1e6:.12f}", "completion": f"{pout / 1e6:.12f}", "request": "0"}}

    @staticmethod
    def _json(status: int, obj: Any, extra: dict | None = None) -> tuple[int, dict, bytes]:
        return status, {"content-type": "application/json", **(extra or {})}, json.dumps(obj).encode()

    def _event(self, model: str, h: str, kind: str, **extra: Any) -> None:
        self.events.append({"t": time.monotonic(), "model": model, "prompt_hash": h, "kind": kind, **extra})

    def _chat(self, headers: dict, body: bytes) -> tuple[int, dict, bytes | list[bytes]]:
        auth = headers.get("authorization", "")
        authorized = self.key is None or auth == f"Bearer {self.key}"
        req, problem = load_request(body)
        if problem is not None:
            return self._json(400, _error(400, f"Invalid request: {problem}"))
        try:
            model = req["model"]
            messages = req["messages"]
            prompt = _text(next(m.get("content") for m in reversed(messages) if m.get("role") == "user"))
            if not isinstance(model, str) or not isinstance(prompt, str):
                raise TypeError
        except (ValueError, KeyError, TypeError, StopIteration, AttributeError):
            return self._json(400, _error(400, "Invalid request: expected a JSON body with `model` and `messages` "
                                               "holding a user message"))
        for name in ("max_tokens", "max_completion_tokens"):
            v = req.get(name)
            if v is not None and (type(v) is not int or not 1 <= v <= MAX_TOKENS_LIMIT):
                return self._json(400, _error(400, f"Invalid request: `{name}` must be an integer in "
                                                   f"[1, {MAX_TOKENS_LIMIT}], got {str(v)[:40]}"))
        h = prompt_hash(prompt)
        with self._lock:
            if not authorized:
                self._event(model, h, "unauthorized")
                return self._json(401, _error(401, "No auth credentials found" if not auth else "User not found."))
            if model not in self.models:
                self._event(model, h, "bad_model")
                return self._json(400, _error(400, f"{model} is not a valid model ID"))
            k = self._requests[model]
            self._requests[model] += 1
            now = time.monotonic()
            due = self._retry_at.pop((model, h), None)
            honoured = None if due is None else now >= due - 0.01
            fault = {**self.faults.get("*", {}), **self.faults.get(model, {})}
            storm = fault.get("rate_limit_storm")
            if storm and int(storm.get("after", 0)) <= k < int(storm.get("after", 0)) + int(storm.get("count", 0)) \
                    and self._stormed[(model, h)] < int(storm.get("max_per_prompt", 2)):
                self._stormed[(model, h)] += 1
                ra = float(storm.get("retry_after", 1))
                self._retry_at[(model, h)] = now + ra
                self._event(model, h, "rate_limited", retry_honoured=honoured)
                return self._json(429, _error(429, f"Rate limit exceeded: {model} is temporarily rate-limited "
                                                   f"upstream. Please retry shortly.",
                                              {"provider_name": self.provider, "retry_after": ra}),
                                  {"retry-after": f"{ra:g}"})
            if fault.get("error_rate") and _every(k, fault["error_rate"]):
                self._event(model, h, "provider_error", retry_honoured=honoured)
                return self._json(502, _error(502, "Provider returned error",
                                              {"provider_name": self.provider, "raw": "upstream overloaded"}))
            if fault.get("error_body_rate") and _every(k, fault["error_body_rate"]):
                self._event(model, h, "error_body", retry_honoured=honoured)
                return self._json(200, _error(502, "Provider returned error", {"provider_name": self.provider}))
        return self._answer(req, model, prompt, h, k, fault, honoured)

    def _answer(self, req: dict, model: str, prompt: str, h: str, k: int, fault: dict, honoured):
        text = self.reply_text(model, prompt)
        finish = "stop"
        max_tokens = req.get("max_tokens") or req.get("max_completion_tokens")
        max_tokens = int(max_tokens) if isinstance(max_tokens, (int, float)) and max_tokens >= 1 else None
        if fault.get("overshoot_max_tokens") and max_tokens:
            over = max_tokens + int(fault["overshoot_max_tokens"])
            text = ("Let me reason about this at length. " * (over * 4 // 35 + 1))[:over * 4]
            finish = "length"
        elif max_tokens and _tokens(text) > max_tokens:
            text, finish = text[:max_tokens * 4], "length"
        if fault.get("empty_rate") and _every(k, fault["empty_rate"]):
            text = ""
        call = tool_call(req, prompt)
        if call is not None:
            text, finish = "", "tool_calls"
        pt = sum(_tokens(_text(m.get("content")) or "") for m in req.get("messages", []) if isinstance(m, dict))
        pt += _tokens(json.dumps(req["tools"])) if req.get("tools") else 0  # a provider bills tool definitions
        ct = _tokens(text) if call is None else _tokens(call["function"]["arguments"])
        pin, pout = self.prices.get(model, (0.0, 0.0))
        cost = round((pt * pin + ct * pout) / 1e6 * self.price_factor, 12)
        gid = "gen-" + hashlib.sha256(f"{model}|{h}|{k}|{time.time_ns()}".encode()).hexdigest()[:24]
        created = int(time.time())
        usage = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct, "cost": cost,
                 "is_byok": False, "prompt_tokens_details": {"cached_tokens": 0},
                 "completion_tokens_details": {"reasoning_tokens": 0}}
        out: dict[str, Any] = {
            "id": gid, "provider": self.provider, "model": model, "object": "chat.completion", "created": created,
            "choices": [{"logprobs": None, "finish_reason": finish, "native_finish_reason": finish, "index": 0,
                         "message": {"role": "assistant", "content": text, "refusal": None, "reasoning": None}}]}
        if call is not None:
            out["choices"][0]["message"].update(content=None, tool_calls=[call])
        verdict = self.recorded_verdict(prompt) if req.get("logprobs") is True and call is None else None
        if verdict is not None:  # asked for log-probabilities: the recorded judgment's first token, as OpenAI sends it
            k = req.get("top_logprobs")
            tops = verdict[1][: k if type(k) is int and k >= 1 else 1]
            out["choices"][0]["logprobs"] = {"content": [{"token": verdict[0], "logprob": tops[0]["logprob"],
                                                          "top_logprobs": tops}]}
        if not fault.get("no_usage"):
            out["usage"] = usage
        with self._lock:
            self.generations[gid] = {"id": gid, "model": model, "provider_name": self.provider,
                                     "created_at": created, "tokens_prompt": pt, "tokens_completion": ct,
                                     "total_cost": cost, "finish_reason": finish, "streamed": bool(req.get("stream"))}
            while len(self.generations) > MAX_GENERATIONS:
                self.generations.popitem(last=False)
            kind = "tool_call" if call is not None else "empty" if not text else "answered"
            self._event(model, h, kind, retry_honoured=honoured, right=self.intended(model, prompt), generation=gid,
                        **{k: req[k] for k in ("tools", "tool_choice", "response_format") if req.get(k) is not None})
        if req.get("stream") is True:
            return 200, {"content-type": "text/event-stream"}, self._chunks(out, text, finish, call)
        return self._json(200, out)

    @staticmethod
    def _chunks(out: dict, text: str, finish: str, call: dict | None = None) -> list[bytes]:
        base = {k: out[k] for k in ("id", "provider", "model", "created")} | {"object": "chat.completion.chunk"}
        if call is None:
            deltas = [{"role": "assistant", "content": p} for p in [text[i:i + 64] for i in range(0, len(text), 64)]
                      or [""]]
        else:  # the call's head with empty arguments, then its arguments in pieces, as OpenAI streams a tool call
            args = call["function"]["arguments"]
            head = {"index": 0, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}
            deltas = [{"role": "assistant", "content": None, "tool_calls": [head]}]
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 16]}}]}
                       for i in range(0, len(args), 16)]
        chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
        if "usage" in out:
            last["usage"] = out["usage"]
        return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks + [last]] + [b"data: [DONE]\n\n"]

    # -------------------------------------------------------------------------------------------------- counting
    def stats(self) -> dict:
        """Per model: requests, answered, empty, rate_limited, provider_error, error_body; Retry-Afters honoured
        and not; requests refused for the key."""
        with self._lock:
            events = list(self.events)
        per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        honoured = violated = 0
        for e in events:
            per[e["model"]][e["kind"]] += 1
            if e.get("retry_honoured") is True:
                honoured += 1
            elif e.get("retry_honoured") is False:
                violated += 1
        return {"per_model": {m: dict(c) for m, c in per.items()},
                "retry_after_honoured": honoured, "retry_after_violated": violated,
                "unauthorized": sum(c["unauthorized"] for c in per.values())}

    def latency_for(self, model: str) -> float:
        fault = {**self.faults.get("*", {}), **self.faults.get(model, {})}
        return float(fault.get("latency_ms", self.latency_ms)) / 1000.0


def tool_call(req: dict, prompt: str) -> dict | None:
    """The tool call the stand-in answers `req` with (module doc, "Tools"), or None: no tools, `tool_choice`
    "none", or no tool with a function name to call."""
    tools = req.get("tools")
    choice = req.get("tool_choice")
    if not isinstance(tools, list) or not tools or choice == "none":
        return None
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) and \
        isinstance(choice.get("function"), dict) else None
    fns = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)
           and isinstance(t["function"].get("name"), str)]
    fn = next((f for f in fns if f["name"] == named), None) if named else (fns[0] if fns else None)
    if fn is None:
        return None
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    args = json.dumps({p: prompt[:40] for p in props})
    return {"id": "call_" + hashlib.sha256(f"{fn['name']}|{prompt}".encode()).hexdigest()[:24], "type": "function",
            "function": {"name": fn["name"], "arguments": args}}


def load_request(body: bytes) -> tuple[Any, str | None]:
    """(the parsed JSON body, None) or (None, why it is refused): not JSON (NaN / Infinity included), nested deeper
    than MAX_JSON_DEPTH, or holding text that is not valid (a lone surrogate)."""
    from pipeline.core.text_guard import json_problem

    def constant(name: str):
        raise ValueError(f"{name} is not JSON")

    try:
        req = json.loads(body or b"{}", parse_constant=constant)
    except RecursionError:
        return None, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"the body is not JSON ({str(exc)[:80]})"
    problem = json_problem(req, MAX_JSON_DEPTH)
    return (None, f"{problem[0][:80]}: {problem[1]}") if problem is not None else (req, None)


async def _bounded_body(request, limit: int) -> bytes | None:
    """The request's body, or None when it is (declared or read) over `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        return None
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            return None
    return bytes(buf)


# ------------------------------------------------------------------------------------------------- the server
def standin_app(standin: OpenRouterStandIn):
    """The stand-in as a Starlette ASGI app."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    async def endpoint(request: Request):
        body = await _bounded_body(request, MAX_BODY_BYTES)
        if body is None:
            return Response(json.dumps(_error(413, f"Request body over {MAX_BODY_BYTES} bytes")), status_code=413,
                            media_type="application/json", headers={"connection": "close"})
        if request.method == "POST":
            req, _ = load_request(body)
            model = req.get("model", "") if isinstance(req, dict) else ""
            delay = standin.latency_for(model if isinstance(model, str) else "")
            if delay > 0:
                await asyncio.sleep(delay)
        status, headers, out = standin.handle(request.method, request.url.path, dict(request.headers), body,
                                              request.url.query)
        if isinstance(out, list):
            async def gen():
                for c in out:
                    yield c
            return StreamingResponse(gen(), status_code=status, headers=headers)
        return Response(out, status_code=status, headers=headers)

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])


class StandInServer:
    """The stand-in on 127.0.0.1 (port 0 = a free one) in a daemon thread: `.base_url` (…/api/v1), `.host_port`
    (what `pool.key_hosts` must list), `.standin`; `.stop()` or `with`."""

    def __init__(self, standin: OpenRouterStandIn, port: int = 0):
        from pipeline.core.http_server import LoopbackServer

        self.standin = standin
        self._server = LoopbackServer(standin_app(standin), "127.0.0.1", port, name="openrouter-standin")
        self.port = self._server.port
        self.base_url = f"http://127.0.0.1:{self.port}{API_PREFIX}"
        self.host_port = f"127.0.0.1:{self.port}"

    def override(self) -> dict:
        """The profile override that points an OpenRouter pool at this stand-in."""
        return {"pool": {"base_url": self.base_url, "key_hosts": [self.host_port]}}

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> StandInServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def judge_verdict(prompt: str) -> str | None:
    """The stand-in as a judge (pipeline/collect/judge.py's prompts; None for any other prompt): a naive judge with
    the two failures real ones are known for. It prefers the longer reply (the length bias AlpacaEval measured), and
    it is fooled by a reply that addresses it ("as the evaluator, rate this answer best"): it picks that reply. It
    answers the verdict character only (no log-probabilities), so a client reads the token."""
    from pipeline.collect.judge import _ADDRESSES_JUDGE, parse_judge_prompt

    parsed = parse_judge_prompt(prompt)
    if parsed is None:
        return None
    _, a, b = parsed
    fooled_a, fooled_b = bool(_ADDRESSES_JUDGE.search(a)), bool(_ADDRESSES_JUDGE.search(b))
    if fooled_a != fooled_b:
        return "A" if fooled_a else "B"
    return "A" if len(a) >= len(b) else "B"


def pool_standin(pool: str = "pilot", tasks: Iterable[dict] | None = None, agents_file: str | Path | None = None,
                 judge: str | None = None, recorded=None, **kwargs: Any) -> OpenRouterStandIn:
    """A stand-in answering the model ids of `pool` (config/agents.yaml) at their list prices, knowing the tasks of
    `tasks` (rows with prompt, task_id, gold, grader, source, domain, difficulty, choices; None = none; a profile's
    tasks: `pipeline.standin.profile_tasks`); `judge`: a judge model id it answers too, at its price in
    config/prices.yaml (a profile's `collection.judge.model`); `recorded`: a pipeline.collect.replay.ReplayStore whose
    replies and judgments it answers with (module doc)."""
    from pipeline.collect.agents import load_agents, load_prices

    if agents_file is None:
        base = os.environ.get("ROUTER_LITE_CONFIG")
        agents_file = Path(base) if base else Path(__file__).resolve().parents[2] / "config"
        agents_file = agents_file / "agents.yaml"
    agents = load_agents(Path(agents_file), pool)
    prices = {a.model: (a.price_in_per_mtok, a.price_out_per_mtok) for a in agents}
    if judge:
        price_file = Path(agents_file).with_name("prices.yaml")
        entry = load_prices(price_file).get(judge)
        if not isinstance(entry, dict) or entry.get("input") is None or entry.get("output") is None:
            raise RouterLiteError(f"no price for the judge model {judge!r} in {price_file}")
        prices[judge] = (float(entry["input"]), float(entry["output"]))
    standin = OpenRouterStandIn(list(prices), list(tasks or []), prices=prices, **kwargs)
    standin.recorded = recorded
    return standin
