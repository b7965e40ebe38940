"""Running the app: `serve_in_thread(app)` under uvicorn on a loopback port in a daemon thread (tests, benchmarks)
with the connection limits of the app's `ServeSettings` (`RouterServer`); `router-lite serve` (cli/main.py) runs it
in the foreground, after `return_big_buffers_to_the_os`."""
from __future__ import annotations

import errno
import os
import socket
import sys

from pipeline.core.errors import RouterLiteError
from pipeline.core.http_server import LoopbackServer
from pipeline.serve.settings import ServeSettings

PR_SET_PDEATHSIG = 1


def return_big_buffers_to_the_os(threshold_bytes: int = 256 * 1024) -> bool:
    """Make glibc serve allocations over `threshold_bytes` with mmap, always (best effort; Linux glibc only).

    glibc raises its mmap threshold each time such a block is freed, after which 1 MB request bodies and their
    copies (parsed JSON, the forwarded payload) come from the heap and the process keeps the memory: 64 concurrent
    1 MB requests left RSS +240 MB. A fixed threshold unmaps each big buffer when it is freed. True when set."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, int(threshold_bytes)))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False


def bind_listener(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on (host, port); a bind failure (the port taken: EADDRINUSE, a host not of this
    machine, a privileged port) -> one RouterLiteError line naming the address, never a traceback."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except (OSError, OverflowError) as exc:
        sock.close()
        why = "the port is in use (another server, or workers of one that was killed?)" \
            if getattr(exc, "errno", None) == errno.EADDRINUSE else (getattr(exc, "strerror", None) or str(exc))
        raise RouterLiteError(f"cannot listen on {host}:{port}: {why}") from None
    return sock


def die_with_parent(sig: int = 15) -> None:
    """In a child process (Popen's preexec_fn): have the kernel send it `sig` (SIGTERM) when its parent dies, so
    `serve --workers N` leaves no orphan worker holding the port after the parent is killed (SIGKILL included).
    Linux (prctl PR_SET_PDEATHSIG); elsewhere nothing. A parent that died already: the child stops at once."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died between fork and prctl
        os.kill(os.getpid(), sig)


def spawn_worker(cmd: list[str], *fds: int):
    """A `serve --workers N` worker process running `cmd`, inheriting `fds` (the listening socket, the pipe it reports
    ready on), that the kernel stops (SIGTERM) when this process dies, however it dies (`die_with_parent`)."""
    import subprocess

    return subprocess.Popen(cmd, pass_fds=fds, preexec_fn=die_with_parent)


class WorkerReports:
    """The supervisor's side of what each worker of `serve --workers N` reports once it is ready to serve (its
    startup lines, on a pipe of its own that it then closes): `poll` hands back one worker's report once every worker
    has reported, so the startup line is printed once, and when the whole server is ready."""

    def __init__(self):
        self.pending: dict[int, list[bytes]] = {}  # read end -> what came so far, until the worker closes it
        self.reports: list[str] = []
        self.expected = 0
        self.told = False

    def started(self, spawn):
        """`spawn(write_fd)` -> the worker process, started with the write end of a new pipe (closed here after)."""
        r, w = os.pipe()
        try:
            proc = spawn(w)
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        self.pending[r], self.expected = [], self.expected + 1
        return proc

    def poll(self, timeout_s: float) -> str | None:
        """Read what the workers wrote within `timeout_s`; the first report once all are in (once), else None. A
        worker that exits before it reports closes its pipe with nothing on it: no report, and none is printed."""
        import select
        import time

        if not self.pending:
            time.sleep(timeout_s)
        else:
            for r in select.select(list(self.pending), [], [], timeout_s)[0]:
                chunk = os.read(r, 65536)
                if chunk:
                    self.pending[r].append(chunk)
                    continue
                text = b"".join(self.pending.pop(r)).decode("utf-8", "replace")
                os.close(r)
                if text:
                    self.reports.append(text)
        if self.told or len(self.reports) < self.expected:
            return None
        self.told = True
        return self.reports[0]

    def close(self) -> None:
        for r in self.pending:
            os.close(r)
        self.pending.clear()


class RouterServer(LoopbackServer):
    """The router app on uvicorn in a daemon thread (lifespan on: clients closed at stop), with the connection
    limits of the app's `ServeSettings`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0):
        settings = getattr(getattr(app, "state", None), "settings", None) or ServeSettings()
        super().__init__(app, host, port, lifespan="on", name="router-server", start_timeout_s=start_timeout_s,
                         **settings.uvicorn_options())


def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0) -> RouterServer:
    """Run `app` on (host, port) in a background thread; port 0 picks a free one."""
    return RouterServer(app, host, port)
