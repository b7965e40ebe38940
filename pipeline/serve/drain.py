"""Stopping without dropping a request (SIGTERM, Ctrl-C, `RouterServer.stop`): `DrainingServer`, the uvicorn server
of `router-lite serve` (one process, and each worker of `--workers N`) and of `serve_in_thread`.

A stop drains, in this order:

1. `/readyz` answers 503 (`"status": "draining"`) from the moment the signal arrives, and every response from then on
   says `Connection: close`, so keep-alive clients leave at a response boundary (no race) and reconnect elsewhere;
2. on SIGTERM, the server goes on serving and accepting for `delay_s` (`serve --drain-delay-s`, default 1 s): a load
   balancer that polls `/readyz` sees the 503 and stops sending before the port closes (Ctrl-C: no delay);
3. it accepts every connection already waiting in the listening socket's queue (made before the port closed: with
   `--workers N` the queue is shared, whichever worker takes them), then stops accepting;
4. each open connection is stopped by the protocol (pipeline/core/http_server.py `_GuardedH11.shutdown`): a request in
   flight is answered, and so is one whose bytes have begun to arrive (parsed or still in the kernel) or that a new
   connection has not had a moment to send; an idle keep-alive connection is closed;
5. once every connection is closed, the app shuts down (its lifespan: agents' clients, the embedding worker) and the
   process exits 0 (uvicorn itself would re-raise SIGTERM and die of it: exit 143), at once (`exit_drained`).

A second Ctrl-C forces the stop (uvicorn's `force_exit`): no more waiting.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import sys
import time

import uvicorn

DRAIN_STATE = "drain"  # the request's `scope["state"]` key (Starlette: `request.state.drain`) holding the `Drain`
ACCEPT_WAIT_S = 2.0  # at most this long for the listening queue to empty (connections keep arriving: stop anyway)


class Drain:
    """Whether the server is stopping (`draining`), since when (`since`, unix s)."""

    def __init__(self):
        self.since: float | None = None

    @property
    def draining(self) -> bool:
        return self.since is not None

    def start(self) -> None:
        if self.since is None:
            self.since = time.time()


def draining(request) -> bool:
    """True when the server answering `request` (a Starlette request) is stopping."""
    drain = getattr(request.state, DRAIN_STATE, None)
    return drain is not None and drain.draining


class _DrainAware:
    """The app as the server calls it: each HTTP request's scope state holds the server's `Drain`, and while it drains
    every response says `Connection: close` (uvicorn closes the connection after it)."""

    def __init__(self, app, drain: Drain):
        self.app, self.drain = app, drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})[DRAIN_STATE] = self.drain

        async def closing(message):
            if message["type"] == "http.response.start" and self.drain.draining:
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        return await self.app(scope, receive, closing)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, stopped by draining (module docstring); `delay_s`: how long it keeps serving after SIGTERM
    before it stops accepting."""

    def __init__(self, config: uvicorn.Config, delay_s: float = 1.0):
        super().__init__(config)
        self.drain, self.delay_s, self._delayed = Drain(), float(delay_s), False

    @property
    def stopped_by_sigterm(self) -> bool:
        return signal.SIGTERM in self._signals_seen

    _signals_seen: tuple = ()

    def handle_exit(self, sig: int, frame) -> None:
        self._signals_seen = (*self._signals_seen, sig)
        self.drain.start()  # /readyz 503 from now, before the main loop's next tick sees should_exit
        self._delayed = self._delayed or sig == signal.SIGTERM
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            try:
                yield
            finally:  # drained: a SIGTERM is not raised again after the stop (exit 0, not 143); Ctrl-C still is (130)
                self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]

    async def startup(self, sockets=None) -> None:
        self.config.loaded_app = _DrainAware(self.config.loaded_app, self.drain)
        await super().startup(sockets=sockets)

    async def shutdown(self, sockets=None) -> None:
        self.drain.start()
        if self._delayed:
            end = self.drain.since + self.delay_s
            while time.time() < end and not self.force_exit:
                await asyncio.sleep(min(0.05, max(0.0, end - time.time())))
        await self._accept_waiting()
        await super().shutdown(sockets=sockets)

    async def _accept_waiting(self) -> None:
        """Let the loop accept every connection waiting in the listening sockets' queue (bounded by ACCEPT_WAIT_S): a
        client whose connection completed is served, not reset when the socket closes."""
        poll = select.poll()
        for server in getattr(self, "servers", ()):
            for sock in server.sockets or ():
                poll.register(sock.fileno(), select.POLLIN)
        end = time.monotonic() + ACCEPT_WAIT_S
        while time.monotonic() < end and not self.force_exit:
            if not any(ev & select.POLLIN for _, ev in poll.poll(0)):  # a listening socket is readable: a queue
                return
            await asyncio.sleep(0.005)  # the loop's accept handler takes them


def exit_drained(code: int = 0) -> None:
    """End the process after a drain as Python's exit would (the atexit handlers: log handlers flushed and closed,
    helper processes stopped), less its final garbage collection of the loaded backbone and libraries, which took
    5 s of an idle one-process `serve` on 2 loaded cores (a worker of --workers N ends like this already:
    multiprocessing's own `os._exit`)."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
