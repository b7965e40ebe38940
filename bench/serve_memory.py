"""Memory of `router-lite serve` under big prompts (issue 12 case 4): RSS of the server process before and after
64 prompts of ~1 MB each (8 concurrent clients), and its peak.

Starts `router-lite serve` from this checkout (PYTHONPATH = the repo this file lies in) on the replay pool; the
big prompts were never recorded, so the picked agent answers 502: what is measured is the router's embedding of
them.

    python bench/serve_memory.py --head DIR     # DIR: a registered head, e.g. from bench/serve.py --save-head DIR
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from _load import REPO, start_serve, stop_server


def status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def send(url: str, prompts: list[str], clients: int) -> list[int]:
    import httpx

    todo, codes = iter(prompts), []
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        async def worker():
            for p in todo:
                r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": p}]})
                codes.append(r.status_code)
        await asyncio.gather(*[worker() for _ in range(clients)])
    return codes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", required=True)
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--chars", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    proc, url, _ = start_serve(["--head", args.head, "--profile", args.profile, "--device", "cpu",
                                "--workers", "1"], ready="/healthz", timeout_s=120)  # one process: one RSS
    try:
        text = ("The quick brown fox jumps over the lazy dog near the river bank while a physicist computes the "
                "derivative of a function. ")
        bigs = [(f"{i} " + text * (args.chars // len(text) + 1))[:args.chars] for i in range(args.prompts + 1)]
        asyncio.run(send(url, bigs[:1], 1))  # first-call allocations
        asyncio.run(send(url, ["What is 2 + 2? Options: (A) 3 (B) 4"], 1))
        before = status_mb(proc.pid, "VmRSS")
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # reset the peak
        t = time.perf_counter()
        codes = asyncio.run(send(url, bigs[1:], args.clients))
        seconds = time.perf_counter() - t
        time.sleep(1.0)
        after, peak = status_mb(proc.pid, "VmRSS"), status_mb(proc.pid, "VmHWM")
    finally:
        stop_server(proc)
    out = {"repo": str(REPO), "prompts": args.prompts, "chars": args.chars, "clients": args.clients,
           "rss_before_mb": round(before), "rss_after_mb": round(after), "rss_peak_mb": round(peak),
           "seconds": round(seconds, 1), "status_codes": sorted(set(codes))}
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
