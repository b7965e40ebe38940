"""A bench endpoint with a provider's latency: lognormal (median 2 s, p99 20 s, capped), some 429s with Retry-After.

The OpenAI-protocol server of tests/fault_server.py (127.0.0.1, keep-alive), answering every chat call after a
lognormal delay; the first request of a prompt is answered 429 + `Retry-After` with probability `--p429` (a retry is
never rate-limited again, so a collector with retries loses nothing to the endpoint itself). `--time-scale` multiplies
every time (latency, cap, Retry-After): 0.5 halves the run and doubles the call rate.

It logs every request: `GET /stats` returns `{"events": [[t_in, t_out, status, prompt_hash, latency_or_retry_after],
...]}` (monotonic seconds of this process; `?reset=1` clears them). bench/collect.py --realistic reads them to
measure how many calls the collector keeps in flight.

    python bench/realistic_endpoint.py [--median-ms 2000] [--p99-ms 20000] [--cap-ms 60000] [--p429 0.02]
                                       [--retry-after-s 1] [--time-scale 1] [--seed 0]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fault_server import FaultServer, phash  # noqa: E402

Z99 = 2.3263478740408408  # the standard normal's 99th percentile


class RealisticServer(FaultServer):
    def __init__(self, median_s: float = 2.0, p99_s: float = 20.0, cap_s: float = 60.0, p429: float = 0.02,
                 retry_after_s: float = 1.0, seed: int = 0, port: int = 0):
        super().__init__(latency_s=0.0, retry_after=f"{retry_after_s:g}", port=port)
        self.mu, self.sigma = math.log(median_s), math.log(p99_s / median_s) / Z99
        self.cap_s, self.p429, self.retry_after_s = cap_s, p429, retry_after_s
        self.rng = random.Random(seed)
        self.events: list[list] = []
        self.seen: set[str] = set()

    def mean_latency_s(self) -> float:
        """E[min(L, cap)] is close to E[L] = median * exp(sigma^2 / 2) for a cap far in the tail."""
        return math.exp(self.mu + self.sigma ** 2 / 2)

    async def _respond(self, method: str, path: str, headers: dict, body: bytes, writer) -> bool:
        if method == "GET" and path.startswith("/stats"):
            payload = json.dumps({"events": self.events, "mean_latency_s": self.mean_latency_s()}).encode()
            if "reset=1" in path:
                self.events, self.seen = [], set()
            self._send(writer, 200, payload)
            await writer.drain()
            return True
        if method != "POST":
            return await super()._respond(method, path, headers, body, writer)
        t_in = time.monotonic()
        req = json.loads(body or b"{}")
        prompt = next((m.get("content") for m in reversed(req.get("messages", [])) if m.get("role") == "user"), "")
        h = phash(prompt or "")
        first = h not in self.seen
        self.seen.add(h)
        if first and self.rng.random() < self.p429:
            self._send(writer, 429, self._err("Rate limit exceeded, slow down", "rate_limit_error", 429),
                       {"retry-after": self.retry_after})
            self.events.append([t_in, time.monotonic(), 429, h, self.retry_after_s])
            try:
                await writer.drain()
            except ConnectionError:
                return False
            return True
        latency = min(self.cap_s, self.rng.lognormvariate(self.mu, self.sigma))
        await asyncio.sleep(latency)
        ok = await super()._respond(method, path, headers, body, writer)
        self.events.append([t_in, time.monotonic(), 200 if ok else 0, h, latency])
        return ok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--median-ms", type=float, default=2000.0)
    ap.add_argument("--p99-ms", type=float, default=20000.0)
    ap.add_argument("--cap-ms", type=float, default=60000.0)
    ap.add_argument("--p429", type=float, default=0.02)
    ap.add_argument("--retry-after-s", type=float, default=1.0)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    k = args.time_scale
    srv = RealisticServer(args.median_ms / 1000 * k, args.p99_ms / 1000 * k, args.cap_ms / 1000 * k, args.p429,
                          args.retry_after_s * k, args.seed, args.port)

    async def amain() -> None:
        await srv._start()
        print(f"listening {srv.base_url}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(amain())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
