"""Readiness (`GET /readyz`): 503 until the served router, the backbone and the grading worker are warm, 200 after
(503 again, `"status": "draining"`, once the server stops: pipeline/serve/drain.py),
with a JSON body naming what is warm and the router served. `/healthz` stays the liveness probe (the process
answers). The warm-up runs in the background once the app starts (`warm_up`), so a probe sees 503 meanwhile:

- the backbone and the router: one decision through the app's batcher (an embedding and the router's pick);
- the grading worker: one comparison that needs sympy, answered by a worker process of pipeline/collect/bounded.py
  within the grading budget (tried again every few seconds until one is).
"""
from __future__ import annotations

import asyncio
import logging

from pipeline.serve.served import warm

log = logging.getLogger(__name__)

RETRY_S = 2.0
SYMPY_PAIR = ("x^2 - 1", "(x - 1)*(x + 1)")  # equal only to sympy: the fast path in process cannot tell


class Readiness:
    def __init__(self):
        self.backbone = self.grading = False
        self.router: str | None = None  # the router whose decision warmed the backbone

    @property
    def ready(self) -> bool:
        return self.backbone and self.grading and self.router is not None

    def body(self, served, follower=None, draining: bool = False) -> dict:
        """`status`: "draining" once the server stops (pipeline/serve/drain.py), else "ready" or "warming"."""
        out = {"status": "draining" if draining else "ready" if self.ready else "warming",
               "warm": {"backbone": self.backbone, "router": self.router is not None, "grading_worker": self.grading},
               "router": served.router_name, "kind": getattr(served.registered, "kind", None),
               "promoted_at": served.origin.get("promoted_at"),
               "promoted_source": served.origin.get("promoted_source")}
        if follower is not None:
            out["follow"] = follower.status()
        return out


async def warm_up(app) -> None:
    """Warm what `/readyz` waits for; the decision and the grading check run side by side."""
    state = app.state

    async def router() -> None:
        while True:
            served = state.served
            try:
                await warm(served)
            except Exception as exc:  # noqa: BLE001 - not ready yet; a request would fail the same way
                log.warning("warming router %s failed (%s: %s); trying again", served.router_name,
                            type(exc).__name__, exc)
                await asyncio.sleep(RETRY_S)
                continue
            if state.open_ended is not None:  # both worlds: the open-ended router is warm too before ready
                await warm(state.open_ended)
            state.readiness.backbone, state.readiness.router = True, served.router_name
            return

    async def grading() -> None:
        from pipeline.collect import bounded

        while True:
            out = await asyncio.to_thread(bounded.agree_outcome, *SYMPY_PAIR, "math_expression")
            if out.status == "ok" and out.value:
                state.readiness.grading = True
                return
            log.warning("the grading worker is not answering yet (%s); trying again", out.status)
            await asyncio.sleep(RETRY_S)

    await asyncio.gather(router(), grading())
