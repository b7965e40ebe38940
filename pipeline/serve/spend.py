"""What a client key may still spend: the budget and rate decisions of `router-lite serve --api-keys` (pure
functions; the ledger that stores the figures is resources/ledger.py, the middleware that asks is auth.py).

**Windows are rolling.** A key's budget covers what its requests cost over the last `budget_window` (and `rpm` the
requests admitted over the last 60 s), whenever one asks: a fixed window (midnight to midnight) would let a client
spend twice its budget across a boundary, and says nothing better about when to retry. Spend is kept in buckets of
window / 120 (at least 1 s) per key, so a check reads at most ~121 rows; a bucket counts until its end leaves the
window, which makes the window up to 1/120 longer, never shorter. `Retry-After` is when enough has gone to make room:
old buckets leaving the window, reservations reaching their deadlines (their requests have settled by then).

**Reserve, then settle** (as the collection budget, pipeline/collect/budget.py): before a request calls an agent its
worst case is reserved (`worst_case_usd`: every agent the plan at its target may call, at its list prices, for the
prompt's byte count + the request's max_tokens); it is admitted only when spent + the reservations of the key's
requests in flight (every process sharing the ledger) + its own worst case fit the budget. After the reply the
reservation is replaced by the reply's `usage.cost`. So a key's spend passes its budget only when a provider bills
a call more than that worst case.
"""
from __future__ import annotations

import dataclasses
import json
import math

from pipeline.collect.forecast import prompt_tokens_high
from pipeline.core.errors import RouterLiteError

RPM_WINDOW_S = 60
BUCKETS_PER_WINDOW = 120
EPS_USD = 1e-12


class LedgerOutage(RouterLiteError):
    """Settlements the ledger could not take, kept in the home's journal until it can (resources/ledger.py); the
    message says how many, where and why."""


@dataclasses.dataclass(frozen=True)
class KeyUsage:
    """One key's figures in the ledger at a moment: settled spend buckets still in the window `(end, usd)` and
    admitted requests per second `(second, n)` over the last RPM_WINDOW_S, each oldest first, the worst cases
    reserved by its requests in flight (`reserved`, their sum) and those reservations `(deadline, usd)`, earliest
    deadline first (`held`: a request has settled by its deadline; () when not known)."""

    spend: tuple = ()
    reserved: float = 0.0
    hits: tuple = ()
    held: tuple = ()

    @property
    def spent(self) -> float:
        return float(sum(usd for _, usd in self.spend))


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A 429: `code` (`budget_exceeded` or `rate_limit_exceeded`), the message, and seconds until a retry fits."""

    code: str
    message: str
    retry_after_s: int


def bucket_seconds(window_s: float) -> int:
    return max(1, int(window_s // BUCKETS_PER_WINDOW))


def bucket_end(now: float, window_s: float) -> int:
    """The end (epoch seconds) of the spend bucket that a cost settled at `now` goes into."""
    b = bucket_seconds(window_s)
    return (int(now // b) + 1) * b


def admission(key, usage: KeyUsage, need_usd: float, now: float) -> Refusal | None:
    """None when `key` (a pipeline.serve.keys.ClientKey) may send a request whose worst case is `need_usd` now,
    else why not and when to retry."""
    if key.rpm is not None:
        count = sum(n for _, n in usage.hits)
        if count >= key.rpm:
            return Refusal("rate_limit_exceeded", f"key {key.name!r} is over its rate of {key.rpm} requests per "
                                                  f"minute", _rate_retry(usage.hits, count - key.rpm + 1, now))
    if key.budget_usd is None:
        return None
    spent, budget = usage.spent, key.budget_usd
    over = spent + usage.reserved + need_usd - budget
    if over <= EPS_USD:
        return None
    figures = (f"${spent:.6f} spent in the window, ${usage.reserved:.6f} reserved by its requests in flight, and "
               f"this request may cost up to ${need_usd:.6f}")
    return Refusal("budget_exceeded", f"key {key.name!r} is over its budget of {key.budget_text()}: {figures}",
                   _budget_retry(usage.spend, usage.held, over, key.window_s, now))


def _rate_retry(hits, excess: int, now: float) -> int:
    """Seconds until `excess` of the admitted requests leave the minute."""
    gone = 0
    for second, n in hits:
        gone += n
        if gone >= excess:
            return max(1, math.ceil(second + RPM_WINDOW_S - now))
    return 1


def _budget_retry(spend, held, over: float, window_s: float, now: float) -> int:
    """Seconds until `over` USD of what holds the budget is gone: settled spend as its bucket leaves the window,
    a reservation by its deadline (its request has settled by then: what it cost replaces it, usually far less
    than its worst case). 1 when even all of that is not enough."""
    gone = 0.0
    for when, usd in sorted([(end + window_s, usd) for end, usd in spend] + [tuple(h) for h in held]):
        gone += usd
        if gone >= over - EPS_USD:
            return max(1, math.ceil(when - now))
    return 1


def over_whole_budget(key, bounds: list[tuple[float, float]], prompt_tokens: int,
                      completion_tokens: int) -> str | None:
    """Why a request whose worst case is more than `key`'s whole budget can never be admitted (no retry, however
    late, fits it), naming the budget, its worst case and the largest max_tokens that fits; None when it fits or the
    key has no budget. Checked before the ledger is asked: such a request is answered 402, not a 429 that clients
    (the openai SDK) retry."""
    if key.budget_usd is None:
        return None
    need = worst_case_usd(bounds, prompt_tokens, completion_tokens)
    if need <= key.budget_usd + EPS_USD:
        return None
    fits = affordable_completion_tokens(bounds, prompt_tokens, key.budget_usd)
    how = f"send max_tokens of at most {fits}" if fits > 0 else "shorten the messages: they alone cost more"
    return (f"key {key.name!r}: this request may cost up to ${need:.6f} ({prompt_tokens} prompt tokens and up to "
            f"{completion_tokens} completion tokens at the list prices of the agents its target may call), more "
            f"than the key's whole budget of {key.budget_text()}, so no retry can fit it: {how}, or raise the "
            "key's budget_usd")


def affordable_completion_tokens(bounds: list[tuple[float, float]], prompt_tokens: int, budget_usd: float) -> int:
    """The most completion tokens a request of `prompt_tokens` may ask for with its worst case within `budget_usd`
    (0: none; the prompt alone is over it)."""
    fits = math.inf
    for p_in, p_out in bounds:
        room = budget_usd * 1e6 - p_in * prompt_tokens
        fits = min(fits, -1 if room < 0 else math.inf if p_out <= 0 else room / p_out)
    return 0 if fits < 1 else int(min(fits, 1 << 31))


# ------------------------------------------------------------------------------------------------ worst cases
def price_bounds(registered, specs, target: str | None) -> list[tuple[float, float]]:
    """(sum of input, sum of output list prices, USD per million tokens) of each set of agents a request at
    `target` may call: one agent alone (a prompt-routed pick, the OOD guard's best single agent, a cascade's prompt
    shortcut), or every agent of each of the cascade's policies at that target (all their stages run). Dominated
    pairs are dropped."""
    pairs = [(float(s.price_in_per_mtok), float(s.price_out_per_mtok)) for s in specs]
    if getattr(registered, "needs_grader", False):
        try:
            plan = registered.router.plan(target)
            policies = [plan.default, *(p for _, p in plan.by_grader)]
        except RouterLiteError:  # a target the cascade cannot resolve: bound by every agent called once
            policies = None
        groups = [set(range(len(specs)))] if policies is None else \
            [{j for st in pol.stages for j in st.agents} for pol in policies]
        pairs += [(sum(pairs[j][0] for j in g), sum(pairs[j][1] for j in g)) for g in groups]
    return [p for p in set(pairs) if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in pairs)]


def request_tokens(upstream: dict, max_tokens_cap: int) -> tuple[int, int]:
    """(prompt tokens, completion tokens) at most, of a request forwarding `upstream`: the messages' JSON bytes +
    the chat template (pipeline.collect.forecast.prompt_tokens_high), and its max_tokens / max_completion_tokens
    (the larger; the cap when it names neither and the server has no default)."""
    prompt = prompt_tokens_high(json.dumps(upstream.get("messages", []), ensure_ascii=False))
    named = [int(upstream[k]) for k in ("max_tokens", "max_completion_tokens") if isinstance(upstream.get(k), int)]
    return prompt, max(named) if named else int(max_tokens_cap)


def worst_case_usd(bounds: list[tuple[float, float]], prompt_tokens: int, completion_tokens: int) -> float:
    return max((p_in * prompt_tokens + p_out * completion_tokens) / 1e6 for p_in, p_out in bounds)
