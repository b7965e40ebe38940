"""A local OpenAI-protocol test server with fault injection (127.0.0.1 only, free port).

A small asyncio HTTP/1.1 server (keep-alive, Content-Length bodies) that answers `POST .../chat/completions` and
`GET .../models`. Faults are queued per (model, prompt), per model, or for every request, and consumed one per hit;
`always(...)` makes a fault permanent. Every chat request is counted in `hits[(model, prompt_hash)]`.

Faults:
  rate_limit       429 + Retry-After: <retry_after> (seconds)      rate_limit_date  429 + Retry-After as HTTP date
  server_error     500 JSON error                                   timeout          wait `hang_s`, then answer
                   (a caller that hangs up meanwhile ends it: the seconds it waited are kept in `hung_up`)
  reset            TCP reset (SO_LINGER 0, no response)             empty            content ""
  null_content     content null                                     length           finish_reason "length", cut text
  malformed        200 with a truncated JSON body                   no_usage         no `usage` object
  cost             usage.cost = 0.0123 (OpenRouter style)           not_found        404 JSON error
  auth_echo        401 whose message echoes the Authorization header (a provider leaking the key back)
  drip             the headers at once, then the body one byte every `drip_s` (per-read timeouts never fire)
  cost_inf         usage.cost Infinity (the JSON literal)       cost_inf_str     usage.cost "inf"
  cost_huge        usage.cost 1e308 (finite, absurd: two sum to inf)
  sse_drip         an SSE chat.completion.chunk stream, one event every `drip_s` (60 of them); a caller that hangs up
                   is seen at the next write (`hung_up`)

In-process:  `with FaultServer(latency_s=0.05) as srv: srv.script("rate_limit", times=2); ... srv.base_url`
As a process: `python tests/fault_server.py --latency-ms 100` prints `listening <base_url>` and serves until killed.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import email.utils
import hashlib
import json
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

FAULTS = ("rate_limit", "rate_limit_date", "server_error", "timeout", "reset", "empty", "null_content", "length",
          "malformed", "no_usage", "cost", "not_found", "auth_echo", "drip", "cost_inf", "cost_inf_str",
          "cost_huge", "sse_drip")
DEFAULT_ANSWER = "Let me think. The answer is (A)."


def phash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


class FaultServer:
    def __init__(self, latency_s: float = 0.0, answer: str | Callable[[str, str], str] = DEFAULT_ANSWER,
                 retry_after: str = "0.1", hang_s: float = 3.0, host: str = "127.0.0.1", port: int = 0,
                 drip_s: float = 1.0):
        self.latency_s = latency_s
        self.answer = answer
        self.retry_after = retry_after
        self.hang_s = hang_s
        self.drip_s = drip_s
        self.host, self.port = host, port
        self.hits: collections.Counter = collections.Counter()
        self.faults_served: collections.Counter = collections.Counter()
        self.auth_seen: set[str] = set()
        self.hung_up: list[float] = []  # `timeout` calls whose caller closed the connection: seconds it waited
        self._queues: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
        self._always: dict[tuple, str] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set = set()

    # ----------------------------------------------------------------------------------------------- control
    def script(self, fault: str, times: int = 1, model: str | None = None, prompt: str | None = None) -> None:
        """Serve `fault` on the next `times` matching hits (most specific queue first)."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        with self._lock:
            self._queues[(model, phash(prompt) if prompt is not None else None)].extend([fault] * times)

    def always(self, fault: str | None, model: str | None = None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        with self._lock:
            if fault is None:
                self._always.pop((model,), None)
            else:
                self._always[(model,)] = fault

    def hit_counts(self) -> dict:
        with self._lock:
            return dict(self.hits)

    @property
    def total_hits(self) -> int:
        with self._lock:
            return sum(self.hits.values())

    def _next_fault(self, model: str, h: str) -> str | None:
        with self._lock:
            self.hits[(model, h)] += 1
            for key in ((model, h), (model, None), (None, None)):
                q = self._queues.get(key)
                if q:
                    f = q.popleft()
                    self.faults_served[f] += 1
                    return f
            f = self._always.get((model,)) or self._always.get((None,))
            if f:
                self.faults_served[f] += 1
            return f

    # ------------------------------------------------------------------------------------------------ server
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                keep = await self._respond(method, path, headers, body, writer, reader)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # client went away, or the server is shutting down
        finally:
            self._conns.discard(writer)
            if not writer.is_closing():
                writer.close()

    @staticmethod
    def _send(writer, status: int, body: bytes, extra: dict | None = None, ctype: str = "application/json"):
        reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests",
                  500: "Internal Server Error"}.get(status, "Status")
        hdrs = {"content-type": ctype, "content-length": str(len(body)), "connection": "keep-alive", **(extra or {})}
        head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        writer.write(head.encode("latin-1") + body)

    @staticmethod
    def _err(message: str, type_: str, code) -> bytes:
        return json.dumps({"error": {"message": message, "type": type_, "code": code}}).encode()

    async def _respond(self, method: str, path: str, headers: dict, body: bytes, writer, reader=None) -> bool:
        if method == "GET" and path.rstrip("/").endswith("/models"):
            self._send(writer, 200, json.dumps({"object": "list", "data": []}).encode())
            await writer.drain()
            return True
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            self._send(writer, 404, self._err(f"no route {method} {path}", "invalid_request_error", "unknown_url"))
            await writer.drain()
            return True
        req = json.loads(body or b"{}")
        model = req.get("model", "")
        prompt = next((m.get("content") for m in reversed(req.get("messages", [])) if m.get("role") == "user"), "")
        h = phash(prompt or "")
        if "authorization" in headers:
            self.auth_seen.add(headers["authorization"])
        fault = self._next_fault(model, h)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if fault == "reset":
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if fault == "timeout":
            t = time.monotonic()
            try:  # the caller sends nothing more on this connection: a read ends only when it hangs up
                gone = await asyncio.wait_for(reader.read(1), self.hang_s) == b""
            except (TimeoutError, ConnectionError):
                gone = False
            if gone:
                with self._lock:
                    self.hung_up.append(time.monotonic() - t)
                return False
        if fault in ("rate_limit", "rate_limit_date"):
            ra = (self.retry_after if fault == "rate_limit"
                  else email.utils.formatdate(time.time() + 1, usegmt=True))
            self._send(writer, 429, self._err("Rate limit exceeded, slow down", "rate_limit_error", 429),
                       {"retry-after": ra})
        elif fault == "server_error":
            self._send(writer, 500, self._err("Internal server error", "server_error", 500))
        elif fault == "not_found":
            self._send(writer, 404, self._err(f"model {model} not found", "invalid_request_error", "model_not_found"))
        elif fault == "auth_echo":
            self._send(writer, 401, self._err(f"Incorrect API key provided: {headers.get('authorization', '')}",
                                              "invalid_request_error", "invalid_api_key"))
        elif fault == "malformed":
            self._send(writer, 200, b'{"id": "chatcmpl-x", "object": "chat.completion", "choices": [{"ind')
        else:
            text = self.answer(model, prompt) if callable(self.answer) else self.answer
            finish = "stop"
            if fault == "empty":
                text = ""
            elif fault == "null_content":
                text = None
            elif fault == "length":
                text, finish = (text or "")[: max(1, len(text or "") // 2)], "length"
            pt = max(1, len(prompt or "") // 4)
            ct = len(text or "") // 4
            resp = {"id": f"chatcmpl-{h}", "object": "chat.completion", "created": int(time.time()), "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": finish, "logprobs": None}]}
            if fault != "no_usage":
                resp["usage"] = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
                if fault == "cost":
                    resp["usage"]["cost"] = 0.0123
                elif fault in ("cost_inf", "cost_inf_str", "cost_huge"):
                    resp["usage"]["cost"] = {"cost_inf": float("inf"), "cost_inf_str": "inf", "cost_huge": 1e308}[fault]
            if fault == "drip":
                return await self._drip(writer, json.dumps(resp).encode())
            if fault == "sse_drip":
                return await self._sse_drip(writer, resp)
            self._send(writer, 200, json.dumps(resp).encode())
        try:
            await writer.drain()
        except ConnectionError:
            return False
        return True

    async def _drip(self, writer, body: bytes) -> bool:
        writer.write(f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
                     "connection: close\r\n\r\n".encode())
        for i in range(len(body)):
            writer.write(body[i:i + 1])
            await writer.drain()
            await asyncio.sleep(self.drip_s)
        return False

    async def _sse_drip(self, writer, resp: dict) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        base = {k: resp[k] for k in ("id", "created", "model")}
        t = time.monotonic()
        try:
            for i in range(60):
                chunk = {**base, "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": {"content": f"{i} "}, "finish_reason": None}]}
                writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                await writer.drain()
                await asyncio.sleep(self.drip_s)
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
        except ConnectionError:
            with self._lock:
                self.hung_up.append(time.monotonic() - t)
        return False

    # ------------------------------------------------------------------------------------------------ lifecycle
    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    def start(self) -> FaultServer:
        ready = threading.Event()
        error: list = []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self._start())
            except BaseException as exc:  # noqa: BLE001
                error.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fault-server", daemon=True)
        self._thread.start()
        if not ready.wait(10) or error:
            raise RuntimeError(f"fault server did not start: {error}")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or not loop.is_running():
            return

        async def shutdown() -> None:
            self._server.close()
            for w in list(self._conns):
                w.transport.abort()
            for t in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                t.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(5)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OpenAI-protocol fault-injection test server (127.0.0.1)")
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--fault", choices=FAULTS, help="serve this fault on every request")
    args = ap.parse_args(argv)
    srv = FaultServer(latency_s=args.latency_ms / 1000.0, port=args.port)
    if args.fault:
        srv.always(args.fault)

    async def amain() -> None:
        await srv._start()
        print(f"listening {srv.base_url}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(amain())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
