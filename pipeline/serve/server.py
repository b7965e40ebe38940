"""Running the app: `serve_in_thread(app)` under uvicorn on a loopback port in a daemon thread (tests, benchmarks)
with the connection limits of the app's `ServeSettings` (`RouterServer`); `router-lite serve` (cli/main.py) runs it
in the foreground, after `return_big_buffers_to_the_os`."""
from __future__ import annotations

from pipeline.core.http_server import LoopbackServer
from pipeline.serve.settings import ServeSettings


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
