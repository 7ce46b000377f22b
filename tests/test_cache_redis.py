"""Tiered feature store against real Redis servers (standalone and a 3-master Cluster).

Every test starts from servers the fixtures own (never the shared 6379) and runs its async body
with ``asyncio.run``. Stores built with ``l1_bytes=0`` have no L1, so every fetch reaches L2.
"""

from __future__ import annotations

import asyncio
import collections
import time

import numpy as np
import pytest

from common.settings import Settings
from harness.redis_servers import RedisServer, free_port
from runners.feature.cache import (
    L1Cache,
    OriginLevel,
    RedisFeatureLevel,
    TieredFeatureStore,
)
from tests.graphs import feature_store

pytestmark = pytest.mark.integration

N, DIM = 600, 16


def make_features(seed: int, n: int = N, dim: int = DIM) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def make_store(url: str, version: str, feats: np.ndarray, *, l1_bytes: int = 0, **l2_kwargs) -> TieredFeatureStore:
    # A fresh Cluster client's first read includes topology discovery, inside the read deadline:
    # 0.5 s was once too little on a loaded 2-core CI run. Fault tests pass their own short ones.
    kw = dict(ttl_s=60.0, timeout_s=5.0, retry_backoff_s=0.1, max_backoff_s=0.4)
    kw.update(l2_kwargs)
    l2 = RedisFeatureLevel.from_url(url, version, feats.shape[1], **kw)
    return TieredFeatureStore(L1Cache(l1_bytes, 300.0, feats.shape[1]), l2, OriginLevel(feats))


def calls(server: RedisServer, command: str) -> int:
    stat = server.info("commandstats").get(f"cmdstat_{command}")
    if stat is None:
        return 0
    return int(dict(kv.split("=") for kv in stat.split(","))["calls"])


@pytest.fixture(params=["standalone", "cluster"])
def redis_url(request) -> str:
    server = request.getfixturevalue(f"redis_{request.param}")
    return server.url


# -- read-through, write-back, isolation, exactness ----------------------------------------------


def test_write_back_on_miss_then_fresh_l1_hits_l2(redis_url):
    feats = make_features(1)
    ids = np.random.default_rng(2).permutation(N)[:276]

    async def main():
        first = make_store(redis_url, "wb", feats, l1_bytes=1 << 20)
        rows, stats = await first.fetch_with_stats(ids)
        np.testing.assert_array_equal(rows, feats[ids])
        assert (stats.l1_hits, stats.l2_hits, stats.origin_hits) == (0, 0, ids.size)
        await first.flush()
        assert first.l2.stats()["writes"] == ids.size
        rows, stats = await first.fetch_with_stats(ids)  # now all in its L1
        assert stats.l1_hits == ids.size
        await first.close()

        second = make_store(redis_url, "wb", feats, l1_bytes=1 << 20)
        rows, stats = await second.fetch_with_stats(ids[::-1])
        np.testing.assert_array_equal(rows, feats[ids[::-1]])
        assert (stats.l1_hits, stats.l2_hits, stats.origin_hits) == (0, ids.size, 0)
        assert stats.l2_s > 0 and stats.origin_s == 0.0
        # Read-through filled L1.
        _, stats = await second.fetch_with_stats(ids)
        assert stats.l1_hits == ids.size and stats.l2_s == 0.0 and stats.origin_s == 0.0
        assert second.stats()["l2"]["errors"] == 0
        await second.close()

    asyncio.run(main())


def test_a_scan_reads_the_origin_only_and_fills_nothing(redis_standalone):
    feats = make_features(4)
    ids = np.random.default_rng(5).permutation(N)[:300]

    async def main():
        store = make_store(redis_standalone.url, "scan", feats, l1_bytes=1 << 20)
        await store.fetch_with_stats(ids[:100])  # normal: origin, L1 fill, write-back
        await store.flush()
        mgets = calls(redis_standalone, "mget")
        rows, stats = await store.fetch_with_stats(ids, scan=True)
        np.testing.assert_array_equal(rows, feats[ids])
        assert stats.scan and (stats.l1_hits, stats.l2_hits, stats.origin_hits) == (0, 0, 300)
        assert stats.l1_s == stats.l2_s == 0.0
        await store.flush()
        assert calls(redis_standalone, "mget") == mgets  # Redis not read...
        assert store.l2.stats()["writes"] == 100  # ...nor written
        assert len(store.l1) == 100  # and L1 kept what it had, nothing more
        _, stats = await store.fetch_with_stats(ids[100:110])
        assert not stats.scan and stats.l2_s > 0  # the normal path is unchanged
        await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("use_scripts", [True, False])
def test_values_round_trip_bit_exact(redis_url, use_scripts):
    feats = make_features(3)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3.4028235e38, 1 / 3], dtype=np.float32)
    feats[:8, :8] = np.resize(specials, (8, 8))
    ids = np.arange(40)

    async def main():
        writer = make_store(redis_url, f"exact-{use_scripts}", feats, use_scripts=use_scripts)
        await writer.fetch(ids)
        await writer.flush()
        reader = make_store(redis_url, f"exact-{use_scripts}", feats, use_scripts=use_scripts)
        rows, stats = await reader.fetch_with_stats(ids)
        assert stats.l2_hits == ids.size
        np.testing.assert_array_equal(rows.view(np.uint32), feats[ids].view(np.uint32))
        assert reader.l2.fallbacks == 0
        await writer.close()
        await reader.close()

    asyncio.run(main())


def test_snapshot_versions_never_mix(redis_url):
    old, new = make_features(4), make_features(5)
    ids = np.arange(0, N, 3)

    async def main():
        a = make_store(redis_url, "snap-a", old)
        b = make_store(redis_url, "snap-b", new)
        await a.fetch(ids)
        await b.fetch(ids)
        await a.flush()
        await b.flush()
        for version, feats in (("snap-a", old), ("snap-b", new)):
            # Origin of the reader is zeros: anything right must have come from its own L2 rows.
            reader = make_store(redis_url, version, np.zeros_like(feats))
            rows, stats = await reader.fetch_with_stats(ids)
            assert stats.l2_hits == ids.size
            np.testing.assert_array_equal(rows, feats[ids])
            await reader.close()
        await a.close()
        await b.close()

    asyncio.run(main())


def test_l2_ttl_expiry(redis_standalone):
    feats = make_features(6)
    ids = np.arange(50)

    async def main():
        store = make_store(redis_standalone.url, "ttl", feats, ttl_s=0.3)
        await store.fetch(ids)
        await store.flush()
        _, stats = await store.fetch_with_stats(ids)
        assert stats.l2_hits == ids.size
        await asyncio.sleep(0.45)
        rows, stats = await store.fetch_with_stats(ids)
        assert (stats.l2_hits, stats.origin_hits) == (0, ids.size)
        np.testing.assert_array_equal(rows, feats[ids])
        await store.close()

    asyncio.run(main())


def test_wrong_length_value_is_a_miss(redis_standalone):
    import redis

    feats = make_features(7)
    with redis.Redis(port=redis_standalone.port) as client:
        client.set("gsf:corrupt:5", b"\x00" * 7)

    async def main():
        store = make_store(redis_standalone.url, "corrupt", feats)
        rows, stats = await store.fetch_with_stats(np.array([5, 6]))
        np.testing.assert_array_equal(rows, feats[[5, 6]])
        assert stats.origin_hits == 2
        assert store.l2.stats()["corrupt"] == 1
        await store.close()

    asyncio.run(main())


def test_warm_loads_l2_and_hottest_into_l1(redis_standalone):
    feats = make_features(8)
    hot_first = np.random.default_rng(9).permutation(N)[:100]

    async def main():
        entry = L1Cache(1, 1, DIM).entry_bytes
        store = make_store(redis_standalone.url, "warm", feats, l1_bytes=30 * entry)
        assert await store.warm(hot_first, batch_size=32) == 100
        assert set(store.l1.ids_by_recency()) == set(hot_first[:30].tolist())
        fresh = make_store(redis_standalone.url, "warm", feats)
        _, stats = await fresh.fetch_with_stats(hot_first)
        assert stats.l2_hits == 100
        await store.close()
        await fresh.close()

    asyncio.run(main())


def test_background_writes_are_coalesced(redis_standalone):
    feats = make_features(12)

    async def main():
        store = make_store(redis_standalone.url, "coalesce", feats, write_delay_s=0.05, write_batch_rows=25)
        evals = calls(redis_standalone, "eval")
        for start in range(0, 20, 5):  # 4 requests' misses, 5 rows each: held, under 25 rows
            store.l2.put_background(np.arange(start, start + 5), feats[start : start + 5])
        assert store.l2.stats()["pending_write_rows"] == 20 and store.l2.stats()["inflight_writes"] == 0
        await asyncio.sleep(0.15)  # the delay passes: one write of all 20 rows
        await store.flush()
        assert calls(redis_standalone, "eval") == evals + 1 and store.l2.stats()["writes"] == 20
        store.l2.put_background(np.arange(20, 50), feats[20:50])  # 30 >= 25 rows: sent at once
        assert store.l2.stats()["pending_write_rows"] == 0 and store.l2.stats()["inflight_writes"] == 1
        store.l2.put_background(np.arange(50, 53), feats[50:53])
        await store.flush()  # sends what waits, no need to sit out the delay
        assert calls(redis_standalone, "eval") == evals + 3 and store.l2.stats()["writes"] == 53
        found, rows = await store.l2.get(np.arange(53))
        assert found.all()
        np.testing.assert_array_equal(rows, feats[:53])
        await store.close()

    asyncio.run(main())


def test_background_writes_are_bounded(redis_standalone):
    feats = make_features(10)

    async def main():
        store = make_store(redis_standalone.url, "bound", feats, max_inflight_writes=2)
        for start in range(0, 50, 10):  # 5 writes scheduled before any can run
            ids = np.arange(start, start + 10)
            store.l2.put_background(ids, feats[ids])
        assert store.l2.stats()["inflight_writes"] == 2
        await store.flush()
        stats = store.l2.stats()
        assert (stats["writes"], stats["writes_dropped"], stats["inflight_writes"]) == (20, 30, 0)
        await store.close()

    asyncio.run(main())


def test_build_feature_store_from_settings(redis_standalone, redis_cluster):
    feats = make_features(11)
    plain = feature_store(Settings(), feats, "v1")
    assert plain.l2 is None and plain.l1.max_bytes == Settings().l1_bytes
    standalone = feature_store(
        Settings(redis_url=redis_standalone.url, l2_timeout_s=0.05, l2_timeout_per_key_us=5.0), feats, "v1"
    )
    assert standalone.l2 is not None and not standalone.l2.cluster
    # The read deadline scales with the keys read: 50 ms + 5 us per key.
    assert standalone.l2.read_deadline_s(1) == pytest.approx(0.050005)
    assert standalone.l2.read_deadline_s(7000) == pytest.approx(0.085)
    clustered = feature_store(Settings(redis_url=redis_cluster.url), feats, "v1")
    assert clustered.l2 is not None and clustered.l2.cluster
    with pytest.raises(ValueError):
        feature_store(Settings(redis_url=redis_standalone.url), feats, "bad{tag}")

    async def main():
        rows = await standalone.fetch(np.arange(10))
        np.testing.assert_array_equal(rows, feats[:10])
        for store in (plain, standalone, clustered):
            await store.close()

    asyncio.run(main())


# -- round trips -------------------------------------------------------------------------------


def test_standalone_fetch_is_one_mget_and_write_one_eval(redis_standalone):
    feats = make_features(12)
    ids = np.arange(276)

    async def main():
        store = make_store(redis_standalone.url, "rt", feats)
        before = {c: calls(redis_standalone, c) for c in ("mget", "eval", "get", "set")}
        await store.fetch(ids)
        await store.flush()
        after = {c: calls(redis_standalone, c) for c in before}
        # commandstats also counts the SETs the script runs server-side; the client sent 2 commands.
        delta = {c: after[c] - before[c] for c in before}
        assert delta == {"mget": 1, "eval": 1, "get": 0, "set": ids.size}
        await store.close()

    asyncio.run(main())


def test_cluster_keys_on_every_master_and_one_command_per_master(redis_cluster):
    feats = make_features(13)
    ids = np.arange(300)
    masters = redis_cluster.nodes

    async def main():
        store = make_store(redis_cluster.url, "spread", feats)
        before_db = [m.dbsize() for m in masters]
        await store.fetch(ids)
        await store.flush()
        added = [m.dbsize() - b for m, b in zip(masters, before_db)]
        assert all(a > 0 for a in added) and sum(added) == ids.size

        before = [(calls(m, "eval"), calls(m, "mget"), calls(m, "get")) for m in masters]
        rows, stats = await store.fetch_with_stats(ids)
        assert stats.l2_hits == ids.size
        np.testing.assert_array_equal(rows, feats[ids])
        after = [(calls(m, "eval"), calls(m, "mget"), calls(m, "get")) for m in masters]
        delta = [tuple(x - y for x, y in zip(a, b)) for a, b in zip(after, before)]
        # One EVAL per master from the client; its GETs run server-side (commandstats counts them).
        assert [d[:2] for d in delta] == [(1, 0)] * 3
        assert [d[2] for d in delta] == added  # every key read on the master that holds it
        await store.close()

    asyncio.run(main())


def test_cluster_plain_path_is_one_round_trip_per_master(redis_cluster, monkeypatch):
    """``use_scripts=False``: mget_nonatomic's cluster pipeline sends one batch per master."""
    from redis.asyncio.cluster import ClusterNode

    batches: collections.Counter[str] = collections.Counter()
    original = ClusterNode.execute_pipeline

    async def counting(self, commands):
        batches[self.name] += 1
        return await original(self, commands)

    monkeypatch.setattr(ClusterNode, "execute_pipeline", counting)
    feats = make_features(14)
    ids = np.arange(276)

    async def main():
        store = make_store(redis_cluster.url, "plain", feats, use_scripts=False)
        await store.fetch(ids)
        await store.flush()
        batches.clear()
        _, stats = await store.fetch_with_stats(ids)
        assert stats.l2_hits == ids.size
        assert len(batches) == 3 and set(batches.values()) == {1}
        await store.close()

    asyncio.run(main())


def test_cluster_script_refused_falls_back_to_plain_commands(redis_cluster, monkeypatch):
    """A stale slot map (as after resharding) makes a master refuse the script: the request
    still hits, through mget_nonatomic, which follows MOVED."""
    feats = make_features(15)
    ids = np.arange(200)

    async def main():
        store = make_store(redis_cluster.url, "stale", feats)
        await store.fetch(ids)
        await store.flush()
        l2 = store.l2
        one_node = l2._by_master(l2._keys(ids[:1]))[0][0]
        monkeypatch.setattr(l2, "_by_master", lambda keys: [(one_node, list(range(len(keys))))])
        rows, stats = await store.fetch_with_stats(ids)
        assert stats.l2_hits == ids.size and l2.fallbacks == 1 and l2.errors == 0
        np.testing.assert_array_equal(rows, feats[ids])
        await store.close()

    asyncio.run(main())


# -- faults ------------------------------------------------------------------------------------


def test_redis_down_from_the_start():
    feats = make_features(16)
    url = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there

    async def main():
        store = make_store(url, "down", feats)
        for _ in range(5):
            rows = await store.fetch(np.arange(20))
            np.testing.assert_array_equal(rows, feats[:20])
        await store.flush()
        stats = store.l2.stats()
        assert stats["errors"] >= 1 and stats["skipped"] >= 1 and stats["circuit_open"] == 1
        await store.close()

    asyncio.run(main())


def test_standalone_killed_mid_stream_then_restarted(redis_standalone):
    feats = make_features(17)
    rng = np.random.default_rng(18)

    async def fetch_ok(store):
        ids = np.unique(rng.integers(0, N, 100))
        rows, stats = await store.fetch_with_stats(ids)
        np.testing.assert_array_equal(rows, feats[ids])
        await store.flush()
        return stats

    async def main():
        store = make_store(redis_standalone.url, "kill", feats)
        await fetch_ok(store)
        assert (await fetch_ok(store)).l2_hits > 0

        redis_standalone.kill()
        t_end = time.monotonic() + 0.8
        while time.monotonic() < t_end:  # any exception fails the test
            stats = await fetch_ok(store)
            assert stats.l2_hits == 0
            await asyncio.sleep(0.01)
        down = store.l2.stats()
        assert down["errors"] >= 2 and down["skipped"] > 0

        redis_standalone.start()  # same port, empty
        restarted = time.monotonic()
        resumed = None
        while time.monotonic() - restarted < 0.4 + 2.0:  # max backoff + slack
            if (await fetch_ok(store)).l2_hits > 0:
                resumed = time.monotonic() - restarted
                break
            await asyncio.sleep(0.01)
        assert resumed is not None, store.l2.stats()
        assert store.l2.stats()["circuit_open"] == 0
        await store.close()

    asyncio.run(main())


def test_concurrent_fetches_through_an_outage(redis_standalone):
    """Many overlapping fetches: none raises, one probe at a time, and L2 comes back."""
    feats = make_features(21)
    rng = np.random.default_rng(22)

    async def burst(store, k=20):
        async def one():
            ids = np.unique(rng.integers(0, N, 80))
            rows, stats = await store.fetch_with_stats(ids)
            np.testing.assert_array_equal(rows, feats[ids])
            return stats.l2_hits

        return sum(await asyncio.gather(*(one() for _ in range(k))))

    async def main():
        store = make_store(redis_standalone.url, "burst", feats)
        await burst(store)
        await store.flush()
        redis_standalone.kill()
        for _ in range(8):
            assert await burst(store) == 0
            await asyncio.sleep(0.05)
        down = store.l2.stats()
        assert down["errors"] >= 1 and down["skipped"] > 0
        redis_standalone.start()
        t0 = time.monotonic()
        hits = 0
        while time.monotonic() - t0 < 2.5 and not hits:
            hits = await burst(store)
            await store.flush()
            await asyncio.sleep(0.02)
        assert hits > 0, store.l2.stats()
        await store.close()

    asyncio.run(main())


def test_stalled_redis_times_out_fast(redis_standalone):
    feats = make_features(19)
    ids = np.arange(30)

    async def main():
        store = make_store(redis_standalone.url, "stall", feats, timeout_s=0.1, write_timeout_s=0.1)
        await store.fetch(ids)
        await store.flush()
        redis_standalone.pause()
        try:
            t0 = time.perf_counter()
            rows = await make_store(redis_standalone.url, "stall", feats, timeout_s=0.1).fetch(ids)
            assert time.perf_counter() - t0 < 0.5
            np.testing.assert_array_equal(rows, feats[ids])
            fresh_l1 = TieredFeatureStore(L1Cache(0, 1, DIM), store.l2, store.origin)
            rows, stats = await fresh_l1.fetch_with_stats(ids)
            assert stats.origin_hits == ids.size and store.l2.errors == 1
        finally:
            redis_standalone.resume()
        await asyncio.sleep(0.15)  # past the first backoff
        _, stats = await TieredFeatureStore(L1Cache(0, 1, DIM), store.l2, store.origin).fetch_with_stats(ids)
        assert stats.l2_hits == ids.size
        await store.close()

    asyncio.run(main())


def test_dead_cluster_master_falls_back_to_origin(redis_cluster):
    """Runs last among the cluster tests: it kills a master and restores it."""
    feats = make_features(20)
    ids = np.arange(300)
    victim = redis_cluster.nodes[1]

    async def main():
        store = make_store(redis_cluster.url, "dead", feats)
        await store.fetch(ids)
        await store.flush()
        victim.kill()
        try:
            t_end = time.monotonic() + 0.6
            while time.monotonic() < t_end:
                rows = await store.fetch(ids)
                np.testing.assert_array_equal(rows, feats[ids])
                await asyncio.sleep(0.01)
            assert store.l2.stats()["errors"] >= 1
        finally:
            victim.start()
            redis_cluster.wait_state("ok")
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            _, stats = await store.fetch_with_stats(ids)
            await store.flush()
            if stats.l2_hits:
                break
            await asyncio.sleep(0.05)
        assert stats.l2_hits > 0, store.l2.stats()
        await store.close()

    asyncio.run(main())
