"""Running the app: `serve_in_thread(app)` under uvicorn on a loopback port in a daemon thread (tests, benchmarks)
with the connection limits of the app's `ServeSettings` (`RouterServer`); `router-lite serve` (cli/main.py) runs it
in the foreground, after `return_big_buffers_to_the_os`, and `serve --workers N` in N processes under uvicorn's
supervisor (`Workers`, `WorkerConfig`), each worker stopped by the kernel with it (`die_with_parent`)."""
from __future__ import annotations

import errno
import os
import socket
import sys

import uvicorn
from uvicorn.supervisors import multiprocess
from uvicorn.supervisors.multiprocess import Multiprocess

from pipeline.core.errors import RouterLiteError
from pipeline.core.http_server import LoopbackServer
from pipeline.serve.drain import DrainingServer, exit_drained
from pipeline.serve.settings import ServeSettings

PR_SET_PDEATHSIG = 1
WORKER_TIMEOUT_S = 60


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


def die_with_parent(parent: int, sig: int = 15) -> None:
    """In a worker process of `serve --workers N`: have the kernel send it `sig` (SIGTERM) when its parent, the
    supervisor of pid `parent`, dies, so no orphan worker holds the port after the supervisor is killed (SIGKILL
    included: uvicorn's supervisor does not see to it). Linux (prctl PR_SET_PDEATHSIG); elsewhere nothing. A parent
    that died already: the worker stops at once."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl
        os.kill(os.getpid(), sig)


class WorkerConfig(uvicorn.Config):
    """uvicorn's Config of `serve --workers N`: the app factory `app`, with the connection limits of `settings`.
    It is pickled into each worker, where its guarded protocol class (made at run time, one per process: it holds
    the idle-connection table) is made again."""

    def __init__(self, app, settings: ServeSettings, **kw):
        self.settings = settings
        # a worker that answers no health ping for this long is replaced; SIGHUP's rolling restart waits as long
        # for each new worker to load (seconds on a loaded CPU)
        super().__init__(app, factory=True, timeout_worker_healthcheck=WORKER_TIMEOUT_S, **kw,
                         **settings.uvicorn_options())

    def __getstate__(self) -> dict:
        return {**vars(self), "http": None}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self.http = self.settings.uvicorn_options()["http"]


class DrainingProcess(multiprocess.Process):
    """A worker of `serve --workers N`: uvicorn's, serving with a `DrainingServer` (pipeline/serve/drain.py) so that the
    supervisor's SIGTERM drains it and it exits 0."""

    @property
    def server(self) -> DrainingServer:
        if self._server is None:
            self._server = DrainingServer(self.config, delay_s=self.config.settings.drain_delay_s)
        return self._server

    def target(self, sockets=None) -> None:
        try:
            super().target(sockets)
        except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: this worker drained on it too
            pass
        if self.server.drain.draining:  # drained (SIGTERM from the supervisor, or Ctrl-C): exit 0 now
            exit_drained(0)


class Workers(Multiprocess):
    """uvicorn's supervisor of `serve --workers N` on the bound socket `sock`: it starts the workers, replaces one
    that dies after it started, stops them all on SIGTERM / Ctrl-C (and when one fails to start), replaces them one
    by one on SIGHUP. Added here: the startup lines (the first worker's report on the pipe `reports`) printed once,
    when every worker is ready; a dead worker's metrics files retired."""

    def __init__(self, config: WorkerConfig, sock: socket.socket, reports, threads: int):
        super().__init__(config, [sock])
        self.reports, self.threads, self.report, self.told = reports, threads, None, False

    def serve(self) -> int:
        """Run until stopped: 0, or 2 when a worker failed to start: its one `router-lite: error:` line is printed,
        and 2 is what that line means everywhere else in the CLI (one process, `serve --workers 1`, says the same)."""
        from uvicorn.config import STARTUP_FAILURE

        uvicorns, multiprocess.Process = multiprocess.Process, DrainingProcess  # every worker it starts or restarts
        try:
            self.run()
        finally:
            multiprocess.Process = uvicorns
        return 2 if any(p.exitcode == STARTUP_FAILURE for p in self.processes) else 0

    stopped_by_signal = False  # SIGTERM or Ctrl-C: the workers drained

    def handle_term(self) -> None:
        self.stopped_by_signal = True
        super().handle_term()

    def handle_int(self) -> None:
        self.stopped_by_signal = True
        super().handle_int()

    def terminate_all(self) -> None:
        """SIGTERM to every worker (each drains: pipeline/serve/drain.py), then the supervisor's copy of the
        listening socket is closed: once the workers have taken what waits in its queue and closed theirs, a new
        connection is refused at once rather than left queued until the supervisor exits."""
        super().terminate_all()
        for sock in self.sockets:
            sock.close()

    def keep_subprocess_alive(self) -> None:
        before = list(self.processes)
        super().keep_subprocess_alive()
        for gone in set(before) - set(self.processes):
            print(f"router-lite serve: worker {gone.pid} exited with {gone.exitcode}; a new worker replaces it",
                  file=sys.stderr, flush=True)
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # its live gauges would count on (metrics.py)
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(gone.pid)
        while self.reports.poll():  # every worker reports (a restarted one too): the first is printed
            report = self.reports.recv()
            self.report = self.report or report
        if self.told or self.report is None or self.should_exit.is_set() or \
                not all(p.is_ready(timeout=1) for p in self.processes):
            return
        self.told = True
        print(f"{self.report.rstrip()}; {len(self.processes)} worker processes (pids "
              f"{', '.join(str(p.pid) for p in self.processes)}, {self.threads} backend thread(s) each)",
              file=sys.stderr, flush=True)


class RouterServer(LoopbackServer):
    """The router app on uvicorn in a daemon thread (lifespan on: clients closed at stop), with the connection
    limits of the app's `ServeSettings`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0):
        settings = getattr(getattr(app, "state", None), "settings", None) or ServeSettings()
        super().__init__(app, host, port, lifespan="on", name="router-server", start_timeout_s=start_timeout_s,
                         server_class=DrainingServer, **settings.uvicorn_options())


def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0) -> RouterServer:
    """Run `app` on (host, port) in a background thread; port 0 picks a free one."""
    return RouterServer(app, host, port)
