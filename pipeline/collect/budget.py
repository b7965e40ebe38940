"""A hard USD budget for a collection (`collection.max_usd`, `router-lite run --max-usd X`).

`Budget(max_usd, spent)` is shared by the workers of `pipeline.collect.calls.collect`: before a call is sent its worst
case is reserved (`pipeline.collect.forecast.call_cost_high`: bound prompt tokens + max_tokens, at the agent's price);
once its row is in the call log the reservation is settled with the call's actual cost. A call is sent only when
spent + every reservation in flight + its own worst case <= max_usd; when it does not fit, the worker waits for the
calls in flight to settle and tries again, and when nothing is in flight and it still does not fit, the budget stops:
no further call starts, the calls in flight finish and are logged. So the spend never passes max_usd unless a
provider charges a call more than its worst case at the price the budget was given.

`spent` counts what the collection already cost (`collection_state`: the logged calls of this collection, every
partition; a logged cost refused as implausible, pipeline/collect/costs.py, counts as its agent's prices x tokens),
so a budget is a ceiling on the whole collection across reruns, and a rerun with a higher one resumes where the
call log stops (the log is keyed by agent/task/repetition/settings hash: nothing lost, nothing doubled).
"""
from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from pipeline.collect.agents import AgentSpec
from pipeline.collect.call_log import DONE_STATUSES, CallLog, call_key
from pipeline.collect.costs import MAX_CALL_USD, logged_cost
from pipeline.collect.forecast import call_cost_high
from pipeline.core.errors import RouterLiteError

log = logging.getLogger(__name__)


def check_max_usd(value, where: str = "collection.max_usd") -> float | None:
    """A budget as given (None = none): a finite number >= 0, else one error naming `where`."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise RouterLiteError(f"{where}: must be a number of USD >= 0, got {str(value)[:40]}") from None
    if not math.isfinite(v) or v < 0 or isinstance(value, bool):
        raise RouterLiteError(f"{where}: must be a number of USD >= 0, got {str(value)[:40]}")
    return v


class Budget:
    """Reserve-then-settle accounting of one collection against `max_usd` (USD), starting from `spent`."""

    def __init__(self, max_usd: float, spent: float = 0.0, max_tokens: int = 4096):
        self.max_usd = float(max_usd)
        self.spent = float(spent)
        self.max_tokens = int(max_tokens)
        self.reserved = 0.0
        self.in_flight = 0
        self.stopped = False
        self.peak_committed = self.spent  # the highest spent + reserved ever held (a test reads it)
        self._changed: asyncio.Condition | None = None

    def _cond(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def worst_case(self, agent: AgentSpec, prompt: str, max_tokens: int | None = None) -> float:
        return call_cost_high(agent, prompt, self.max_tokens if max_tokens is None else max_tokens)

    async def reserve(self, agent: AgentSpec, prompt: str, max_tokens: int | None = None) -> float | None:
        """Reserve the worst case of one call (`max_tokens`: its completion cap, default the collection's; a judge's
        is its own); None when the budget stopped (send nothing)."""
        need = self.worst_case(agent, prompt, max_tokens)
        async with self._cond():
            while not self.stopped:
                if self.spent + self.reserved + need <= self.max_usd:
                    self.reserved += need
                    self.in_flight += 1
                    self.peak_committed = max(self.peak_committed, self.spent + self.reserved)
                    return need
                if self.in_flight == 0:  # nothing will free room: the budget is spent
                    self.stopped = True
                    self._cond().notify_all()
                    break
                await self._cond().wait()
            return None

    async def settle(self, reserved: float, cost_usd: float | None) -> None:
        """The call whose worst case was `reserved` is logged and cost `cost_usd` (None: an error, 0)."""
        async with self._cond():
            self.reserved = max(0.0, self.reserved - reserved)
            self.in_flight -= 1
            self.spent += float(cost_usd or 0.0)
            self._cond().notify_all()


def collection_state(logs: Iterable[str | Path], tasks: pd.DataFrame, agents: list[AgentSpec], repetitions: int,
                     settings_hash: str, source_of=None) -> dict:
    """What a collection already holds: {spent, done, wanted, missing} over the call logs `logs` (every partition's
    directory): `spent` sums the logged cost of its calls (every row of its call keys, errors at 0), `done` counts
    its call keys with a done row, `missing` lists (agent, task_id, repetition) without one."""
    wanted = {call_key(a.name, str(t), r, settings_hash): (a.name, str(t), r)
              for r in range(repetitions) for t in tasks["task_id"] for a in agents}
    by_name = {a.name: a for a in agents}
    spent, done, refused = 0.0, set(), 0
    for d in logs:
        for row in CallLog(d).iter_rows():
            k = row.get("call_key")
            if k in wanted:
                spent += logged_cost(row, by_name.get(row.get("agent")))  # a refused cost: its estimate
                refused += bool(row.get("cost_invalid"))
                if row.get("status") in DONE_STATUSES:
                    done.add(k)
    if refused:
        log.warning("collection: %d logged call(s) hold a provider cost that is not plausible (not finite, < 0 or "
                    "over $%g): counted at their agent's list prices x tokens", refused, MAX_CALL_USD)
    missing = [wanted[k] for k in wanted if k not in done]
    return {"spent": spent, "done": len(done), "wanted": len(wanted), "missing": missing, "cost_invalid": refused}


def stop_line(budget: Budget, state: dict) -> str:
    """The one line a budget stop prints: spent, remaining calls, how to resume."""
    return (f"collection budget reached: spent ${state['spent']:.6f} of max_usd ${budget.max_usd:.6f}; "
            f"{len(state['missing']):,} of {state['wanted']:,} calls remain (every made call is logged); resume with "
            f"a higher budget: router-lite run --max-usd X (or the profile's collection.max_usd)")
