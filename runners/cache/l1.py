"""L1: a per-process LRU of feature rows, bounded in bytes, with a TTL per entry.

Layout: rows live in one preallocated slab ``[capacity, F]`` float32, so a batch lookup is a
single fancy-index gather and a batch insert a single scatter, not one small array per entry.
An ``OrderedDict`` maps node id -> slab slot and keeps the recency order (least recent first);
``_expiry[slot]`` holds each entry's deadline on the injectable ``clock``. Per id that costs one
C-level dict lookup and one ``move_to_end``; a vectorised numpy open-addressing table was measured
and was slower at 276 and at 3000 ids (many small probe rounds), so the dict stays.

Byte bound: every entry is charged its row bytes plus ``ENTRY_OVERHEAD_BYTES`` for the index
(dict entry, linked-list node, boxed ints, deadline; measured with tracemalloc), so
``capacity = max_bytes // (4 * F + ENTRY_OVERHEAD_BYTES)`` and ``nbytes <= max_bytes`` always.
The slab is ``np.empty``: pages that were never written are never committed.

Eviction is exact LRU and happens only on insert, when no free slot is left. Expired entries are
dropped lazily when a ``get`` meets them (counted as ``expired``, and a miss); until then they
sit in the LRU order like any other entry and leave through eviction.

Not thread-safe: the feature runner uses it from its event loop only. ``get_many`` / ``put_many``
are synchronous (no I/O); ``get`` / ``put`` wrap them for the ``FeatureLevel`` protocol.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

import numpy as np

from .base import ROW_DTYPE, as_ids

ENTRY_OVERHEAD_BYTES = 176


def _consume(it: Iterator[object]) -> None:
    collections.deque(it, maxlen=0)


class L1Cache:
    name = "l1"

    def __init__(
        self,
        max_bytes: int,
        ttl_s: float,
        dim: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dim = dim
        self.ttl_s = float(ttl_s)
        self.max_bytes = int(max_bytes)
        self.entry_bytes = dim * np.dtype(ROW_DTYPE).itemsize + ENTRY_OVERHEAD_BYTES
        self.capacity = max(0, self.max_bytes // self.entry_bytes)
        self._clock = clock
        self._slab = np.empty((self.capacity, dim), dtype=ROW_DTYPE)
        self._expiry = np.empty(self.capacity, dtype=np.float64)
        self._index: OrderedDict[int, int] = OrderedDict()
        self._free: list[int] = []  # slots given back by eviction/expiry
        self._high_water = 0  # slots [0, high_water) have been handed out at least once
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        return len(self._index) * self.entry_bytes

    def __contains__(self, node_id: int) -> bool:
        """Presence without touching recency or counters (expired entries still count)."""
        return int(node_id) in self._index

    def get_many(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = as_ids(ids)
        n = ids.size
        if n == 0 or not self._index:
            self.misses += n
            return np.zeros(n, dtype=bool), np.empty((0, self.dim), dtype=ROW_DTYPE)
        index = self._index
        slots = self._lookup(ids)
        found = slots >= 0
        hit_slots = slots[found]
        if hit_slots.size:
            stale = self._expiry[hit_slots] <= self._clock()
            if stale.any():
                stale_pos = np.flatnonzero(found)[stale]
                for i in ids[stale_pos].tolist():
                    slot = index.pop(i, None)  # None: a duplicate id already dropped
                    if slot is not None:
                        self._free.append(slot)
                found[stale_pos] = False
                hit_slots = hit_slots[~stale]
                self.expired += int(stale_pos.size)
            _consume(map(index.move_to_end, ids[found].tolist()))
        n_hit = int(hit_slots.size)
        self.hits += n_hit
        self.misses += n - n_hit
        return found, self._slab[hit_slots]

    def put_many(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Insert or refresh ``ids`` (unique expected; a duplicate keeps its last row).

        A batch larger than the cache keeps its tail.
        """
        ids = as_ids(ids)
        rows = np.asarray(rows, dtype=ROW_DTYPE).reshape(ids.size, self.dim)
        if ids.size == 0 or self.capacity == 0:
            return
        if ids.size > self.capacity:
            ids, rows = ids[-self.capacity :], rows[-self.capacity :]
        deadline = self._clock() + self.ttl_s
        index = self._index
        slots = self._lookup(ids)
        present = slots >= 0
        if present.any():
            old = slots[present]
            self._slab[old] = rows[present]
            self._expiry[old] = deadline
            _consume(map(index.move_to_end, ids[present].tolist()))
        new = np.flatnonzero(~present)
        if new.size:
            # Present ids were just moved to the MRU end, so they survive this eviction.
            new_slots = self._alloc(int(new.size))
            self._slab[new_slots] = rows[new]
            self._expiry[new_slots] = deadline
            new_ids = ids[new].tolist()
            before = len(index)
            index.update(zip(new_ids, new_slots.tolist()))
            if len(index) - before != len(new_ids):
                self._release_shadowed(new_ids, new_slots)

    def _lookup(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each id, -1 when absent. map() over the C methods beats a generator by ~30%."""
        n = ids.size
        return np.fromiter(
            map(self._index.get, ids.tolist(), itertools.repeat(-1, n)), dtype=np.int64, count=n
        )

    def _alloc(self, k: int) -> np.ndarray:
        """``k`` free slots, evicting least-recently-used entries when there are too few."""
        fresh = self.capacity - self._high_water
        short = k - len(self._free) - fresh
        if short > 0:
            pop_lru = self._index.popitem
            self._free.extend(pop_lru(last=False)[1] for _ in range(short))
            self.evictions += short
        from_fresh = min(k, fresh)
        taken = np.arange(self._high_water, self._high_water + from_fresh, dtype=np.int64)
        self._high_water += from_fresh
        rest = k - from_fresh
        if rest == 0:
            return taken
        reused = np.array(self._free[-rest:], dtype=np.int64)
        del self._free[-rest:]
        return np.concatenate([taken, reused])

    def _release_shadowed(self, new_ids: list[int], new_slots: np.ndarray) -> None:
        """A duplicated id got two slots and kept the last: free the others (misuse path)."""
        index = self._index
        self._free.extend(s for i, s in zip(new_ids, new_slots.tolist()) if index[i] != s)

    def clear(self) -> None:
        self._index.clear()
        self._free.clear()
        self._high_water = 0

    async def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.get_many(ids)

    async def put(self, ids: np.ndarray, rows: np.ndarray) -> None:
        self.put_many(ids, rows)

    def stats(self) -> dict[str, int]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "expired": self.expired,
            "entries": len(self._index),
            "bytes": self.nbytes,
            "capacity_bytes": self.max_bytes,
        }
