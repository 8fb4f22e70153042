"""A mapping that keeps only its most recently used entries: for results an engine keeps per
request input (a text, a seed, an audio) so that repeating a request skips a phase, without
growing for as long as the process runs."""
from __future__ import annotations

import collections
import threading
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most `kept` entries. Reading an entry makes it the newest; adding one past the limit
    drops the least recently used. Safe for requests running at once (`compute.gpu_jobs` > 1)."""

    def __init__(self, kept: int) -> None:
        if kept < 1:
            raise ValueError(f"an LruCache keeps at least one entry, not {kept}")
        self.kept = kept
        self._entries: collections.OrderedDict[K, V] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            if key not in self._entries:
                return None
            self._entries.move_to_end(key)
            return self._entries[key]

    def __getitem__(self, key: K) -> V:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.kept:
                self._entries.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._entries))

    def values(self) -> list[V]:
        """The values, oldest first (reading them does not make them newer)."""
        with self._lock:
            return list(self._entries.values())

    def items(self) -> list[tuple[K, V]]:
        """The entries, oldest first (reading them does not make them newer)."""
        with self._lock:
            return list(self._entries.items())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
