"""Good requests' latency while clients push chunked bodies that never end, reading nothing (the attack suite's row
"body" asserts that such a connection is closed after its 400; this prints what the flood costs the others).

    python bench/body_flood.py [--clients 8] [--requests 40]

Each pusher opens ONE connection, sends a chunked request head and then 64 KiB chunks without end; the server answers
400 body_too_large at `max_body_bytes` (1 MiB) and, with `Connection: close`, closes the socket. Printed: p50 of
`--requests` good chat requests alone and with the pushers on, and how many bytes the pushers got in.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attack  # noqa: E402 - the suite's synthetic server and its chat helper

HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
CHUNK = b"%x\r\n" % 65536 + b" " * 65536 + b"\r\n"


def push(host: str, port: int, stop: threading.Event, pushed: list) -> None:
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(HEAD)
    s.settimeout(0.2)
    while not stop.is_set():
        try:
            s.sendall(CHUNK)
            pushed.append(len(CHUNK))
        except TimeoutError:
            continue
        except OSError:  # closed by the server
            break
    s.close()


def p50(c, n: int) -> float:
    took = []
    for _ in range(n):
        t = time.perf_counter()
        assert attack._chat(c).status_code == 200
        took.append(time.perf_counter() - t)
    return statistics.median(took)


def main(argv=None) -> int:
    import httpx

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=40)
    args = ap.parse_args(argv)
    with attack.server(body_timeout_s=30) as srv, httpx.Client(base_url=srv.base_url, timeout=60) as c:
        alone = p50(c, args.requests)
        stop, pushed = threading.Event(), []
        threads = [threading.Thread(target=push, args=(srv.host, srv.port, stop, pushed), daemon=True)
                   for _ in range(args.clients)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        time.sleep(1.0)
        flooded = p50(c, args.requests)
        stop.set()
        for th in threads:
            th.join(5)
        wall = time.perf_counter() - t0
    print(f"p50 of {args.requests} good requests: alone {alone:.4f} s | with {args.clients} pushers {flooded:.4f} s; "
          f"the pushers got {sum(pushed) / 1e6:,.1f} MB in over {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
