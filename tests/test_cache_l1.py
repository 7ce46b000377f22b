"""L1Cache: byte bound, exact LRU order, TTL on an injected clock, counters; and a model check."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.settings import Settings
from runners.feature.cache import OriginLevel, TieredFeatureStore
from runners.feature.cache.l1 import (
    ENTRY_OVERHEAD_BYTES,
    EVICT_FRACTION,
    FREQ_WINDOW_PER_SLOT,
    MAP_BYTES_PER_ID,
    USES_BYTES_PER_ID,
    USES_MAX,
    L1Cache,
)
from tests.graphs import feature_store

DIM = 4
ENTRY = DIM * 4 + ENTRY_OVERHEAD_BYTES


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rows_for(ids) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    return (ids[:, None] * 10 + np.arange(DIM)).astype(np.float32)


def make(entries: int, ttl: float = 60.0, clock=None, admit_min_uses: int = 0) -> L1Cache:
    return L1Cache(entries * ENTRY + ENTRY - 1, ttl, DIM, clock=clock or FakeClock(), admit_min_uses=admit_min_uses)


def cached_ids(cache: L1Cache) -> list[int]:
    """Ids in LRU order (least recent first), read without touching recency."""
    return cache.ids_by_recency()


def test_capacity_is_bytes_over_entry_size():
    cache = L1Cache(10 * ENTRY + ENTRY - 1, 60, DIM)
    assert cache.capacity == 10
    assert cache.entry_bytes == ENTRY
    assert L1Cache(ENTRY - 1, 60, DIM).capacity == 0
    # Wider rows, fewer entries for the same bytes.
    assert L1Cache(10 * ENTRY, 60, DIM * 8).capacity < 10


def test_dense_id_map_is_charged_when_the_id_range_is_known():
    budget = 10 * ENTRY + 1000 * MAP_BYTES_PER_ID
    cache = L1Cache(budget, 60, DIM, num_ids=1000)
    assert cache.capacity == 10 and cache.map_bytes == 4000
    ids = np.arange(990, 1000)
    cache.put_many(ids, rows_for(ids))
    assert len(cache) == 10 and cache.nbytes == budget
    with pytest.raises(IndexError):
        cache.put_many(np.array([1000]), rows_for([1000]))
    # Lookups outside the range are plain misses.
    assert cache.get_many(np.array([5, 999, 5000]))[0].tolist() == [False, True, False]


def test_byte_bound_never_exceeded_and_lru_evicted_first():
    cache = make(8)
    for start in range(0, 40, 3):
        ids = np.arange(start, start + 3)
        cache.put_many(ids, rows_for(ids))
        assert cache.nbytes <= cache.max_bytes
        assert len(cache) <= cache.capacity
    # 42 ids went in, the cache holds the 8 most recent, in insertion order.
    assert cached_ids(cache) == list(range(34, 42))
    assert cache.evictions == 42 - 8
    found, rows = cache.get_many(np.arange(42))
    assert found.sum() == 8 and found[34:].all()
    np.testing.assert_array_equal(rows, rows_for(range(34, 42)))


def test_get_refreshes_recency():
    cache = make(4)
    cache.put_many(np.arange(4), rows_for(range(4)))
    cache.get_many(np.array([0, 1]))  # 0 and 1 become the most recent
    cache.put_many(np.array([10, 11]), rows_for([10, 11]))  # evicts 2 and 3
    assert sorted(cached_ids(cache)) == [0, 1, 10, 11]
    assert cached_ids(cache)[:2] == [0, 1]


def test_put_of_present_id_refreshes_row_and_recency():
    cache = make(3)
    cache.put_many(np.arange(3), rows_for(range(3)))
    new_row = np.full((1, DIM), -1.0, np.float32)
    cache.put_many(np.array([0]), new_row)
    cache.put_many(np.array([7]), rows_for([7]))  # evicts 1, the LRU now
    assert cached_ids(cache) == [2, 0, 7]
    found, rows = cache.get_many(np.array([0]))
    assert found.all()
    np.testing.assert_array_equal(rows, new_row)


def test_ttl_expiry_with_injected_clock():
    clock = FakeClock()
    cache = make(10, ttl=5.0, clock=clock)
    cache.put_many(np.arange(3), rows_for(range(3)))
    clock.now += 2
    cache.put_many(np.array([3]), rows_for([3]))  # younger entry
    clock.now += 2.9  # 4.9 s after the first put
    assert cache.get_many(np.arange(4))[0].all()
    clock.now += 0.1  # exactly the TTL for 0..2
    found, rows = cache.get_many(np.arange(4))
    assert found.tolist() == [False, False, False, True]
    np.testing.assert_array_equal(rows, rows_for([3]))
    assert cache.expired == 3 and len(cache) == 1
    # A refresh by put restarts the TTL.
    cache.put_many(np.array([3]), rows_for([3]))
    clock.now += 4.5
    assert cache.get_many(np.array([3]))[0].all()


def test_expired_slots_are_reused():
    clock = FakeClock()
    cache = make(4, ttl=1.0, clock=clock)
    cache.put_many(np.arange(4), rows_for(range(4)))
    clock.now += 2
    cache.get_many(np.arange(4))  # drops all four
    cache.put_many(np.arange(10, 14), rows_for(range(10, 14)))
    assert cache.evictions == 0 and len(cache) == 4
    np.testing.assert_array_equal(cache.get_many(np.arange(10, 14))[1], rows_for(range(10, 14)))


def test_counters_and_stats():
    cache = make(4)
    cache.get_many(np.arange(3))
    cache.put_many(np.arange(6), rows_for(range(6)))  # keeps the tail 2..5
    found, _ = cache.get_many(np.array([0, 2, 5, 9]))
    assert found.tolist() == [False, True, True, False]
    s = cache.stats()
    assert s["hits"] == 2 and s["misses"] == 3 + 2
    assert s["entries"] == 4 and s["bytes"] == 4 * ENTRY <= s["capacity_bytes"]
    assert s["evictions"] == 0  # an oversized batch is cut before insertion, nothing evicted
    assert s["expired"] == 0


def test_zero_capacity_and_empty_batches():
    cache = L1Cache(0, 60, DIM)
    cache.put_many(np.arange(5), rows_for(range(5)))
    found, rows = cache.get_many(np.arange(5))
    assert not found.any() and rows.shape == (0, DIM)
    found, rows = make(4).get_many(np.array([], dtype=np.int64))
    assert found.shape == (0,) and rows.shape == (0, DIM)


def test_duplicate_ids_do_not_leak_slots():
    cache = make(4)
    cache.put_many(np.array([1, 1, 2]), rows_for([1, 1, 2]))
    assert len(cache) == 2
    cache.put_many(np.arange(10, 12), rows_for([10, 11]))
    assert len(cache) == 4 and cache.evictions == 0
    found, rows = cache.get_many(np.array([1, 1]))
    assert found.all()
    np.testing.assert_array_equal(rows, rows_for([1, 1]))


def test_tiered_without_l2_reads_origin_once_then_l1():
    feats = rows_for(range(100))
    store = TieredFeatureStore(make(50), None, OriginLevel(feats))
    ids = np.array([7, 3, 99, 0])

    async def go():
        first = await store.fetch_with_stats(ids)
        second = await store.fetch_with_stats(ids[::-1])
        with pytest.raises(IndexError):
            await store.fetch(np.array([100]))
        return first, second

    (rows, s1), (rows2, s2) = asyncio.run(go())
    np.testing.assert_array_equal(rows, feats[ids])
    np.testing.assert_array_equal(rows2, feats[ids[::-1]])
    assert (s1.l1_hits, s1.l2_hits, s1.origin_hits, s1.l2_s) == (0, 0, 4, 0.0)
    assert (s2.l1_hits, s2.origin_hits, s2.origin_s) == (4, 0, 0.0)
    assert store.last_stats == s2
    assert store.stats() == {"l1": store.l1.stats(), "origin": {"hits": 4}}


def test_tiered_fills_l1_after_the_fetch_returns():
    """The fill is off the fetch's path: queued, inserted on the next loop turn (or by the next
    fetch, whichever comes first), and timed on its own."""
    feats = rows_for(range(100))
    store = TieredFeatureStore(make(50), None, OriginLevel(feats))
    drains: list[float] = []
    store.on_fill = drains.append

    async def go():
        await store.fetch(np.array([1, 2]))
        queued = (1 in store.l1, drains[:])
        await asyncio.sleep(0)  # the scheduled drain runs
        after_turn = (1 in store.l1, 2 in store.l1, len(drains))
        await store.fetch(np.array([3]))
        _, stats = await store.fetch_with_stats(np.array([3, 1]))  # no turn in between
        return queued, after_turn, stats

    queued, after_turn, stats = asyncio.run(go())
    assert queued == (False, [])
    assert after_turn == (True, True, 1)
    assert (stats.l1_hits, stats.origin_hits) == (2, 0)
    assert len(drains) == 2 and store.fill_seconds == pytest.approx(sum(drains))


def test_build_feature_store_without_redis_has_no_l2():
    store = feature_store(Settings(l1_bytes=1 << 20, l1_ttl_s=5), rows_for(range(10)), "v")
    assert store.l2 is None and store.l1.max_bytes == 1 << 20 and store.l1.ttl_s == 5


class ReferenceLRU:
    """The obvious, slow model: OrderedDict of id -> (deadline, row).

    When a put needs room it evicts the least recent entries, at least ``chunk`` of them but
    never one this put refreshed (L1Cache's chunked eviction; chunk 1 is textbook LRU).
    """

    def __init__(self, capacity: int, ttl: float, chunk: int = 1) -> None:
        self.capacity, self.ttl, self.d, self.chunk = capacity, ttl, OrderedDict(), chunk

    def get(self, ids, now):
        out = []
        for i in ids:
            entry = self.d.get(i)
            if entry is not None and entry[0] <= now:
                del self.d[i]
                entry = None
            if entry is not None:
                self.d.move_to_end(i)
            out.append(entry is not None)
        return out

    def put(self, ids, now):
        ids = ids[-self.capacity :] if self.capacity else []
        present = [i for i in ids if i in self.d]
        for i in present:
            self.d[i] = (now + self.ttl, i)
            self.d.move_to_end(i)
        new = [i for i in ids if i not in present]
        short = len(self.d) + len(new) - self.capacity
        if short > 0:
            for _ in range(min(max(short, self.chunk), len(self.d) - len(present))):
                self.d.popitem(last=False)
        for i in new:
            self.d[i] = (now + self.ttl, i)


class ReferenceAdmissionLRU(ReferenceLRU):
    """ReferenceLRU behind the admission filter: a use count per id, bumped by each get (at most
    USES_MAX) and halved every FREQ_WINDOW_PER_SLOT x capacity lookups; when a put's new ids do not
    all fit in the free slots, only those with at least ``admit`` uses go in."""

    def __init__(self, capacity: int, ttl: float, chunk: int, admit: int) -> None:
        super().__init__(capacity, ttl, chunk)
        self.admit, self.uses, self.counted = admit, {}, 0

    def get(self, ids, now):
        if self.capacity and ids:
            for i in ids:
                self.uses[i] = min(self.uses.get(i, 0) + 1, USES_MAX)
            self.counted += len(ids)
            if self.counted >= FREQ_WINDOW_PER_SLOT * self.capacity:
                self.uses = {i: u // 2 for i, u in self.uses.items()}
                self.counted = 0
        return super().get(ids, now)

    def put(self, ids, now):
        ids = ids[-self.capacity :] if self.capacity else []
        new = [i for i in ids if i not in self.d]
        slack = self.chunk if self.chunk > 1 else 0  # the free chunk an eviction leaves is no room
        if len(new) > self.capacity - len(self.d) - slack:
            ids = [i for i in ids if i in self.d or self.uses.get(i, 0) >= self.admit]
        super().put(ids, now)


def op_lists(kinds: list[str], max_id: int, max_ids: int, max_ops: int):
    """Sequences of (get | put | tick, unique ids, seconds to advance)."""
    op = st.tuples(
        st.sampled_from(kinds), st.lists(st.integers(0, max_id), unique=True, max_size=max_ids), st.floats(0, 3)
    )
    return st.lists(op, max_size=max_ops)


ops = op_lists(["get", "put", "tick"], max_id=30, max_ids=12, max_ops=40)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(0, 9), ops=ops)
def test_matches_reference_lru(capacity, ops):
    run_against_reference(make(capacity, ttl=4.0, clock=FakeClock()), ops, chunk=1)


big_ops = op_lists(["get", "put", "put", "tick"], max_id=400, max_ids=60, max_ops=30)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(64, 200), ops=big_ops)
def test_chunked_eviction_matches_reference(capacity, ops):
    cache = make(capacity, ttl=4.0, clock=FakeClock())
    assert cache._evict_chunk == capacity // EVICT_FRACTION >= 1
    run_against_reference(cache, ops, chunk=cache._evict_chunk)


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.integers(0, 9),
    admit=st.integers(1, 3),
    ops=op_lists(["get", "get", "put", "tick"], max_id=30, max_ids=12, max_ops=60),
)
def test_admission_matches_reference(capacity, admit, ops):
    cache = make(capacity, ttl=4.0, clock=FakeClock(), admit_min_uses=admit)
    run_against_reference(cache, ops, chunk=1, ref=ReferenceAdmissionLRU(cache.capacity, 4.0, 1, admit))


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(64, 200),
    admit=st.integers(1, 3),
    ops=op_lists(["get", "get", "put", "put", "tick"], max_id=400, max_ids=60, max_ops=40),
)
def test_chunked_admission_matches_reference(capacity, admit, ops):
    cache = make(capacity, ttl=4.0, clock=FakeClock(), admit_min_uses=admit)
    chunk = cache._evict_chunk
    run_against_reference(cache, ops, chunk=chunk, ref=ReferenceAdmissionLRU(cache.capacity, 4.0, chunk, admit))


def run_against_reference(cache: L1Cache, ops, chunk: int, ref: ReferenceLRU | None = None) -> None:
    clock = cache._clock
    ref = ref or ReferenceLRU(cache.capacity, 4.0, chunk)
    for op, ids, dt in ops:
        arr = np.array(ids, dtype=np.int64)
        if op == "tick":
            clock.now += dt
        elif op == "put":
            cache.put_many(arr, rows_for(arr))
            ref.put(ids, clock.now)
        else:
            found, rows = cache.get_many(arr)
            assert found.tolist() == ref.get(ids, clock.now)
            np.testing.assert_array_equal(rows, rows_for(arr[found]))
        assert cached_ids(cache) == list(ref.d)
        assert cache.nbytes <= cache.max_bytes


def test_full_cache_admits_only_ids_looked_up_often_enough():
    cache = make(4, admit_min_uses=3)
    cache.put_many(np.arange(4), rows_for(range(4)))  # room for all: no filter
    assert cached_ids(cache) == [0, 1, 2, 3] and cache.rejected == 0
    cache.get_many(np.array([10]))
    cache.put_many(np.array([10]), rows_for([10]))  # seen once: kept out, nothing evicted
    assert 10 not in cache and cached_ids(cache) == [0, 1, 2, 3] and cache.rejected == 1
    for _ in range(2):
        cache.get_many(np.array([10]))
    cache.put_many(np.array([10]), rows_for([10]))  # seen 3 times: in, the LRU entry out
    assert cached_ids(cache) == [1, 2, 3, 10] and cache.inserts == 5
    cache.put_many(np.array([20]), rows_for([20]), admit_all=True)  # start-up warming
    assert cached_ids(cache) == [2, 3, 10, 20]


def test_use_counts_saturate_and_halve_after_the_window():
    cache = make(2, admit_min_uses=2)
    for _ in range(USES_MAX + 5):
        cache.get_many(np.array([7]))
    assert cache._uses[7] == USES_MAX // 2  # window 10: halved at lookup 10 (10 -> 5) and 20 (capped 15 -> 7)
    window = FREQ_WINDOW_PER_SLOT * cache.capacity
    cache = make(2, admit_min_uses=2)
    cache.get_many(np.array([5, 6]))
    cache.get_many(np.array([5]))
    assert cache._uses[5] == 2 and cache._uses[6] == 1
    for _ in range(window - 3):
        cache.get_many(np.array([9]))
    assert cache._uses[5] == 1 and cache._uses[6] == 0  # halved: 5 no longer passes a filter of 2


def test_admission_counts_are_charged_to_the_byte_budget():
    budget = 10 * ENTRY + 1000 * (MAP_BYTES_PER_ID + USES_BYTES_PER_ID)
    cache = L1Cache(budget, 60, DIM, num_ids=1000, admit_min_uses=3)
    assert cache.capacity == 10 and cache.map_bytes == 5000
    assert L1Cache(budget, 60, DIM, num_ids=1000).capacity == 10 + 1000 // ENTRY
    with pytest.raises(ValueError):
        L1Cache(budget, 60, DIM, admit_min_uses=USES_MAX + 1)


def test_feature_store_l1_uses_the_configured_admission():
    feats = np.zeros((100, DIM), np.float32)
    store = feature_store(Settings(l1_bytes=1 << 20, l1_admit_min_uses=2), feats, "graph-snapshot:t")
    assert store.l1.admit_min_uses == 2
    assert (
        feature_store(Settings(l1_bytes=1 << 20, l1_admit_min_uses=0), feats, "graph-snapshot:t").l1.admit_min_uses == 0
    )
