"""One collection at a time per call-log directory.

The call log has one writer per directory by design (`pipeline.collect.call_log`); two collections of the same partition
at once (a UI backfill next to `make run`, two `router-lite run`) would each read the same "done" keys and make the
missing calls twice, doubling a paid provider's bill. `collection_lock` holds an exclusive `flock` on
`<call-log dir>/.collect.lock` for the whole collection of a partition. The kernel drops the lock when its holder
exits, even on kill -9, so a crashed run never leaves a stale lock behind. `flock` locks belong to an open file,
so two runs in one process (threads) exclude each other as two processes do.

A second collector fails at once with "collection for <partition> is running (pid N)", or, asked to wait, waits
until the first is done (and then makes only the calls still missing: none, when the first finished).
"""
from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.core.errors import RouterLiteError

LOCK_FILE = ".collect.lock"
POLL_S = 0.2


def wait_setting(value: str | None) -> float | None:
    """How long a second collector waits: 0.0 = fail at once, None = as long as it takes, else seconds."""
    text = (value or "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return 0.0
    if text in ("1", "true", "yes", "on", "forever"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise RouterLiteError(f"collection wait setting {value!r} must be true/false or a number of seconds") from None
    if not seconds >= 0:
        raise RouterLiteError(f"collection wait setting {value!r} must be >= 0 seconds")
    return seconds


def _holder(fh) -> str:
    fh.seek(0)
    return fh.read().strip() or "unknown"


@contextmanager
def collection_lock(directory: str | Path, partition: str, wait: float | None = 0.0) -> Iterator[None]:
    """Hold the collection lock of the call log in `directory` (created if needed) for the `with` body."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fh = open(directory / LOCK_FILE, "a+")  # noqa: SIM115 - held open for the lock's lifetime
    try:
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    waited = f" after waiting {wait:g} s" if wait else ""
                    raise RouterLiteError(
                        f"collection for {partition} is running (pid {_holder(fh)}){waited}: its call log {directory} "
                        f"is locked. Let it finish, or ask to wait for it (router-lite run --wait-for-collection, or "
                        f"run config ops: {{graded_calls: {{config: {{wait_for_collection: 'true'}}}}}})") from None
                time.sleep(POLL_S)
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()  # no stale pid for the next holder's rivals to read
    finally:
        fh.close()  # closing the file releases the lock
