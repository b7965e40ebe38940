"""Executing a cascade policy (pipeline/route/cascade.py) on one live request: each stage's new agents are asked in
parallel, their answers extracted and compared with the request's grader, and the first stage whose agreement rule
holds returns the reply of its preferred agreeing agent. A failed or empty call never agrees, so it escalates; only
a failure of the last agent is the caller's error. Cost is every call made (the provider's `usage.cost`, else the
agent's prices × tokens, estimated from characters when usage is missing; a `usage.cost` that is negative, not
finite or over pipeline/collect/costs.py's MAX_CALL_USD is no cost: the estimate replaces it and the reply is flagged
`cost_invalid`, so a cascade's sum stays finite). Each call is bounded as a whole by
`options["timeout"]` (headers and body: an agent trickling bytes is a timeout at the deadline, not per read).

A reply that calls a tool (`tool_calls` or a legacy `function_call` in its message) has no answer, whatever text it
carries: it escalates like an empty reply, and the last stage returns it as it is (`sse_of` streams its calls). A
request carrying tools never reaches a cascade (app.py `_request_grader`: one agent answers it, or a 400), so this
holds for an agent that calls a tool unasked.

Extraction and comparison of the replies run under the grading budget, off the event loop
(pipeline/collect/bounded.py): a reply whose grading overruns the budget or raises has no answer (so it escalates),
and `CascadeResult.grading_overruns` counts them (the `X-Router-Grading-Overruns` header).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.collect import bounded
from pipeline.collect.agents import AgentSpec
from pipeline.collect.client import cost_invalid, parse_completion, reply_usage
from pipeline.route.cascade import Policy, new_agents, stage_step
from pipeline.serve.relay import deadline_of, finite_float, post_chat, within


@dataclasses.dataclass
class Reply:
    agent: int  # index into the agents
    data: dict | None  # the chat.completion body (None: the call failed)
    answer: str | None  # extracted with the request's grader (None: failed, empty or no answer)
    cost: float
    latency_ms: float
    error: BaseException | None = None
    grading: str = "ok"  # the extraction's status: "ok", "overrun" or "error" (pipeline/collect/bounded.py)
    text: str | None = None  # the reply's text, until it is graded
    cost_invalid: bool = False  # the agent's usage.cost was refused (client.cost_invalid): estimated
    tokens: tuple[int, int] = (0, 0)  # (prompt, completion) tokens it was priced for (`reply_usage`, once)


@dataclasses.dataclass
class CascadeResult:
    accepted: Reply | None  # None: the last agent failed too (its error is in `replies`)
    replies: list[Reply]  # every call made, in the order they finished stage by stage
    stage: int  # the stage that answered
    stage_ms: list[float] = dataclasses.field(default_factory=list)  # wall of each stage run (its calls in parallel)
    grading_overruns: int = 0  # extractions and comparisons without a verdict (budget overrun or error)

    @property
    def cost(self) -> float:
        return float(sum(r.cost for r in self.replies))

    @property
    def called(self) -> list[int]:
        return [r.agent for r in self.replies]


async def ask(j: int, spec: AgentSpec, client: Any, upstream: dict, options: dict, grader: str) -> Reply:
    """One non-streamed call of agent `j`; any failure becomes a Reply without data (never raises)."""

    t0 = time.perf_counter()

    async def call() -> dict:
        resp = await post_chat(client, {"model": spec.model, **upstream, "stream": False}, options, deadline,
                               stream=False)
        try:
            # NaN / Infinity / 1e400: strings (a cost refused as such, flagged), never relayed as numbers
            return json.loads(await resp.aread(), parse_constant=str, parse_float=_number_or_text)
        finally:
            await resp.aclose()

    deadline = deadline_of(options)
    try:
        data = await within(deadline, call())  # the whole call
        fields = parse_completion(data)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failed cheap call escalates
        return Reply(j, None, None, 0.0, (time.perf_counter() - t0) * 1000.0, exc)
    # graded with the stage's other replies (run_cascade: one thread hop, bounded); a tool call is no answer
    text = None if calls_tools(data) else fields["text"]
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    invalid = cost_invalid(usage)
    if invalid and isinstance(data.get("usage"), dict):
        data["usage"] = {**usage, "cost": None}  # relayed to the client: never "inf"
    paid = reply_usage(spec, upstream, data, text)
    return Reply(j, data, None, paid["cost"], (time.perf_counter() - t0) * 1000.0, text=text,
                 cost_invalid=invalid, tokens=(paid["prompt_tokens"], paid["completion_tokens"]))


def calls_tools(data: dict) -> bool:
    """Whether a chat.completion's first message calls a tool (`tool_calls`, or the legacy `function_call`)."""
    choice = (data.get("choices") or [{}])[0]
    msg = choice.get("message") if isinstance(choice, dict) else None
    return isinstance(msg, dict) and bool(msg.get("tool_calls") or msg.get("function_call"))


def _number_or_text(text: str) -> float | str:
    v = finite_float(text)
    return text if v is None else v


async def run_cascade(policy: Policy, order: Sequence[int], specs: Sequence[AgentSpec], clients: Sequence[Any],
                      upstream: dict, options: dict, grader: str, start: int = 0) -> CascadeResult:
    """Run `policy`'s stages from `start` (the prompt shortcuts were applied by the caller)."""
    upstream = {k: v for k, v in upstream.items() if k not in ("stream", "stream_options")}
    K = len(specs)
    order = np.asarray(order, dtype=np.int64)
    replies: dict[int, Reply] = {}
    done: list[Reply] = []
    walls: list[float] = []
    bad = 0  # gradings without a verdict
    for t, stage in enumerate(policy.stages[start:], start):
        new = new_agents(stage, replies)
        t0 = time.perf_counter()
        got = await asyncio.gather(*(ask(j, specs[j], clients[j], upstream, options, grader) for j in new))
        walls.append((time.perf_counter() - t0) * 1000.0)
        for r in got:
            replies[r.agent] = r
            done.append(r)
        table: dict = {}
        if stage.k:  # the last stage (k = 0) accepts its agent: its reply needs no grading
            known = {a: r.answer for a, r in replies.items() if r not in got}
            graded, table, n_bad = await bounded.grade_stage_async({r.agent: r.text for r in got}, known, grader)
            for r in got:
                r.answer, r.grading, r.text = graded[r.agent].value, graded[r.agent].status, None
            bad += n_bad
        # the table holds a verdict for every pair the rule can ask (an answer two agents gave, with itself too):
        # a pair without one agrees with nothing, identical text included
        j = stage_step(stage, {a: r.answer for a, r in replies.items()}, K, order,
                       lambda x, y, tb=table: tb.get((str(x), str(y)), False))
        if j is not None:  # an agreeing class's reply has an answer; the last agent's may have failed
            return CascadeResult(replies[j] if replies[j].data else None, done, t, walls, bad)
    raise AssertionError("a policy's last stage answers without condition")  # Policy.__post_init__ guarantees it


def sse_of(data: dict, router: dict) -> bytes:
    """A whole chat.completion as a chat.completion.chunk SSE stream (the accepted reply of a cascade was read in
    full to compare answers; the stream mode then streams it): one content chunk (with the message's tool calls, each
    whole, indexed as a stream indexes them), a finish chunk, [DONE]."""
    choice = (data.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    base = {"id": data.get("id", ""), "object": "chat.completion.chunk", "created": data.get("created", 0),
            "model": data.get("model", "")}
    delta = {"role": "assistant", "content": msg.get("content") or ""}
    if isinstance(msg.get("tool_calls"), list) and msg["tool_calls"]:
        delta["content"] = msg.get("content")  # null beside tool calls, as an agent streams it
        delta["tool_calls"] = [{"index": i, **c} if isinstance(c, dict) else c for i, c in enumerate(msg["tool_calls"])]
    if isinstance(msg.get("function_call"), dict):
        delta["function_call"] = msg["function_call"]
    first = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}], "router": router}
    last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason") or "stop"}]}
    if isinstance(data.get("usage"), dict):
        last["usage"] = data["usage"]
    return b"".join(b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\n\n" for e in (first, last)) + \
        b"data: [DONE]\n\n"
