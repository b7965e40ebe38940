"""Durable append-only call log: one JSONL file per agent in one directory.

Every finished call (ok, empty *and* error) is appended as one JSON line, flushed and fsync'ed before `append`
returns, so a call that returned is never lost, and a crash can at worst leave one torn (newline-less) last line.

- Reading only takes newline-terminated lines: a torn trailing line is ignored. A broken line in the middle of a
  file cannot come from a crash, so it raises `RouterLiteError` naming file and line; a log opened with
  `quarantine=True` (the collecting writer, under its lock: `router-lite run --quarantine-bad-log-lines`) instead
  moves such lines to `<agent>.jsonl.quarantine` (appended, with their line numbers) and rewrites the file without
  them (temp file + rename), with a warning.
- Before the first append to a file, a torn tail left by a crash is cut off (it was never acknowledged), so the next
  row starts on a fresh line.
- `keys()` is the set of *done* call keys: rows with status ok or empty. An error row stays in the log (visible,
  counted) but does not make its call done: the next collection retries it. `latest()` has one row per key: the
  done row when there is one, else the last error.
- A logged `cost_usd` that is not a plausible cost (pipeline/collect/costs.py: negative, not finite, over
  MAX_CALL_USD; an older log may hold a provider's 1e308) reads as None with `cost_invalid: true`; new rows hold the
  estimate and that flag already (pipeline/collect/client.py).
- One writer per directory at a time (collection partitions are (source x repetition), each with its own directory);
  readers may run concurrently with the writer.
"""
from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.collect.costs import plausible_usd
from pipeline.core.errors import RouterLiteError

DONE_STATUSES = ("ok", "empty")
STATUSES = ("ok", "empty", "error")

# Call-log row fields (docs/architecture.md, "call"), in column order; extra keys in a row are kept after these.
CALL_FIELDS = [
    "call_key", "agent", "model", "task_id", "repetition", "settings_hash", "status", "error_kind",
    "response_text", "extracted", "correct", "prompt_tokens", "completion_tokens", "cost_usd", "latency_ms",
    "finish_reason", "ts",
    # extras: number of HTTP attempts, scrubbed error message, "provider" | "estimated" token counts
    "attempts", "error_message", "usage_source",
]
REQUIRED_FIELDS = ("call_key", "agent", "status")

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def call_key(agent: str, task_id: str, repetition: int, settings_hash: str) -> str:
    """`<agent>|<task_id>|<repetition>|<settings_hash>` (readable, unique per logical call)."""
    for name, value in (("agent", agent), ("task_id", task_id), ("settings_hash", settings_hash)):
        if not isinstance(value, str) or not value or "|" in value:
            raise RouterLiteError(f"call key part {name}={value!r} must be a non-empty string without '|'")
    if isinstance(repetition, bool) or int(repetition) != repetition or repetition < 0:
        raise RouterLiteError(f"call key part repetition={repetition!r} must be an integer >= 0")
    return f"{agent}|{task_id}|{int(repetition)}|{settings_hash}"


def _file_name(agent: str) -> str:
    safe = _SAFE_NAME.sub("_", agent)
    if safe in ("", ".", ".."):
        raise RouterLiteError(f"agent name {agent!r} cannot name a call-log file")
    return f"{safe}.jsonl"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalar
        try:
            return _clean(value.item())
        except (ValueError, TypeError):
            return value
    return value


def _checked_cost(row: dict) -> dict:
    """A row as read: a `cost_usd` that pipeline/collect/costs.py refuses (a log written before costs were checked
    may hold a provider's 1e308) reads as None with `cost_invalid`, so no sum of the log is inf; the readers that
    know the agent's prices estimate it (`costs.logged_cost`)."""
    if row.get("cost_usd") is not None and plausible_usd(row["cost_usd"]) is None:
        return {**row, "cost_usd": None, "cost_invalid": True}
    return row


class CallLog:
    """Append-only call log under `directory` (`<directory>/<agent>.jsonl`)."""

    def __init__(self, directory: str | Path, quarantine: bool = False):
        self.directory = Path(directory)
        self.quarantine = quarantine
        self._handles: dict[str, Any] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------------ writing
    def path_for(self, agent: str) -> Path:
        return self.directory / _file_name(agent)

    def _handle(self, agent: str):
        fh = self._handles.get(agent)
        if fh is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.path_for(agent)
            fh = open(path, "ab")
            size = fh.seek(0, os.SEEK_END)
            if size:
                with open(path, "rb") as rf:  # cut a torn tail left by a crash: it was never acknowledged
                    rf.seek(max(0, size - 1))
                    if rf.read(1) != b"\n":
                        rf.seek(0)
                        data = rf.read()
                        keep = data.rfind(b"\n") + 1
                        fh.truncate(keep)
                        fh.seek(keep)
                        os.fsync(fh.fileno())
            self._handles[agent] = fh
        return fh

    @staticmethod
    def _encode(row: dict) -> bytes:
        for f in REQUIRED_FIELDS:
            if not row.get(f):
                raise RouterLiteError(f"call-log row lacks {f!r}: {sorted(row)}")
        if row["status"] not in STATUSES:
            raise RouterLiteError(f"call-log row {row['call_key']!r} has status {row['status']!r}, not one of "
                                  f"{STATUSES}")
        clean = {k: _clean(v) for k, v in row.items()}
        return (json.dumps(clean, ensure_ascii=False, allow_nan=False, default=str) + "\n").encode("utf-8")

    def append(self, row: dict) -> None:
        """Write one row as one JSON line, flush and fsync before returning."""
        self.append_many([row])

    def append_many(self, rows: Iterable[dict]) -> None:
        """Write rows (one line each) and fsync each touched file once: a group commit."""
        by_agent: dict[str, list[bytes]] = {}
        for row in rows:
            by_agent.setdefault(str(row.get("agent")), []).append(self._encode(row))
        with self._lock:
            for agent, lines in by_agent.items():
                fh = self._handle(agent)
                fh.write(b"".join(lines))
                fh.flush()
                os.fsync(fh.fileno())

    def close(self) -> None:
        with self._lock:
            for fh in self._handles.values():
                fh.close()
            self._handles.clear()

    def __enter__(self) -> CallLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------ reading
    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.jsonl")) if self.directory.exists() else []

    def iter_rows(self) -> Iterable[dict]:
        for path in self.files():
            data = path.read_bytes()
            complete = data[: data.rfind(b"\n") + 1]  # a torn trailing line (no newline) is ignored
            rows, bad = [], []
            for lineno, line in enumerate(complete.split(b"\n")[:-1], start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    row = None
                if not isinstance(row, dict) or "call_key" not in row:
                    if not self.quarantine:
                        raise RouterLiteError(
                            f"corrupt call-log line {path}:{lineno} (not a JSON call row: {line[:40]!r}); remove it, "
                            "or set it aside with `router-lite run --quarantine-bad-log-lines`")
                    bad.append(lineno)
                    continue
                rows.append(_checked_cost(row))
            if bad:
                self._set_aside(path, complete, bad)
            yield from rows

    def _set_aside(self, path: Path, complete: bytes, bad: list[int]) -> None:
        """Move lines `bad` (1-based) of `path` to `<path>.quarantine` and rewrite `path` without them."""
        import logging

        lines = complete.split(b"\n")[:-1]
        drop = set(bad)
        with open(path.with_name(path.name + ".quarantine"), "ab") as q:
            q.write(b"".join(f"{n}\t".encode() + lines[n - 1] + b"\n" for n in bad))
            q.flush()
            os.fsync(q.fileno())
        with self._lock:
            for agent, fh in list(self._handles.items()):  # an open append handle would write to the old file
                if Path(fh.name) == path:
                    fh.close()
                    del self._handles[agent]
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "wb") as out:
                out.write(b"".join(line + b"\n" for n, line in enumerate(lines, 1) if n not in drop))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        logging.getLogger(__name__).warning("call log %s: %d bad line(s) (first: line %d) moved to %s.quarantine",
                                            path, len(bad), bad[0], path.name)

    def keys(self) -> set[str]:
        """Call keys that are done (a row with status ok or empty)."""
        return {r["call_key"] for r in self.iter_rows() if r.get("status") in DONE_STATUSES}

    def read(self) -> pd.DataFrame:
        """Every row of every file (errors and retries included), columns in CALL_FIELDS order."""
        return _frame(list(self.iter_rows()))

    def latest(self) -> pd.DataFrame:
        """One row per call key: its first done row when it has one, else its last error row."""
        best: dict[str, dict] = {}
        for r in self.iter_rows():
            k = r["call_key"]
            prev = best.get(k)
            if prev is None or prev.get("status") not in DONE_STATUSES:
                best[k] = r
        return _frame(list(best.values()))


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for c in CALL_FIELDS:
        if c not in df.columns:
            df[c] = pd.Series([None] * len(df), dtype=object)
    extra = [c for c in df.columns if c not in CALL_FIELDS]
    df = df[CALL_FIELDS + extra]
    if len(df):
        df["correct"] = df["correct"].astype(object).where(df["correct"].notna(), None)
    return df.reset_index(drop=True)
