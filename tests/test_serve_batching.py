"""The router endpoint's micro-batcher (pipeline.serve.batching.DecisionBatcher) and input guards, without a model: a
backbone whose embedding encodes the prompt's number, so every decision can be checked against the prompt it answers."""
from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import numpy as np
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.core.text_guard import CHARS_PER_TOKEN, bad_text, cut_for_tokens, json_problem
from pipeline.serve.batching import DecisionBatcher
from pipeline.serve.requests import RequestError, parse_chat_request
from pipeline.serve.settings import ServeSettings

K = 7  # agents


class NumberBackbone:
    """encode("q123") -> rows whose first column is 123; refuses texts holding 'BAD' (like a tokenizer would)."""

    dim = 4

    def __init__(self, delay_s: float = 0.002):
        self.delay_s, self.calls, self.threads = delay_s, [], set()

    def encode(self, texts):
        self.calls.append(list(texts))
        self.threads.add(threading.current_thread().name)
        if any("BAD" in t for t in texts):
            raise RouterLiteError("prompt holds BAD")
        time.sleep(self.delay_s * len(texts))  # a forward pass: longer for bigger batches
        X = np.zeros((len(texts), self.dim), np.float32)
        X[:, 0] = [int(t[1:].split()[0]) for t in texts]
        return X


class NumberHead:
    """Picks agent n % K for prompt n; the guard 'fires' for multiples of 5."""

    def route(self, X):
        n = X[:, 0].astype(int)
        return n % K, n % 5 == 0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_pairing_under_concurrency():
    """300 concurrent decisions with random arrival: each gets the pick for its own prompt (a swap would show)."""
    router = DecisionBatcher(NumberHead(), NumberBackbone(),
                             ServeSettings(max_batch=16, batch_wait_ms=2, embed_cache_size=0))

    async def one(n):
        await asyncio.sleep(random.random() * 0.05)
        return n, await router.decide(f"q{n}")

    async def main():
        return await asyncio.gather(*[one(n) for n in range(300)])

    random.seed(0)
    outs = run(main())
    router.close()
    assert all(d.index == n % K and d.ood == (n % 5 == 0) and not d.cached for n, d in outs)
    assert max(router.batches) > 1 and sum(s * c for s, c in router.batches.items()) == 300  # batches did form
    assert max(router.batches) <= 16
    assert router.backbone.threads == {t for t in router.backbone.threads if t.startswith("router-embed")}


def test_batch_wait_collects_arriving_requests_into_one_forward():
    """While another request is being read (`arriving`), the first waits for it (at most batch_wait_ms)."""
    bb = NumberBackbone()
    router = DecisionBatcher(NumberHead(), bb, ServeSettings(max_batch=32, batch_wait_ms=500, embed_cache_size=0))

    async def late(n):
        await asyncio.sleep(0.05)
        router.arriving -= 1  # read and validated: asks for its decision
        return await router.decide(f"q{n}")

    async def main():
        router.arriving = 3
        return await asyncio.gather(router.decide("q0"), late(1), late(2), late(3))

    outs = run(main())
    router.close()
    assert [d.index for d in outs] == [0, 1, 2, 3]
    assert bb.calls == [["q0", "q1", "q2", "q3"]]


class ShiftedHead:
    """Another operating point of the same head: picks agent (n + 1) % K."""

    def route(self, X):
        n = X[:, 0].astype(int)
        return (n + 1) % K, np.zeros(len(n), bool)


def test_operating_points_share_one_embedding_per_prompt():
    """Two targets asking about the same prompt in one batch: embedded once, each target's view picks its own."""
    bb = NumberBackbone()
    router = DecisionBatcher(NumberHead(), bb, ServeSettings(max_batch=32, batch_wait_ms=500, embed_cache_size=16))
    shifted = ShiftedHead()

    async def late(coro):
        await asyncio.sleep(0.05)
        router.arriving -= 1
        return await coro

    async def main():
        router.arriving = 2
        return await asyncio.gather(router.decide("q3"), late(router.decide("q3", shifted, "other")),
                                    late(router.decide("q4", shifted, "other")))

    outs = run(main())
    again = run(router.decide("q3", shifted, "other"))  # cached under its own target, not the default's pick
    router.close()
    assert [d.index for d in outs] == [3, 4, 5]
    assert bb.calls == [["q3", "q4"]]
    assert (again.index, again.cached) == (4, True)


def test_a_lone_request_does_not_wait_for_a_batch():
    bb = NumberBackbone(delay_s=0)
    router = DecisionBatcher(NumberHead(), bb, ServeSettings(max_batch=32, batch_wait_ms=1000, embed_cache_size=0))

    async def main():
        t = time.perf_counter()
        d = await router.decide("q5")
        return d, time.perf_counter() - t

    d, seconds = run(main())
    router.close()
    assert d.index == 5 and seconds < 0.5


def test_max_batch_1_is_the_unbatched_path():
    bb = NumberBackbone()
    router = DecisionBatcher(NumberHead(), bb, ServeSettings(max_batch=1, batch_wait_ms=0, embed_cache_size=0))

    async def main():
        return await asyncio.gather(*[router.decide(f"q{n}") for n in range(8)])

    assert [d.index for d in run(main())] == [n % K for n in range(8)]
    router.close()
    assert all(len(c) == 1 for c in bb.calls) and len(bb.calls) == 8


def test_a_failing_prompt_fails_only_its_own_request():
    """Server half: the batch fails, its prompts are retried one by one, only the culprit fails."""
    bb = NumberBackbone()
    router = DecisionBatcher(NumberHead(), bb, ServeSettings(max_batch=32, batch_wait_ms=20, embed_cache_size=0))
    texts = [f"q{n}" for n in range(20)]
    texts.insert(7, "q999 BAD")

    async def main():
        return await asyncio.gather(*[router.decide(t) for t in texts], return_exceptions=True)

    outs = run(main())
    router.close()
    bad = [i for i, o in enumerate(outs) if isinstance(o, Exception)]
    assert bad == [7] and isinstance(outs[7], RouterLiteError)
    good = [o for i, o in enumerate(outs) if i != 7]
    assert [d.index for d in good] == [n % K for n in range(20)]
    assert len(bb.calls[0]) == 21  # one batch first, then each alone
    assert sorted(map(tuple, bb.calls[1:])) == sorted((t,) for t in texts)


def test_repeated_prompts_in_one_batch_are_embedded_once_and_cached():
    bb = NumberBackbone()
    router = DecisionBatcher(NumberHead(), bb, ServeSettings(max_batch=32, batch_wait_ms=20))

    async def main():
        first = await asyncio.gather(*[router.decide(f"q{n % 3}") for n in range(9)])
        return first, await router.decide("q1")

    first, again = run(main())
    router.close()
    assert [d.index for d in first] == [n % 3 for n in range(9)]
    assert bb.calls == [["q0", "q1", "q2"]] and again.cached and again.index == 1


# ------------------------------------------------------------------------------------------------ input guards
def body(**kw) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], **kw}).encode()


def test_lone_surrogate_is_refused_up_front():
    for raw in (b'{"messages":[{"role":"user","content":"\\ud800 x"}]}',
                b'{"messages":[{"role":"system","content":"\\udfff"},{"role":"user","content":"x"}]}',
                b'{"messages":[{"role":"user","content":"x"}],"stop":["\\ud800"]}',
                b'{"messages":[{"role":"user","content":"x"}],"\\ud800":1}'):
        with pytest.raises(RequestError) as ei:
            parse_chat_request(raw, "h", ServeSettings())
        assert ei.value.status == 400 and ei.value.code == "invalid_text", raw
        json.dumps(ei.value.body()).encode("utf-8")  # the message itself is valid text
    # a valid pair (an emoji as \\ud83d\\ude00) and RTL text are fine
    r = parse_chat_request(b'{"messages":[{"role":"user","content":'
                           b'"\\ud83d\\ude00 \\u202e\\u05e9\\u05dc\\u05d5\\u05dd"}]}',
                           "h", ServeSettings())
    assert r.text.startswith("\U0001f600")


def test_deep_json_is_400_not_recursion_error():
    """Deeply nested JSON is a 400 (json_too_deep), not a RecursionError."""
    for raw in (b"[" * 100000 + b"]" * 100000, b'{"a":' * 100000 + b"1" + b"}" * 100000,
                json.dumps({"messages": [{"role": "user", "content": "x"}], "x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
                    ]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}).encode()):
        with pytest.raises(RequestError) as ei:
            parse_chat_request(raw, "h", ServeSettings())
        assert ei.value.status == 400 and ei.value.code == "json_too_deep"
    parse_chat_request(body(x=[[[[1]]]]), "h", ServeSettings())  # ordinary nesting passes


def test_nan_and_infinity_are_not_json():
    for raw in (b'{"messages":[{"role":"user","content":"x"}],"temperature":NaN}',
                b'{"messages":[{"role":"user","content":"x"}],"tools":[Infinity]}'):
        with pytest.raises(RequestError) as ei:
            parse_chat_request(raw, "h", ServeSettings())
        assert ei.value.code == "invalid_json"


@pytest.mark.parametrize("kw", [dict(max_tokens=10 ** 23), dict(max_tokens=32769), dict(max_completion_tokens=10 ** 6),
                                dict(seed=1 << 63), dict(seed=-(1 << 63) - 1), dict(seed=1.5), dict(max_tokens=1e3),
                                dict(temperature=-0.1)])
def test_sampling_bounds(kw):
    """max_tokens over the cap and seeds outside 64 bits are 400s, not forwarded."""
    with pytest.raises(RequestError) as ei:
        parse_chat_request(body(**kw), "h", ServeSettings())
    assert ei.value.status == 400 and ei.value.code == "invalid_value" and ei.value.param == next(iter(kw))


def test_sampling_bounds_accept_the_edges_and_follow_the_profile_cap():
    from pipeline.collect.settings import CollectionSettings

    r = parse_chat_request(body(max_tokens=32768, seed=(1 << 63) - 1), "h", ServeSettings())
    assert r.upstream["max_tokens"] == 32768 and r.upstream["seed"] == (1 << 63) - 1
    parse_chat_request(body(seed=-(1 << 63)), "h", ServeSettings())
    s = ServeSettings.from_collection(CollectionSettings(max_tokens=4096))
    assert s.max_tokens_cap == 4096
    parse_chat_request(body(max_tokens=4096), "h", s)
    with pytest.raises(RequestError, match=r"\[1, 4096\]"):
        parse_chat_request(body(max_tokens=4097), "h", s)


def test_text_guard_helpers():
    assert bad_text("plain") is None and bad_text("caf\u00e9 \u202e") is None
    assert "U+D800" in bad_text("ab\ud800")
    assert "byte 0xE9 at character 3" in bad_text("caf\udce9")  # what argv gives for b"caf\xe9"
    long = ("word " * 100000)[:-1]
    cut = cut_for_tokens(long, 128)
    assert len(cut) <= 128 * CHARS_PER_TOKEN and long.startswith(cut) and not cut.endswith(" ")
    assert cut_for_tokens("short text", 128) == "short text"
    assert len(cut_for_tokens("x" * 10 ** 6, 4)) == 4 * CHARS_PER_TOKEN  # no whitespace: cut at the bound
    assert json_problem({"a": [{"b": "c"}]}, 3) is None
    assert json_problem({"a": [{"b": "c"}]}, 2)[1].startswith("JSON nested")
    assert json_problem({"a": ["ok", "\ud800"]}, 5)[0] == "a[1]"
