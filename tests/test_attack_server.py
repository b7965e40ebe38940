"""Attacks on the served endpoint over loopback (the synthetic head in process, agents on a MockTransport): connection
exhaustion and slowloris, huge heads, paths and bodies, bad JSON and sampling values, an unknown n, a lone surrogate,
bodies pushed on after their refusal; a taken port, a worker outliving its parent; the OpenRouter stand-in's bounds.
Each gets its documented status (or one line, exit 2) and the server keeps answering good requests."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from attack_kit import REPO, chat, cli, one_line, peer_closed, read_all, server, world_files


def test_connection_exhaustion() -> None:
    """server: one client holds 300 half-open sockets (cap 64); /healthz and chat still answer"""
    import httpx

    socks = []
    with server(max_connections=64, max_idle_per_client=16, reserved_connections=8, header_timeout_s=20) as srv:
        try:
            for _ in range(300):
                s = socket.create_connection((srv.host, srv.port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # half a head, then silence
                socks.append(s)
            t = time.perf_counter()
            with httpx.Client(base_url=srv.base_url, timeout=10) as c:
                for _ in range(10):
                    assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 200
                    assert chat(c).status_code == 200
            took = time.perf_counter() - t
            open_ = sum(1 for s in socks if not peer_closed(s))
        finally:
            for s in socks:
                s.close()
    assert open_ <= 16, open_
    print(f"20 good requests all 200 in {took:.2f}s; {open_} of the attacker's 300 sockets left open (bound 16)")


def test_connection_full_is_503() -> None:
    """server: every slot serving a request -> 503 with Retry-After, not a reset"""
    socks = []
    with server(max_connections=4, max_idle_per_client=4, reserved_connections=1, body_timeout_s=20) as srv:
        try:
            for _ in range(4):  # complete heads, bodies never sent: busy, not idle
                s = socket.create_connection((srv.host, srv.port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
                socks.append(s)
            time.sleep(0.2)
            s = socket.create_connection((srv.host, srv.port), timeout=5)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = read_all(s)
            s.close()
        finally:
            for s in socks:
                s.close()
    assert reply.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in reply.lower(), reply[:200]
    print(reply.split(b"\r\n")[0].decode())


def test_target_table() -> None:
    """server: 20 distinct lambda= targets, then parity / quality>=0.98 / budget=0.5"""
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for i in range(20):
            r = chat(c, headers={"X-Router-Target": f"lambda={i / 7:.4f}"})
            assert r.status_code == 200, r.text
        for t in ("parity", "quality>=0.98", "budget=0.5", "max-quality"):
            r = chat(c, headers={"X-Router-Target": t})
            assert r.status_code == 200 and r.headers["x-router-target"] == t, (t, r.status_code, r.text[:200])
    print("every target resolves after 20 distinct ones (LRU of head views)")


def test_huge_echo() -> None:
    """server: 60 KB X-Router-Target header, 1 MB router_target, 20 KB path"""
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        r = chat(c, headers={"X-Router-Target": "x" * 60_000})
        assert r.status_code == 431 and len(r.content) < 1000, (r.status_code, len(r.content))
        r = chat(c, body={"router_target": "y" * 1_000_000})  # under the 1 MiB body limit: the target is read
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_target" and len(r.content) < 1000, \
            (r.status_code, len(r.content))
        r = chat(c, body={"router_target": "y" * (1 << 20)})  # over it: body_too_large, its body left unread
        assert r.status_code == 400 and len(r.content) < 1000, (r.status_code, len(r.content))
        r = c.get("/" + "z" * 20_000)
        assert r.status_code == 431 and len(r.content) < 1000, (r.status_code, len(r.content))
        r = c.get("/" + "z" * 8_000)
        assert r.status_code == 404 and len(r.content) < 1000, (r.status_code, len(r.content))
        ok = chat(c, headers={"X-Filler": "f" * 15_000})
        assert ok.status_code == 200, ok.status_code  # a head under 16 KiB still passes
    print("head > 16 KiB -> 431; echoed values cut (replies < 1 kB)")


def test_n_not_one() -> None:
    """server: n = true / 2 / 1.0"""
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for n in (True, 2, 1.0, "1"):
            r = chat(c, body={"n": n})
            assert r.status_code == 400 and r.json()["error"]["param"] == "n", (n, r.status_code)
        assert chat(c, body={"n": 1}).status_code == 200
    print("400 invalid_value for every n but 1")


def test_lone_surrogate() -> None:
    """server: a lone surrogate next to good requests"""
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        r = c.post("/chat/completions", content=b'{"messages":[{"role":"user","content":"\\ud800 x"}]}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_text"
        assert chat(c).status_code == 200
    print("400 invalid_text; the next request 200")


def test_deep_json() -> None:
    """server: JSON nested 100,000 deep; NaN; a 2 MB body"""
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for body, code in ((b"[" * 100_000 + b"]" * 100_000, "json_too_deep"), (b'{"messages": NaN}', "invalid_json"),
                           (b"{" + b" " * (2 << 20) + b"}", "body_too_large")):
            r = c.post("/chat/completions", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["code"] == code, (code, r.status_code)
    print("400 each")


def test_sampling_bounds() -> None:
    """server: max_tokens 1e23, seed 2^70"""
    import httpx

    with server() as srv, httpx.Client(base_url=srv.base_url, timeout=10) as c:
        for body in ({"max_tokens": 10**23}, {"seed": 2**70}, {"temperature": 3}):
            assert chat(c, body=body).status_code == 400, body
    print("400 each")


def test_slowloris() -> None:
    """server: slowloris: a partial head trickled a byte at a time is closed"""
    with server(header_timeout_s=1.0) as srv:
        s = socket.create_connection((srv.host, srv.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        t = time.perf_counter()
        closed = False
        while time.perf_counter() - t < 4 and not closed:
            time.sleep(0.2)
            try:
                s.sendall(b"a")
            except OSError:
                closed = True
            closed = closed or peer_closed(s)
        s.close()
    assert closed, "still open after 4 s"
    print(f"closed after {time.perf_counter() - t:.1f}s (header timeout 1 s)")


def test_bind_error_one_line() -> None:
    """serve: a taken port -> one line, exit 2 (--workers 1 and --workers 2)"""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        for workers in ("1", "2"):
            err = one_line(*cli("serve", "--head", str(world_files()), "--profile", "demo", "--port", str(port),
                                 "--workers", workers), f"127.0.0.1:{port}", "in use")
    finally:
        busy.close()
    print(err[:120])


def test_workers_die_with_parent(tmp_path) -> None:
    """serve --workers: a worker dies with its parent (SIGKILL of the parent: no orphan on the port)"""
    import signal

    # what a worker of `serve --workers N` does first (cli/main.py serve_worker_app), in a process started as
    # uvicorn's supervisor starts its workers (multiprocessing, spawn)
    script = ("import multiprocessing, time\n"
              "from pipeline.serve.server import die_with_parent\n"
              "def worker():\n"
              "    die_with_parent(multiprocessing.parent_process().pid)\n"
              "    time.sleep(60)\n"
              "if __name__ == '__main__':\n"
              "    p = multiprocessing.get_context('spawn').Process(target=worker)\n"
              "    p.start()\n"
              "    print(p.pid, flush=True)\n"
              "    time.sleep(60)\n")
    (tmp_path / "supervisor.py").write_text(script)  # a file: spawn imports `worker` from the parent's main module
    parent = subprocess.Popen([sys.executable, str(tmp_path / "supervisor.py")], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        child = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        t = time.perf_counter()
        while time.perf_counter() - t < 5 and _alive(child):
            time.sleep(0.05)
        alive = _alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, f"worker {child} outlived its parent by 5 s"
    print(f"the worker got SIGTERM and exited {time.perf_counter() - t:.2f}s after the parent's SIGKILL")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read().lower()
    except OSError:
        return False


def test_standin_bounds() -> None:
    """stand-in: max_tokens Infinity / 1e30, JSON 100,000 deep, a 200 MB body -> 4xx, no traceback"""
    import httpx

    from pipeline.collect.standin import OpenRouterStandIn, StandInServer

    bodies = [b'{"model": "m", "max_tokens": Infinity, "messages": [{"role": "user", "content": "hi"}]}',
              b'{"model": "m", "max_tokens": 1e30, "messages": [{"role": "user", "content": "hi"}]}',
              b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"]
    with StandInServer(OpenRouterStandIn(["m"])) as srv, httpx.Client(timeout=10) as c:
        codes = [c.post(srv.base_url + "/chat/completions", content=b,
                        headers={"content-type": "application/json"}).status_code for b in bodies]
        assert codes == [400, 400, 400], codes
        host, port = srv.host_port.split(":")
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 209715200\r\n\r\n" + b" " * 65536)
        reply = read_all(s)
        s.close()
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        ok = c.post(srv.base_url + "/chat/completions",
                    json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200, ok.text[:200]
    print("400 x3, 413 for the 200 MB body (refused from its Content-Length); then 200")


def _push_body(host: str, port: int, head: bytes, limit_s: float) -> tuple[float | None, int, bytes]:
    """Send `head`, then chunks of a body that never ends, reading nothing, for at most `limit_s`: (seconds until
    the server closed the connection or None, bytes pushed, the reply read afterwards)."""
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(head)
    chunk = b"%x\r\n" % 65536 + b" " * 65536 + b"\r\n"
    pushed, closed, t0 = 0, None, time.perf_counter()
    s.settimeout(0.2)
    while closed is None and time.perf_counter() - t0 < limit_s:
        try:
            s.sendall(chunk)
            pushed += len(chunk)
        except TimeoutError:
            continue  # the server stopped reading but kept the socket: not closed yet
        except OSError:
            closed = time.perf_counter() - t0
    reply = read_all(s, 2.0)
    s.close()
    return closed, pushed, reply


def test_body_refused_closes() -> None:
    """server: a chunked body (and a declared 1 GB one) pushed on after its 400 body_too_large -> Connection: close, the
    socket closed within 2 s"""
    import httpx

    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with server(body_timeout_s=30) as srv:
        out = []
        for framing in (b"Transfer-Encoding: chunked\r\n\r\n", b"Content-Length: 1000000000\r\n\r\n"):
            closed, pushed, reply = _push_body(srv.host, srv.port, head + framing, 6.0)
            assert reply.startswith(b"HTTP/1.1 400") and b"body_too_large" in reply, reply[:200]
            assert b"connection: close" in reply.lower(), reply[:300]
            assert closed is not None and closed < 2.0, f"still open after {pushed / 1e6:.0f} MB in 6 s"
            out.append(f"{framing.split(b':')[0].decode()}: closed after {closed:.2f} s, {pushed / 1e6:.1f} MB")
        with httpx.Client(base_url=srv.base_url, timeout=10) as c:
            assert chat(c).status_code == 200
    print("; ".join(out))


@pytest.mark.parametrize(("stream", "fault"), [(False, "timeout"), (True, "timeout"), (True, "sse_drip")],
                         ids=["whole reply", "stream", "mid-stream"])
def test_disconnect_cancels_the_prompt_routed_call(stream: bool, fault: str) -> None:
    """serve: a client of a prompt-routed router that hangs up while its agent has not answered (or, mid-stream,
    while its agent streams an event every 0.2 s) cancels the agent's call within a second (before: the call was
    kept to the agent's deadline)"""
    import json

    import numpy as np
    from attack_kit import RowBackbone, fault_client_for, fault_server

    from pipeline.collect.agents import AgentSpec
    from pipeline.route import registry
    from pipeline.serve.app import build_app
    from pipeline.serve.server import serve_in_thread
    from pipeline.serve.settings import ServeSettings

    hang_s = 6.0
    with fault_server(hang_s=hang_s, drip_s=0.2) as fs:
        fs.always(fault)  # the agent answers after hang_s (or streams for 12 s), unless its caller hangs up first
        specs = [AgentSpec("expensive", "big-model", "test", None, 10.0, 30.0),
                 AgentSpec("cheap", "small-model", "test", None, 0.1, 0.3)]
        X = np.load(world_files().parent.parent / "X.npy")
        app = build_app(registry.load(world_files()), RowBackbone(X), specs, fault_client_for(fs),
                        ServeSettings(upstream_timeout_s=20.0))
        with serve_in_thread(app) as srv:
            body = json.dumps({"messages": [{"role": "user", "content": "row 3"}], "stream": stream}).encode()
            s = socket.create_connection((srv.host, srv.port), timeout=5)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            deadline = time.monotonic() + 10
            while fs.total_hits < 1 and time.monotonic() < deadline:  # the agent's call is in flight
                time.sleep(0.02)
            if fault == "sse_drip":  # the stream is relayed: its head and a first event reached the client
                got = b""
                while b"data: {" not in got and time.monotonic() < deadline:
                    got += s.recv(65536)
                assert got.startswith(b"HTTP/1.1 200") and b"text/event-stream" in got, got[:300]
            time.sleep(0.3)
            s.close()
            hung_up_at = time.monotonic()
            while not fs.hung_up and time.monotonic() - hung_up_at < hang_s - 1:
                time.sleep(0.02)
            cancelled_after = time.monotonic() - hung_up_at if fs.hung_up else None
    assert fs.total_hits == 1
    assert cancelled_after is not None and cancelled_after < 1.0, \
        f"the agent's call was not cancelled within {hang_s - 1:.0f} s of the client hanging up"
    print(f"stream={stream}, agent {fault}: the agent's call ended {cancelled_after * 1000:.0f} ms after the client "
          f"hung up (its caller waited {fs.hung_up[0]:.2f} s; the agent would end at {hang_s:.0f}-12 s)")
