"""The routing decisions, micro-batched (`DecisionBatcher`): every request's prompt is embedded in one worker thread,
never on the event loop; the first new prompt waits at most `batch_wait_ms` for others (or until `max_batch` are
queued), requests that arrive while the worker is busy join the next batch, and a batch that fails is retried prompt
by prompt so only the culprit's request fails. Each view of the router (an operating point, a cascade's grader) picks
from the batch's embeddings, after its OOD guard. An LRU of recent prompts (`embed_cache_size`, keyed by a SHA-256 of
the operating point and the text) keeps their decision: a repeated prompt is not re-embedded (the router and guard are
fixed, so the decision is what its embedding would give)."""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.serve.settings import ServeSettings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Decision:
    index: int  # into the router's agent order
    ood: bool
    cached: bool
    format: int = -1  # a format-guessing view's guess (index into its formats), -1: none or not guessed


class DecisionBatcher:
    """Embed-and-pick through a micro-batcher: one worker thread, batches of up to `max_batch` distinct prompts
    collected for at most `batch_wait_ms`, an LRU of decisions (one per app).

    Every operating point shares it: a request may name its own router view (`decide(text, view, tag)`); a prompt is
    embedded once per batch whatever the targets asking for it, and each target's view picks from that embedding.

    The wait applies only while other requests are `arriving` (counted by the app from the start of a request
    until it asks for its decision): a lone client never waits for a batch that nobody else will join.

    A batch that fails is retried prompt by prompt (in the worker thread), so one bad prompt fails only its own
    request. Each waiter gets the decision for its own text (matched by text, not by position).
    """

    def __init__(self, registered, backbone, settings: ServeSettings):
        self.registered, self.backbone, self.settings = registered, backbone, settings
        self._cache: collections.OrderedDict[bytes, tuple[int, bool, int]] = collections.OrderedDict()
        self._pending: list[tuple[bytes, str, Any, asyncio.Future]] = []
        self._worker: asyncio.Task | None = None
        self._joined: asyncio.Event | None = None  # set whenever a prompt is queued
        self.arriving = 0  # requests being read or validated (the app counts them): they may join the next batch
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="router-embed")
        self.batches: collections.Counter[int] = collections.Counter()  # batch size -> count (tests, benchmarks)

    def embed_isolated(self, texts: Sequence[str]) -> dict[str, np.ndarray | Exception]:
        """Blocking: text -> embedding row; when the batch fails, each text is retried alone so only culprits fail."""
        try:
            return dict(zip(texts, self.backbone.encode(list(texts)), strict=True))
        except Exception as exc:  # noqa: BLE001 - find the culprit(s) below
            if len(texts) == 1:
                return {texts[0]: exc}
            log.warning("embedding a batch of %d prompts failed (%s): retrying them one by one", len(texts),
                        type(exc).__name__)
        out: dict[str, np.ndarray | Exception] = {}
        for t in texts:
            try:
                out[t] = self.backbone.encode([t])[0]
            except Exception as exc:  # noqa: BLE001 - this prompt's own failure
                out[t] = exc
        return out

    def route_isolated(self, asks: Sequence[tuple[str, Any]]) -> list[tuple[int, bool, int] | Exception]:
        """Blocking: one outcome (pick, OOD fired, guessed format) per (text, router view): distinct texts embedded
        once, each view picks (after its OOD guard) for the rows that asked it. A view's `route(X)` returns
        (picks, fired) or, guessing answer formats, (picks, fired, formats)."""
        rows = self.embed_isolated(list(dict.fromkeys(t for t, _ in asks)))
        out: list = [rows[t] if isinstance(rows[t], Exception) else None for t, _ in asks]
        by_view: dict[int, list[int]] = {}
        for i, (_, view) in enumerate(asks):
            if out[i] is None:
                by_view.setdefault(id(view), []).append(i)
        for idx in by_view.values():
            view = asks[idx[0]][1]
            try:
                picks, fired, *guessed = view.route(np.stack([rows[asks[i][0]] for i in idx]))
                formats = guessed[0] if guessed else [-1] * len(idx)
                for i, p, f, g in zip(idx, picks, fired, formats, strict=True):
                    out[i] = (int(p), bool(f), int(g))
            except Exception as exc:  # noqa: BLE001 - this view's failure, not the other targets'
                for i in idx:
                    out[i] = exc
        return out

    async def decide(self, text: str, view=None, tag: str = "") -> Decision:
        """The pick for `text` by `view` (a view of the router at one operating point; default: the DecisionBatcher's
        own), cached under `tag` + text (the tag names the operating point)."""
        view = self.registered if view is None else view
        key = hashlib.sha256(tag.encode() + b"\0" + text.encode("utf-8", "surrogatepass")).digest()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return Decision(hit[0], hit[1], True, hit[2])
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((key, text, view, fut))
        if self._joined is None:
            self._joined = asyncio.Event()
        self._joined.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        idx, ood, fmt = await fut
        return Decision(idx, ood, False, fmt)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        wait_s = float(self.settings.batch_wait_ms) / 1000.0
        while self._pending:
            deadline = loop.time() + wait_s
            # let requests that are being read join, for at most wait_s
            while len(self._pending) < self.settings.max_batch and self.arriving > 0 and loop.time() < deadline:
                self._joined.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._joined.wait(), deadline - loop.time())
            batch = self._pending[: self.settings.max_batch]
            del self._pending[: len(batch)]
            live = [item for item in batch if not item[3].done()]
            if not live:
                continue
            self.batches[len({text for _, text, _, _ in live})] += 1  # batch size = distinct texts embedded
            asks = [(text, view) for _, text, view, _ in live]
            try:
                outcomes = await loop.run_in_executor(self._executor, self.route_isolated, asks)
            except Exception as exc:  # noqa: BLE001 - the executor itself failed (shut down): everyone's failure
                outcomes = [exc] * len(live)
            for (key, _, _, fut), out in zip(live, outcomes, strict=True):
                if fut.done():
                    continue
                if isinstance(out, BaseException):
                    fut.set_exception(out)
                else:
                    self._remember(key, out)
                    fut.set_result(out)

    def _remember(self, key: bytes, value: tuple[int, bool, int]) -> None:
        size = self.settings.embed_cache_size
        if size <= 0:
            return
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > size:
            self._cache.popitem(last=False)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
