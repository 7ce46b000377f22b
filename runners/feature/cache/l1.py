"""L1: a per-process LRU of feature rows, bounded in bytes, with a TTL per entry; all numpy.

Node ids are dense (``[0, num_nodes)``), so the index is a direct map, not a hash table:

* ``_slot_of[id]`` -> slab slot or -1 (int32, one per node id: 0.4 MB at 100k nodes);
* ``_slab[slot]`` holds the row, ``_id_of[slot]`` its id (-1: free), ``_expiry[slot]`` its
  deadline on the injectable ``clock`` and ``_last_use[slot]`` a logical timestamp.

A batch lookup is therefore three gathers and a scatter, with no Python loop per id, and was
measured faster than the ``OrderedDict`` LRU it replaced, for single requests and bulk batches
alike (``python bench/bench_cache.py`` times ``L1 get``; ``python bench/bench_features.py``,
section 1, the L1 path of a request). Recency is a counter, not a linked list: ``get`` stamps each
hit with the next timestamps in batch order (a later duplicate is more recent, as with
``move_to_end``).

Eviction (only on insert, when no free slot is left) takes the least recently used entries with
one ``argpartition`` over the timestamps. That is O(capacity), so it evicts in chunks: the
``short`` slots needed, and at least ``capacity // EVICT_FRACTION`` when the cache is that large,
never an entry the same ``put`` just refreshed. The cache thus sits between 15/16 and all of its
capacity, and the partition runs once per chunk, not per request (1/64 chunks were slower for
about the same hit ratio on that stream: the 1/16 chunk is the better trade; no benchmark varies
``EVICT_FRACTION``, but ``bench/bench_features.py``'s "L1 policy" section, run with it changed,
would show it). Which entries leave is still decided by recency alone (``tests/test_cache_l1.py``
checks it against a reference model).

Byte bound: each slot costs its row plus ``ENTRY_OVERHEAD_BYTES`` (id, deadline, timestamp, a
place on the free stack); with ``num_ids`` known the direct map (4 B per id, 5 with admission) is
charged up front, so ``capacity = (max_bytes - map_bytes) // (4 * F + ENTRY_OVERHEAD_BYTES)`` and
the process never holds more than ``max_bytes`` for L1. Without ``num_ids`` (unit tests) the map
grows to the largest id seen and is not charged. Slab pages never written are never committed
(``np.empty``).

Admission (``admit_min_uses`` > 0, what the FeatureRunner runs; 0 = plain LRU): when an insert
would have to evict, a new id is admitted only if it has been looked up at least that many times
recently, as TinyLFU's frequency filter does. Counts are one saturating byte per id (charged to the
budget like the map), bumped by every ``get_many`` and halved after ``FREQ_WINDOW_PER_SLOT`` x
capacity lookups, so old popularity fades. Why: a sampled 2-hop neighbourhood is mostly nodes seen
once, and under LRU each of them pushed out a row that would have been hit again. On the demo graph
(single-target Zipf(1.0) requests, fanout [25, 10], L1 at 10% of the rows; ``python
bench/bench_features.py``, section "L1 policy") the filter at 3 uses raised the hit ratio and cut
the rows inserted per request to a small fraction, for uniform targets as well. Until
the cache is full (less the chunk that eviction keeps free), everything is admitted, so a cold
start fills as fast as before. ``warm`` (the start-up preload) bypasses the filter (``admit_all``).

Expired entries are dropped lazily when a ``get`` meets them (counted as ``expired``, and a miss);
until then they age out through eviction like any other entry.

Not thread-safe: the feature runner uses it from its event loop only. ``get_many`` / ``put_many``
are synchronous (no I/O).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .base import ROW_DTYPE, as_ids

ENTRY_OVERHEAD_BYTES = 32  # _id_of int64 + _expiry float64 + _last_use int64 + free stack int64
MAP_BYTES_PER_ID = 4  # _slot_of int32
USES_BYTES_PER_ID = 1  # _uses uint8, with admission on
USES_MAX = 15  # a saturating count: the filter only asks "at least admit_min_uses"
# Counts halve after 5 x capacity lookups: long enough for a hot node to earn admission, short
# enough that a node hot an hour ago does not keep its count (bench/bench_features.py's "L1
# policy" section, run with this changed, shows the hit ratio it buys).
FREQ_WINDOW_PER_SLOT = 5
EVICT_FRACTION = 16
_NEVER = np.iinfo(np.int64).max  # _last_use of a free slot: never chosen for eviction


class L1Cache:
    name = "l1"

    def __init__(
        self,
        max_bytes: int,
        ttl_s: float,
        dim: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        num_ids: int | None = None,
        admit_min_uses: int = 0,
    ) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if not 0 <= admit_min_uses <= USES_MAX:
            raise ValueError(f"admit_min_uses must be in [0, {USES_MAX}], got {admit_min_uses}")
        self.admit_min_uses = int(admit_min_uses)
        self.dim = dim
        self.ttl_s = float(ttl_s)
        self.max_bytes = int(max_bytes)
        self.entry_bytes = dim * np.dtype(ROW_DTYPE).itemsize + ENTRY_OVERHEAD_BYTES
        per_id = MAP_BYTES_PER_ID + (USES_BYTES_PER_ID if self.admit_min_uses else 0)
        self.map_bytes = per_id * int(num_ids) if num_ids is not None else 0
        self.capacity = max(0, (self.max_bytes - self.map_bytes) // self.entry_bytes)
        self._clock = clock
        cap = self.capacity
        self._slot_of = np.full(int(num_ids or 0) if cap else 0, -1, dtype=np.int32)
        self._fixed_map = num_ids is not None
        self._slab = np.empty((cap, dim), dtype=ROW_DTYPE)
        self._id_of = np.full(cap, -1, dtype=np.int64)
        self._expiry = np.zeros(cap, dtype=np.float64)
        self._last_use = np.full(cap, _NEVER, dtype=np.int64)
        self._free = np.arange(cap - 1, -1, -1, dtype=np.int64)  # a stack: slot 0 on top
        self._n_free = cap
        self._now_tick = 0  # next logical timestamp
        self._evict_chunk = cap // EVICT_FRACTION if cap >= EVICT_FRACTION else 1
        self._uses = np.zeros(int(num_ids or 0) if cap and self.admit_min_uses else 0, dtype=np.uint8)
        self._uses_window = FREQ_WINDOW_PER_SLOT * cap
        # Eviction frees a chunk at a time; the slots it leaves free are no room to admit anyone
        # into, or every put after an eviction would pass unfiltered.
        self._admission_slack = self._evict_chunk if self._evict_chunk > 1 else 0
        self._uses_counted = 0  # lookups since the last halving
        self.hits = 0
        self.inserts = 0
        self.rejected = 0  # new ids the admission filter kept out
        self.misses = 0
        self.evictions = 0
        self.invalidations = 0
        self.expired = 0

    def __len__(self) -> int:
        return self.capacity - self._n_free

    @property
    def nbytes(self) -> int:
        return len(self) * self.entry_bytes + (self.map_bytes if self._fixed_map else 0)

    def __contains__(self, node_id: int) -> bool:
        """Presence without touching recency or counters (expired entries still count)."""
        i = int(node_id)
        return 0 <= i < self._slot_of.size and self._slot_of[i] >= 0

    def ids_by_recency(self) -> list[int]:
        """Cached ids, least recently used first (tests, debugging; O(capacity log capacity))."""
        used = np.flatnonzero(self._id_of >= 0)
        return self._id_of[used[np.argsort(self._last_use[used], kind="stable")]].tolist()

    def get_many(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = as_ids(ids)
        n = ids.size
        self._count_uses(ids)
        if n == 0 or len(self) == 0:
            self.misses += n
            return np.zeros(n, dtype=bool), np.empty((0, self.dim), dtype=ROW_DTYPE)
        slots = self._lookup(ids)
        found = slots >= 0
        hit_slots = slots[found]
        if hit_slots.size:
            stale = self._expiry[hit_slots] <= self._clock()
            if stale.any():
                self._release(np.unique(hit_slots[stale]))
                self.expired += int(np.count_nonzero(stale))
                found[np.flatnonzero(found)[stale]] = False
                hit_slots = hit_slots[~stale]
            self._touch(hit_slots)
        n_hit = int(hit_slots.size)
        self.hits += n_hit
        self.misses += n - n_hit
        return found, self._slab[hit_slots]

    def put_many(self, ids: np.ndarray, rows: np.ndarray, admit_all: bool = False) -> None:
        """Insert or refresh ``ids``; a duplicated id keeps its last row and position.

        A batch larger than the cache keeps its tail. Present ids are always refreshed; new ones
        pass the admission filter when there is no room for all of them (``admit_all``: never).
        """
        ids = as_ids(ids)
        rows = np.asarray(rows, dtype=ROW_DTYPE).reshape(ids.size, self.dim)
        if ids.size == 0 or self.capacity == 0:
            return
        ids, rows = _last_occurrences(ids, rows)
        if ids.size > self.capacity:
            ids, rows = ids[-self.capacity :], rows[-self.capacity :]
        deadline = self._clock() + self.ttl_s
        slots = self._lookup(ids)
        present = slots >= 0
        old = slots[present]
        if old.size:
            self._slab[old] = rows[present]
            self._expiry[old] = deadline
            self._touch(old)  # now the most recent: the eviction below cannot take them
        new = np.flatnonzero(~present)
        if self.admit_min_uses and not admit_all and new.size > self._n_free - self._admission_slack:
            admitted = _gather(self._uses, ids[new], 0) >= self.admit_min_uses
            self.rejected += int(new.size - np.count_nonzero(admitted))
            new = new[admitted]
        if new.size:
            self.inserts += int(new.size)
            new_ids = ids[new]
            new_slots = self._alloc(int(new.size), protected=int(old.size))
            self._grow_map(int(new_ids.max()) + 1)
            self._slab[new_slots] = rows[new]
            self._expiry[new_slots] = deadline
            self._id_of[new_slots] = new_ids
            self._slot_of[new_ids] = new_slots
            self._touch(new_slots)

    def _lookup(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each id, -1 when absent (ids beyond the map are absent)."""
        return _gather(self._slot_of, ids, -1)

    def _count_uses(self, ids: np.ndarray) -> None:
        """One more use of each id (a repeated id counts once per call), aged by halving."""
        if not (self.admit_min_uses and self.capacity and ids.size):
            return
        top = int(ids.max()) + 1
        if top > self._uses.size:
            if self._fixed_map:
                return  # out of range: get_many reports it a miss, nothing to count
            self._uses = _grown(self._uses, top, 0)
        uses = self._uses
        uses[ids] = np.minimum(uses[ids], USES_MAX - 1) + 1
        self._uses_counted += ids.size
        if self._uses_counted >= self._uses_window:
            uses >>= 1
            self._uses_counted = 0

    def _touch(self, slots: np.ndarray) -> None:
        """Stamp ``slots`` as used now, in order (for a repeated slot the last stamp wins)."""
        k = slots.size
        self._last_use[slots] = np.arange(self._now_tick, self._now_tick + k, dtype=np.int64)
        self._now_tick += k

    def _alloc(self, k: int, protected: int) -> np.ndarray:
        """``k`` free slots, evicting least-recently-used entries when there are too few.

        ``protected``: entries refreshed by the current put (the most recent), never evicted.
        """
        short = k - self._n_free
        if short > 0:
            evictable = len(self) - protected
            self._evict(min(max(short, self._evict_chunk), evictable))
        top = self._n_free
        self._n_free -= k
        return self._free[top - k : top][::-1].copy()

    def _evict(self, count: int) -> None:
        victims = np.argpartition(self._last_use, count - 1)[:count]
        self._release(victims)
        self.evictions += count

    def _release(self, slots: np.ndarray) -> None:
        """Free unique, occupied ``slots``."""
        self._slot_of[self._id_of[slots]] = -1
        self._id_of[slots] = -1
        self._last_use[slots] = _NEVER
        top = self._n_free
        self._free[top : top + slots.size] = slots
        self._n_free += slots.size

    def _grow_map(self, size: int) -> None:
        if size <= self._slot_of.size:
            return
        if self._fixed_map:
            raise IndexError(f"node id {size - 1} outside the cache's id range")
        self._slot_of = _grown(self._slot_of, size, -1)

    def clear(self) -> None:
        used = np.flatnonzero(self._id_of >= 0)
        self._release(used)

    def invalidate(self, ids: np.ndarray) -> int:
        """Drop the rows of ``ids`` (a graph update changed them); returns how many were held."""
        slots = self._lookup(as_ids(ids))
        held = np.unique(slots[slots >= 0])
        if held.size:
            self._release(held)
        self.invalidations += int(held.size)
        return int(held.size)

    def stats(self) -> dict[str, int]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "expired": self.expired,
            "inserts": self.inserts,
            "rejected": self.rejected,
            "entries": len(self),
            "bytes": self.nbytes,
            "capacity_bytes": self.max_bytes,
        }


def _last_occurrences(ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop all but the last occurrence of each id, keeping the batch order otherwise."""
    if ids.size < 2:
        return ids, rows
    _, first_in_reversed = np.unique(ids[::-1], return_index=True)
    if first_in_reversed.size == ids.size:
        return ids, rows
    keep = np.sort(ids.size - 1 - first_in_reversed)
    return ids[keep], rows[keep]


def _gather(table: np.ndarray, ids: np.ndarray, missing: int) -> np.ndarray:
    """``table[ids]``, with ``missing`` for ids beyond the table (it grows with the largest id seen)."""
    if ids.size and int(ids.max()) < table.size:
        return table[ids]
    out = np.full(ids.size, missing, dtype=table.dtype)
    inside = ids < table.size
    out[inside] = table[ids[inside]]
    return out


def _grown(table: np.ndarray, size: int, fill: int) -> np.ndarray:
    """A copy of ``table`` at least ``size`` long (doubling), new entries ``fill``."""
    grown = np.full(max(size, 2 * table.size), fill, dtype=table.dtype)
    grown[: table.size] = table
    return grown
