"""`preflight(...)`: 20 calls per agent checking it is usable (valid completions, max_tokens respected, usage
reported, empty-rate < 5 %) before a paid collection. Pre-flight calls are not logged."""
from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

import pandas as pd

from pipeline.collect.agents import AgentSpec
from pipeline.collect.calls import check_agents, close_clients, run_sync
from pipeline.collect.client import call_once
from pipeline.collect.settings import CollectionSettings
from pipeline.core.errors import RouterLiteError

PREFLIGHT_CALLS = 20
PREFLIGHT_MAX_EMPTY_RATE = 0.05
USABLE_USAGE = ("provider", "provider_estimate")  # token counts the provider returned (replay: by a stated method)
ESTIMATED_USAGE = ("provider_estimate", "estimated")  # costs from these counts are estimates, and say so


async def preflight_async(client_for: Callable[[AgentSpec], Any], agents: list[AgentSpec], prompts: list[str],
                          settings: CollectionSettings | None = None, n_calls: int = PREFLIGHT_CALLS) -> pd.DataFrame:
    settings = settings or CollectionSettings()
    check_agents(agents)
    prompts = [p for p in prompts if isinstance(p, str) and p.strip()]
    if not prompts:
        raise RouterLiteError("preflight needs at least one non-empty prompt")
    chosen = [prompts[i % len(prompts)] for i in range(n_calls)]
    sems: dict[str, asyncio.Semaphore] = collections.defaultdict(lambda: asyncio.Semaphore(settings.concurrency))
    clients = {a.name: client_for(a) for a in agents}

    async def one(a: AgentSpec, p: str) -> dict:
        async with sems[a.provider]:
            return await call_once(clients[a.name], a, p, settings)

    rows = []
    try:
        results = await asyncio.gather(*[asyncio.gather(*[one(a, p) for p in chosen]) for a in agents])
    finally:
        await close_clients(clients)
    for a, calls in zip(agents, results):
        n = len(calls)
        errors = [c for c in calls if c["status"] == "error"]
        answered = [c for c in calls if c["status"] != "error"]
        n_empty = sum(c["status"] == "empty" for c in calls)
        max_ct = max((c["completion_tokens"] or 0 for c in answered), default=0)
        no_usage = sum(c["usage_source"] not in USABLE_USAGE or not c["prompt_tokens"] for c in answered)
        reasons = []
        if errors:
            kinds = collections.Counter(c["error_kind"] for c in errors)
            reasons.append(f"{len(errors)}/{n} calls failed ({', '.join(f'{k}: {v}' for k, v in kinds.items())}; "
                           f"first: {errors[0]['error_message'][:160]})")
        if max_ct > settings.max_tokens:
            reasons.append(f"max_tokens not respected: {max_ct} completion tokens > {settings.max_tokens}")
        if no_usage:
            reasons.append(f"{no_usage}/{len(answered)} responses lack usable usage token counts")
        empty_rate = n_empty / n if n else 1.0
        if empty_rate >= PREFLIGHT_MAX_EMPTY_RATE:
            reasons.append(f"empty-rate {empty_rate:.0%} >= {PREFLIGHT_MAX_EMPTY_RATE:.0%}")
        rows.append({
            "agent": a.name, "model": a.model, "provider": a.provider, "n_calls": n,
            "n_ok": sum(c["status"] == "ok" for c in calls), "n_empty": n_empty, "n_error": len(errors),
            "empty_rate": empty_rate, "max_completion_tokens": max_ct,
            "min_completion_tokens": min((c["completion_tokens"] or 0 for c in answered), default=None),
            "mean_latency_ms": float(sum(c["latency_ms"] for c in calls) / n) if n else 0.0,
            "cost_usd": float(sum(c["cost_usd"] or 0.0 for c in answered)),
            "passed": not reasons, "reason": "; ".join(reasons) if reasons else "ok",
        })
    return pd.DataFrame(rows)


def preflight(client_for: Callable[[AgentSpec], Any], agents: list[AgentSpec], prompts: list[str],
              settings: CollectionSettings | None = None, n_calls: int = PREFLIGHT_CALLS) -> pd.DataFrame:
    """Per agent: `n_calls` (20) calls; passed when every call returned a valid completion, max_tokens was
    respected, usage token counts were reported, and the empty-rate is < 5 %. Columns: agent, model, provider,
    n_calls, n_ok, n_empty, n_error, empty_rate, max_completion_tokens, min_completion_tokens, mean_latency_ms,
    cost_usd, passed, reason.
    Runs its own event loop (in a helper thread when called from inside a running loop)."""
    return run_sync(preflight_async(client_for, agents, prompts, settings, n_calls))


def preflight_judge(client_for: Callable[[AgentSpec], Any], agents: list[AgentSpec], prompts: list[str],
                    settings: CollectionSettings, n_calls: int = 3) -> dict:
    """The judge of judge-graded tasks (`settings.judge`, pipeline/collect/judge.py), checked before the collection:
    on up to `n_calls` of `prompts`, the reference agent and one other agent answer, and the judge compares the two
    replies; passed when every comparison has a readable verdict. Returns {judge, model, n_calls, n_judged, cost_usd,
    passed, reason}; the calls are not logged."""
    from pipeline.collect.judge import JudgeSettings, judge_agent
    from pipeline.collect.judge_call import judge_reply

    js = getattr(settings, "judge", None) or JudgeSettings()
    js.check([a.name for a in agents])
    ref = next(a for a in agents if a.name == js.reference)
    other = next((a for a in agents if a.name != js.reference), None)
    if other is None:
        raise RouterLiteError("the judge's pre-flight needs an agent besides the reference")
    judge = judge_agent(js, ref)
    chosen = [p for p in prompts if isinstance(p, str) and p.strip()][:n_calls]

    async def run() -> list[dict]:
        clients = {a.name: client_for(a) for a in (ref, other, judge)}
        out = []
        try:
            for i, p in enumerate(chosen):
                r, o = await asyncio.gather(call_once(clients[ref.name], ref, p, settings),
                                            call_once(clients[other.name], other, p, settings))
                if r["status"] != "ok" or o["status"] != "ok":
                    out.append({"judge_state": "unjudgeable", "judge_cost_usd": 0.0,
                                "judge_reason": f"no replies to judge ({r['status']}, {o['status']})"})
                    continue
                out.append(await judge_reply(clients[judge.name], judge, js, settings, f"preflight/{i}", other.name,
                                             p, (o["response_text"], r["response_text"])))
        finally:
            await close_clients(clients)
        return out

    results = run_sync(run())
    bad = [r for r in results if r["judge_state"] == "unjudgeable"]
    return {"judge": judge.name, "model": judge.model, "n_calls": len(results), "n_judged": len(results) - len(bad),
            "cost_usd": float(sum(r["judge_cost_usd"] for r in results)), "passed": bool(results) and not bad,
            "reason": "ok" if results and not bad else
            ("; ".join(r["judge_reason"] for r in bad[:3]) or "no prompt to judge")}
