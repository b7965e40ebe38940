"""A uvicorn server for an ASGI app in a daemon thread, bound before start (port 0 picks a free one), and an h11
protocol for uvicorn that closes slow or surplus connections.

uvicorn (0.5x) has a keep-alive timeout only: a client that connects and sends its request head (or body) a byte at
a time, or never, holds its connection open forever (each byte received cancels the keep-alive timer). Many such
clients exhaust file descriptors (slowloris). `guarded_h11(...)` closes a connection whose request head has not
arrived within `header_timeout_s` of the connection (or of the previous response), whose body has not arrived
within `body_timeout_s` of its head, and any connection beyond `max_connections` open at once (closed on accept).
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any


def guarded_h11(header_timeout_s: float, body_timeout_s: float, max_connections: int):
    """A uvicorn HTTP protocol class (pass as `uvicorn.Config(http=...)`) enforcing read timeouts and a cap."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _read_timer = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:  # over the cap: refuse before reading anything
                self.connections.discard(self)
                transport.close()
                return
            self._arm(header_timeout_s)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._follow_state()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow_state()  # the next request's head must arrive in time too

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _follow_state(self) -> None:
            if self.transport.is_closing():
                return self._disarm()
            state = self.conn.their_state
            if state is h11.IDLE:  # waiting for a request head
                if self._read_timer is None:
                    self._arm(header_timeout_s)
            elif state is h11.SEND_BODY:  # head read: the body has its own deadline, from now
                if getattr(self, "_reading", None) is not h11.SEND_BODY:
                    self._disarm()
                    self._arm(body_timeout_s, h11.SEND_BODY)
            else:  # request read (or connection ending): no read deadline
                self._disarm()

        def _arm(self, seconds: float, reading=None) -> None:
            self._reading = reading if reading is not None else h11.IDLE
            self._read_timer = self.loop.call_later(seconds, self._read_timed_out)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
            self._read_timer, self._reading = None, None

        def _read_timed_out(self) -> None:
            self._read_timer = None
            if not self.transport.is_closing() and self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
                self.transport.close()

    return GuardedH11Protocol


class LoopbackServer:
    """`.url` (http://host:port) and `.base_url` (… /v1); `.stop()` or `with` shuts it down."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, lifespan: str = "off", name: str = "server",
                 start_timeout_s: float = 30.0, **uvicorn_options: Any):
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan=lifespan,
                                                    **uvicorn_options))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=f"{name}-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} on {self.host}:{self.port} did not start")
            time.sleep(0.01)
        self.url = f"http://{self.host}:{self.port}"
        self.base_url = self.url + "/v1"

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
