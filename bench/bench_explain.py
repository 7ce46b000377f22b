"""What ``explain`` costs per node against a plain prediction (prints numbers, never asserts).

    python bench/bench_explain.py [--sizes 1,4,16] [--rounds 3] [--window 5] [--warmup 3]
                                  [--concurrency 1] [--dist zipf]

The app (``harness.app.SplitApp``: gateway, FeatureRunner, GraphSAGERunner as separate
processes) on the 100k/1M demo store (``bench.suite.runner.ensure_store(HOME_100K)``), auth off,
no Redis. Per request size (node ids per request, at most ``GSAGE_EXPLAIN_MAX_NODES``), the same
bodies (Zipf ids, a seed per body, so both sides sample the same neighbourhoods) are sent to
``/predict`` plain and with ``explain: true``, closed loop at ``--concurrency``, in interleaved
windows: ``--rounds`` rounds of one window per side and size, the order alternating each round, so
both sides meet the same background load.

Per size and side: req/s, P50/P99 and mean latency per request and per node, the CPU
milliseconds per node of each service (the process trees' user + system time over the windows),
and, for explain, the trees in its forward pass per node (1 + the node's real hop-1 slots, from
the answers). Then the ratios explain/plain. Writes bench/results/explain.json. Only loopback
addresses; every load is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import httpx
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.suite.runner import HOME_100K, ensure_store, snapshot_counts  # noqa: E402
from harness import load as loadgen  # noqa: E402
from harness.app import SplitApp  # noqa: E402
from harness.workload import make_dist  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "explain.json")
BODIES_PER_SIZE = 400
SIDES = ("plain", "explain")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_bodies(ids: np.ndarray, explain: bool) -> list[bytes]:
    """One body per row of ``ids``, seeded by its index: both sides sample the same trees."""
    extra = {"explain": True} if explain else {}
    return [json.dumps({"node_ids": row.tolist(), "seed": i, **extra}).encode() for i, row in enumerate(ids)]


def trees_per_node(url: str, bodies: list[bytes], sample: int = 50) -> float:
    """Trees in an explained request's forward pass per node: each node's own and one per real
    hop-1 slot (``runners.feature.explain.with_variants``), read from the answers."""
    nodes = trees = 0
    for body in bodies[:sample]:
        r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
        r.raise_for_status()
        for p in r.json()["predictions"]:
            nodes += 1
            trees += 1 + len(p["explanation"]["neighbours"])
    return trees / max(nodes, 1)


def side_summary(parts: list[loadgen.LoadResult], cpu_s: Counter, size: int) -> dict[str, Any]:
    s = loadgen.LoadResult.pooled(parts).summary()
    nodes = max(s["ok"], 1) * size
    out = {k: s[k] for k in ("ok", "error_count", "req_per_s", "p50_ms", "p99_ms", "mean_ms") if k in s}
    out["nodes_per_s"] = s["req_per_s"] * size
    out["mean_ms_per_node"] = s["mean_ms"] / size
    out["cpu_ms_per_node"] = {k: round(v / nodes * 1e3, 3) for k, v in cpu_s.items()}
    out["cpu_ms_per_node"]["server"] = round(sum(cpu_s.values()) / nodes * 1e3, 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,4,16", help="node ids per request, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window", type=float, default=5.0, help="seconds per window")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load per side and size before the windows")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--dist", choices=("zipf", "uniform"), default="zipf")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]

    info = ensure_store(HOME_100K, [], log)
    num_nodes, num_edges = snapshot_counts(HOME_100K)
    work = tempfile.mkdtemp(prefix="gsage-explain-bench-")
    env = {
        "GSAGE_GRPC_PORT": "0",
        "GSAGE_REDIS_URL": "",
        "GSAGE_GRAPH_LOG_DIR": os.path.join(work, "update-log"),
        "GSAGE_EXPLAIN_MAX_NODES": str(max(sizes + [16])),
    }
    log(f"{info['graphsage']}; {num_nodes} nodes, {num_edges} edges; sizes {sizes}; starting the app")
    app = SplitApp(HOME_100K, env, log_dir=work).start()
    url = app.gateway.url + "/predict"
    dist = make_dist(a.dist, num_nodes, a.seed)
    pools = {
        (n, side): make_bodies(ids, side == "explain")
        for n in sizes
        for ids in [dist.draw(n * BODIES_PER_SIZE).reshape(BODIES_PER_SIZE, n)]
        for side in SIDES
    }
    load_before = os.getloadavg()
    try:
        trees = {n: trees_per_node(url, pools[(n, "explain")]) for n in sizes}
        for n in sizes:
            for side in SIDES:
                asyncio.run(
                    loadgen.closed_loop(url, pools[(n, side)], a.concurrency, a.warmup, warmup_requests=a.concurrency)
                )
        parts: dict[tuple[int, str], list[loadgen.LoadResult]] = {k: [] for k in pools}
        cpu_s: dict[tuple[int, str], Counter] = {k: Counter() for k in pools}
        for r in range(a.rounds):
            for n in sizes:
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    start = app.cpu_seconds()
                    res = asyncio.run(
                        loadgen.closed_loop(
                            url,
                            pools[(n, side)],
                            a.concurrency,
                            a.window,
                            warmup_requests=a.concurrency,
                            nodes_per_request=n,
                        )
                    )
                    end = app.cpu_seconds()
                    cpu_s[(n, side)].update({k: end[k] - start[k] for k in start})
                    parts[(n, side)].append(res)
                    s = res.summary()
                    log(
                        f"round {r + 1}/{a.rounds} {n:>3} nodes {side:7}: {s['req_per_s']:.1f} req/s, "
                        f"P99 {s.get('p99_ms', float('nan')):.2f} ms, errors {s['error_count']}"
                    )
    finally:
        app.stop()
    results = []
    for n in sizes:
        plain, explained = (side_summary(parts[(n, s)], cpu_s[(n, s)], n) for s in SIDES)
        results.append(
            {
                "nodes_per_request": n,
                "trees_per_node": round(trees[n], 2),
                "plain": plain,
                "explain": explained,
                "ratios": {
                    "mean_latency": explained["mean_ms"] / plain["mean_ms"],
                    "p99": explained["p99_ms"] / plain["p99_ms"],
                    "throughput": explained["req_per_s"] / plain["req_per_s"],
                    "server_cpu_per_node": explained["cpu_ms_per_node"]["server"] / plain["cpu_ms_per_node"]["server"],
                },
            }
        )
    out = {
        "config": {
            "model": info["graphsage"],
            "concurrency": a.concurrency,
            "dist": a.dist,
            "rounds": a.rounds,
            "window_s": a.window,
            "nodes": num_nodes,
            "edges": num_edges,
            "cores": os.cpu_count(),
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
        },
        "sizes": results,
    }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(out, f, indent=2)
    print_report(out)


def print_report(out: dict[str, Any]) -> None:
    c = out["config"]
    print(
        f"\nexplain vs plain: /predict, c={c['concurrency']}, {c['dist']} ids, {c['rounds']} rounds x "
        f"{c['window_s']:.0f} s per side and size; {c['model']}; {c['cores']} cores, "
        f"load {c['load_avg_before'][0]:.2f} -> {c['load_avg_after'][0]:.2f}"
    )
    print(
        f"{'nodes':>5} {'side':8}{'req/s':>8}{'P50 ms':>9}{'P99 ms':>9}{'ms/node':>9}"
        f"{'CPU ms/node: gateway':>22}{'feature':>9}{'model':>9}{'all':>9}"
    )
    for row in out["sizes"]:
        for side in SIDES:
            s = row[side]
            cpu_ms = s["cpu_ms_per_node"]
            print(
                f"{row['nodes_per_request']:>5} {side:8}{s['req_per_s']:8.1f}{s['p50_ms']:9.2f}{s['p99_ms']:9.2f}"
                f"{s['mean_ms_per_node']:9.3f}{cpu_ms['gateway']:22.3f}{cpu_ms['feature']:9.3f}"
                f"{cpu_ms['model']:9.3f}{cpu_ms['server']:9.3f}"
            )
        r = row["ratios"]
        print(
            f"{'':6}explain/plain: mean latency {r['mean_latency']:.2f}x, P99 {r['p99']:.2f}x, throughput "
            f"{r['throughput']:.2f}x, server CPU per node {r['server_cpu_per_node']:.2f}x; "
            f"{row['trees_per_node']} trees per node in the forward pass"
        )


if __name__ == "__main__":
    main()
