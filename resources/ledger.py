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

**Nothing settled is lost.** A settlement carries an id (its request's reservation id) that the ledger records with it
(`client_settled`, kept SETTLED_KEEP_S): writing one twice adds its cost once. A settlement that cannot be written
(the database down, the SQLite file removed, replaced or locked) is appended to a journal in the home
(`<home>/serve/pending/<ledger>.jsonl`, one JSON line each, fsync'd; `PendingSettlements`) and written from there,
exactly once, by the first access of any process of that home once the ledger answers (an admission replays the
journal before it decides: the spend it holds counts) and when a ledger is opened (`serve` starting). While the journal
holds settlements and the ledger does not answer, every admission fails: a keyed request is refused (503), never
served unmetered. A SQLite file that was removed is an outage, not an empty ledger: it is never created again
after start (a file put back in its place, holding the ledger's tables, is used).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from pipeline.core.errors import RouterLiteError
from pipeline.serve.spend import RPM_WINDOW_S, LedgerOutage
from resources.storage import default_home

LEDGER_ENV = "ROUTER_LITE_LEDGER_URL"
log = logging.getLogger(__name__)
LEDGER_FILE = ("serve", "ledger.sqlite")  # under the home
PENDING_DIR = ("serve", "pending")  # under the home: settlements waiting for their ledger (`PendingSettlements`)
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of an SQLite file
SETTLED_KEEP_S = 7 * 86400  # how long a settlement's id is kept: a journal replayed later is not checked for twins
_PG = re.compile(r"^postgres(?:ql)?(?:\+psycopg2)?://", re.I)
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS client_spend (key_name TEXT NOT NULL, ends BIGINT NOT NULL, usd DOUBLE PRECISION "
    "NOT NULL, requests BIGINT NOT NULL, PRIMARY KEY (key_name, ends))",
    "CREATE TABLE IF NOT EXISTS client_reservations (id TEXT PRIMARY KEY, key_name TEXT NOT NULL, usd DOUBLE "
    "PRECISION NOT NULL, expires DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS client_reservations_key ON client_reservations (key_name, expires)",
    "CREATE TABLE IF NOT EXISTS client_hits (key_name TEXT NOT NULL, second BIGINT NOT NULL, n BIGINT NOT NULL, "
    "PRIMARY KEY (key_name, second))",
    "CREATE TABLE IF NOT EXISTS client_settled (id TEXT PRIMARY KEY, key_name TEXT NOT NULL, at DOUBLE PRECISION "
    "NOT NULL)",
    "CREATE INDEX IF NOT EXISTS client_settled_at ON client_settled (at)",
)
_SETTLED = "INSERT INTO client_settled (id, key_name, at) VALUES (:id, :k, :at) ON CONFLICT (id) DO NOTHING"
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
    """One process's connection to the ledger at `url` (module doc); safe to call from several threads. `pending`:
    the folder of the settlement journals (default `<home>/serve/pending`)."""

    def __init__(self, url: str | Path | None = None, pending: str | Path | None = None):
        self.url = str(url or default_ledger_url())
        self.postgres = bool(_PG.match(self.url))
        self.path = None if self.postgres else Path(re.sub(r"^sqlite:///", "", self.url)).expanduser().resolve()
        self.journal = PendingSettlements(Path(pending or Path(default_home()).resolve().joinpath(*PENDING_DIR)),
                                          shown(self.url) if self.postgres else str(self.path))
        self._lock = threading.Lock()
        self._conn = self._now = self._file = self._fd = None
        self._pruned = 0.0  # when old settlement ids were last deleted
        with self._lock:
            self._connect(create=True)
        # a second SQLite connection that never waits for the file's lock (`admit_now`, on the event loop)
        self._now_lock = threading.Lock()
        if not self.postgres:
            self._now = self._open_sqlite(busy_timeout_s=0.0)
        try:
            self.replay()  # what an earlier outage left: written now (a ledger that fails here cannot be opened)
        except Exception as exc:  # noqa: BLE001 - one line: the settlements stay in the journal
            self.close()
            raise RouterLiteError(f"spend ledger {shown(self.url)}: the settlements kept in {self.journal.file} "
                                  f"cannot be written ({type(exc).__name__}: {_first_line(exc)})") from None

    # --------------------------------------------------------------------------------------------- connection
    def _connect(self, create: bool = False) -> None:
        try:
            self._conn = self._open_postgres() if self.postgres else self._open_sqlite(create=create)
        except RouterLiteError:
            raise
        except Exception as exc:  # noqa: BLE001 - any driver error: one line naming the ledger
            raise RouterLiteError(f"spend ledger {shown(self.url)}: cannot be opened ({type(exc).__name__}: "
                                  f"{shown(str(exc)).strip().splitlines()[0] if str(exc).strip() else ''})") from None

    def _open_sqlite(self, busy_timeout_s: float = 30.0, create: bool = False):
        """A connection to the SQLite file; `create`: made when missing (only when the ledger is first opened: after
        that a missing file is an outage, `_same_file`), else it must hold the ledger's tables."""
        path = self.path
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None, check_same_thread=False)
        else:
            with open(path, "rb") as fh:  # (in WAL mode SQLite would read page 1 from the WAL: not enough)
                if fh.read(16) != SQLITE_MAGIC:
                    raise RouterLiteError(f"spend ledger {path}: the file in its place is not an SQLite database")
            conn = sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True, timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
            try:
                if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'client_spend'").fetchone():
                    raise RouterLiteError(f"spend ledger {path}: the file in its place holds no ledger")
            except BaseException:
                conn.close()
                raise
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
        fd = os.open(path, os.O_RDONLY)
        st = os.fstat(fd)
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._file = fd, (st.st_dev, st.st_ino)  # the file this ledger writes to (`_same_file`)
        return conn

    def _same_file(self) -> bool:
        """Whether the SQLite file at the ledger's path is still the one its connections write to, and still a
        SQLite file: a removed or replaced one would have them go on writing to the old one, which nobody reads; one
        overwritten in place (its pages in the WAL meanwhile) would be corrupted at the next checkpoint. Once not,
        the connections are opened again (`_reopen_sqlite`) before the next transaction."""
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) != self._file:
                return False
            if os.pread(self._fd, 16, 0) != SQLITE_MAGIC:  # (two system calls: ~2 us)
                self._file = None  # a file written over: never trusted again without a reopen
                return False
        except OSError:
            return False
        return True

    def _reopen_sqlite(self) -> None:
        """(holding `_lock`) The SQLite file was removed, replaced or written over: both connections go to the file
        now at the path, which must hold the ledger's tables; else the ledger stays unreachable (one error naming
        why) and the old connections stay (closing them could checkpoint into the file written over)."""
        with self._now_lock:
            conn = now = None
            try:
                conn, now = self._open_sqlite(), self._open_sqlite(busy_timeout_s=0.0)
            except Exception as exc:  # noqa: BLE001 - any: the ledger is unreachable until a good file is back
                for c in (conn, now):
                    if c is not None:
                        c.close()
                self._file = None
                why = str(exc) if isinstance(exc, RouterLiteError) else f"{type(exc).__name__}: {exc}"
                raise RouterLiteError(f"spend ledger {self.path}: the file was removed, replaced or written over, "
                                      f"and no ledger can be opened in its place ({why})") from None
            for old in (self._conn, self._now):
                with contextlib.suppress(Exception):
                    old.close()
            self._conn, self._now = conn, now
        log.warning("spend ledger %s: the file at its path changed; writing to the ledger now there", self.path)

    def _open_postgres(self):
        import psycopg2

        conn = psycopg2.connect(_PG.sub("postgresql://", self.url), connect_timeout=10)
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(7236975)")  # CREATE ... IF NOT EXISTS races between processes
            for stmt in SCHEMA:
                cur.execute(stmt)
        conn.commit()
        return conn

    def _run(self, name: str | tuple, work):
        """`work(execute)` in one transaction locked for key `name` (module doc); a lost PostgreSQL connection is
        opened again once, a removed or replaced SQLite file is looked for again."""
        with self._lock:
            if self._conn is None:
                raise RouterLiteError(f"spend ledger {shown(self.url)}: closed")
            if not self.postgres and not self._same_file():
                self._reopen_sqlite()
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
                with contextlib.suppress(Exception):  # a lost connection cannot roll back: the server did
                    conn.rollback()
                raise
            finally:
                with contextlib.suppress(Exception):
                    cur.close()
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = work(conn.execute)
            conn.execute("COMMIT")
            return out
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------------------------------------- ledger
    def admit(self, name: str, need_usd: float, now: float, expires: float, since: tuple[float, float], decide):
        """In one locked transaction: read key `name`'s spend buckets ending after `since[0]`, its live reservations
        `(expires, usd)` (earliest deadline first) and its admitted requests per second after `since[1]`;
        `decide(spend, reservations, hits)` (pipeline/serve/spend.py) returns a refusal or None; on None reserve
        `need_usd` until `expires` and count the request. Returns (reservation id, None) or (None, the refusal).
        Settlements waiting in the journal are written first (their spend counts); when they cannot be, this
        fails: no admission while the ledger is behind."""
        if self.journal.waiting():
            self.replay()
        return self._run(name, self._admission(name, need_usd, now, expires, since, decide))

    def admit_now(self, name: str, need_usd: float, now: float, expires: float, since: tuple[float, float], decide):
        """`admit` without waiting, for a caller on the event loop: the same transaction on a connection that does
        not wait for the file's lock; None (nothing done) when another process or thread holds it, when the
        journal holds settlements or the file was replaced (`admit` sees to them), or on PostgreSQL (a network
        round trip: `admit`, in a thread). A thread hop costs a request up to the interpreter's switch interval
        (5 ms) while the loop is busy; an uncontended SQLite admission ~0.1 ms."""
        if self._now is None or self.journal.waiting() or not self._now_lock.acquire(blocking=False):
            return None
        try:
            if self._now is None or not self._same_file():
                return None
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
            held = ex("SELECT expires, usd FROM client_reservations WHERE key_name = :k AND expires > :now ORDER BY "
                      "expires", k).fetchall()
            hits = ex("SELECT second, n FROM client_hits WHERE key_name = :k AND second > :hs ORDER BY second",
                      k).fetchall()
            refusal = decide(tuple(map(tuple, spend)), tuple(map(tuple, held)), tuple(map(tuple, hits)))
            if refusal is not None:
                return None, refusal
            rid = uuid.uuid4().hex
            ex("INSERT INTO client_reservations (id, key_name, usd, expires) VALUES (:id, :k, :usd, :exp)",
               {**k, "id": rid, "usd": float(need_usd), "exp": float(expires)})
            ex(_ADD_HIT, {**k, "second": int(now)})
            return rid, None

        return work

    def settle(self, name: str, reservation: str | None, usd: float, bucket_end: int) -> None:
        """The request of `reservation` cost `usd`: its reservation goes, the cost joins key `name`'s bucket ending
        at `bucket_end`."""
        self.settle_many([(name, reservation, usd, bucket_end)])

    def settle_many(self, settled, now: float | None = None) -> None:
        """`settle` for each (name, reservation, usd, bucket_end) of `settled`, in one transaction, each once (by
        its reservation id; None: an id of its own); then the keys' reservations expired at `now` and their hits
        older than the rate's minute are deleted (the admission only skips them). Settlements that cannot be
        written are kept in the journal (`LedgerOutage` says so) and written at the next access."""
        now = time.time() if now is None else now
        records = [{"id": rid or uuid.uuid4().hex, "key": name, "reservation": rid, "usd": float(usd),
                    "ends": int(bucket_end), "at": now} for name, rid, usd, bucket_end in settled]
        if not records:
            return
        try:
            if self.journal.waiting():
                self.replay()
            self._write(records, now)
        except Exception as exc:  # noqa: BLE001 - whatever the database did: the journal keeps them
            self.journal.keep(records)  # raises (OSError) when the home cannot be written either
            usd = sum(r["usd"] for r in records)
            raise LedgerOutage(f"spend ledger {shown(self.url)}: {len(records)} settlement(s) (${usd:.8f}) kept in "
                               f"{self.journal.file} until it can be written: {type(exc).__name__}: "
                               f"{_first_line(exc)}") from exc

    def _write(self, records: list[dict], now: float) -> None:
        prune = now - self._pruned >= 60  # old settlement ids: once a minute per process is enough

        def work(ex):
            for r in records:
                if r["reservation"] is not None:
                    ex("DELETE FROM client_reservations WHERE id = :id", {"id": r["reservation"]})
                if ex(_SETTLED, {"id": r["id"], "k": r["key"], "at": r["at"]}).rowcount:  # 0: written already
                    ex(_ADD_SPEND, {"k": r["key"], "ends": r["ends"], "usd": r["usd"]})
            for name in {r["key"] for r in records}:
                k = {"k": name, "now": now, "hs": int(now - RPM_WINDOW_S)}
                ex("DELETE FROM client_reservations WHERE key_name = :k AND expires <= :now", k)
                ex("DELETE FROM client_hits WHERE key_name = :k AND second <= :hs", k)
            if prune:
                ex("DELETE FROM client_settled WHERE at < :old", {"old": now - SETTLED_KEEP_S})

        self._run(tuple(r["key"] for r in records), work)
        if prune:
            self._pruned = now

    def replay(self) -> int:
        """Write the settlements the journal holds (any process of this home may have kept them), each once; how
        many. Raises when the ledger cannot take them (they stay in the journal)."""
        with self.journal.claimed() as records:
            if records:
                self._write(records, time.time())
                log.warning("spend ledger %s: %d settlement(s) kept during an outage written ($%.8f)",
                            shown(self.url), len(records), sum(r["usd"] for r in records))
        return len(records)

    def totals(self) -> dict[str, dict]:
        """{key name: {"usd", "requests"}} over everything the ledger holds (reports, tests)."""
        rows = self._run("", lambda ex: ex("SELECT key_name, SUM(usd), SUM(requests) FROM client_spend GROUP BY "
                                           "key_name", {}).fetchall())
        return {r[0]: {"usd": float(r[1]), "requests": int(r[2])} for r in rows}

    def close(self) -> None:
        with self._lock, self._now_lock:
            for conn in (self._conn, self._now):
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
            if self._fd is not None:
                os.close(self._fd)
            self._conn = self._now = self._fd = None


class PendingSettlements:
    """The journal of settlements a ledger could not take: `<folder>/<ledger>.jsonl` (the ledger named by a digest of
    its file or its URL without password, so servers of one home on different ledgers never write each other's),
    one JSON line per settlement, appended under an exclusive `flock` and fsync'd as soon as the ledger refused it;
    `claimed()` hands them to one replayer at a time, which empties the file once they are written."""

    def __init__(self, folder: Path, ledger: str):
        self.folder = Path(folder)
        self.file = self.folder / f"{hashlib.sha256(ledger.encode()).hexdigest()[:16]}.jsonl"
        self.ledger = ledger

    def waiting(self) -> bool:
        """Whether the journal holds settlements (a stat: cheap enough for every admission)."""
        try:
            return self.file.stat().st_size > 0
        except OSError:
            return False

    def keep(self, records: list[dict]) -> None:
        """Append `records`, durably (fsync of the file, and of its folder when the file is new)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        new = not self.file.exists()
        with open(self.file, "ab") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            size = os.fstat(fh.fileno()).st_size
            lead = b""
            if size:  # a write cut short (a crash) must not glue its half line to these
                with open(self.file, "rb") as rd:
                    rd.seek(size - 1)
                    lead = b"" if rd.read(1) == b"\n" else b"\n"
            fh.write(lead + b"".join(json.dumps({**r, "ledger": self.ledger}).encode() + b"\n" for r in records))
            fh.flush()
            os.fsync(fh.fileno())
        if new:
            fd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def claimed(self):
        """The journal's settlements, held under its lock; emptied (durably) when the block ends without an error.
        A line that is not a settlement (a write cut short by a crash) goes to `<file>.rejected`, logged once."""
        if not self.waiting():
            yield []
            return
        with open(self.file, "r+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            records, junk = [], []
            for line in fh.read().splitlines():
                try:
                    r = json.loads(line)
                    records.append({k: r[k] for k in ("id", "key", "reservation", "usd", "ends", "at")})
                except (ValueError, KeyError, TypeError):
                    if line.strip():
                        junk.append(line)
            yield records
            if junk:
                with open(f"{self.file}.rejected", "ab") as bad:
                    bad.write(b"".join(j + b"\n" for j in junk))
                    bad.flush()
                    os.fsync(bad.fileno())
                log.error("spend ledger journal %s: %d line(s) that are not settlements moved to %s.rejected",
                          self.file, len(junk), self.file)
            fh.truncate(0)
            fh.flush()
            os.fsync(fh.fileno())


def _first_line(exc: BaseException) -> str:
    text = shown(str(exc)).strip()
    return text.splitlines()[0] if text else ""


def _pg_params(sql: str) -> str:
    return re.sub(r":(\w+)", r"%(\1)s", sql)


def _connection_lost(exc: BaseException) -> bool:
    try:
        import psycopg2
    except ImportError:
        return False
    return isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError))
