"""Running the app: `serve_in_thread(app)` under uvicorn on a loopback port in a daemon thread (tests, benchmarks)
with the connection limits of the app's `ServeSettings` (`RouterServer`); `router-lite serve` (cli/main.py) runs it
in the foreground, after `return_big_buffers_to_the_os`, and `serve --workers N` in N processes under uvicorn's
supervisor (`Workers`, `WorkerConfig`), each worker stopped by the kernel with it (`die_with_parent`). SIGHUP
re-reads the client keys in every process (`KeysOnHangup`; the supervisor's `Workers.handle_hup`)."""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys
import threading
import time

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


class KeysOnHangup:
    """SIGHUP re-reads the client keys of this serving process (`Keyring.reload`, pipeline/serve/keys.py) in a
    thread of its own, and prints one line: what changed, or why the file was not taken (the keys in force stay).
    `install()` first thing (a SIGHUP's default would end the process), `attach(keyring)` once the keys are read (a
    SIGHUP before is answered then). `announce=False` (a worker of `serve --workers N`, whose supervisor says it
    once): only a file that this process could not take is printed."""

    def __init__(self, announce: bool = True):
        self.announce, self.keyring, self.asked, self.attached = announce, None, False, False
        self.lock = threading.Lock()

    def install(self) -> KeysOnHangup:
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=self.reload, name="keys-reload",
                                                                 daemon=True).start())
        return self

    def attach(self, keyring) -> None:
        with self.lock:
            self.keyring, self.attached = keyring, True
            asked = self.asked
        if asked:
            self.reload()

    def reload(self) -> None:
        with self.lock:
            if not self.attached:
                self.asked = True
                return
            if self.keyring is None:
                ok, line = True, "router-lite serve: SIGHUP: no client keys to re-read (serve without --api-keys)"
            else:
                ok, line = self.keyring.reload()
        if self.announce or not ok:
            print(line, file=sys.stderr, flush=True)


class WorkerConfig(uvicorn.Config):
    """uvicorn's Config of `serve --workers N`: the app factory `app`, with the connection limits of `settings`.
    It is pickled into each worker, where its guarded protocol class (made at run time, one per process: it holds
    the idle-connection table) is made again."""

    def __init__(self, app, settings: ServeSettings, **kw):
        self.settings = settings
        # a worker that answers no health ping for this long is replaced (loading takes seconds on a loaded CPU)
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
    that dies after it started, stops them all on SIGTERM / Ctrl-C (and when one fails to start while the server
    starts), adds or removes one on SIGTTIN / SIGTTOU. Changed here:

    - SIGHUP re-reads the client keys (`keyring`, the keys in force: a new worker starts with them, never reads
      the file itself) and, when the file is valid, has every worker re-read it too (one line, printed here);
    - once every worker was ready, a worker that fails to start (a keys file, a profile or a registry that became
      invalid since) stops nothing: one line, the others serve on, and it is tried again 1, 2, 4 ... 60 s later;
    - the startup lines (the first worker's report on the pipe `reports`) are printed once, when every worker is
      ready; a dead worker's metrics files are retired."""

    RETRY_MAX_S = 60.0

    def __init__(self, config: WorkerConfig, sock: socket.socket, reports, threads: int, keyring=None):
        super().__init__(config, [sock])
        self.reports, self.threads, self.report, self.told = reports, threads, None, False
        self.keyring, self.failed_start = keyring, False
        self.retry_at: dict[int, float] = {}  # worker slot -> when its failed start is tried again
        self.failures: dict[int, int] = {}  # worker slot -> failed starts in a row

    def serve(self) -> int:
        """Run until stopped: 0, or 2 when a worker failed to start while the server started: its one
        `router-lite: error:` line is printed, and 2 is what that line means everywhere else in the CLI (one
        process, `serve --workers 1`, says the same). Every worker it starts or restarts drains on SIGTERM."""
        uvicorns, multiprocess.Process = multiprocess.Process, DrainingProcess
        try:
            self.run()
        finally:
            multiprocess.Process = uvicorns
        return 2 if self.failed_start else 0

    def handle_hup(self) -> None:
        if self.keyring is None:
            print("router-lite serve: SIGHUP: no client keys to re-read (serve without --api-keys)", file=sys.stderr,
                  flush=True)
            return
        ok, line = self.keyring.reload()
        print(line, file=sys.stderr, flush=True)
        if not ok:  # the workers keep the keys in force too
            return
        for p in self.processes:  # one still loading may die of it: it is replaced, with the keys now in force
            if p.process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGHUP)

    def handle_ttou(self) -> None:
        super().handle_ttou()
        for slots in (self.retry_at, self.failures):  # a slot removed: its retry goes with it
            for idx in [i for i in slots if i >= len(self.processes)]:
                del slots[idx]

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
        from uvicorn.config import STARTUP_FAILURE

        if self.should_exit.is_set():
            return
        for idx, process in enumerate(self.processes):
            if idx in self.retry_at:
                if time.monotonic() >= self.retry_at[idx]:
                    del self.retry_at[idx]
                    self._start(idx)
                continue
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung: killed
            process.join()
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # its live gauges would count on (metrics.py)
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(process.pid)
            if process.exitcode == STARTUP_FAILURE and not self.told:
                # while the server starts: the set-up is broken and every worker would fail the same way
                print(f"router-lite serve: worker {process.pid} failed to start; stopping", file=sys.stderr,
                      flush=True)
                self.failed_start = True
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            if process.exitcode == STARTUP_FAILURE:
                n = self.failures[idx] = self.failures.get(idx, 0) + 1
                wait = min(self.RETRY_MAX_S, 2.0 ** (n - 1))
                serving = sum(p.process.is_alive() for j, p in enumerate(self.processes) if j != idx)
                print(f"router-lite serve: a new worker ({process.pid}) failed to start; the other {serving} "
                      f"worker(s) serve on with the keys in force; trying again in {wait:g} s", file=sys.stderr,
                      flush=True)
                self.retry_at[idx] = time.monotonic() + wait
                continue
            self.failures.pop(idx, None)
            print(f"router-lite serve: worker {process.pid} exited with {process.exitcode}; a new worker replaces "
                  "it", file=sys.stderr, flush=True)
            self._start(idx)
        self._tell_ready()

    def _start(self, idx: int) -> None:
        from uvicorn.supervisors.multiprocess import Process

        process = Process(self.config, self.sockets)
        process.start()
        self.processes[idx] = process

    def _tell_ready(self) -> None:
        for idx in [i for i in self.failures if i not in self.retry_at]:  # a worker that failed before, ready now
            process = self.processes[idx]
            if process.is_ready(timeout=1):
                print(f"router-lite serve: worker {process.pid} started, after {self.failures.pop(idx)} failed "
                      "start(s)", file=sys.stderr, flush=True)
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
