"""The FeatureRunner's in-process path on the demo graph (prints numbers, never asserts).

    python bench/bench_features.py [--quick] [--nodes 100000] [--edges 1000000] [--no-redis]

What the service does per request, without HTTP: ``NeighbourhoodBuilder.validate`` + ``build`` +
``feature_tensor.encode``, fanout [25, 10], on ``training_export.synthetic.generate`` (defaults:
100k nodes / 1M edges / 128-dim). Target ids are Zipf(1.0): ranks r = 1..N with P(r) ~ 1/r, mapped
to node ids through a random permutation (hot nodes are not simply low ids).

Sections:

1. single-target latency (P50/P99 of validate + build + encode):
   a. L1 at 10% of the feature bytes, warmed by the Zipf stream, no Redis (misses go to origin);
      a'. L1 holding every node (all hits), for the pure L1 path;
   b. L1 off, L2 Redis pre-warmed with every row: every lookup answered by Redis;
   c. L1 off, no Redis: every row gathered from the origin (here the generated, in-memory feature
      matrix, i.e. a fully page-cached snapshot: the cheapest an origin gets);
   c'. L1 off, Redis on but flushed before each request: L2 miss + origin + background write-back.
2. hit ratios per lookup over a Zipf stream of single-target requests (L1 at 10% of the features,
   Redis on, write-back on miss), in four windows: from a cold start (L1 and Redis empty), and
   after the service's start-up warming (``GSAGE_WARM_NODES``: the 20% highest-degree nodes into
   Redis and, as far as it holds them, L1).
2b. L1 policy: plain LRU against LRU behind the admission filter (``GSAGE_L1_ADMIT_MIN_USES``),
   L1 at 10%, no Redis, Zipf and uniform targets: hit ratio, L1 inserts per request, build time.
3. throughput: 256 single-target requests (own seeds) merged into one ``build`` (what the batcher
   hands the builder under load) + one encode per request, in targets/s.
4. PyG comparison per 256-target batch: ``torch_geometric`` 2.8 samples neighbours only through
   pyg-lib or torch-sparse (``NeighborSampler`` raises ImportError without them; checked at run
   time), so the baseline is a plain-torch per-node ``torch.randperm`` sampler ("naive"), plus
   PyG's ``k_hop_subgraph`` (full 2-hop neighbourhood, no fanout: a different, heavier job) for scale.
5. layout: bytes per target of the padded [25, 10] tree vs the deduplicated FeatureTensor
   (float32, float16, and encoded float32) for batch sizes 1, 16, 256.

Writes bench/results/feature_bench.json. Starts its own redis-server on a free loopback port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.feature_tensor import encode, padded_nbytes
from common.settings import Settings
from harness.redis_servers import RedisServer, redis_available
from harness.workload import Uniform, Zipf
from runners.feature.cache.tiered import build_feature_store
from runners.feature.neighbourhood import NeighbourhoodBuilder
from runners.feature.sampling import sample_tree
from runners.feature.tree_layout import compact
from training_export.synthetic import SyntheticGraphSpec, generate

FANOUT = (25, 10)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "feature_bench.json")


def pct(seconds: list[float] | np.ndarray) -> dict[str, float]:
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "n": int(ms.size),
    }


def level_ratios(store, before: dict) -> dict[str, float]:
    """Per-lookup hit ratios of the fetches since ``before`` (a ``store.stats()`` snapshot)."""
    now = store.stats()
    l1_hits = now["l1"]["hits"] - before["l1"]["hits"]
    lookups = l1_hits + now["l1"]["misses"] - before["l1"]["misses"]
    l2_hits = (now["l2"]["hits"] - before["l2"]["hits"]) if "l2" in now else 0
    return {
        "lookups": int(lookups),
        "l1": l1_hits / max(lookups, 1),
        "l2": l2_hits / max(lookups, 1),
        "combined": (l1_hits + l2_hits) / max(lookups, 1),
    }


class Bench:
    def __init__(self, args: argparse.Namespace, graph, redis_url: str) -> None:
        self.args = args
        self.graph = graph
        self.redis_url = redis_url
        self.zipf = Zipf(graph.num_nodes, seed=args.seed)
        self.seed_rng = np.random.default_rng(args.seed + 1)
        self.feature_bytes = int(graph.features.nbytes)
        self.results: dict = {}
        self.stores = []

    def builder(
        self, l1_bytes: int, redis: bool, version: str = "bench", admit_min_uses: int = Settings.l1_admit_min_uses
    ) -> NeighbourhoodBuilder:
        cfg = Settings(
            l1_bytes=l1_bytes,
            redis_url=self.redis_url if redis else "",
            l2_timeout_s=1.0,
            l1_admit_min_uses=admit_min_uses,
        )
        store = build_feature_store(cfg.feature_cache, cfg.redis, self.graph.features, f"graph-snapshot:{version}")
        self.stores.append(store)
        return NeighbourhoodBuilder(self.graph, store, FANOUT, max_nodes=1024)

    def next_seed(self) -> int:
        return int(self.seed_rng.integers(0, 2**62))

    async def one(self, b: NeighbourhoodBuilder, node: int) -> int:
        """What FeatureRunner.features does for one request, minus HTTP and the batcher."""
        request = b.validate([node], None, self.next_seed(), "float32")
        (ft,) = await b.build([request])
        return len(encode(ft))

    async def single_latency(
        self, b: NeighbourhoodBuilder, nodes: np.ndarray, before_each: Callable | None = None
    ) -> dict:
        times, stages = [], {"sample": [], "fetch": [], "assemble": []}
        for node in nodes.tolist():
            if before_each is not None:
                await before_each()
            t = time.perf_counter()
            await self.one(b, node)
            times.append(time.perf_counter() - t)
            last = b.last
            stages["sample"].append(last.sample_s)
            stages["fetch"].append(last.fetch.l1_s + last.fetch.l2_s + last.fetch.origin_s)
            stages["assemble"].append(last.assemble_s)
        out = pct(times)
        out["stage_p50_ms"] = {k: float(np.median(v) * 1e3) for k, v in stages.items()}
        return out

    async def run(self) -> None:
        a = self.args
        n_lat = a.latency_requests
        l1_10 = self.feature_bytes // 10
        res = self.results
        res["config"] = {
            "nodes": self.graph.num_nodes,
            "edges": self.graph.num_edges,
            "feature_dim": self.graph.feature_dim,
            "feature_bytes": self.feature_bytes,
            "l1_bytes_10pct": l1_10,
            "fanout": list(FANOUT),
            "zipf_exponent": 1.0,
            "redis": bool(self.redis_url),
            "quick": a.quick,
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs, python {platform.python_version()}",
        }
        lat = res["single_target"] = {}

        # (a) L1 at 10% of the features, warmed by the Zipf stream; misses from the origin.
        b = self.builder(l1_10, redis=False)
        res["config"]["l1_rows_10pct"] = b.store.l1.capacity
        for node in self.zipf.draw(a.warm_requests).tolist():
            await self.one(b, node)
        before = b.store.stats()
        lat["a_l1_10pct_warm"] = await self.single_latency(b, self.zipf.draw(n_lat))
        lat["a_l1_10pct_warm"]["hit_ratio"] = level_ratios(b.store, before)

        # (a') L1 holding every node: all hits.
        b = self.builder(2 * self.feature_bytes + 64 * 2**20, redis=False)
        await b.store.warm(np.arange(self.graph.num_nodes))
        before = b.store.stats()
        lat["a2_l1_all_hits"] = await self.single_latency(b, self.zipf.draw(n_lat))
        lat["a2_l1_all_hits"]["hit_ratio"] = level_ratios(b.store, before)

        if self.redis_url:
            # (b) L1 off, Redis pre-warmed with every row.
            b = self.builder(0, redis=True, version="bench-l2")
            await b.store.warm(np.arange(self.graph.num_nodes))
            for node in self.zipf.draw(50).tolist():  # connections, scripts
                await self.one(b, node)
            before = b.store.stats()
            lat["b_l2_redis"] = await self.single_latency(b, self.zipf.draw(n_lat))
            lat["b_l2_redis"]["hit_ratio"] = level_ratios(b.store, before)

        # (c) L1 off, no Redis: origin only.
        b = self.builder(0, redis=False)
        lat["c_origin"] = await self.single_latency(b, self.zipf.draw(n_lat))

        if self.redis_url:
            # (c') L1 off, Redis empty: an L2 miss, the origin, a background write-back.
            b = self.builder(0, redis=True, version="bench-cold")
            client = b.store.l2._client

            async def flush() -> None:
                await b.store.flush()
                await client.flushdb()

            lat["c2_l2_miss_origin"] = await self.single_latency(b, self.zipf.draw(max(n_lat // 2, 50)), flush)
            await b.store.flush()
            await client.flushdb()

        # Hit ratios over a Zipf stream: L1 10%, Redis on, write-back on miss; from a cold start,
        # and with the service's start-up warming (GSAGE_WARM_NODES: the highest-degree nodes).
        hits = res["hit_ratio_stream"] = {
            "requests": a.stream_requests,
            "l1_bytes": l1_10,
            "redis": bool(self.redis_url),
            "warm_nodes": a.warm_nodes,
        }
        for start in ("cold", "warmed"):
            b = self.builder(l1_10, redis=bool(self.redis_url), version=f"bench-stream-{start}")
            if start == "warmed":
                await b.store.warm(np.argsort(-self.graph.degrees(), kind="stable")[: a.warm_nodes])
            stream = self.zipf.draw(a.stream_requests)
            windows = hits[start] = {}
            for q, part in enumerate(np.array_split(stream, 4)):
                before = b.store.stats()
                for node in part.tolist():
                    await self.one(b, node)
                await b.store.flush()
                windows[f"q{q + 1}"] = level_ratios(b.store, before)
            if self.redis_url:
                await b.store.l2._client.flushdb()

        res["l1_policy"] = await self.l1_policy(l1_10)

        # Throughput: 256 single-target requests merged into one build, + 256 encodes.
        thr = res["throughput_256"] = {}
        configs = [("l1_10pct", l1_10, False)]
        if self.redis_url:
            configs.append(("l1_10pct_redis", l1_10, True))
        for name, l1_bytes, redis in configs:
            b = self.builder(l1_bytes, redis=redis, version=f"bench-thr-{name}")
            for _ in range(a.warm_batches):
                await self.batch(b, self.zipf.draw(256))
            await b.store.flush()
            before = b.store.stats()
            times, distinct = [], []
            for _ in range(a.batches):
                t = time.perf_counter()
                await self.batch(b, self.zipf.draw(256))
                times.append(time.perf_counter() - t)
                distinct.append(b.last.distinct_nodes)
            thr[name] = {
                **pct(times),
                "targets_per_s": 256 / float(np.mean(times)),
                "distinct_nodes_per_batch": float(np.mean(distinct)),
                "hit_ratio": level_ratios(b.store, before),
            }

    async def l1_policy(self, l1_bytes: int) -> dict:
        """Plain LRU against LRU behind the admission filter (``l1_admit_min_uses``), L1 at 10%, no
        Redis (a miss goes to the origin), on the same Zipf and uniform streams. The policies take
        turns in blocks of 200 requests, each on its own store, so all meet the same machine."""
        a, out = self.args, {}
        policies = (0, 2, 3, 4)
        for dist in ("zipf", "uniform"):
            targets = (self.zipf if dist == "zipf" else Uniform(self.graph.num_nodes, seed=a.seed)).draw(
                a.warm_requests + a.stream_requests
            )
            builders = {
                k: self.builder(l1_bytes, redis=False, version=f"policy-{k}", admit_min_uses=k) for k in policies
            }
            seeds = [self.next_seed() for _ in range(targets.size)]
            before, times = {}, {k: [] for k in policies}
            for start in range(0, targets.size, 200):
                for k, b in builders.items():
                    if start == a.warm_requests:
                        b.store._drain_fills()
                        before[k] = b.store.l1.stats()
                    for node, seed in zip(targets[start : start + 200].tolist(), seeds[start : start + 200]):
                        t = time.perf_counter()
                        await b.build([b.validate([node], None, seed, "float32")])
                        if start >= a.warm_requests:
                            times[k].append(time.perf_counter() - t)
            out[dist] = {}
            for k, b in builders.items():
                b.store._drain_fills()
                after = b.store.l1.stats()
                d = {c: after[c] - before[k][c] for c in ("hits", "misses", "inserts", "rejected")}
                n = len(times[k])
                out[dist][f"admit_{k}"] = {
                    **pct(times[k]),
                    "hit_ratio": d["hits"] / max(d["hits"] + d["misses"], 1),
                    "inserts_per_request": d["inserts"] / n,
                    "rejected_per_request": d["rejected"] / n,
                    "fill_ms_per_request": b.store.fill_seconds * 1e3 / (a.warm_requests + n),
                }
        return out

    async def batch(self, b: NeighbourhoodBuilder, nodes: np.ndarray) -> int:
        requests = [b.validate([n], None, self.next_seed(), "float32") for n in nodes.tolist()]
        return sum(len(encode(ft)) for ft in await b.build(requests))

    # -- PyG / naive baseline ---------------------------------------------------------------------

    def compare_pyg(self) -> dict:
        import torch
        import torch_geometric
        from torch_geometric.data import Data
        from torch_geometric.utils import k_hop_subgraph

        a, g = self.args, self.graph
        out: dict = {
            "torch": torch.__version__,
            "torch_geometric": torch_geometric.__version__,
            "with_pyg_lib": bool(torch_geometric.typing.WITH_PYG_LIB),
            "with_torch_sparse": bool(torch_geometric.typing.WITH_TORCH_SPARSE),
        }
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        indptr = torch.from_numpy(np.asarray(g.indptr, dtype=np.int64))
        indices = torch.from_numpy(np.asarray(g.indices, dtype=np.int64))
        x = torch.from_numpy(np.asarray(g.features))
        batches = [self.zipf.draw(256) for _ in range(a.pyg_batches)]

        # Does PyG's own sampler run here?
        try:
            from torch_geometric.sampler import NeighborSampler, NodeSamplerInput

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                src = torch.repeat_interleave(torch.arange(g.num_nodes), indptr.diff())
                data = Data(edge_index=torch.stack([indices, src]), num_nodes=g.num_nodes)
                sampler = NeighborSampler(data, num_neighbors=list(FANOUT))
                t = time.perf_counter()
                sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.from_numpy(batches[0])))
            out["pyg_neighbor_sampler"] = {"runs": True, "first_batch_ms": (time.perf_counter() - t) * 1e3}
        except ImportError as exc:
            out["pyg_neighbor_sampler"] = {"runs": False, "error": str(exc)}

        def naive(targets: np.ndarray) -> tuple[list[torch.Tensor], torch.Tensor]:
            """Per-node torch.randperm sampling over the CSR, then one feature gather."""
            layers = [torch.from_numpy(targets)]
            for k in FANOUT:
                nxt = []
                for v in layers[-1].tolist():
                    lo, hi = int(indptr[v]), int(indptr[v + 1])
                    nbrs = indices[lo:hi]
                    if hi - lo > k:
                        nbrs = nbrs[torch.randperm(hi - lo)[:k]]
                    nxt.append(nbrs)
                layers.append(torch.cat(nxt))
            nodes = torch.unique(torch.cat(layers))
            return layers, x.index_select(0, nodes)

        def time_it(fn: Callable[[np.ndarray], object], reps: list[np.ndarray]) -> list[float]:
            fn(reps[0])
            times = []
            for ids in reps:
                t = time.perf_counter()
                fn(ids)
                times.append(time.perf_counter() - t)
            return times

        ours = time_it(lambda ids: sample_tree(g.indptr, g.indices, ids, FANOUT, seed=self.next_seed()), batches)
        b = self.builder(2 * self.feature_bytes + 64 * 2**20, redis=False)

        async def ours_full() -> list[float]:  # sampling + features + encodes, L1 all hits
            await b.store.warm(np.arange(g.num_nodes))
            await self.batch(b, batches[0])
            times = []
            for ids in batches:
                t = time.perf_counter()
                await self.batch(b, ids)
                times.append(time.perf_counter() - t)
            return times

        full = asyncio.run(ours_full())
        naive_t = time_it(naive, batches)
        naive_sample_only = time_it(lambda ids: naive(ids)[0], batches)
        khop_reps = batches[: max(2, a.khop_batches)]
        edge_index = torch.stack([torch.repeat_interleave(torch.arange(g.num_nodes), indptr.diff()), indices])
        khop = time_it(
            lambda ids: k_hop_subgraph(torch.from_numpy(ids), 2, edge_index, num_nodes=g.num_nodes), khop_reps
        )
        out["per_256_batch"] = {
            "ours_sample_tree": pct(ours),
            "ours_build_encode_l1_hits": pct(full),
            "naive_torch_randperm_sample": pct(naive_sample_only),
            "naive_torch_randperm_sample_gather": pct(naive_t),
            "pyg_k_hop_subgraph_full_2hop": pct(khop),
        }
        out["ratio_naive_over_ours_sampling"] = float(np.mean(naive_sample_only) / np.mean(ours))
        out["ratio_naive_gather_over_ours_build"] = float(np.mean(naive_t) / np.mean(full))
        return out

    # -- layout -------------------------------------------------------------------------------------

    def layout(self) -> dict:
        g, out = self.graph, {}
        for batch, reps in ((1, 200), (16, 50), (256, 10)):
            if self.args.quick:
                reps = max(3, reps // 4)
            padded = dedup32 = dedup16 = enc = 0
            b = self.builder(2 * self.feature_bytes + 64 * 2**20, redis=False)
            for _ in range(reps):
                ids = self.zipf.draw(batch)
                seed = self.next_seed()
                tree = sample_tree(g.indptr, g.indices, ids, FANOUT, seed=seed)
                unique, index = compact(tree)
                idx_bytes = sum(i.nbytes for i in index)
                padded += padded_nbytes(tree, g.feature_dim, 4)
                dedup32 += unique.size * g.feature_dim * 4 + idx_bytes
                dedup16 += unique.size * g.feature_dim * 2 + idx_bytes
                (ft,) = asyncio.run(b.build([b.validate(ids.tolist(), None, seed)]))
                enc += len(encode(ft))
            n = reps * batch
            out[str(batch)] = {
                "padded_f32": padded / n,
                "dedup_f32": dedup32 / n,
                "dedup_f16": dedup16 / n,
                "encoded_dedup_f32": enc / n,
                "padded_over_dedup_f32": padded / dedup32,
            }
        return out


def print_table(res: dict) -> None:
    c = res["config"]
    print(
        f"\nFeatureRunner in-process bench: {c['nodes']:,} nodes / {c['edges']:,} edges, "
        f"F={c['feature_dim']}, fanout {c['fanout']}, Zipf(1.0) ids, {c['machine']}"
    )
    print(f"L1 10% of features = {c['l1_bytes_10pct'] / 2**20:.1f} MiB = {c['l1_rows_10pct']:,} rows")
    print(
        "\nsingle-target request (validate + build + encode)      p50 ms   p99 ms   sample/fetch/assemble p50 ms   hit"
    )
    names = {
        "a_l1_10pct_warm": "(a)  L1 10%, warm, no Redis (miss->origin)",
        "a2_l1_all_hits": "(a') L1 holds all (100% L1)",
        "b_l2_redis": "(b)  L1 off, L2 Redis warm",
        "c_origin": "(c)  L1 off, no Redis: origin",
        "c2_l2_miss_origin": "(c') L1 off, L2 miss -> origin + write-back",
    }
    for key, label in names.items():
        r = res["single_target"].get(key)
        if r is None:
            continue
        s = r["stage_p50_ms"]
        hr = r.get("hit_ratio")
        hit = f"L1 {hr['l1']:.0%} L2 {hr['l2']:.0%}" if hr else ""
        print(
            f"  {label:<50} {r['p50_ms']:7.3f}  {r['p99_ms']:7.3f}   "
            f"{s['sample']:.3f}/{s['fetch']:.3f}/{s['assemble']:.3f}{'':12}{hit}"
        )
    h = res["hit_ratio_stream"]
    print(
        f"\nhit ratio per lookup, {h['requests']:,} single-target Zipf requests in 4 windows, L1 10%, "
        f"Redis {'on' if h['redis'] else 'OFF'}, write-back on miss"
    )
    for start, label in (("cold", "cold start"), ("warmed", f"warm top-{h['warm_nodes']:,}-degree")):
        cells = "  ".join(f"{q} {r['combined']:6.1%} (L1 {r['l1']:4.0%})" for q, r in h[start].items())
        print(f"  {label:<22} combined: {cells}")
    print("\nL1 policy, single-target requests, L1 10%, no Redis (same stream, policies interleaved)")
    print("  targets  admission            L1 hit   inserts/req  rejected/req  fill ms/req   build p50 ms  p99 ms")
    for dist, rows in res["l1_policy"].items():
        for name, r in rows.items():
            k = int(name.split("_")[1])
            label = "off (plain LRU)" if k == 0 else f">= {k} uses"
            print(
                f"  {dist:<8} {label:<18} {r['hit_ratio']:8.1%}  {r['inserts_per_request']:11.1f}  "
                f"{r['rejected_per_request']:12.1f}  {r['fill_ms_per_request']:11.3f}   {r['p50_ms']:10.3f}  {r['p99_ms']:6.3f}"
            )
    print("\nthroughput, 256 single-target requests merged per build (+256 encodes)")
    for name, r in res["throughput_256"].items():
        hr = r["hit_ratio"]
        print(
            f"  {name:<16} {r['targets_per_s']:9,.0f} targets/s   batch p50 {r['p50_ms']:.2f} ms "
            f"p99 {r['p99_ms']:.2f} ms   {r['distinct_nodes_per_batch']:,.0f} distinct nodes/batch   "
            f"L1 {hr['l1']:.1%} L2 {hr['l2']:.1%}"
        )
    p = res["pyg_comparison"]
    ns = p["pyg_neighbor_sampler"]
    print(
        f"\nPyG comparison per 256-target batch (torch {p['torch']}, PyG {p['torch_geometric']}, "
        f"pyg-lib {p['with_pyg_lib']}, torch-sparse {p['with_torch_sparse']})"
    )
    print(f"  PyG NeighborSampler: {'runs' if ns['runs'] else 'does not run: ' + ns['error']}")
    for key, r in p["per_256_batch"].items():
        print(f"  {key:<38} p50 {r['p50_ms']:8.2f} ms   p99 {r['p99_ms']:8.2f} ms")
    print(
        f"  naive/ours sampling x{p['ratio_naive_over_ours_sampling']:.1f};   "
        f"naive sample+gather / ours build+encode x{p['ratio_naive_gather_over_ours_build']:.1f}"
    )
    print("\nlayout, bytes per target ([25,10] tree)   padded f32   dedup f32   dedup f16   encoded f32   padded/dedup")
    for batch, r in res["layout"].items():
        print(
            f"  batch {batch:>4}{'':29} {r['padded_f32']:10,.0f}  {r['dedup_f32']:10,.0f}  {r['dedup_f16']:10,.0f}"
            f"  {r['encoded_dedup_f32']:11,.0f}   x{r['padded_over_dedup_f32']:.1f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (~30 s)")
    ap.add_argument("--nodes", type=int, default=SyntheticGraphSpec.num_nodes)
    ap.add_argument("--edges", type=int, default=SyntheticGraphSpec.num_edges)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-redis", action="store_true", help="skip the L2 cases")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args()
    q = args.quick
    args.latency_requests = 300 if q else 2000
    args.warm_requests = 1000 if q else 5000
    args.stream_requests = 4000 if q else 16000
    args.warm_nodes = 20_000 if args.nodes >= 100_000 else args.nodes // 5
    args.warm_batches, args.batches = (2, 10) if q else (5, 40)
    args.pyg_batches = 3 if q else 10
    args.khop_batches = 2 if q else 5

    t0 = time.perf_counter()
    graph = generate(SyntheticGraphSpec(num_nodes=args.nodes, num_edges=args.edges, seed=args.seed), progress=False)
    print(f"graph generated in {time.perf_counter() - t0:.1f} s", flush=True)

    server = None
    with tempfile.TemporaryDirectory(prefix="bench-features-") as tmp:
        try:
            if not args.no_redis:
                if redis_available():
                    server = RedisServer(os.path.join(tmp, "redis")).start()
                else:
                    print("redis-server not installed: the L2 cases are skipped")
            bench = Bench(args, graph, server.url if server else "")

            async def cached_sections() -> None:
                try:
                    await bench.run()
                finally:
                    for store in bench.stores:
                        await store.flush()
                        await store.close()
                    bench.stores.clear()

            t = time.perf_counter()
            asyncio.run(cached_sections())
            print(f"latency / hit ratio / throughput sections: {time.perf_counter() - t:.1f} s", flush=True)
        finally:
            if server is not None:
                server.stop()
    t = time.perf_counter()
    bench.results["pyg_comparison"] = bench.compare_pyg()
    bench.results["layout"] = bench.layout()
    print(f"PyG and layout sections: {time.perf_counter() - t:.1f} s", flush=True)
    bench.results["elapsed_s"] = time.perf_counter() - t0

    print_table(bench.results)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(bench.results, f, indent=2)
    print(f"\nwrote {args.out} ({bench.results['elapsed_s']:.0f} s in all)")


if __name__ == "__main__":
    main()
