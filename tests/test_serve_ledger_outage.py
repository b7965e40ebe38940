"""A spend-ledger outage loses nothing (resources/ledger.py, pipeline/serve/auth.py): the ledger made unreachable
while requests are in flight (the SQLite file moved away, or PostgreSQL cut off behind a proxy), then back: every
200's `usage.cost` ends in the ledger exactly once, every keyed request meanwhile is refused (a key without limits
too), and the key is admitted again as soon as the ledger answers. Fake agents on loopback hold their replies until
the test lets them go, so the outage falls between admission and settlement on any machine load."""
from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import threading
import time

import httpx
import openai
import pytest
import test_serve_keys as keyed
from test_serve_keys import COST, IN_CI, KEY_A, KEY_B, PG_URL, PRICE_IN, PRICE_OUT, HashBackbone, keys_file

from pipeline.collect.agents import AgentSpec
from pipeline.core.http_server import LoopbackServer
from pipeline.serve import spend
from pipeline.serve.app import build_app
from pipeline.serve.auth import guard_clients
from pipeline.serve.keys import ClientKey, load_keys
from pipeline.serve.server import serve_in_thread
from pipeline.serve.settings import ServeSettings
from resources.ledger import LedgerOutage, SpendLedger

world, pg_ledger_url = keyed.world, keyed.pg_ledger_url  # test_serve_keys.py's fixtures


def gated_agents_app(gate: threading.Event):
    """Agents that answer only once `gate` is set, billing COST[model]."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat(request):
        body = await request.json()
        while not gate.is_set():
            await asyncio.sleep(0.01)
        model = body["model"]
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": model,
                             "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25,
                                       "cost": COST[model]},
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": "The answer is 42."}}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


class Outage:
    """`router-lite serve`'s app in process with keys (team-a: a budget, team-b: none) on `ledger_url`, its agents
    gated; `burst(n)` sends n requests per key and returns once all are admitted (their reservations are in the
    ledger), `replies()` lets the agents answer and collects them."""

    def __init__(self, world, tmp_path, ledger_url, count_reservations):
        reg, _, _, _ = world
        self.gate, self.count = threading.Event(), count_reservations
        self.agents = LoopbackServer(gated_agents_app(self.gate), name="gated-agents").__enter__()
        names = ["a0", "a1", "a2"]
        specs = [AgentSpec(n, f"m{i}", "openai_compatible", self.agents.base_url, PRICE_IN, PRICE_OUT)
                 for i, n in enumerate(names)]

        def client_for(agent):
            return openai.AsyncOpenAI(api_key="upstream", base_url=self.agents.base_url, max_retries=0, timeout=60)

        self.ledger = SpendLedger(ledger_url, pending=tmp_path / "pending")
        app = guard_clients(build_app(reg, HashBackbone(), specs, client_for, ServeSettings()),
                            load_keys(keys_file(tmp_path, budget_usd=5.0, budget_window="1d")), self.ledger)
        self.srv = serve_in_thread(app).__enter__()
        self.threads, self.out = [], []

    def ask(self, key, prompt="What is 6 x 7?"):
        return httpx.post(self.srv.base_url + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 100}, timeout=60)

    def burst(self, n: int) -> None:
        self.gate.clear()
        before = self.count()
        for i in range(n):
            for key in (KEY_A, KEY_B):
                t = threading.Thread(target=lambda k=key, i=i: self.out.append((k, self.ask(k, f"question {i}"))))
                t.start()
                self.threads.append(t)
        deadline = time.monotonic() + 60
        while self.count() < before + 2 * n:  # admitted: reserved in the ledger, waiting for their agents
            assert time.monotonic() < deadline, "the burst was not admitted"
            time.sleep(0.02)

    def replies(self) -> list:
        self.gate.set()
        for t in self.threads:
            t.join(60)
        out, self.out, self.threads = self.out, [], []
        return out

    def settled(self, timeout_s: float = 30.0) -> None:
        """Wait until the ledger's thread has nothing left to write."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.count() == 0:
                return
            time.sleep(0.02)
        raise AssertionError(f"{self.count()} reservations left in the ledger")

    def close(self) -> None:
        self.gate.set()
        self.srv.stop()
        self.agents.__exit__(None, None, None)


def _paid(replies) -> dict:
    out = {}
    for key, r in replies:
        assert r.status_code == 200, r.text
        name = "team-a" if key == KEY_A else "team-b"
        out[name] = out.get(name, 0.0) + r.json()["usage"]["cost"]
    return out


def _refused_while_down(outage) -> None:
    for key in (KEY_A, KEY_B):  # team-b has no budget nor rate: refused all the same, never served unmetered
        r = outage.ask(key)
        assert r.status_code == 503 and r.json()["error"]["code"] == "ledger_unavailable", r.text
        assert r.headers["retry-after"]


def _journal(outage) -> list[dict]:
    f = outage.ledger.journal.file
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def test_a_sqlite_ledger_moved_away_with_requests_in_flight_loses_nothing(world, tmp_path, caplog):
    path = tmp_path / "ledger.sqlite"

    def reservations() -> int:
        try:
            with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=30) as db:
                return db.execute("SELECT COUNT(*) FROM client_reservations").fetchone()[0]
        except sqlite3.Error:
            return -1  # moved away: nothing to count

    outage = Outage(world, tmp_path, path, reservations)
    try:
        outage.burst(2)
        first = _paid(outage.replies())  # while nothing is wrong
        outage.settled()
        outage.burst(2)  # 4 requests admitted and waiting for their agents ...
        path.rename(tmp_path / "away.sqlite")  # ... when the ledger goes
        in_flight = outage.replies()
        paid_during = _paid(in_flight)  # served: they were admitted before the outage
        deadline = time.monotonic() + 30
        while len(_journal(outage)) < 4 or "kept in" not in caplog.text:  # kept in the home's journal, durably
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.02)
        assert {r["key"] for r in _journal(outage)} == {"team-a", "team-b"} and KEY_A not in caplog.text
        _refused_while_down(outage)
        (tmp_path / "away.sqlite").rename(path)  # the ledger is back
        t0 = time.monotonic()
        again = [(k, outage.ask(k)) for k in (KEY_A, KEY_B)]  # admitted at once, not after the requests' deadline
        assert all(r.status_code == 200 for _, r in again) and time.monotonic() - t0 < 30
        outage.settled()
    finally:
        outage.close()
    assert _journal(outage) == []
    paid = {k: first[k] + paid_during[k] + _paid(again)[k] for k in first}
    totals = SpendLedger(path, pending=tmp_path / "pending").totals()
    for name in ("team-a", "team-b"):
        assert totals[name]["requests"] == 5 and totals[name]["usd"] == pytest.approx(paid[name], abs=1e-12)
    with sqlite3.connect(path) as db:  # every reservation released, each settlement recorded once
        assert db.execute("SELECT COUNT(*) FROM client_reservations").fetchone()[0] == 0
        assert db.execute("SELECT COUNT(*) FROM client_settled").fetchone()[0] == 10


@pytest.mark.parametrize("damage", ["removed", "written over"])
def test_a_sqlite_ledger_removed_or_written_over_refuses_every_keyed_request(world, tmp_path, damage):
    path = tmp_path / "ledger.sqlite"
    outage = Outage(world, tmp_path, path, lambda: 0)
    try:
        outage.gate.set()
        assert [outage.ask(k).status_code for k in (KEY_A, KEY_B)] == [200, 200]
        if damage == "removed":
            path.unlink()
        else:
            path.write_bytes(b"not a ledger\n" * 1000)
        _refused_while_down(outage)
    finally:
        outage.close()
    assert damage != "removed" or not path.exists()  # never made again, empty


class Proxy:
    """A TCP proxy on loopback to (host, port): `down()` drops every connection through it and refuses new ones (the
    server stopped, as its clients see it), `up()` serves again on the same port."""

    def __init__(self, host: str, port: int):
        self.target, self.conns, self.lock = (host, port), [], threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.serving = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if not self.serving:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def down(self):
        self.serving = False
        with self.lock:
            for s in self.conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self.conns = []

    def up(self):
        self.serving = True

    def close(self):
        self.down()
        self.sock.close()


@pytest.mark.postgres
@pytest.mark.skipif(not PG_URL and not IN_CI, reason="no PostgreSQL: set ROUTER_LITE_PG_URL (source .ci/postgres.sh)")
def test_postgres_stopped_with_requests_in_flight_loses_nothing(world, tmp_path, pg_ledger_url):
    """The issue's case: PostgreSQL stopped while requests are in flight, then started again: the ledger ends equal
    to the 200 replies' usage.cost, and the key is admitted again at once (before: 429 for the reservations'
    16 minutes, and the spend lost)."""
    import psycopg2
    from sqlalchemy.engine import make_url

    url = make_url(pg_ledger_url)
    proxy = Proxy(url.host, url.port or 5432)
    through = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    direct = pg_ledger_url.replace("+psycopg2", "")

    def reservations() -> int:
        db = psycopg2.connect(direct, connect_timeout=10)
        try:
            with db.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM client_reservations")
                return cur.fetchone()[0]
        finally:
            db.close()

    outage = Outage(world, tmp_path, through, reservations)
    try:
        outage.burst(2)
        proxy.down()  # PostgreSQL "stops" with 4 requests in flight
        paid_during = _paid(outage.replies())
        deadline = time.monotonic() + 60
        while len(_journal(outage)) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        _refused_while_down(outage)
        proxy.up()
        again = [(k, outage.ask(k)) for k in (KEY_A, KEY_B)]
        assert all(r.status_code == 200 for _, r in again), [r.text for _, r in again]
        outage.settled()
    finally:
        outage.close()
        proxy.close()
    paid = _paid(again)
    totals = SpendLedger(direct, pending=tmp_path / "pending").totals()
    for name in ("team-a", "team-b"):
        assert totals[name]["requests"] == 3
        assert totals[name]["usd"] == pytest.approx(paid_during[name] + paid[name], abs=1e-12)
    assert reservations() == 0


def test_a_settlement_is_written_once_however_often_it_is_kept_and_replayed(tmp_path, caplog):
    """The ledger records each settlement's id: one whose commit was in doubt (written, and kept in the journal as
    well) is not counted twice when the journal is replayed; a line cut short by a crash goes to `.rejected`; a
    ledger opened later (a server starting) replays what an outage left."""
    path, pending = tmp_path / "ledger.sqlite", tmp_path / "pending"
    ledger = SpendLedger(path, pending=pending)
    now = time.time()
    rid, _ = ledger.admit("team-a", 0.5, now, now + 60, (now - 86400, now - 60), lambda *_: None)
    ledger.settle_many([("team-a", rid, 0.125, 1000)], now)
    record = {"id": rid, "key": "team-a", "reservation": rid, "usd": 0.125, "ends": 1000, "at": now}
    ledger.journal.keep([record, {**record, "id": "other", "reservation": None, "usd": 0.25}])
    with open(ledger.journal.file, "ab") as fh:
        fh.write(b'{"id": "half a li')  # a crash in the middle of a write
    ledger.journal.keep([{**record, "id": "third", "reservation": None, "usd": 0.5}])
    ledger.close()
    again = SpendLedger(path, pending=pending)  # replays at open
    assert again.totals() == {"team-a": {"usd": pytest.approx(0.875), "requests": 3}}
    assert not ledger.journal.waiting()
    assert b"half a li" in (pending / f"{ledger.journal.file.name}.rejected").read_bytes()
    assert again.replay() == 0 and again.totals()["team-a"]["requests"] == 3
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM client_reservations").fetchone()[0] == 0


def test_a_settlement_the_ledger_cannot_take_is_kept_and_admissions_wait_for_it(tmp_path):
    path, pending = tmp_path / "ledger.sqlite", tmp_path / "pending"
    ledger = SpendLedger(path, pending=pending)
    now = time.time()
    args = ("team-a", 0.5, now, now + 60, (now - 86400, now - 60), lambda *_: None)
    rid, _ = ledger.admit_now(*args)
    path.rename(tmp_path / "away")
    with pytest.raises(LedgerOutage, match=r"1 settlement\(s\) \(\$0\.12500000\) kept in .*pending"):
        ledger.settle("team-a", rid, 0.125, int(now) + 10)
    assert ledger.journal.waiting()
    assert ledger.admit_now(*args) is None  # the journal first: the thread's path
    with pytest.raises(Exception, match="removed, replaced or written over"):
        ledger.admit(*args)
    (tmp_path / "away").rename(path)
    seen = []
    ledger.admit(*args[:5], lambda spend_, held, hits: seen.append((spend_, held)))
    assert seen == [(((int(now) + 10, 0.125),), ())]  # the kept spend counts, its reservation is gone
    assert not ledger.journal.waiting()


def test_retry_after_is_when_the_reservations_in_flight_reach_their_deadlines_not_a_day():
    key = ClientKey("k", b"", budget_usd=1.0, window_s=86400)
    now = 100_000.0
    usage = spend.KeyUsage(spend=((now - 10, 0.7),), reserved=0.3, held=((now + 900, 0.2), (now + 960, 0.1)))
    r = spend.admission(key, usage, 0.15, now)  # 0.15 over: the first reservation's deadline frees 0.2
    assert r.code == "budget_exceeded" and r.retry_after_s == 900
    r = spend.admission(key, usage, 0.25, now)  # 0.25 over: both reservations
    assert r.retry_after_s == 960
    r = spend.admission(key, usage, 0.35, now)  # more than the reservations: the spend must leave the window
    assert r.retry_after_s == 86400 - 10
