"""Cluster mode's costs against the local mode, side by side in one run (prints numbers, never asserts).

    python bench/bench_feature_cluster.py [--nodes 1000000] [--edges 10000000] [--dim 128]
                                          [--seconds 8] [--concurrency 32] [--quick]

1. A synthetic snapshot (``training_export.synthetic``) saved into a private BentoML home, and a
   Redis Cluster of 3 masters + 3 replicas on loopback ports (``harness.redis_servers``).
2. The loader (``training_export.load_features``): rows/s written (each master's share of a batch
   in one EVAL, then WAIT for its replica), and the verification pass.
3. For each mode (local: the snapshot's memory-mapped ``features.npy``; cluster: the rows from the
   cluster), the FeatureRunner as its own BentoML service (``harness.app.Service``, one worker;
   its model-runner dependency is never called: ``/features`` samples and fetches only), driven
   by ``harness.load.closed_loop`` at ``--concurrency`` with single-node ``/features`` requests,
   fanout [25, 10]: once with L1 **cold** (``GSAGE_L1_BYTES=0``: every row from the origin) and
   once **warm** (256 MB L1, Zipf-distributed ids, after a warm-up window as long as the
   measured one). Requests/s, P50/P99, the service's CPU seconds per request, its process
   tree's RSS and USS (private memory: a mapped file's pages count in RSS only) after the load
   and after start-up.
4. Under a memory limit of ``--limit-fraction`` of the features' size (a cgroup v1
   ``memory.limit_in_bytes``, as a container's limit; skipped where no cgroup can be made), cluster
   mode with L1 cold: whether it starts and serves, and the cgroup's peak usage.
5. Failover (cluster mode, L1 cold): the same load while a master is killed a quarter into the
   window (its replica is promoted after ``cluster-node-timeout``, 1 s here): failed requests
   and the longest request (the time the failover held it).

The FeatureRunner alone is measured: its work (sampling + fetch) is where the two modes differ;
the gateway's and the model runner's parts (``python -m bench.suite``) are the same in both. Writes
bench/results/feature_cluster.json. Only loopback addresses; every load is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "feature_cluster.json"

from harness.memory_limit import MemoryLimit  # noqa: E402
from harness.ready_stub import ReadyStub  # noqa: E402


def percentile_ms(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values) * 1000, q)), 3) if values else float("nan")


# -- one FeatureRunner service, one mode ------------------------------------------------------


def bodies(num_nodes: int, warm: bool, n: int = 20_000) -> list[bytes]:
    """Single-node /features requests, fanout [25, 10], a seed each: uniform ids (L1 cold), or
    Zipf over a shuffled id order (a few hot nodes, a long tail: what L1 is for)."""
    rng = np.random.default_rng(1)
    if warm:
        ids = rng.permutation(num_nodes)[np.minimum(rng.zipf(1.2, n), num_nodes) - 1]
    else:
        ids = rng.integers(0, num_nodes, n)
    return [json.dumps({"node_ids": [int(v)], "fanout": [25, 10], "seed": i}).encode() for i, v in enumerate(ids)]


def memory(svc: Any) -> dict[str, float]:
    """The service's process tree: RSS and USS (private: a mapped file's pages count in RSS only)."""
    rss = uss = 0
    for p in svc.tree():
        try:
            info = p.memory_full_info()
        except Exception:
            continue
        rss, uss = rss + info.rss, uss + info.uss
    return {"rss_mb": round(rss / 2**20, 1), "uss_mb": round(uss / 2**20, 1)}


def redis_cpu_s(cluster: Any) -> float:
    """CPU seconds the cluster's running nodes have used (``INFO cpu``)."""
    total = 0.0
    for node in cluster.nodes:
        if node.proc is not None:
            info = node.info("cpu")
            total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def measure(
    env: dict[str, str],
    args: argparse.Namespace,
    num_nodes: int,
    warm: bool,
    cluster: Any = None,
    limit: MemoryLimit | None = None,
    redis: Any = None,
) -> dict[str, Any]:
    """A FeatureRunner started with ``env`` (under ``limit``), closed-loop /features at
    ``--concurrency``; with ``cluster``, a master killed a quarter into the window."""
    from harness.app import Service, service_headers
    from harness.load import closed_loop
    from harness.ports import free_port

    svc = Service("FeatureRunner", free_port(), env, depends={"GraphSAGERunner": args.model_stub}, log_dir=args.log_dir)
    out: dict[str, Any] = {}
    svc.launch()
    try:
        if limit is not None:
            limit.enter(svc.proc.pid)  # before it loads anything: its children are forked into it
        svc.wait_ready(180)
        out["after_start"] = memory(svc)
        reqs = bodies(num_nodes, warm)
        headers = service_headers(env)
        url = svc.url + "/features"
        if warm:
            asyncio.run(closed_loop(url, reqs, args.concurrency, args.seconds, headers=headers))
        killer = None
        cpu0 = svc.cpu_seconds()
        redis0 = redis_cpu_s(redis) if redis is not None else 0.0
        if cluster is not None:
            victim = next(n for n in cluster.nodes if cluster.roles().get(n.port) == "master")
            killer = threading.Timer(args.seconds / 4, victim.kill)
            killer.start()
            out["killed_port"] = victim.port
        result = asyncio.run(
            closed_loop(url, reqs, args.concurrency, args.seconds, headers=headers, warmup_requests=args.concurrency)
        )
        if killer is not None:
            killer.join()
        cpu = svc.cpu_seconds() - cpu0
        if redis is not None:
            out["redis_cpu_ms_per_request"] = round((redis_cpu_s(redis) - redis0) * 1000 / max(1, result.ok), 3)
        lat = result.latencies_s
        out.update(
            requests=result.ok,
            errors=dict(result.errors),
            req_per_s=round(result.ok / result.elapsed_s, 1),
            p50_ms=percentile_ms(list(lat), 50),
            p99_ms=percentile_ms(list(lat), 99),
            max_ms=round(float(lat.max()) * 1000, 1) if lat.size else None,
            cpu_ms_per_request=round(cpu * 1000 / max(1, result.ok), 3),
            **memory(svc),
        )
    finally:
        svc.stop()
        if limit is not None:
            out["memory_limit"] = limit.figures()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=10_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="100k nodes / 1M edges, 3 s windows")
    ap.add_argument(
        "--limit-fraction",
        type=float,
        default=0.75,
        help="the memory limit's runs: this fraction of the features' size",
    )
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.edges, args.seconds = 100_000, 1_000_000, 3.0
    home = tempfile.mkdtemp(prefix="gsage-cluster-bench-home-")
    os.environ["BENTOML_HOME"] = home
    args.log_dir = tempfile.mkdtemp(prefix="gsage-cluster-bench-logs-")
    args.model_stub = ReadyStub().url

    from harness.redis_servers import RedisCluster3
    from runners.feature.authority import AuthorityPolicy, FeatureAuthority
    from runners.feature.snapshot import save_snapshot
    from training_export.load_features import load_features
    from training_export.synthetic import SyntheticGraphSpec, generate

    out: dict[str, Any] = {"nodes": args.nodes, "edges": args.edges, "dim": args.dim, "cores": os.cpu_count()}
    t0 = time.perf_counter()
    snap = generate(SyntheticGraphSpec(num_nodes=args.nodes, num_edges=args.edges, feature_dim=args.dim))
    tag = save_snapshot(snap)
    out["generate_s"] = round(time.perf_counter() - t0, 1)
    out["features_mb"] = round(snap.features.nbytes / 2**20, 1)
    out["structure_mb"] = round((snap.indptr.nbytes + snap.indices.nbytes) / 2**20, 1)
    print(f"snapshot {tag}: {args.nodes:,} nodes, {snap.num_edges:,} edges, features {out['features_mb']} MB")

    with tempfile.TemporaryDirectory() as redis_dir, RedisCluster3(redis_dir, replicas=1) as cluster:

        async def load() -> Any:
            authority = FeatureAuthority.connect(cluster.url, snap.feature_set, args.dim, AuthorityPolicy())
            try:
                return await load_features(snap, authority, batch_rows=4096)
            finally:
                await authority.close()

        report = asyncio.run(load())
        out["loader"] = {
            "rows_per_s": report.rows_per_s,
            "load_s": report.load_seconds,
            "verify_s": report.verify_seconds,
            "verified": report.verified,
        }
        used = [int(cluster.nodes[i].info("memory")["used_memory"]) for i in range(len(cluster.nodes))]
        out["cluster_used_memory_mb"] = round(sum(used) / 2**20, 1)
        out["cluster_bytes_per_row"] = round(sum(used) / 2 / args.nodes, 1)  # a master and its replica each
        print(
            f"loader: {report.rows_per_s:,.0f} rows/s, verified {report.verified}; cluster {out['cluster_used_memory_mb']} MB"
        )

        base = {
            **os.environ,
            "BENTOML_HOME": home,
            "BENTOML_DO_NOT_TRACK": "true",
            "GSAGE_SNAPSHOT_TAG": tag,
            "GSAGE_GRAPH_LOG": "file",
            "GSAGE_GRAPH_LOG_DIR": os.path.join(home, "update-log"),
        }
        modes = {
            "local": base,
            "cluster": {**base, "GSAGE_FEATURE_SOURCE": "redis", "GSAGE_FEATURE_REDIS_URL": cluster.url},
        }
        for l1_name, l1 in (("cold", "0"), ("warm", str(256 << 20))):
            for mode, env in modes.items():
                result = measure(
                    {**env, "GSAGE_L1_BYTES": l1},
                    args,
                    args.nodes,
                    warm=l1_name == "warm",
                    redis=cluster if mode == "cluster" else None,
                )
                out[f"{mode}_{l1_name}"] = result
                print(
                    f"{mode:8s} L1 {l1_name}: {result['req_per_s']} req/s, P50 {result['p50_ms']} ms, "
                    f"P99 {result['p99_ms']} ms, {result['cpu_ms_per_request']} CPU ms/req "
                    f"(+ Redis {result.get('redis_cpu_ms_per_request', 0)}), "
                    f"RSS {result['rss_mb']} MB (USS {result['uss_mb']} MB; {result['after_start']['rss_mb']} MB "
                    f"after start), errors {result['errors']}"
                )
        for l1_name in ("cold", "warm"):
            c, loc = out[f"cluster_{l1_name}"], out[f"local_{l1_name}"]
            out[f"ratio_{l1_name}"] = {
                "throughput": round(c["req_per_s"] / loc["req_per_s"], 3),
                "p99": round(c["p99_ms"] / loc["p99_ms"], 3),
                "cpu_per_request": round(c["cpu_ms_per_request"] / loc["cpu_ms_per_request"], 3),
            }
            print(f"cluster/local L1 {l1_name}: {out[f'ratio_{l1_name}']}")
        # Under a memory limit below the size of the features (a container's limit, cgroup v1).
        why_not = MemoryLimit.available()
        if why_not:
            out["memory_limit"] = {"skipped": why_not}
            print(f"memory limit: skipped, {why_not}")
        else:
            limit_bytes = int(snap.features.nbytes * args.limit_fraction)
            # Cluster mode only: a cgroup is charged the page cache its members first read, and
            # the snapshot's pages were read before (local runs above), so the limit would not
            # bind the local mode's mapped rows here; its RSS above says what they cost it.
            for mode, env in (("cluster", modes["cluster"]),):
                limit = MemoryLimit(limit_bytes)
                try:
                    result = measure({**env, "GSAGE_L1_BYTES": "0"}, args, args.nodes, warm=False, limit=limit)
                except Exception as exc:  # e.g. killed by the limit while starting
                    result = {"failed": f"{type(exc).__name__}: {str(exc)[:300]}", "memory_limit": limit.figures()}
                finally:
                    limit.remove()
                out[f"{mode}_limited"] = result
                print(
                    f"{mode:8s} under {result['memory_limit']['limit_mb']} MB (features {out['features_mb']} MB): {result}"
                )
        out["failover"] = f = measure(
            {**modes["cluster"], "GSAGE_L1_BYTES": "0"}, args, args.nodes, warm=False, cluster=cluster
        )
        print(
            f"failover: {sum(f['errors'].values())} failed of {f['requests'] + sum(f['errors'].values())}, "
            f"max latency {f['max_ms']} ms (the failover), P99 {f['p99_ms']} ms"
        )
    out["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
