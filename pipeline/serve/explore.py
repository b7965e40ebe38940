"""Exploration on a budget (`serve --explore SHARE --explore-usd-per-day CAP`; docs/serving.md, "Exploration"): for
a recorded request drawn for it (pipeline/serve/traffic.py `drawn`), after the client has its reply, the agents of the
router's pool that the decision did not ask are asked the same messages, so its row in the traffic log is complete:
every agent's reply to one prompt, the unbiased evidence the lineage grades and the gate compares routers on.

Off the client's path and purse: a job is queued once the reply has gone (a bounded queue per worker; full: the
request is not explored, counted), run by the worker's own tasks through the serve's agent clients with at most
`explore_concurrency` calls in flight, never through the client-key ledger (the key pays only its own request).
Before its calls, a job reserves their worst case (the agents' list prices x the prompt's tokens and the request's
max_tokens, as a key's budget does: pipeline/serve/spend.py) against the day's cap in the home's spend counter
(resources/traffic.py `ExploreSpend`, shared by every worker); afterwards what was paid replaces it. A reservation
that does not fit means the cap is reached: one log line, and no more exploration that UTC day in this worker.

A stop (SIGTERM drains the server, pipeline/serve/drain.py; the app's shutdown then closes the explorer): queued jobs
are abandoned (their calls never start, nothing is reserved), jobs in flight get `explore_drain_s` to finish and
write their line, then are cancelled (their reservation stays counted: their calls may have been paid). One line
says how many of each.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from pipeline.serve import spend
from pipeline.serve.cascade_calls import ask
from pipeline.serve.traffic import reply_call, stamp

log = logging.getLogger(__name__)


class Explorer:
    """One worker's exploration: `submit` (from the event loop, never blocks) and `close` (the app's shutdown).
    `budget`: a resources.traffic.ExploreSpend; `writer`: the TrafficWriter; `options`: the serve's upstream
    options (timeout, no retries); `max_tokens_cap`: the worst case of a request that names no max_tokens."""

    def __init__(self, settings, writer, budget, options: dict, max_tokens_cap: int):
        self.settings, self.writer, self.budget = settings, writer, budget
        self.options, self.max_tokens_cap = dict(options), int(max_tokens_cap)
        self.metrics = None
        self.queue: asyncio.Queue | None = None
        self.tasks: list[asyncio.Task] = []
        self.running: set[asyncio.Task] = set()
        self.slots: asyncio.Semaphore | None = None
        self.capped_day: str | None = None
        self.counts = {"explored": 0, "capped": 0, "full": 0, "abandoned": 0, "cancelled": 0}
        self.closing = False

    def submit(self, rid: str, served, upstream: dict, asked: list[str]) -> bool:
        """Queue request `rid` (what it forwarded, the agents it asked) for exploration; False when it is not."""
        refused = "abandoned" if self.closing else "capped" if self.capped_day == stamp()[1] else None
        if refused is None:
            self._start()
            try:
                self.queue.put_nowait((rid, served, upstream, asked))
                return True
            except asyncio.QueueFull:
                refused = "full"
        self._count(refused)
        return False

    def _start(self) -> None:
        if self.queue is None:  # made in the app's loop, on first use
            self.queue = asyncio.Queue(maxsize=self.settings.explore_queue)
            self.slots = asyncio.Semaphore(self.settings.explore_concurrency)
            self.tasks = [asyncio.create_task(self._worker()) for _ in range(self.settings.explore_concurrency)]

    async def _worker(self) -> None:
        while True:
            job = await self.queue.get()
            task = asyncio.current_task()
            self.running.add(task)
            try:
                await self.explore(*job)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - an exploration never stops the worker
                log.warning("exploration of request %s failed: %s: %s", job[0], type(exc).__name__, exc)
            finally:
                self.running.discard(task)
                self.queue.task_done()

    async def explore(self, rid: str, served, upstream: dict, asked: list[str]) -> None:
        """Ask every agent of `served`'s pool that `asked` lacks; write the "exploration" line."""
        todo = [j for j, s in enumerate(served.specs) if s.name not in set(asked)]
        upstream = {k: v for k, v in upstream.items() if k not in ("stream", "stream_options")}
        day = stamp()[1]
        worst = self.worst_case(served, todo, upstream)
        cap = float(self.settings.explore_usd_per_day)
        if todo and not await asyncio.to_thread(self.budget.reserve, day, worst, cap):
            self._capped(day, cap)
            return
        try:
            replies = await asyncio.gather(*(self._ask(j, served, upstream) for j in todo))
        except asyncio.CancelledError:
            self._count("cancelled")
            raise
        paid = float(sum(r.cost for r in replies))
        if todo:
            await asyncio.to_thread(self.budget.settle, day, worst, paid)
        ts, line_day = stamp()
        calls = [reply_call(r, served.specs[r.agent], served.clients[r.agent]) for r in replies]
        self.writer.write({"v": 1, "record": "exploration", "request_id": rid, "ts": ts, "day": line_day,
                           "calls": calls, "complete": True, "usd": paid})
        self._count("explored")
        if self.metrics is not None and paid > 0:
            self.metrics.explore_usd.inc(paid)

    async def _ask(self, j: int, served, upstream: dict):
        async with self.slots:  # the provider's limit: calls in flight per worker
            return await ask(j, served.specs[j], served.clients[j], upstream, self.options, "")

    def worst_case(self, served, todo: list[int], upstream: dict) -> float:
        """What asking agents `todo` may cost at most: each one's list prices x the prompt's tokens (high) and the
        request's max_tokens (pipeline/serve/spend.py)."""
        prompt, completion = spend.request_tokens(upstream, self.max_tokens_cap)
        return float(sum(spend.worst_case_usd([(served.specs[j].price_in_per_mtok, served.specs[j].price_out_per_mtok)],
                                              prompt, completion) for j in todo))

    def _capped(self, day: str, cap: float) -> None:
        self._count("capped")
        if self.capped_day != day:
            self.capped_day = day
            log.warning("exploration: the cap of $%.4f for %s (UTC) is reached (%s); no more exploration in this "
                        "worker until the next UTC day", cap, day, f"${self.budget.spent(day):.4f} spent or reserved")

    def _count(self, what: str, n: int = 1) -> None:
        self.counts[what] += n
        if self.metrics is not None and n:
            self.metrics.explorations.labels(what).inc(n)

    async def close(self, grace_s: float) -> None:
        """Abandon the queued jobs, give those in flight `grace_s` to finish, cancel the rest; one line."""
        self.closing = True
        if self.queue is None:
            return
        abandoned = 0
        while not self.queue.empty():
            self.queue.get_nowait()
            self.queue.task_done()
            abandoned += 1
        self._count("abandoned", abandoned)
        t0, before = time.monotonic(), self.counts["explored"]
        while self.running and time.monotonic() - t0 < grace_s:
            await asyncio.sleep(0.05)
        in_flight = len(self.running)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        finished = self.counts["explored"] - before
        if abandoned or in_flight or finished:
            log.warning("exploration: stopping: %d in flight finished, %d queued abandoned, %d cancelled after %g s "
                        "(their reservations stay counted)", finished, abandoned, in_flight, grace_s)


def _tokens(text: str | None) -> int:
    return -(-len(text or "") // 4)  # chars / 4, as the replay's and a reply without usage are priced


def exploration_forecast(rows: list[dict], specs: dict, share: float, cap: float | None, now: float) -> dict:
    """What a day of exploration costs at the current request rate: the request lines of the last 24 h (`rows`:
    traffic log lines; `now`: unix s) x `share` x the mean cost of asking a request's un-asked agents, priced at
    their list prices (`specs`: agent name -> AgentSpec, config/prices.yaml) for its messages and the mean length
    of the replies it got; beside it what the explorations of those 24 h did cost (`measured_usd_per_request`) and
    the cap. A log younger than a day is extrapolated to one."""
    import datetime

    def when(r):
        return datetime.datetime.fromisoformat(str(r["ts"]).replace("Z", "+00:00")).timestamp()

    day = [r for r in rows if r.get("ts") and now - 86400 <= when(r) <= now]
    requests = [r for r in day if r.get("record") == "request"]
    explored = [r for r in day if r.get("record") == "exploration"]
    span_s = (now - min(when(r) for r in requests)) if requests else 0.0
    per_day = len(requests) * (86400.0 / span_s if 0 < span_s < 86400 else 1.0)
    costs = []
    for r in requests:
        asked = {c.get("agent") for c in r.get("calls") or []}
        replies = [c.get("reply") for c in r.get("calls") or [] if c.get("reply")]
        completion = sum(_tokens(t) for t in replies) / len(replies) if replies else 0
        prompt = _tokens(json.dumps(r.get("messages") or [], ensure_ascii=False))
        costs.append(sum(specs[a].cost(prompt, completion) for a in r.get("pool") or []
                         if a not in asked and a in specs))
    mean = sum(costs) / len(costs) if costs else 0.0
    day_usd = per_day * float(share) * mean
    return {"requests_last_24h": len(requests), "requests_per_day": round(per_day, 3),
            "extrapolated_from_hours": round(span_s / 3600, 3) if 0 < span_s < 86400 else None,
            "share": float(share), "mean_unasked_usd": mean, "usd_per_day": day_usd, "cap_usd_per_day": cap,
            "capped": cap is not None and day_usd > cap,
            "measured_usd_per_request": (sum(float(e.get("usd") or 0) for e in explored) / len(explored)
                                         if explored else None), "explored_last_24h": len(explored)}
