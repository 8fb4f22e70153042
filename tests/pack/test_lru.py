"""LruCache: the bounded map the engines keep per-request results in (IndexTTS-2's emotion
readings, issue 25): at most `kept` entries, the least recently used dropped first."""
from __future__ import annotations

import pytest

from mizuoto_runtime.lru import LruCache


def test_the_least_recently_used_entry_is_dropped() -> None:
    cache: LruCache[str, int] = LruCache(2)
    cache["a"], cache["b"] = 1, 2
    assert cache["a"] == 1  # reading makes "a" the newest
    cache["c"] = 3
    assert list(cache) == ["a", "c"] and "b" not in cache and len(cache) == 2
    cache["a"] = 4  # writing too
    cache["d"] = 5
    assert cache.items() == [("a", 4), ("d", 5)]
    assert cache.get("c") is None
    with pytest.raises(KeyError):
        cache["c"]
    cache.clear()
    assert len(cache) == 0


def test_it_keeps_at_least_one_entry() -> None:
    with pytest.raises(ValueError, match="at least one"):
        LruCache(0)
