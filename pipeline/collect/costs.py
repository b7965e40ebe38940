"""What one call may plausibly cost or count, the one rule for a provider's `usage` (pipeline/collect/client.py) and
for a cost already in a call log (`logged_cost`).

The dearest list prices (about $150 / $600 per million tokens in / out) x a 1M-token prompt and 100k completion
tokens come to about $210: a `usage.cost` over MAX_CALL_USD is no price but a broken or hostile provider (two calls
of 1e308 sum to inf), so it is treated like a negative, NaN or infinite one: refused, and the agent's list prices x
tokens replace it, flagged `cost_invalid`. Sums of at most a few thousand such calls stay finite and printable.
"""
from __future__ import annotations

MAX_CALL_USD = 1_000.0
MAX_CALL_TOKENS = 100_000_000  # no context holds 10^8 tokens: a larger count is broken (and int(inf) raises)
MAX_PRICE_PER_MTOK = 10_000.0  # USD per million tokens: 16x the dearest list price; more is a typo or a unit slip


def price_problem(v) -> str | None:
    """Why `v` is no price in USD per million tokens (a number in [0, MAX_PRICE_PER_MTOK]), or None: a negative,
    NaN or infinite price makes every forecast, budget and estimate of its agent meaningless."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return f"must be a number of USD per million tokens, got {str(v)[:40]!r}"
    try:
        f = float(v)
    except ValueError:
        return f"must be a number of USD per million tokens, got {str(v)[:40]!r}"
    if not 0 <= f <= MAX_PRICE_PER_MTOK:  # NaN fails both
        return f"must be a number of USD per million tokens in [0, {MAX_PRICE_PER_MTOK:g}], got {str(v)[:40]}"
    return None


def plausible_usd(v) -> float | None:
    """`v` as USD when it is a number in [0, MAX_CALL_USD], else None (bool, text, NaN, inf, negative, absurd)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        v = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if 0 <= v <= MAX_CALL_USD else None  # NaN fails both comparisons


def plausible_tokens(v) -> int | None:
    """`v` as a token count when it is a number in [0, MAX_CALL_TOKENS], else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_CALL_TOKENS:
        return None
    return int(v)


def logged_cost(row: dict, agent) -> float:
    """The USD a call-log row counts for: its `cost_usd` when plausible (0 when absent: an error); a refused one
    (`cost_invalid`, e.g. 1e308 written before costs were checked) is `agent`'s prices x the row's tokens (0 without
    the agent or its tokens)."""
    cost = plausible_usd(row.get("cost_usd"))
    if cost is not None:
        return cost
    if not row.get("cost_invalid") and row.get("cost_usd") is None:
        return 0.0
    pt, ct = plausible_tokens(row.get("prompt_tokens")), plausible_tokens(row.get("completion_tokens"))
    return float(agent.cost(pt or 0, ct or 0)) if agent is not None else 0.0
