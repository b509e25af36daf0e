"""A small thread-safe least-recently-used cache, bounded by entries and by bytes.

The in-process caches that repeated loads reuse (decoded XNNPACK graphs, written
one-delegate flatbuffers, load-time verdicts) hold one entry per delegate of a program; a
program can have hundreds of delegates, and a cache bounded by fewer entries than a
program has would evict each entry just before the next load asks for it. So each cache
holds many entries and is bounded by the bytes its values stand for as well. Imports no
torch.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Key", "Lru"]

V = TypeVar("V")


class Key:
    """A tuple as a cache key, hashed once (the tuples these caches are keyed by hold many
    frozen descriptions, whose hashes Python computes afresh on every dictionary use)."""

    __slots__ = ("_hash", "items")

    def __init__(self, *items: object) -> None:
        self.items = items
        self._hash = hash(items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and (
            self is other or (self._hash == other._hash and self.items == other.items)
        )


class Lru(Generic[V]):
    """At most ``entries`` values whose costs (bytes, as the caller counts them) sum to at
    most ``budget``; the least recently used go first. A value costing more than the
    budget is not kept."""

    def __init__(self, entries: int, budget: int) -> None:
        self.entries = entries
        self.budget = budget
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._cost = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        """The value kept for ``key`` (now the most recently used), or None. (Each of the
        dictionary's operations is atomic; only :meth:`put`'s sequence takes the lock. A
        key evicted between the two is a hit that stays evicted.)"""
        items = self._items
        hit = items.get(key)
        if hit is None:
            return None
        # (not contextlib.suppress: this is every load's lookup, and that costs 0.3 us)
        try:  # noqa: SIM105
            items.move_to_end(key)
        except KeyError:
            pass
        return hit[0]

    def take(self, key: Hashable) -> V | None:
        """The value kept for ``key``, no longer kept (None: none): of two callers taking
        the same key at once, one gets it."""
        with self._lock:
            hit = self._items.pop(key, None)
            if hit is None:
                return None
            self._cost -= hit[1]
            return hit[0]

    def put(self, key: Hashable, value: V, cost: int = 0) -> None:
        """Keep ``value`` for ``key``, evicting the least recently used beyond the bounds."""
        if cost > self.budget:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._cost -= old[1]
            self._items[key] = (value, cost)
            self._cost += cost
            while len(self._items) > self.entries or self._cost > self.budget:
                _, (_, c) = self._items.popitem(last=False)
                self._cost -= c

    def values(self) -> list[V]:
        """The values kept now, least recently used first."""
        with self._lock:  # (one C call copies them: a get's reordering cannot interleave)
            kept = list(self._items.values())
        return [v for v, _ in kept]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._cost = 0

    def __len__(self) -> int:
        return len(self._items)
