"""Latency of each feature-cache level for one request's worth of ids (prints, never asserts).

    python bench/bench_cache.py [--ids 276] [--dim 128] [--nodes 200000] [--iters 500] [--cluster]

Starts its own redis-server (and, with ``--cluster``, a 3-master Cluster) on free loopback
ports, writes a random float32 feature matrix to a temporary ``.npy`` and memory-maps it like a
snapshot, then times, per call of ``--ids`` unique random ids:

    L1 get       L1Cache.get_many, all hits
    L2 MGET      the same command through redis-py's asyncio client and through the lean
                 connection the L2 reads with (runners/feature/cache/resp.py), side by side
    L2 get       RedisFeatureLevel.get: one MGET (standalone) + decode, all hits
    L2 put       RedisFeatureLevel.put: one EVAL of the SET script
    origin       OriginLevel.get_many: fancy-index gather from the memmap (page cache warm)
    fetch        TieredFeatureStore.fetch with L1 disabled, i.e. L2 hit path end to end
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.redis_servers import RedisCluster3, RedisServer
from runners.feature.cache import L1Cache, OriginLevel, RedisFeatureLevel, TieredFeatureStore
from runners.feature.cache.resp import pack_command


def summary(name: str, seconds: list[float]) -> str:
    us = np.asarray(seconds) * 1e6
    return (
        f"{name:<28} p50 {np.percentile(us, 50):8.1f} us   p99 {np.percentile(us, 99):8.1f} us"
        f"   mean {us.mean():8.1f} us"
    )


def time_sync(fn: Callable[[], object], iters: int) -> list[float]:
    for _ in range(min(20, iters)):
        fn()
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


async def time_async(fn: Callable[[], Awaitable[object]], iters: int) -> list[float]:
    for _ in range(min(20, iters)):
        await fn()
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return out


async def bench_l2(url: str, label: str, feats: np.ndarray, id_sets: list[np.ndarray], iters: int) -> list[str]:
    l2 = RedisFeatureLevel.from_url(url, "bench", feats.shape[1], ttl_s=600, timeout_s=1.0, retry_backoff_s=1.0)
    for ids in id_sets:
        await l2.put(ids, feats[ids])
    it = iter(range(10**9))

    def next_ids() -> np.ndarray:
        return id_sets[next(it) % len(id_sets)]

    lines = []
    if not l2.cluster:
        keys = [l2._keys(ids) for ids in id_sets]
        lines.append(
            summary(
                f"L2 MGET, redis-py [{label}]",
                await time_async(lambda: l2._client.mget(keys[next(it) % len(keys)]), iters),
            )
        )
        packed = [pack_command(b"MGET", *k) for k in keys]
        lines.append(
            summary(
                f"L2 MGET, lean conn [{label}]",
                await time_async(lambda: l2._reads.execute(packed[next(it) % len(packed)]), iters),
            )
        )
    lines.append(summary(f"L2 get [{label}]", await time_async(lambda: l2.get(next_ids()), iters)))
    ids0 = id_sets[0]
    lines.append(summary(f"L2 put [{label}]", await time_async(lambda: l2.put(ids0, feats[ids0]), max(50, iters // 5))))
    store = TieredFeatureStore(L1Cache(0, 1, feats.shape[1]), l2, OriginLevel(feats))
    lines.append(summary(f"fetch, L1 off [{label}]", await time_async(lambda: store.fetch(next_ids()), iters)))
    assert l2.errors == 0 and l2.fallbacks == 0, l2.stats()
    await store.close()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ids", type=int, default=276)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--cluster", action="store_true", help="also bench a 3-master Cluster")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "features.npy")
        np.save(path, rng.standard_normal((args.nodes, args.dim), dtype=np.float32))
        feats = np.load(path, mmap_mode="r")
        id_sets = [rng.choice(args.nodes, args.ids, replace=False) for _ in range(32)]
        print(
            f"{args.ids} ids x {args.dim} float32 ({args.ids * args.dim * 4 / 1024:.0f} KiB)"
            f" per call, {args.nodes} nodes, {args.iters} calls, {os.cpu_count()} CPUs"
        )

        l1 = L1Cache(64 << 20, 300, args.dim)
        for ids in id_sets:
            l1.put_many(ids, feats[ids])
        origin = OriginLevel(feats)
        it = iter(range(10**9))
        lines = [
            summary("L1 get (all hit)", time_sync(lambda: l1.get_many(id_sets[next(it) % 32]), args.iters)),
            summary("origin gather (mmap)", time_sync(lambda: origin.get_many(id_sets[next(it) % 32]), args.iters)),
        ]
        with RedisServer(os.path.join(tmp, "redis")) as server:
            lines += asyncio.run(bench_l2(server.url, "standalone", feats, id_sets, args.iters))
        if args.cluster:
            with RedisCluster3(os.path.join(tmp, "cluster")) as cluster:
                lines += asyncio.run(bench_l2(cluster.url, "cluster", feats, id_sets, args.iters))
        print("\n".join(lines))


if __name__ == "__main__":
    main()
