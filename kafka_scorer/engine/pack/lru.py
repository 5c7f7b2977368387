"""The one least-recently-used store under a byte bound that the engine's caches keep their entries in.

The prefix cache (a template's head: keys and values per layer) and the embedding cache (a ColBERT
document's vectors, an image's features) differ in what an entry is and when one may be kept; they
share how entries are kept: by key, most recently used last, evicted oldest first until a new one fits,
with the bytes, the peak and the evictions counted. Both are read and changed from the packing and the
device threads, so every method takes the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class LruUsage:
    """What a store holds at one moment, read under its lock (the counters agree with each other)."""

    entries: int
    bytes: int
    peak_bytes: int
    evictions: int


class ByteBoundedLru(Generic[K, V]):
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = self._peak = self._evictions = 0

    def usage(self) -> LruUsage:
        with self._lock:
            return LruUsage(len(self._entries), self._bytes, self._peak, self._evictions)

    def values(self) -> list[V]:
        """What is kept now, least recently used first."""
        with self._lock:
            return [value for value, _ in self._entries.values()]

    def get(self, key: K) -> V | None:
        """The value kept under `key`, now the most recently used; None when absent."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V, size: int, *, evict: bool = True, replace: bool = True) -> bool:
        """Keep `value` (`size` bytes) under `key`, evicting the least recently used entries to make room
        (`evict=False`: only where there is room already); `replace=False` keeps an entry already there.
        False when it was not kept: larger than the whole bound, no room, or kept before."""
        if size > self.capacity_bytes:
            return False
        with self._lock:
            if key in self._entries:
                if not replace:
                    return False
                self._bytes -= self._entries.pop(key)[1]
            if not evict and self._bytes + size > self.capacity_bytes:
                return False
            while self._entries and self._bytes + size > self.capacity_bytes:
                _, (_, old) = self._entries.popitem(last=False)
                self._bytes -= old
                self._evictions += 1
            self._entries[key] = (value, size)
            self._bytes += size
            self._peak = max(self._peak, self._bytes)
            return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
