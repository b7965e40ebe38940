"""Following promotions without a restart: `PointerFollower` polls the registry's pointer (`registry/latest.json`,
read only through `pipeline.route.registry.latest_entry` / `latest_path`) and swaps the router an app serves.

Every `interval_s` seconds the pointer's bytes are hashed; when they changed and name another router than the one
served, the new router is loaded and checked in a thread (`registry.load`, then `served_router`: backbone, agents in
the pool, the server's default target among its operating points, the default answer format), warmed beside the old
one (one embedding and one decision through the app's batcher), and swapped in with one assignment of
`app.state.served` (an immutable `ServedRouter`): requests that started on the old router finish on it, later ones
take the new one. A candidate that fails at any step is never swapped in: the old router keeps serving, and the
failure is logged once and counted once per pointer content (the same content is not tried again: re-promote, which
rewrites the pointer, to retry) and shown by `/readyz`. A pointer rewritten to name the served router again only
updates its promotion record.

Each `serve --workers N` worker runs its own follower (the app's lifespan starts it), so the workers swap
independently, each within about one interval of the pointer's change.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.core.errors import RouterLiteError
from pipeline.route import registry
from pipeline.serve.served import origin_of, served_router, warm

log = logging.getLogger(__name__)


class PointerFollower:
    """Follow `root`/latest.json for an app (`run(app)` is its background task). `formats_for(registered)`: the
    answer-format guess of a cascade (None: none), computed with the router as it loads."""

    def __init__(self, root, interval_s: float, formats_for: Callable | None = None):
        if not float(interval_s) > 0:
            raise RouterLiteError(f"follow interval {interval_s!r} must be > 0 seconds")
        self.root, self.interval_s, self.formats_for = Path(root), float(interval_s), formats_for
        self.seen: str | None = None  # sha256 of the pointer bytes last acted on
        self.swaps = self.failures = 0
        self.last_failure: dict | None = None

    @property
    def pointer(self) -> Path:
        return self.root / registry.LATEST

    def status(self) -> dict:
        """What `/readyz` shows of the follower."""
        failure = None if self.last_failure is None else {**self.last_failure,
                                                           "current": self.last_failure["pointer_sha256"] == self.seen}
        return {"pointer": str(self.pointer), "interval_s": self.interval_s, "swaps": self.swaps,
                "failures": self.failures, "last_failure": failure}

    async def run(self, app) -> None:
        while True:
            try:
                await self.poll(app)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a follower that dies would silently stop following
                log.exception("following %s failed; trying again in %.1f s", self.pointer, self.interval_s)
            await asyncio.sleep(self.interval_s)

    async def poll(self, app) -> bool:
        """Act on the pointer once; True when a new router was swapped in."""
        raw = await asyncio.to_thread(self._pointer_bytes)
        sha = hashlib.sha256(raw or b"").hexdigest()
        if sha == self.seen:
            return False
        self.seen = sha
        current, metrics, path = app.state.served, app.state.metrics, None
        try:
            # the bytes just hashed are the ones parsed: a pointer that moves meanwhile is the next poll's
            entry, path = await asyncio.to_thread(_read_pointer, self.root, raw)
            origin = origin_of(entry, path)
            if _same_dir(path, current.origin.get("path")):  # re-promoted to the router being served
                if (origin["promoted_at"], origin["promoted_source"]) != (current.origin["promoted_at"],
                                                                          current.origin["promoted_source"]):
                    app.state.served = current.with_origin(origin)
                    if metrics is not None:
                        metrics.router(app.state.served, current)
                return False
            fresh = await asyncio.to_thread(self._load, path, current.endpoint, origin)
            await warm(fresh)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of a candidate keeps the old router serving
            self._failed(sha, path, exc, metrics)
            return False
        app.state.served = fresh  # the swap: later requests take the new router
        fresh.endpoint.retired.add(current.router_name)  # clients that pinned its name (models.list) keep working
        fresh.endpoint.retired.discard(fresh.router_name)
        self.swaps += 1
        if metrics is not None:
            metrics.swaps.inc()
            metrics.router(fresh, current)
        log.info("router-lite serve: following %s: now serving %s %s (was %s)", self.pointer,
                 fresh.registered.kind, fresh.router_name, current.router_name)
        return True

    def _pointer_bytes(self) -> bytes | None:
        try:
            return self.pointer.read_bytes()
        except FileNotFoundError:
            return None

    def _load(self, path: Path, endpoint, origin: dict):
        reg = registry.load(path)
        formats = self.formats_for(reg) if self.formats_for is not None and reg.needs_grader else None
        return served_router(reg, endpoint, formats=formats, origin=origin)

    def _failed(self, sha: str, path, exc: BaseException, metrics) -> None:
        why = str(exc) if isinstance(exc, RouterLiteError) else f"{type(exc).__name__}: {exc}"
        self.failures += 1
        self.last_failure = {"pointer_sha256": sha, "path": None if path is None else str(path), "error": why[:1000],
                             "at": time.time()}
        if metrics is not None:
            metrics.swap_failures.inc()
        log.error("router-lite serve: following %s: not swapping to %s: %s; still serving the current router",
                  self.pointer, path or "(no router)", why)


def _read_pointer(root: Path, raw: bytes | None):
    """(entry, router directory) the pointer `raw` (its bytes, None: no file) names; a missing or unreadable pointer
    -> RouterLiteError."""
    try:
        entry = registry.latest_entry(root, raw)
        path = None if entry is None else entry["path"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RouterLiteError(f"{Path(root) / registry.LATEST} is not a valid pointer: {type(exc).__name__}: "
                              f"{exc}") from None
    if entry is None or path is None:
        raise RouterLiteError(f"{Path(root) / registry.LATEST} is missing")
    return entry, Path(path)


def _same_dir(a, b) -> bool:
    if a is None or b is None:
        return False
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False
