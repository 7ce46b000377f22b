"""The FeatureRunner's feature store: L1 (process LRU) -> L2 (Redis, optional) -> origin (mmap).

In cluster mode (``GSAGE_FEATURE_SOURCE=redis``) the origin is the feature cluster
(``runners.feature.authority``) and there is no L2: L1 -> the cluster, which is shared already.

``fetch(ids)`` for unique int64 ids returns ``[n, F]`` float32 rows in the order of ``ids``:

1. L1 answers what it holds (no I/O).
2. The L1 misses go to L2 in one read (read-through); rows L2 found will be copied into L1.
3. What L2 missed is gathered from the origin; those rows will go into L1 and are written back to
   L2 by a background task, so the request never waits for a cache write.

Filling L1 is off the request's path too: the rows found below L1 are queued and inserted by a
callback on the next event-loop turn, or at the start of the next fetch if that comes first (so
a caller that fetches again right away still finds them). An insert is the costly half of L1
(eviction is an O(capacity) partition, once per chunk): in the service at c=1, fills inline made
L1's P99 several times that of the lookup alone, a large part of a retrieval whose P99 target is
1 ms (the ``l1`` and ``l1_fill`` stages of ``python -m bench.suite``'s stage breakdown). Fill time
is reported on its own (``fill_seconds``, ``on_fill``).

A *scan* (``fetch_with_stats(ids, scan=True)``: the builder's bulk batches) reads the origin
only and writes nothing back: a bulk batch touches thousands of distinct rows, which would evict
most of L1 and cost a multi-thousand-key MGET, far slower than a gather from the memory-mapped
snapshot (``python bench/bench_cache.py --ids <n>``: "L2 MGET" against "origin"), for rows the
latency path mostly never asks for again. Nor does it look in L1 first: a lookup in a warm L1,
then merging its hits with the origin's rows into one array, cost more than reading every row
straight from a snapshot in page cache, on the 100k and the 1M graph alike (``python -m
bench.suite.ab --variant GSAGE_SCAN_MIN_TARGETS=0`` runs bulk batches through the caches
instead). A snapshot that is not in page cache pays disk reads there instead; L1 would hide only
its hottest rows of them.

A level that fails (Redis down) just misses; origin always answers, so ``fetch`` raises only for
ids outside ``[0, num_nodes)``. Each call reports its stage timings and per-level hit counts as
a ``FetchStats`` (``fetch_with_stats``; ``last_stats`` keeps the most recent one for callers
that do not overlap fetches): the service turns them into Prometheus histograms. Cumulative
counters per level come from ``stats()``.

Concurrent fetches of the same cold id may both read the origin and both write it back; the
rows are identical, so the race costs a duplicate write, never a wrong answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from common.settings import FeatureCacheSection, RedisSection

from .base import ROW_DTYPE, as_ids
from .l1 import L1Cache
from .l2_redis import RedisFeatureLevel
from .origin import OriginLevel

WARM_BATCH = 4096


@dataclasses.dataclass(frozen=True)
class FetchStats:
    n: int = 0
    l1_hits: int = 0
    l2_hits: int = 0
    origin_hits: int = 0
    # Wall seconds per stage (L1: the lookup; its fill is deferred, see the module docstring). A
    # level that was not consulted (everything found above it, or no L2) reports exactly 0.0.
    l1_s: float = 0.0
    l2_s: float = 0.0
    origin_s: float = 0.0
    scan: bool = False


class Origin(Protocol):
    """Where rows come from when no cache holds them: the snapshot (``OriginLevel``) or the
    feature cluster (``runners.feature.authority.ClusterOrigin``)."""

    name: str
    num_nodes: int
    dim: int

    async def fetch(self, ids: np.ndarray) -> np.ndarray: ...

    async def start(self) -> None: ...

    def rebound(self, graph: Any) -> Origin: ...

    def stats(self) -> dict[str, int]: ...

    async def close(self) -> None: ...


class TieredFeatureStore:
    def __init__(self, l1: L1Cache, l2: RedisFeatureLevel | None, origin: Origin) -> None:
        for level in (l1, l2):
            if level is not None and level.dim != origin.dim:
                raise ValueError(f"{level.name} holds rows of {level.dim}, origin of {origin.dim}")
        self.l1 = l1
        self.l2 = l2
        self.origin = origin
        self.last_stats = FetchStats()
        self._fills: list[tuple[np.ndarray, np.ndarray]] = []  # (ids, rows) not yet in L1
        self._fill_scheduled = False
        self.fill_seconds = 0.0
        self.on_fill: Callable[[float], None] | None = None  # called with each drain's seconds
        # Each id's feature version (a live graph's; None: rows never change): L2 keys carry it.
        self.versions_of: Callable[[np.ndarray], np.ndarray | None] | None = None

    @property
    def dim(self) -> int:
        return self.origin.dim

    @property
    def num_nodes(self) -> int:
        return self.origin.num_nodes

    async def fetch(self, ids: np.ndarray) -> np.ndarray:
        rows, _ = await self.fetch_with_stats(ids)
        return rows

    async def fetch_with_stats(self, ids: np.ndarray, scan: bool = False) -> tuple[np.ndarray, FetchStats]:
        ids = as_ids(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
            raise IndexError(f"node ids must be in [0, {self.num_nodes})")
        if scan:
            return await self._scan(ids)
        self._drain_fills()
        out = np.empty((ids.size, self.dim), dtype=ROW_DTYPE)

        t0 = time.perf_counter()
        found, rows = self.l1.get_many(ids)
        out[found] = rows
        miss = np.flatnonzero(~found)
        l1_hits = ids.size - miss.size
        t1 = time.perf_counter()

        l2_hits = 0
        asked_l2 = bool(miss.size) and self.l2 is not None
        versions = self.versions_of(ids) if self.versions_of is not None and self.l2 is not None else None
        if asked_l2 and self.l2 is not None:
            found, rows = await self.l2.get(ids[miss], None if versions is None else versions[miss])
            if rows.shape[0]:
                hit = miss[found]
                out[hit] = rows
                l2_hits = int(hit.size)
                self._queue_fill(ids[hit], rows)
                miss = miss[~found]
        t2 = time.perf_counter()

        asked_origin = bool(miss.size)
        if asked_origin:
            cold = ids[miss]
            rows = await self.origin.fetch(cold)
            out[miss] = rows
            self._queue_fill(cold, rows)
            if self.l2 is not None:
                self.l2.put_background(cold, rows, None if versions is None else versions[miss])
        t3 = time.perf_counter()

        stats = FetchStats(
            n=int(ids.size),
            l1_hits=int(l1_hits),
            l2_hits=l2_hits,
            origin_hits=int(miss.size),
            l1_s=t1 - t0,
            l2_s=t2 - t1 if asked_l2 else 0.0,
            origin_s=t3 - t2 if asked_origin else 0.0,
        )
        self.last_stats = stats
        return out, stats

    def _queue_fill(self, ids: np.ndarray, rows: np.ndarray) -> None:
        self._fills.append((ids, rows))
        if not self._fill_scheduled:
            self._fill_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain_fills)

    def _drain_fills(self) -> None:
        """Insert the queued rows into L1, oldest first (a later row of an id wins)."""
        self._fill_scheduled = False
        if not self._fills:
            return
        fills, self._fills = self._fills, []
        t0 = time.perf_counter()
        for ids, rows in fills:
            self.l1.put_many(ids, rows)
        spent = time.perf_counter() - t0
        self.fill_seconds += spent
        if self.on_fill is not None:
            self.on_fill(spent)

    async def _scan(self, ids: np.ndarray) -> tuple[np.ndarray, FetchStats]:
        t0 = time.perf_counter()
        rows = await self.origin.fetch(ids)
        stats = FetchStats(n=int(ids.size), origin_hits=int(ids.size), origin_s=time.perf_counter() - t0, scan=True)
        self.last_stats = stats
        return rows, stats

    def rebind(self, graph: Any) -> None:
        """Serve ``graph`` (a live graph, e.g. the one a compaction made): its rows at the origin,
        its feature versions and its snapshot's keys in L2. L1 stays: it holds current rows by
        id, and a compaction changes no row."""
        self.origin = self.origin.rebound(graph)
        self.versions_of = graph.feature_versions
        if self.l2 is not None and self.l2.snapshot_version != graph.base.tag and graph.base.tag:
            self.l2.use_snapshot(graph.base.tag)

    def invalidate(self, ids: np.ndarray) -> None:
        """Rows of ``ids`` changed: L1 forgets them (after the fills queued before the change, so
        that none of those puts an old row back). L2 needs nothing: its keys carry the version."""
        self._drain_fills()
        self.l1.invalidate(ids)

    async def warm(self, ids: np.ndarray, batch_size: int = WARM_BATCH) -> int:
        """Preload ``ids`` (hottest first) into L2 and, as far as it holds them, L1.

        L1 keeps the first ``l1.capacity`` ids: they are inserted coldest first, so the hottest
        end up most recently used. L2 writes are awaited here (start-up, not a request path).
        Returns the number of rows loaded.
        """
        ids = as_ids(ids)
        for start in range(0, ids.size, batch_size):
            chunk = ids[start : start + batch_size]
            rows = await self.origin.fetch(chunk)
            if self.l2 is not None:
                await self.l2.put(chunk, rows)
        hot = ids[: self.l1.capacity][::-1]
        for start in range(0, hot.size, batch_size):
            chunk = hot[start : start + batch_size]
            self.l1.put_many(chunk, await self.origin.fetch(chunk), admit_all=True)
        return int(ids.size)

    def stats(self) -> dict[str, dict[str, int]]:
        levels = [self.l1, self.l2, self.origin]
        return {level.name: level.stats() for level in levels if level is not None}

    async def flush(self) -> None:
        """Settle L1 fills and wait for pending background writes (tests, shutdown)."""
        self._drain_fills()
        if self.l2 is not None:
            await self.l2.flush()

    async def start(self) -> None:
        """Check that the origin can serve (the feature cluster holds this snapshot's rows)."""
        await self.origin.start()

    async def close(self) -> None:
        if self.l2 is not None:
            await self.l2.close()
        await self.origin.close()


def build_feature_store(
    cache: FeatureCacheSection,
    redis: RedisSection,
    features: Any,
    snapshot_version: str,
    graph: Any = None,
    cluster_origin: Origin | None = None,
) -> TieredFeatureStore:
    """L1 + origin always; L2 only when ``redis.redis_url`` is set. ``graph``: a live graph
    (``runners.feature.graph.LiveGraph``), whose rows and ids the levels then serve.
    ``cluster_origin``: the feature cluster as the origin (no L2 then: it is the shared level)."""
    origin: Origin
    if cluster_origin is not None:
        origin = cluster_origin
    elif graph is None:
        origin = OriginLevel(features)
    else:
        origin = OriginLevel(features, rows=graph.rows, num_nodes=graph.capacity)
    l1 = L1Cache(
        cache.l1_bytes, cache.l1_ttl_s, origin.dim, num_ids=origin.num_nodes, admit_min_uses=cache.l1_admit_min_uses
    )
    l2 = None
    if redis.redis_url and cluster_origin is None:
        l2 = RedisFeatureLevel.from_url(
            redis.redis_url,
            snapshot_version,
            origin.dim,
            ttl_s=cache.l2_ttl_s,
            timeout_s=cache.l2_timeout_s,
            timeout_per_key_s=cache.l2_timeout_per_key_us * 1e-6,
            write_delay_s=cache.l2_write_delay_ms / 1000,
            write_batch_rows=cache.l2_write_batch_rows,
            max_inflight_writes=cache.l2_max_inflight_writes,
            retry_backoff_s=cache.l2_retry_backoff_s,
            script_pause_s=cache.l2_script_pause_s,
            ca_file=redis.redis_ca_file,
        )
    store = TieredFeatureStore(l1, l2, origin)
    if graph is not None:
        store.rebind(graph)
    return store
