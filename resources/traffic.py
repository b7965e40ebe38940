"""The served traffic log: where it lives, its append-only writer, its retention and its deletion
(docs/serving.md, "Recording traffic"; the line format: pipeline/serve/traffic.py).

Layout: `<home>/traffic/<YYYY-MM-DD>/<pid>.jsonl`, `home` the served profile's home (`resources.storage.home_of`), the
UTC day of the request, one file per writing process (the workers of `serve --workers N` never share a file, so no
lines interleave). The folders are the operator's only (0700, files 0600): they hold what users sent.

`TrafficWriter` appends from a thread of its own: the request path only queues a line (never a disk wait); the thread
writes each line with one `os.write` on an O_APPEND descriptor, truncates a write that failed part way (a file never
holds a torn line before a whole one) and `fdatasync`s once per batch of queued lines (group commit), so a line is on
disk a moment after its reply went out, and the reply never waited for it. A write that fails is reported to
`on_outcome` (a metric, one warning line a minute at most), never raised.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import queue
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.core.errors import RouterLiteError

log = logging.getLogger(__name__)

TRAFFIC_DIR = "traffic"
EXPLORE_SPEND_FILE = ("serve", "explore_spend.sqlite")  # under the home: the day's exploration spend, all workers
DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
WARN_EVERY_S = 60.0  # a failing disk: one warning line a minute, with the count since the last
BATCH = 512  # lines written between two fdatasync calls, at most


def traffic_root(home) -> Path:
    return Path(home).resolve() / TRAFFIC_DIR


def check_day(day: str) -> str:
    """`day` when it is a calendar day written YYYY-MM-DD, else RouterLiteError naming it."""
    try:
        if not DAY_RE.match(str(day)):
            raise ValueError
        datetime.date.fromisoformat(day)
    except ValueError:
        raise RouterLiteError(f"{day!r} is not a day: write it YYYY-MM-DD (UTC), e.g. 2026-12-05") from None
    return day


def traffic_day_dir(home, day: str) -> Path:
    return traffic_root(home) / check_day(day)


def derived_files(home, day: str) -> list[Path]:
    """What the lineage derived from `day`'s log and keeps (the `traffic` partition: prompts and replies): deleting a
    day of traffic deletes these too (`traffic_rewards` drops the day at its next refresh)."""
    from resources.storage import asset_path

    return [p for p in (asset_path(home, "traffic", day), asset_path(home, "traffic", day, ".json")) if p.exists()]


def _remove_day(home, day: str) -> None:
    shutil.rmtree(traffic_root(home) / day, ignore_errors=True)  # another worker's sweep may race this one
    for p in derived_files(home, day):
        p.unlink(missing_ok=True)


def utc_day(when: datetime.datetime | None = None) -> str:
    return (when or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%d")


def days(home) -> list[str]:
    """The day folders of the log, oldest first (anything else in the folder is left alone)."""
    root = traffic_root(home)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and DAY_RE.match(p.name))


def day_files(home, day: str) -> list[Path]:
    """The day's log files (one per writing process), by name."""
    return sorted(traffic_day_dir(home, day).glob("*.jsonl"))


def day_bytes(home, day: str) -> int:
    """The day's log size in bytes (a stat per file): the traffic sensor counts lines again only when it changed."""
    return sum(p.stat().st_size for p in day_files(home, day))


def day_rows(home, day: str) -> int:
    """Whole lines logged on `day` (each ends with a newline): the size the traffic sensor compares."""
    return sum(p.read_bytes().count(b"\n") for p in day_files(home, day))


def read_day(home, day: str) -> tuple[list[dict], int]:
    """(every whole line of `day`'s files as a dict, the lines that were not: a torn last line of a process that
    died mid-write)."""
    rows, torn = [], 0
    for f in day_files(home, day):
        for raw in f.read_bytes().split(b"\n"):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError:
                torn += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                torn += 1
    return rows, torn


def day_stats(home, day: str) -> dict:
    """{day, files, rows (request lines), explorations, torn, bytes} of one day folder."""
    files = day_files(home, day)
    rows, torn = read_day(home, day)
    return {"day": day, "files": len(files), "rows": sum(r.get("record") == "request" for r in rows),
            "explorations": sum(r.get("record") == "exploration" for r in rows), "torn": torn,
            "bytes": sum(f.stat().st_size for f in files)}


def delete_days(home, before: str | None = None, everything: bool = False, day: str | None = None) -> list[dict]:
    """Delete day `day`, or the days older than `before` (YYYY-MM-DD, that day kept), or all of them: their stats,
    as they were. A writer still running opens a new file in a deleted day's folder at its next line."""
    if before is None and not everything and day is None:
        raise RouterLiteError("say which days to delete: --day DAY, --before DAY or --all")
    for d in (before, day):
        if d is not None:
            check_day(d)
    gone = []
    for d in days(home):
        if everything or (before is not None and d < before) or d == day:
            stats = day_stats(home, d)
            _remove_day(home, d)
            gone.append(stats)
    return gone


def sweep(home, retention_days: int, today: str | None = None) -> list[str]:
    """Delete the day folders more than `retention_days` days before `today` (UTC): the days kept are today and
    the `retention_days` before it. The days deleted."""
    today_d = datetime.date.fromisoformat(today or utc_day())
    gone = []
    for day in days(home):
        if (today_d - datetime.date.fromisoformat(day)).days > int(retention_days):
            _remove_day(home, day)
            gone.append(day)
    return gone


def encode_line(line: dict) -> bytes:
    """One JSON line, UTF-8; a string that is no valid text (a lone surrogate in an agent's reply) escaped."""
    try:
        return (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(line, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


class TrafficWriter:
    """This process's append-only writer of `<home>/traffic/<day>/<pid>.jsonl` (module docstring). `write(line)`
    queues a dict that has `day` (never blocks; False when the queue is full or the writer closed: the line is
    dropped and counted); `on_outcome(outcome, n)` hears "written", "failed" and "dropped" (the metrics).
    `retention_days`: the days older are deleted when the writer starts and whenever the day changes."""

    def __init__(self, home, retention_days: int | None = None, max_queue: int = 10000,
                 on_outcome: Callable[[str, int], None] | None = None):
        self.home, self.retention_days = Path(home).resolve(), retention_days
        self.on_outcome = on_outcome or (lambda outcome, n: None)
        self.queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self.failed = self.written = self.dropped = 0
        self._fd: int | None = None
        self._fd_day: str | None = None
        self._size = 0
        self._unwarned, self._warned_at = 0, 0.0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="traffic-writer", daemon=True)
        self._thread.start()

    def write(self, line: dict) -> bool:
        if self._closed:
            return self._count("dropped")
        try:
            self.queue.put_nowait(line)
            return True
        except queue.Full:
            self._warn(f"traffic log: queue of {self.queue.maxsize} lines full (the disk is slower than the "
                       "requests); a line dropped")
            return self._count("dropped")

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued line is written (True) or `timeout_s` passed (False)."""
        done = threading.Event()
        try:
            self.queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then stop the thread (and close the file)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    # --------------------------------------------------------------------------------------------- the thread
    def _run(self) -> None:
        if self.retention_days is not None:
            self._sweep()
        while True:
            batch = [self.queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            stop = False
            for item in batch:
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    self._sync()
                    item.set()
                else:
                    self._append(item)
            self._sync()
            if stop:
                self._close_file()
                return

    def _append(self, line: dict) -> None:
        try:
            data = encode_line(line)
            fd = self._file(str(line["day"]))
        except Exception as exc:  # noqa: BLE001 - no folder, no space, a line that is no JSON: never the request's
            self.failed_line(exc)
            return
        start = self._size
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            self._size += len(data)
            self._count("written")
        except OSError as exc:
            try:  # a line cut short (a full disk) is taken back: the next one starts on a line of its own
                os.ftruncate(fd, start)
            except OSError:
                self._close_file()  # the next line reopens it, and drops the torn tail (`_file`)
            self.failed_line(exc)

    def _file(self, day: str) -> int:
        if self._fd is not None and self._fd_day == day and os.path.isdir(traffic_day_dir(self.home, day)):
            return self._fd
        new_day = self._fd_day is not None and self._fd_day != day
        self._close_file()
        if new_day and self.retention_days is not None:
            self._sweep()
        folder = traffic_day_dir(self.home, day)
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(folder / f"{os.getpid()}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        size = os.fstat(fd).st_size
        if size:  # a file of an earlier process of this pid: a torn last line of it is cut off
            with open(folder / f"{os.getpid()}.jsonl", "rb") as f:
                f.seek(max(0, size - (1 << 20)))
                tail = f.read()
            if not tail.endswith(b"\n"):
                cut = tail.rfind(b"\n")
                size = size - len(tail) + cut + 1 if cut >= 0 else max(0, size - len(tail))
                os.ftruncate(fd, size)
        self._fd, self._fd_day, self._size = fd, day, size
        return fd

    def _sync(self) -> None:
        if self._fd is not None:
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                self._warn(f"traffic log: fdatasync failed ({exc})")

    def _close_file(self) -> None:
        if self._fd is not None:
            try:
                os.fdatasync(self._fd)
            except OSError:
                pass
            os.close(self._fd)
        self._fd = self._fd_day = None

    def _sweep(self) -> None:
        try:
            gone = sweep(self.home, self.retention_days)
        except OSError as exc:
            self._warn(f"traffic log: retention sweep failed ({exc})")
            return
        if gone:
            log.info("traffic log: deleted %d day(s) older than %d days: %s", len(gone), self.retention_days,
                     ", ".join(gone))

    def failed_line(self, exc: BaseException) -> None:
        """A line that could not be made or written (counted, one warning line a minute at most)."""
        self._count("failed")
        self._warn(f"traffic log: a line could not be written to {traffic_root(self.home)} "
                   f"({type(exc).__name__}: {exc}); the request was answered")

    def _count(self, outcome: str) -> bool:
        setattr(self, outcome, getattr(self, outcome) + 1)
        try:
            self.on_outcome(outcome, 1)
        except Exception:  # noqa: BLE001 - a metric never fails a write
            pass
        return False

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        self._unwarned += 1
        if self._warned_at and now - self._warned_at < WARN_EVERY_S:
            return
        more = f" ({self._unwarned - 1} more since the last warning)" if self._unwarned > 1 else ""
        log.warning("%s%s", message, more)
        self._warned_at, self._unwarned = now, 0


class ExploreSpend:
    """The exploration spend of each UTC day (USD), in one SQLite file every worker of the home shares
    (`<home>/serve/explore_spend.sqlite`; WAL, each change one BEGIN IMMEDIATE transaction: the processes take
    turns). Reserve a worst case before asking, settle what was paid after: a day's spend passes its cap only when a
    provider bills a call more than its list-price worst case."""

    def __init__(self, path):
        self.path = Path(path).resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS explore_spend (day TEXT PRIMARY KEY, usd REAL NOT NULL)")

    @classmethod
    def of_home(cls, home) -> ExploreSpend:
        return cls(Path(home).resolve().joinpath(*EXPLORE_SPEND_FILE))

    def _db(self):
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return contextlib.closing(db)

    def spent(self, day: str) -> float:
        with self._lock, self._db() as db:
            row = db.execute("SELECT usd FROM explore_spend WHERE day = ?", (day,)).fetchone()
        return float(row[0]) if row else 0.0

    def reserve(self, day: str, usd: float, cap: float) -> bool:
        """Add `usd` to `day`'s spend when it stays within `cap` (True), else change nothing (False)."""
        with self._lock, self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT usd FROM explore_spend WHERE day = ?", (day,)).fetchone()
            spent = float(row[0]) if row else 0.0
            if spent + usd > cap + 1e-12:
                db.execute("ROLLBACK")
                return False
            db.execute("INSERT INTO explore_spend (day, usd) VALUES (?, ?) ON CONFLICT(day) DO UPDATE SET usd = ?",
                       (day, spent + usd, spent + usd))
            db.execute("COMMIT")
            return True

    def settle(self, day: str, reserved: float, paid: float) -> None:
        """Replace a reservation of `reserved` USD by what was `paid`."""
        with self._lock, self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO explore_spend (day, usd) VALUES (?, ?) ON CONFLICT(day) DO UPDATE SET "
                       "usd = MAX(0, usd + ?)", (day, max(0.0, paid - reserved), paid - reserved))
            db.execute("COMMIT")

