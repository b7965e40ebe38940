"""The serve view cache: one LRU rule for a router's views (by target, by target and answer format, format-guessing)."""
import pytest

from pipeline.serve.served import ViewCache


def test_least_recently_used_goes_first_and_the_pinned_default_never():
    made = []
    cache = ViewCache(3, pinned={"parity": "default view"})

    def make(key):
        return lambda: made.append(key) or f"view {key}"

    for key in ("a", "b", "a", "c"):  # "a" used again: "b" is the least recently used
        cache.get(key, make(key))
    assert made == ["a", "b", "c"] and len(cache) == 3
    assert cache["parity"] == "default view"
    assert cache.get("a", make("a")) == "view a" and made == ["a", "b", "c"]  # kept: not made again
    cache.get("b", make("b"))  # made again, as any dropped view is
    assert made == ["a", "b", "c", "b"]


def test_every_key_resolves_however_many_distinct_ones_come_and_the_size_stays_bounded():
    cache = ViewCache(4)
    for i in range(100):
        assert cache.get(i, lambda i=i: i * i) == i * i
    assert len(cache) == 4  # bounded, whatever the clients send


def test_a_failing_make_caches_nothing():
    cache = ViewCache(2)

    def bad():
        raise ValueError("unknown target")

    with pytest.raises(ValueError):
        cache.get("x", bad)
    assert len(cache) == 0
    assert cache.get("x", lambda: "now good") == "now good"
