"""The spend ledger of `router-lite serve --api-keys`: per client key, the settled spend (buckets of its window),
the reservations of its requests in flight and its admitted requests per second, in a database that every process
serving the keys shares, so budgets and rates hold across `serve --workers N` and across several `serve` processes.

- SQLite (default: `<home>/serve/ledger.sqlite`, `sqlite:///PATH` or a plain path): WAL mode (readers never wait
  for the writer), `synchronous=NORMAL` (a commit survives a crash of the process; an OS crash may lose the last
  moments' spend), each admission and settlement one `BEGIN IMMEDIATE` transaction: the processes take turns.
- PostgreSQL (`postgresql://` or `postgresql+psycopg2://`; psycopg2 comes with dagster-postgres): the same
  statements, each transaction serialised per key by `pg_advisory_xact_lock`.

A reservation carries an expiry (the longest a request can run): one left by a process that died is ignored after
it and deleted by the next settlement of its key (as are the per-second hits older than the minute: an admission,
which runs on the event loop, only reads and inserts). The budget decision itself is pipeline/serve/spend.py's
(`decide` below): this module only reads, locks and writes. URLs are shown with the password hidden.
"""
from __future__ import annotations

import re
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from pipeline.core.errors import RouterLiteError
from pipeline.serve.spend import RPM_WINDOW_S
from resources.storage import default_home

LEDGER_ENV = "ROUTER_LITE_LEDGER_URL"
LEDGER_FILE = ("serve", "ledger.sqlite")  # under the home
_PG = re.compile(r"^postgres(?:ql)?(?:\+psycopg2)?://", re.I)
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS client_spend (key_name TEXT NOT NULL, ends BIGINT NOT NULL, usd DOUBLE PRECISION "
    "NOT NULL, requests BIGINT NOT NULL, PRIMARY KEY (key_name, ends))",
    "CREATE TABLE IF NOT EXISTS client_reservations (id TEXT PRIMARY KEY, key_name TEXT NOT NULL, usd DOUBLE "
    "PRECISION NOT NULL, expires DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS client_reservations_key ON client_reservations (key_name, expires)",
    "CREATE TABLE IF NOT EXISTS client_hits (key_name TEXT NOT NULL, second BIGINT NOT NULL, n BIGINT NOT NULL, "
    "PRIMARY KEY (key_name, second))",
)
_ADD_SPEND = ("INSERT INTO client_spend (key_name, ends, usd, requests) VALUES (:k, :ends, :usd, 1) ON CONFLICT "
              "(key_name, ends) DO UPDATE SET usd = client_spend.usd + excluded.usd, requests = client_spend.requests "
              "+ 1")
_ADD_HIT = ("INSERT INTO client_hits (key_name, second, n) VALUES (:k, :second, 1) ON CONFLICT (key_name, second) "
            "DO UPDATE SET n = client_hits.n + 1")


def default_ledger_url() -> str:
    return str(Path(default_home()).resolve().joinpath(*LEDGER_FILE))


def shown(url: str) -> str:
    """`url` with its password hidden (messages and logs)."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", str(url))


class SpendLedger:
    """One process's connection to the ledger at `url` (module doc); safe to call from several threads."""

    def __init__(self, url: str | Path | None = None):
        self.url = str(url or default_ledger_url())
        self.postgres = bool(_PG.match(self.url))
        self._lock = threading.Lock()
        self._conn = self._now = None
        with self._lock:
            self._connect()
        # a second SQLite connection that never waits for the file's lock (`admit_now`, on the event loop)
        self._now_lock = threading.Lock()
        if not self.postgres:
            self._now = self._open_sqlite(busy_timeout_s=0.0)

    # --------------------------------------------------------------------------------------------- connection
    def _connect(self) -> None:
        try:
            self._conn = self._open_postgres() if self.postgres else self._open_sqlite()
        except RouterLiteError:
            raise
        except Exception as exc:  # noqa: BLE001 - any driver error: one line naming the ledger
            raise RouterLiteError(f"spend ledger {shown(self.url)}: cannot be opened ({type(exc).__name__}: "
                                  f"{shown(str(exc)).strip().splitlines()[0] if str(exc).strip() else ''})") from None

    def _open_sqlite(self, busy_timeout_s: float = 30.0):
        path = Path(re.sub(r"^sqlite:///", "", self.url)).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
        for attempt in range(50):  # switching to WAL needs a moment alone with the file (workers start together)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError:
                if attempt == 49:
                    raise
                time.sleep(0.1)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        for stmt in SCHEMA:
            conn.execute(stmt)
        conn.execute("COMMIT")
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        return conn

    def _open_postgres(self):
        import psycopg2

        conn = psycopg2.connect(_PG.sub("postgresql://", self.url), connect_timeout=10)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(7236975)")  # CREATE ... IF NOT EXISTS races between processes
            for stmt in SCHEMA:
                cur.execute(stmt)
        conn.commit()
        return conn

    def _run(self, name: str, work):
        """`work(execute)` in one transaction locked for key `name` (module doc); a lost PostgreSQL connection is
        opened again once."""
        with self._lock:
            for attempt in (0, 1):
                try:
                    return self._transaction(name, work)
                except Exception as exc:  # noqa: BLE001
                    if not self.postgres or attempt or not _connection_lost(exc):
                        raise
                    self._connect()

    def _transaction(self, name: str | tuple, work, conn=None):
        conn = conn or self._conn
        if self.postgres:
            cur = conn.cursor()
            try:
                for one in sorted(set(name)) if isinstance(name, tuple) else (name,):  # in order: no deadlock
                    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (one,))
                out = work(lambda sql, params: (cur.execute(_pg_params(sql), params), cur)[1])
                conn.commit()
                return out
            except BaseException:
                conn.rollback()
                raise
            finally:
                cur.close()
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = work(conn.execute)
            conn.execute("COMMIT")
            return out
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------------------------------------- ledger
    def admit(self, name: str, need_usd: float, now: float, expires: float, since: tuple[float, float], decide):
        """In one locked transaction: read key `name`'s spend buckets ending after `since[0]`, its live reservations
        and its admitted requests per second after `since[1]`; `decide(spend, reserved, hits)` (pipeline/serve/
        spend.py) returns a refusal or None; on None reserve `need_usd` until `expires` and count the request.
        Returns (reservation id or None, the refusal or None)."""
        return self._run(name, self._admission(name, need_usd, now, expires, since, decide))

    def admit_now(self, name: str, need_usd: float, now: float, expires: float, since: tuple[float, float], decide):
        """`admit` without waiting, for a caller on the event loop: the same transaction on a connection that does
        not wait for the file's lock; None (nothing done) when another process or thread holds it, or on
        PostgreSQL (a network round trip: `admit`, in a thread). A thread hop costs a request up to the
        interpreter's switch interval (5 ms) while the loop is busy; an uncontended SQLite admission ~0.1 ms."""
        if self._now is None or not self._now_lock.acquire(blocking=False):
            return None
        try:
            return self._transaction(name, self._admission(name, need_usd, now, expires, since, decide), self._now)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return None
            raise
        finally:
            self._now_lock.release()

    @staticmethod
    def _admission(name: str, need_usd: float, now: float, expires: float, since: tuple[float, float], decide):
        def work(ex):
            k = {"k": name, "now": now, "hs": int(since[1])}  # expired rows are skipped here, deleted by `settle`
            spend = ex("SELECT ends, usd FROM client_spend WHERE key_name = :k AND ends > :since ORDER BY ends",
                       {**k, "since": since[0]}).fetchall()
            reserved = ex("SELECT COALESCE(SUM(usd), 0) FROM client_reservations WHERE key_name = :k AND expires > "
                          ":now", k).fetchone()
            hits = ex("SELECT second, n FROM client_hits WHERE key_name = :k AND second > :hs ORDER BY second",
                      k).fetchall()
            refusal = decide(tuple(map(tuple, spend)), float(reserved[0]), tuple(map(tuple, hits)))
            if refusal is not None:
                return None, refusal
            rid = uuid.uuid4().hex
            ex("INSERT INTO client_reservations (id, key_name, usd, expires) VALUES (:id, :k, :usd, :exp)",
               {**k, "id": rid, "usd": float(need_usd), "exp": float(expires)})
            ex(_ADD_HIT, {**k, "second": int(now)})
            return rid, None

        return work

    def settle(self, name: str, reservation: str | None, usd: float, bucket_end: int) -> None:
        """The request of `reservation` (None: a key without limits reserves nothing) cost `usd`: its reservation
        goes, the cost joins key `name`'s bucket ending at `bucket_end`."""
        self.settle_many([(name, reservation, usd, bucket_end)])

    def settle_many(self, settled, now: float | None = None) -> None:
        """`settle` for each (name, reservation, usd, bucket_end) of `settled`, in one transaction; then the keys'
        reservations expired at `now` and their hits older than the rate's minute are deleted (the admission only
        skips them)."""
        now = time.time() if now is None else now

        def work(ex):
            for name, reservation, usd, bucket_end in settled:
                if reservation is not None:
                    ex("DELETE FROM client_reservations WHERE id = :id", {"id": reservation})
                ex(_ADD_SPEND, {"k": name, "ends": int(bucket_end), "usd": float(usd)})
            for name in {s[0] for s in settled}:
                k = {"k": name, "now": now, "hs": int(now - RPM_WINDOW_S)}
                ex("DELETE FROM client_reservations WHERE key_name = :k AND expires <= :now", k)
                ex("DELETE FROM client_hits WHERE key_name = :k AND second <= :hs", k)

        if settled:
            self._run(tuple(s[0] for s in settled), work)

    def totals(self) -> dict[str, dict]:
        """{key name: {"usd", "requests"}} over everything the ledger holds (reports, tests)."""
        rows = self._run("", lambda ex: ex("SELECT key_name, SUM(usd), SUM(requests) FROM client_spend GROUP BY "
                                           "key_name", {}).fetchall())
        return {r[0]: {"usd": float(r[1]), "requests": int(r[2])} for r in rows}

    def close(self) -> None:
        with self._lock, self._now_lock:
            for conn in (self._conn, self._now):
                if conn is not None:
                    conn.close()
            self._conn = self._now = None


def _pg_params(sql: str) -> str:
    return re.sub(r":(\w+)", r"%(\1)s", sql)


def _connection_lost(exc: BaseException) -> bool:
    try:
        import psycopg2
    except ImportError:
        return False
    return isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError))
