"""The extension tables: graders (pipeline/collect/grading.py), task sources (pipeline/tasks/sources.py), router
kinds (pipeline/route/routers.py) and pool kinds (resources/pool.py) are each one `Table`, name -> entry, that the
`register_*` functions add to.

A table reads like a dict (`in`, `[name]`, `.get`, iteration in registration order, `.keys()` a live view) and adds
what all four need: `register` (a name check, and a taken name refused unless `replace=True`), `lookup` (an unknown
name is one `RouterLiteError` naming it and listing the known ones), a loader of built-in entries that register
themselves on import (run before the first read), and `restored()`, the table given back as it was found (a test
or a plugin trial).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar

from pipeline.core.errors import RouterLiteError

T = TypeVar("T")


class Table(Mapping[str, T], Generic[T]):
    """Registered entries of one kind (`what`, e.g. "grader", "pool kind") by name.

    `entries`: the built-in entries by name. `builtins`: imports the modules whose entries register themselves (run
    once, before the first read). `on_change(table)`: runs after every change (views kept in step with the table)."""

    def __init__(self, what: str, entries: Mapping[str, T] | None = None, *,
                 builtins: Callable[[], None] | None = None, on_change: Callable[[Table[T]], None] | None = None):
        self.what = what
        self._entries: dict[str, T] = {}
        self._builtins, self._loaded = builtins, builtins is None
        self._on_change = on_change
        for name, entry in (entries or {}).items():
            self.register(name, entry)

    # ------------------------------------------------------------------------------------------------ reading
    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # before the imports: a built-in module registering itself reads the table too
            self._builtins()

    def __getitem__(self, name: str) -> T:
        self._load()
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Table({self.what!r}: {', '.join(self._entries)})"

    def lookup(self, name: str) -> T:
        """The entry of `name`; an unknown name -> one error naming it and the known ones."""
        self._load()
        entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is None:
            raise RouterLiteError(f"unknown {self.what} {name!r}; known {self.what}s: {', '.join(sorted(self))}")
        return entry

    # ------------------------------------------------------------------------------------------------ writing
    def register(self, name: str, entry: T, replace: bool = False) -> T:
        """Add `entry` under `name` (a non-empty name without '/': names end up in paths, task ids and partition
        keys). A name taken by another entry -> error unless `replace`; the same entry again changes nothing."""
        self.check_name(name)
        taken = self._entries.get(name)
        if taken is not None and taken is not entry and not replace:
            raise RouterLiteError(f"{self.what} {name!r} is already registered (replace=True to change it)")
        self._entries[name] = entry
        self._changed()
        return entry

    def check_name(self, name: str) -> None:
        """A name an entry may have; else one error naming it."""
        if not isinstance(name, str) or not name.strip() or name != name.strip() or "/" in name:
            raise RouterLiteError(f"a {self.what} name must be a non-empty string without '/' or surrounding spaces, "
                                  f"got {name!r}")

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self)

    @contextmanager
    def restored(self) -> Iterator[Table[T]]:
        """This table as it was on entry (built-ins loaded), restored on exit."""
        self._load()
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)
            self._changed()
