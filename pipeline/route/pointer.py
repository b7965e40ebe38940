"""The served pointer `registry/latest.json` and the promotion history `registry/promotions.jsonl`.

The pointer names the router `serve` and `publish` follow. Its paths are stored relative to the registry root (the
folder the pointer lies in), so a home copied elsewhere (`cp -a`) serves its own files; reading resolves them
against that root and refuses one that lands outside it (an absolute path into another home, `..`, an entry that
is a symlink to a folder elsewhere). A pointer written before paths were relative (absolute, inside this registry)
still reads and is rewritten relative. Every malformed pointer is one error naming the file and the field.

Schema (docs/architecture.md, "The registry"): `name`, `path` (relative), `kind`, `promoted_at` (UTC ISO 8601),
`promoted_by` (gate | promote | rollback), `head` {name, path} (the prompt router of the run), `star` (what the
promoted router stands for at the serving target), `target`, `evidence` (relative path of its per-row held-out
figures). Only `name` and `path` are required (a pointer of an older release has no more).

History: one JSON object per line, appended for every verdict: `at`, `action` (promoted | refused | rolled back),
`by` (gate | promote | rollback), `name`, `path`, `kind`, `target`, `reason`, `evidence`, `verdict`, `previous`
{name, path}. No line is appended after a junk one: each writer first sets lines that are not JSON objects aside,
verbatim, in promotions.invalid.jsonl and says so (`repaired` in the line it appends).
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from pipeline.core.errors import RouterLiteError
from pipeline.core.io import atomic_write_json, atomic_write_text

LATEST = "latest.json"
HISTORY = "promotions.jsonl"
SCHEMA = 2  # 1: {name, path (absolute), head, star}; 2: relative paths and the promotion fields
OPTIONAL_STR = ("kind", "promoted_at", "promoted_by", "target", "evidence")


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def inside(root: Path, stored, where: str) -> Path:
    """`stored` (a pointer's path: relative to `root`, or an old absolute one) resolved, symlinks followed; outside
    the registry `root` -> one error naming `where` (the file and field)."""
    if not isinstance(stored, str) or not stored:
        raise RouterLiteError(f"{where} must be a non-empty string (a registry entry's path), got {stored!r}")
    p = Path(stored)
    real, home = (p if p.is_absolute() else Path(root) / p).resolve(), Path(root).resolve()
    if real == home or not real.is_relative_to(home):
        raise RouterLiteError(f"{where} {stored!r} resolves to {real}, outside the registry {home}: re-promote "
                              "an entry of this registry (`router-lite promote NAME`)")
    return real


def relative(root: Path, path) -> str:
    """`path` (absolute or relative to `root`) as stored in a pointer: relative to the registry root."""
    real = inside(root, str(path), f"registry entry {path}")
    return real.relative_to(Path(root).resolve()).as_posix()


def mark_latest(root: Path, name: str, path: Path, **fields) -> None:
    """Point latest.json at `name` / `path` (stored relative); `fields` (head={name, path}, star, kind, promoted_at,
    ...) are stored beside them, a head's path relative too. Atomic: a reader sees the old pointer or the new."""
    root = Path(root)
    if isinstance(fields.get("head"), dict):
        fields["head"] = {**fields["head"], "path": relative(root, fields["head"]["path"])}
    atomic_write_json({"schema": SCHEMA, "name": name, "path": relative(root, path), **fields}, root / LATEST)


def _check(f: Path, entry) -> None:
    if not isinstance(entry, dict):
        raise RouterLiteError(f"{f}: a JSON object is expected, got {type(entry).__name__}")
    for key in ("name", "path"):
        if key not in entry:
            raise RouterLiteError(f"{f}: required field {key!r} is missing")
        if not isinstance(entry[key], str) or not entry[key]:
            raise RouterLiteError(f"{f}: field {key!r} must be a non-empty string, got {type(entry[key]).__name__}")
    for key in OPTIONAL_STR:
        if entry.get(key) is not None and not isinstance(entry[key], str):
            raise RouterLiteError(f"{f}: field {key!r} must be a string, got {type(entry[key]).__name__}")
    head = entry.get("head")
    if head is not None and not (isinstance(head, dict) and all(isinstance(head.get(k), str) and head[k]
                                                                for k in ("name", "path"))):
        raise RouterLiteError(f"{f}: field 'head' must be an object with string 'name' and 'path'")
    if entry.get("star") is not None and not isinstance(entry["star"], dict):
        raise RouterLiteError(f"{f}: field 'star' must be an object, got {type(entry['star']).__name__}")


_READ = object()  # read latest.json from the file


def read_latest(root: Path, raw=_READ) -> dict | None:
    """latest.json under `root` as stored (checked, paths as written), None when there is none; `raw`: its bytes as
    a caller already read them (None: no file), so that what is parsed is what the caller saw."""
    f = Path(root) / LATEST
    if raw is _READ:
        raw = f.read_bytes() if f.exists() else None
    if raw is None:
        return None
    try:
        entry = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RouterLiteError(f"{f} is corrupt (not JSON: {exc})") from None
    _check(f, entry)
    return entry


def latest_entry(root: Path, raw=_READ) -> dict | None:
    """latest.json under `root` (None when no router is promoted), checked, with `path` (and `head.path`) resolved
    against `root` to absolute paths inside it; an entry written before the ★ router was named gets "head" =
    itself. An old absolute pointer into this registry is rewritten relative (best effort: a read-only home still
    reads). `raw`: as `read_latest`'s."""
    root = Path(root)
    stored = read_latest(root, raw)
    if stored is None:
        return None
    f = root / LATEST
    entry = dict(stored)
    entry.setdefault("head", {"name": entry["name"], "path": entry["path"]})
    entry["path"] = str(inside(root, entry["path"], f"{f}: field 'path'"))
    entry["head"] = {**entry["head"], "path": str(inside(root, entry["head"]["path"], f"{f}: field 'head.path'"))}
    if Path(stored["path"]).is_absolute() or Path(stored.get("head", {}).get("path", "")).is_absolute():
        try:  # migrate: the same pointer, relative
            mark_latest(root, **{k: v for k, v in entry.items() if k != "schema"})
        except OSError:
            pass
    return entry


def latest_path(root: Path) -> Path | None:
    """The directory of the promoted router under `root` (resolved and checked), None when none is."""
    entry = latest_entry(root)
    return Path(entry["path"]) if entry else None


INVALID = "promotions.invalid.jsonl"  # lines set aside from the history (not JSON objects), kept as they were
_HISTORY_LOCK = ".promotions.lock"  # serialises a repair with the appends (a gate in the daemon, a CLI override)


@contextmanager
def _history_locked(root: Path):
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / _HISTORY_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, even on kill -9
        yield


def _parsed(f: Path) -> tuple[list[dict], list[tuple[int, str]], list[str]]:
    """(the history's records, its lines that are not JSON objects as (line number, text), the records' lines as
    written), blank lines skipped."""
    good, bad, kept = [], [], []
    if not f.exists():
        return good, bad, kept
    for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            good.append(rec)
            kept.append(line)
        else:
            bad.append((i, line))
    return good, bad, kept


def _repair(root: Path) -> str | None:
    """Under the history lock: set the junk lines aside (appended to INVALID, verbatim) and rewrite the history
    without them, atomically; what was done, or None when the history was clean."""
    f = root / HISTORY
    _, bad, kept = _parsed(f)
    if not bad:
        return None
    with open(root / INVALID, "a") as out:  # first kept, then removed: a crash in between loses nothing
        out.writelines(f"{line}\n" for _, line in bad)
        out.flush()
        os.fsync(out.fileno())
    atomic_write_text("".join(f"{line}\n" for line in kept), f)
    lines = ", ".join(str(i) for i, _ in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    return (f"repaired {f}: line{'s' if len(bad) > 1 else ''} {lines} {'were' if len(bad) > 1 else 'was'} not a "
            f"JSON object; set aside verbatim in {root / INVALID}, the history goes on without "
            f"{'them' if len(bad) > 1 else 'it'}")


def repair_history(root: Path) -> str | None:
    """Set aside the history's lines that are not JSON objects (a hand edit, a truncated write), saying so: the
    message (None: nothing to repair). Every writer repairs first, so no record is appended after a junk line."""
    root = Path(root)
    if not (root / HISTORY).exists():
        return None
    with _history_locked(root):
        return _repair(root)


def append_history(root: Path, record: dict) -> dict:
    """One line of registry/promotions.jsonl (`at` stamped now when absent), written in one append, after the
    history's junk lines are set aside (`repair_history`; the record then says so in `repaired`)."""
    root = Path(root)
    record = {"at": utc_now(), **record}
    with _history_locked(root):
        repaired = _repair(root)
        if repaired:
            record["repaired"] = repaired
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        fd = os.open(root / HISTORY, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    return record


def history(root: Path) -> list[dict]:
    """The promotion history, oldest first (a line that is not a JSON object -> one error naming the line and the
    repair: `router-lite promotions --repair`, or any promotion, sets it aside)."""
    f = Path(root) / HISTORY
    good, bad, _ = _parsed(f)
    if bad:
        raise RouterLiteError(f"{f}: line {bad[0][0]} is not a JSON object (`router-lite promotions --repair` sets "
                              "such lines aside, kept verbatim)")
    return good


def served_stack(records: list[dict]) -> list[dict]:
    """The promotions still standing, oldest first: each promotion pushes its router, each rollback pops one; the
    last is the router served, the one before it what `rollback` returns to."""
    stack: list[dict] = []
    for r in records:
        if r.get("action") == "promoted":
            stack.append(r)
        elif r.get("action") == "rolled back" and stack:
            stack.pop()
    return stack


EVIDENCE = "evidence"  # registry/evidence/<name>.json: a promoted router's per-row held-out outcome


def save_evidence(root: Path, ev: dict, rel: str | None = None) -> str:
    """Store a candidate's evidence (pipeline.report.promotion.evidence) at `rel` (relative to the registry, inside
    it; default evidence/<name>.json); its path relative to the registry."""
    rel = rel or f"{EVIDENCE}/{ev['name']}.json"
    atomic_write_json(ev, inside(root, rel, "evidence"))
    return rel


def load_evidence(root: Path, rel) -> dict | None:
    """The evidence a pointer names (None when it names none, or it is gone or unreadable: the next candidate then
    stands on its own evidence)."""
    if not isinstance(rel, str) or not rel:
        return None
    try:
        f = inside(root, rel, "evidence")
        ev = json.loads(f.read_text())
    except (RouterLiteError, OSError, ValueError):
        return None
    ok = isinstance(ev, dict) and all(isinstance(ev.get(k), list) for k in ("task_ids", "reward", "cost", "agents"))
    return ev if ok and len(ev["reward"]) == len(ev["cost"]) == len(ev["task_ids"]) else None


def promote(root: Path, entry: dict, *, by: str, reason: str, verdict: dict | None = None) -> dict:
    """Point latest.json at `entry` ({name, path, kind, and optionally target, head, star, evidence}) and append the
    history line (`by`: gate | promote | rollback; `previous`: what the pointer named before). Returns the line."""
    root = Path(root)
    try:
        current = read_latest(root)
    except RouterLiteError:  # a malformed pointer is replaced (by hand: the operator's repair), named in the line
        current = {"name": "(malformed latest.json)", "path": ""}
    now = utc_now()
    fields = {k: entry[k] for k in ("kind", "target", "head", "star", "evidence") if entry.get(k) is not None}
    mark_latest(root, entry["name"], entry["path"], **fields, promoted_at=now, promoted_by=by)
    return append_history(root, {
        "at": now, "action": "rolled back" if by == "rollback" else "promoted", "by": by, "name": entry["name"],
        "path": relative(root, entry["path"]), "kind": entry.get("kind"), "target": entry.get("target"),
        "evidence": entry.get("evidence"), "reason": reason, "verdict": verdict,
        "previous": None if current is None else {"name": current["name"], "path": current["path"]}})
