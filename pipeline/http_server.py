"""A uvicorn server for an ASGI app in a daemon thread, bound before start (port 0 picks a free one)."""
from __future__ import annotations

import socket
import threading
import time
from typing import Any


class LoopbackServer:
    """`.url` (http://host:port) and `.base_url` (… /v1); `.stop()` or `with` shuts it down."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, lifespan: str = "off", name: str = "server",
                 start_timeout_s: float = 30.0):
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan=lifespan))
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
