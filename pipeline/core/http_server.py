"""A uvicorn server for an ASGI app in a daemon thread, bound before start (port 0 picks a free one), and an h11
protocol for uvicorn that bounds what slow, idle or surplus connections can hold.

uvicorn (0.5x) has a keep-alive timeout only: a client that connects and sends its request head (or body) a byte at
a time, or never, holds its connection open forever (each byte received cancels the keep-alive timer). Many such
clients exhaust file descriptors (slowloris). `guarded_h11(...)`:

- closes a connection whose request head has not arrived within `header_timeout_s` of the connection (or of the
  previous response), or whose body has not arrived within `body_timeout_s` of its head;
- bounds the *idle* connections (waiting for a request head: new, half-open or keep-alive) per client address
  (`max_idle_per_client`) and in all (`max_connections - reserved`): beyond either bound the oldest idle connection
  of that client (of the client holding the most, for the global bound) is answered `429` with `Retry-After` and
  closed, so one address cannot hold the slots that requests with a complete head need (the `reserved` ones are only
  ever theirs). A connection whose request bytes have arrived but are not read yet (a burst: the loop accepts many
  connections before it reads any), or a new one that has had less than `FRESH_GRACE_S` to send them, is not
  evicted by the idle bounds: it is served (the bounds are enforced again when that grace is over); when all
  `max_connections` are open, the oldest idle one goes first, new or not (the newest stays: a real client's);
- when `max_connections` are open and none is idle, answers a new connection `503` with `Retry-After` (a response,
  not a reset) and closes it;
- answers a request head over `max_head_bytes` with `431` (h11 alone accepts any head that arrives in one read).
"""
from __future__ import annotations

import collections
import contextlib
import json
import re
import socket
import struct
import threading
import time
from typing import Any

import h11

_HEAD_END = re.compile(rb"\n\r?\n")
MAX_LINGERING = 1024  # refused connections kept half-closed (so the client reads the refusal) at once; more are cut
LINGER_S = 1.0
FRESH_GRACE_S = 1.0  # a new connection that has sent nothing yet is not evicted this long (at most a quarter of the
# header timeout): its request is on the way


def _refusal(status: int, reason: str, code: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": {"message": message, "type": "server_error" if status >= 500 else
                                 "invalid_request_error", "param": None, "code": code}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n{extra}\r\n").encode() + body


def _unread_bytes(transport) -> int:
    """Bytes the kernel holds for this connection that the loop has not read yet (0 when unknown)."""
    try:
        import fcntl
        import termios

        sock = transport.get_extra_info("socket")
        got = fcntl.ioctl(sock.fileno(), termios.FIONREAD, struct.pack("i", 0))
        return struct.unpack("i", got)[0]
    except (ImportError, OSError, AttributeError, ValueError):
        return 0


class _Limits:
    """One server's bounds and its table of idle connections (client host -> its idle protocols, oldest first)."""

    def __init__(self, header_timeout_s: float, body_timeout_s: float, max_connections: int,
                 max_idle_per_client: int | None, reserved: int, max_head_bytes: int, retry_after_s: int):
        self.header_timeout_s, self.body_timeout_s = header_timeout_s, body_timeout_s
        self.max_connections, self.max_head_bytes = max_connections, max_head_bytes
        self.idle_limit = max(1, max_connections - max(0, reserved))
        self.per_client = max(1, min(max_idle_per_client or self.idle_limit, self.idle_limit))
        self.grace_s = min(FRESH_GRACE_S, header_timeout_s / 4)
        self.idle: dict[Any, collections.OrderedDict] = {}
        self.n_idle = self.lingering = 0
        self.recheck = None  # the timer that enforces the bounds again once new connections' grace is over
        retry = f"retry-after: {retry_after_s}\r\n"
        self.busy_503 = _refusal(503, "Service Unavailable", "server_busy",
                                 f"all {max_connections} connections are serving requests; retry later", retry)
        self.idle_429 = _refusal(429, "Too Many Requests", "too_many_connections",
                                 f"over {self.per_client} connections without a request from one client address "
                                 f"(or {self.idle_limit} in all); retry later", retry)
        self.head_431 = _refusal(431, "Request Header Fields Too Large", "request_head_too_large",
                                 f"the request head is over the limit of {max_head_bytes} bytes")

    def mark_idle(self, proto) -> None:
        conns = self.idle.setdefault(proto._host(), collections.OrderedDict())
        if proto in conns:
            return
        conns[proto] = None
        self.n_idle += 1
        self.enforce(proto._host(), proto.loop, exclude=proto)

    def enforce(self, host, loop, exclude=None) -> None:
        """Evict `host`'s oldest evictable idle connections beyond the per-client bound (never `exclude`, the
        newest), then the oldest of the client holding the most beyond the total; when some were kept because
        they are new, look again once their grace is over."""
        conns = self.idle.get(host, {})
        excess = len(conns) - self.per_client
        for p in [p for p in conns if p is not exclude] if excess > 0 else ():
            if excess <= 0:
                break
            excess -= self.evict(p)
        while self.n_idle > self.idle_limit and self.evict_one(exclude=exclude):
            pass
        if self.recheck is None and (len(self.idle.get(host, ())) > self.per_client or self.n_idle > self.idle_limit):
            self.recheck = loop.call_later(self.grace_s, self._enforce_again, host, loop)

    def _enforce_again(self, host, loop) -> None:
        self.recheck = None
        self.enforce(host, loop)

    def unmark_idle(self, proto) -> None:
        conns = self.idle.get(proto._host())
        if conns is not None and proto in conns:
            del conns[proto]
            self.n_idle -= 1
            if not conns:
                del self.idle[proto._host()]

    def evict(self, proto, fresh_too: bool = False) -> bool:
        """Answer an idle connection 429 and close it; False (kept) when it is new (its request may be on the way;
        unless `fresh_too`) or its request bytes wait to be read."""
        if not fresh_too and not proto._heard and proto.loop.time() - proto._born < self.grace_s:
            return False
        if _unread_bytes(proto.transport) > 0:
            return False
        proto._refuse(self.idle_429)
        return True

    def evict_one(self, exclude, fresh_too: bool = False) -> bool:
        """Evict the oldest evictable idle connection of the client holding the most; False when none is."""
        for _, host in sorted(((len(c), h) for h, c in self.idle.items()), key=lambda t: -t[0]):
            if any(self.evict(p, fresh_too) for p in list(self.idle.get(host, ())) if p is not exclude):
                return True
        return False


class _GuardedH11:
    """The methods `guarded_h11` mixes into uvicorn's H11Protocol; `limits` (a `_Limits`) is set per server."""

    limits: _Limits
    _read_timer = None
    _linger_timer = None
    _refused = False
    _head_seen = 0
    _head_tail = b""
    _reading = None
    _heard = False  # a byte has been received on this connection
    _stopping = False  # the server stops: the next request is answered, then the connection closed
    _born = 0.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._born = self.loop.time()
        self._bound_parsed_heads()
        self.limits.mark_idle(self)  # answers the oldest idle connections beyond the per-client and idle bounds
        if len(self.connections) > self.limits.max_connections and not self.limits.evict_one(self) and \
                not self.limits.evict_one(self, fresh_too=True):  # every slot full: an old silent one goes first
            return self._refuse(self.limits.busy_503)  # every slot serves a request: say so, do not reset
        self._arm(self.limits.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # refused: drain what the client still sends until it reads the answer and goes
            return
        self._heard = True
        if self.conn.their_state is h11.IDLE and self._head_too_big(data):  # reading a request head: bound it
            return self._refuse(self.limits.head_431)
        super().data_received(data)
        if self._stopping and self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # the request that arrived while stopping: answered, then closed
        self._follow_state()

    def shutdown(self) -> None:
        """The server stops (uvicorn calls this on every open connection once it stopped accepting): a request in
        flight is answered, then the connection closed (uvicorn's own rule); so is a request whose bytes have begun
        to arrive (parsed by h11, or still unread in the kernel), and one a new connection has not had
        `FRESH_GRACE_S` to send (its client connected before the stop); an idle connection is closed. uvicorn
        closes a waiting connection at once, and the client of a request already sent gets a reset."""
        if self._refused or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return super().shutdown()  # keep_alive off: closed after its response
        self._stopping = True
        if self._request_begun():
            return  # served (data_received turns its keep-alive off), then closed
        fresh = self.limits.grace_s - (self.loop.time() - self._born)
        if not self._heard and fresh > 0:  # connected just before the stop: its request may be on the way
            self.loop.call_later(fresh, self._close_if_idle)
            return
        self._close_if_idle()

    def _request_begun(self) -> bool:
        return self.conn.their_state is not h11.IDLE or bool(self.conn.trailing_data[0]) or \
            _unread_bytes(self.transport) > 0

    def _close_if_idle(self) -> None:
        if not self.transport.is_closing() and not self._request_begun() and \
                (self.cycle is None or self.cycle.response_complete):
            self.limits.unmark_idle(self)
            self._disarm()
            with contextlib.suppress(h11.LocalProtocolError):
                self.conn.send(h11.ConnectionClosed())
            self.transport.close()

    def _head_too_big(self, data: bytes) -> bool:
        m = _HEAD_END.search(self._head_tail + data)
        size = self._head_seen + (len(data) if m is None else m.end() - len(self._head_tail))
        if size > self.limits.max_head_bytes:
            return True
        self._head_seen, self._head_tail = (size, (self._head_tail + data)[-2:]) if m is None else (0, b"")
        return False

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_state()  # the next request's head must arrive in time too

    def connection_lost(self, exc) -> None:
        self._disarm()
        self.limits.unmark_idle(self)
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
            self.limits.lingering -= 1
        super().connection_lost(exc)

    def _bound_parsed_heads(self) -> None:
        """The byte count in `data_received` sees heads read while the connection waits for one; a head that
        follows an unread body (pipelined) is measured once h11 has parsed it."""
        next_event, limit = self.conn.next_event, self.limits.max_head_bytes

        def bounded_next_event():
            event = next_event()
            if isinstance(event, h11.Request) and len(event.method) + len(event.target) + 12 + sum(
                    len(k) + len(v) + 4 for k, v in event.headers) > limit:
                self._refuse(self.limits.head_431)
                return h11.PAUSED  # uvicorn stops handling events on this connection
            return event

        self.conn.next_event = bounded_next_event

    def _host(self):
        return self.client[0] if self.client else None

    def _follow_state(self) -> None:
        if self.transport.is_closing():
            self.limits.unmark_idle(self)
            return self._disarm()
        state = self.conn.their_state
        if state is h11.IDLE:  # waiting for a request head
            self.limits.mark_idle(self)
            if self._read_timer is None and not self._refused:
                self._head_seen, self._head_tail = 0, b""
                self._arm(self.limits.header_timeout_s)
            return
        self.limits.unmark_idle(self)
        if state is h11.SEND_BODY:  # head read: the body has its own deadline, from now
            if self._reading is not h11.SEND_BODY:
                self._disarm()
                self._arm(self.limits.body_timeout_s, h11.SEND_BODY)
        else:  # request read (or connection ending): no read deadline
            self._disarm()

    def _refuse(self, response: bytes) -> None:
        """Answer `response` and close: half-close first and drain the client's bytes for a moment, so the
        answer is read rather than lost to a reset."""
        self._disarm()
        self.limits.unmark_idle(self)
        self.connections.discard(self)  # its slot is free now, not when the loop reports the close
        self._refused = True
        self.transport.write(response)
        if self.limits.lingering >= MAX_LINGERING or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.limits.lingering += 1
        self._linger_timer = self.loop.call_later(LINGER_S, self.transport.close)

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
            self.limits.unmark_idle(self)
            self.transport.close()


def guarded_h11(header_timeout_s: float, body_timeout_s: float, max_connections: int, *,
                max_idle_per_client: int | None = None, reserved: int = 0, max_head_bytes: int = 16 * 1024,
                retry_after_s: int = 1):
    """A uvicorn HTTP protocol class (pass as `uvicorn.Config(http=...)`) enforcing read timeouts and the
    connection bounds above (one class per server: the idle table lives in its `limits`)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    limits = _Limits(header_timeout_s, body_timeout_s, max_connections, max_idle_per_client, reserved,
                     max_head_bytes, retry_after_s)
    return type("GuardedH11Protocol", (_GuardedH11, H11Protocol), {"limits": limits})


class LoopbackServer:
    """`.url` (http://host:port) and `.base_url` (… /v1); `.stop()` or `with` shuts it down."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, lifespan: str = "off", name: str = "server",
                 start_timeout_s: float = 30.0, server_class=None, **uvicorn_options: Any):
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan=lifespan, **uvicorn_options)
        self._server = (server_class or uvicorn.Server)(config)
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
