"""What the serving benches share: `router-lite serve` started from this checkout on a free loopback port and stopped,
load from concurrent clients with the router's headers read back, percentiles, the server processes' CPU time,
the recorded MMLU-Pro prompts, and the folder the results go to."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def bench_dir() -> Path:
    from resources.storage import default_home

    return Path(default_home()) / "bench"


def recorded_prompts(n: int, skip: int = 0) -> list[str]:
    """MMLU-Pro prompts (bundled source) recorded for every agent of the mmlu_pro pool, in source order."""
    from pipeline.tasks.sources import load_source
    from resources.pool import PoolResource

    pool = PoolResource(kind="replay", pool="mmlu_pro")
    store, agents = pool.store(), pool.agents()
    out = []
    for p in load_source("mmlu_pro")["prompt"]:
        if all(store.text_for(a.model, p) is not None for a in agents):
            out.append(p)
            if len(out) == skip + n:
                break
    return out[skip:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(serve_args: list[str], env: dict | None = None, ready: str = "/readyz", timeout_s: float = 240.0,
                settle_s: float = 0.0):
    """`router-lite serve SERVE_ARGS --port <free>` from this checkout; (process, base URL, its output lines) once
    its startup line is printed (with --workers N: once every worker is ready), `ready` answers 200 and `settle_s`
    more have passed."""
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", *serve_args, "--port", str(port)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"router-lite serve exited with {proc.returncode}:\n{''.join(lines)[-3000:]}")
        started = any("router-lite serve: " in ln and " on http" in ln for ln in lines)
        try:
            if started and httpx.get(url + ready, timeout=2).status_code == 200:
                time.sleep(settle_s)
                return proc, url, lines
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"router-lite serve was not ready within {timeout_s:.0f} s:\n{''.join(lines)[-3000:]}")


def stop_server(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def phase(url: str, head_name: str, prompts: list[str], concurrency: int, max_seconds: float,
                headers: dict | None = None) -> dict:
    """Send each prompt once from `concurrency` concurrent clients; (overheads, latencies, errors, seconds)."""
    import httpx

    todo = iter(prompts)
    over, lat, errors, upstream = [], [], 0, []
    deadline = time.monotonic() + max_seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60, headers=headers) as client:
        async def worker():
            nonlocal errors
            for p in todo:
                if time.monotonic() > deadline:
                    return
                t = time.perf_counter()
                try:
                    r = await client.post("/v1/chat/completions",
                                          json={"model": head_name, "messages": [{"role": "user", "content": p}]})
                except httpx.HTTPError:
                    errors += 1
                    continue
                lat.append((time.perf_counter() - t) * 1000)
                if r.status_code != 200:
                    errors += 1
                    continue
                over.append(float(r.headers["x-router-overhead-ms"]))
                timing = dict(part.split(";dur=")[:2] for part in r.headers.get("server-timing", "").split(", ")
                              if ";dur=" in part)
                if "upstream" in timing:
                    upstream.append(float(timing["upstream"].split(";")[0]))

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        seconds = time.perf_counter() - t0
    return {"overhead_ms": over, "latency_ms": lat, "errors": errors, "seconds": seconds, "upstream_ms": upstream}


def phase_row(r: dict, cpu_s: float) -> dict:
    """A `phase` result as the benches' row: requests, errors, router overhead and end-to-end p50 / p99, requests/s and
    the server's CPU time per request."""
    n = len(r["latency_ms"])
    return {"requests": n, "errors": r["errors"],
            "overhead_p50_ms": pct(r["overhead_ms"], 50), "overhead_p99_ms": pct(r["overhead_ms"], 99),
            "e2e_p50_ms": pct(r["latency_ms"], 50), "e2e_p99_ms": pct(r["latency_ms"], 99),
            "req_per_s": n / r["seconds"] if r["seconds"] else float("nan"),
            "server_cpu_ms_per_req": 1000 * cpu_s / max(1, n)}


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and its child processes (the workers of `serve --workers N`)."""
    return cpu_seconds(pid) + sum(cpu_seconds(c) for c in _children(pid))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc; nan elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")
