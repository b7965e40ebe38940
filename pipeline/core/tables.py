"""The extension tables (graders, task sources, router types; pool kinds in resources/pool.py) are module-level
dicts that `register_*` functions add to. `restored` gives a test (or a plugin trial) a table back as it found it."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def restored(table: dict, after: Callable[[], None] | None = None) -> Iterator[dict]:
    """`table` as it was on entry, restored on exit (`after` runs once restored: views kept in step with it)."""
    saved = dict(table)
    try:
        yield table
    finally:
        table.clear()
        table.update(saved)
        if after is not None:
            after()
