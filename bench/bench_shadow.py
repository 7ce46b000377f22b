"""What the shadow canary costs the primary's traffic (prints numbers, never asserts).

    python bench/bench_shadow.py [--rounds 6] [--window 10] [--warmup 8] [--concurrency 8]
                                 [--dist zipf] [--same-version] [--queue-size N]

The app (``harness.app.SplitApp``: gateway, FeatureRunner, GraphSAGERunner as separate
processes) on the 100k/1M demo store (``bench.suite.runner.ensure_store(HOME_100K)``), auth off,
a routing file in a temporary directory, no Redis. Single-node ``/predict`` without a seed (the
gateway draws one per request and the shadow reuses it), closed loop at ``--concurrency``, Zipf ids,
in interleaved windows: ``--rounds`` rounds of one window WITH the shadow at 100% (``set_shadow``
through ``POST /admin/routing``, the other version of the store, or the primary's own with
``--same-version``) and one WITHOUT (``clear_shadow``), the order alternating each round
(on off, off on, ...) so both sides meet the same background load. Between windows the shadow's
queue is drained (``GET /admin/shadow``), so no window pays for the one before.

Per side: the windows pooled (req/s, P50/P99), each window's req/s and P99 (the spread), and the CPU
milliseconds per answered request of each service and of this load generator (the process trees'
user + system time over the windows). Then the ratios with/without: P99, throughput, and the
per-round ratios; and the shadow's own figures (compared, dropped, agreement, latency of each side).
Writes bench/results/shadow.json. Only loopback addresses; every load is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.suite.runner import HOME_100K, ensure_store, snapshot_counts  # noqa: E402
from harness import load as loadgen  # noqa: E402
from harness.app import SplitApp  # noqa: E402
from harness.workload import bodies as make_bodies  # noqa: E402
from harness.workload import make_dist  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "shadow.json")
ADMIN_TIMEOUT_S = 30.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def versions(home: str) -> list[str]:
    base = os.path.join(home, "models", "graphsage")
    return sorted(f"graphsage:{v}" for v in os.listdir(base) if os.path.isdir(os.path.join(base, v)))


def admin(base: str, change: dict[str, Any]) -> None:
    r = httpx.post(base + "/admin/routing", json=change, timeout=ADMIN_TIMEOUT_S)
    if r.status_code != 200:
        raise SystemExit(f"admin {change} answered {r.status_code}: {r.text}")


def shadow_doc(base: str) -> dict[str, Any]:
    return httpx.get(base + "/admin/shadow", timeout=10).json()


def drain(base: str, limit_s: float = 30.0) -> float:
    """Until the gateway's shadow queue is empty and no shadow call is in flight; the seconds it took."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        queue = shadow_doc(base)["queue"]
        if queue["waiting"] == 0 and queue["in_flight"] == 0:
            break
        time.sleep(0.05)
    return time.perf_counter() - started


def cpu(app: SplitApp) -> dict[str, float]:
    """The services' CPU seconds and this load generator's."""
    t = os.times()
    return {**app.cpu_seconds(), "client": t.user + t.system}


def side_summary(parts: list[loadgen.LoadResult], cpu_s: Counter) -> dict[str, Any]:
    pooled = loadgen.LoadResult.pooled(parts).summary()
    pooled["per_window_req_per_s"] = [round(p.summary()["req_per_s"], 1) for p in parts]
    pooled["per_window_p99_ms"] = [round(p.summary().get("p99_ms", float("nan")), 2) for p in parts]
    ok = max(pooled["ok"], 1)
    pooled["cpu_ms_per_request"] = {k: round(v / ok * 1e3, 3) for k, v in cpu_s.items()}
    pooled["cpu_ms_per_request"]["server"] = round(sum(v for k, v in cpu_s.items() if k != "client") / ok * 1e3, 3)
    return pooled


async def window(url: str, pool: list[bytes], a: argparse.Namespace) -> loadgen.LoadResult:
    return await loadgen.closed_loop(url, pool, a.concurrency, a.window, warmup_requests=a.concurrency)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--window", type=float, default=10.0, help="seconds per window")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds of load per side before the windows")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--dist", choices=("zipf", "uniform"), default="zipf")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--same-version", action="store_true", help="the shadow is the primary's own version")
    p.add_argument("--queue-size", type=int, default=None, help="GSAGE_SHADOW_QUEUE_SIZE (default: the setting's)")
    a = p.parse_args()

    info = ensure_store(HOME_100K, [], log)
    primary = info["graphsage"]
    others = [v for v in versions(HOME_100K) if v != primary]
    shadow = primary if a.same_version or not others else others[0]
    num_nodes, num_edges = snapshot_counts(HOME_100K)
    work = tempfile.mkdtemp(prefix="gsage-shadow-bench-")
    routes = os.path.join(work, "routes.json")
    with open(routes, "w") as f:
        json.dump(
            {"default_model": "graphsage", "models": {"graphsage": {"routes": [{"version": primary, "weight": 1.0}]}}},
            f,
        )
    env = {
        "GSAGE_ROUTING_FILE": routes,
        "GSAGE_MODEL_TAGS": ",".join(dict.fromkeys([primary, shadow])),
        "GSAGE_GRPC_PORT": "0",
        "GSAGE_REDIS_URL": "",
        "GSAGE_GRAPH_LOG_DIR": os.path.join(work, "update-log"),
    }
    if a.queue_size is not None:
        env["GSAGE_SHADOW_QUEUE_SIZE"] = str(a.queue_size)
    log(f"primary {primary}, shadow {shadow}; {num_nodes} nodes, {num_edges} edges; starting the app")
    app = SplitApp(HOME_100K, env, log_dir=work).start()
    base = app.gateway.url
    url = base + "/predict"
    pool = make_bodies(make_dist(a.dist, num_nodes, a.seed), 1, 4000)
    load_before = os.getloadavg()
    try:
        log(f"warm-up: {a.warmup:.0f} s per side at c={a.concurrency}")
        admin(base, {"action": "set_shadow", "version": shadow, "share": 1.0})
        asyncio.run(loadgen.closed_loop(url, pool, a.concurrency, a.warmup, warmup_requests=2 * a.concurrency))
        admin(base, {"action": "clear_shadow"})
        drain(base)
        asyncio.run(loadgen.closed_loop(url, pool, a.concurrency, a.warmup, warmup_requests=2 * a.concurrency))
        before_figures = next((q for q in shadow_doc(base)["pairs"] if q["shadow"] == shadow), None)

        parts: dict[bool, list[loadgen.LoadResult]] = {True: [], False: []}
        cpu_s: dict[bool, Counter] = {True: Counter(), False: Counter()}
        drains: list[float] = []
        for r in range(a.rounds):
            for on in (True, False) if r % 2 == 0 else (False, True):
                if on:
                    admin(base, {"action": "set_shadow", "version": shadow, "share": 1.0})
                start = cpu(app)
                res = asyncio.run(window(url, pool, a))
                if on:
                    admin(base, {"action": "clear_shadow"})
                    drains.append(drain(base))
                end = cpu(app)
                cpu_s[on].update({k: end[k] - start[k] for k in start})
                parts[on].append(res)
                s = res.summary()
                log(
                    f"round {r + 1}/{a.rounds} shadow {'on ' if on else 'off'}: {s['req_per_s']:.1f} req/s, "
                    f"P99 {s.get('p99_ms', float('nan')):.2f} ms, errors {s['error_count']}"
                )
        doc = shadow_doc(base)
        figures = next((q for q in doc["pairs"] if q["shadow"] == shadow), None)
        calls = doc.get("calls")
    finally:
        app.stop()
    on, off = side_summary(parts[True], cpu_s[True]), side_summary(parts[False], cpu_s[False])
    per_round = [(x.summary(), y.summary()) for x, y in zip(parts[True], parts[False])]
    out = {
        "config": {
            "primary": primary,
            "shadow": shadow,
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
        "with_shadow": on,
        "without_shadow": off,
        "ratios": {
            "p99": on["p99_ms"] / off["p99_ms"],
            "p50": on["p50_ms"] / off["p50_ms"],
            "throughput": on["req_per_s"] / off["req_per_s"],
            "per_round_p99": [round(x["p99_ms"] / y["p99_ms"], 3) for x, y in per_round],
            "per_round_throughput": [round(x["req_per_s"] / y["req_per_s"], 3) for x, y in per_round],
        },
        "drain_after_window_s": [round(d, 3) for d in drains],
        "shadow_figures_warmup": before_figures,
        "shadow_figures": figures,
        "shadow_calls": calls,
    }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(out, f, indent=2)
    print_report(out)


def print_report(out: dict[str, Any]) -> None:
    c = out["config"]
    print(
        f"\nshadow canary: single-node /predict, c={c['concurrency']}, {c['dist']} ids, {c['rounds']} rounds x "
        f"{c['window_s']:.0f} s per side; primary {c['primary']}, shadow {c['shadow']}; {c['cores']} cores, "
        f"load {c['load_avg_before'][0]:.2f} -> {c['load_avg_after'][0]:.2f}"
    )
    print(f"{'':16}{'req/s':>9}{'P50 ms':>9}{'P99 ms':>9}   windows: req/s | P99 ms")
    for name, key in (("shadow 100%", "with_shadow"), ("no shadow", "without_shadow")):
        s = out[key]
        print(
            f"{name:16}{s['req_per_s']:9.1f}{s['p50_ms']:9.2f}{s['p99_ms']:9.2f}   "
            f"{s['per_window_req_per_s']} | {s['per_window_p99_ms']}"
        )
    r = out["ratios"]
    print(
        f"ratios with/without: P99 {r['p99']:.3f} (bar <= 1.2), throughput {r['throughput']:.3f} (bar >= 0.85), "
        f"P50 {r['p50']:.3f}"
    )
    print(
        f"  per round: P99 {r['per_round_p99']} (median {statistics.median(r['per_round_p99']):.3f}), "
        f"throughput {r['per_round_throughput']} (median {statistics.median(r['per_round_throughput']):.3f})"
    )
    print("CPU ms per answered request:")
    for name, key in (("shadow 100%", "with_shadow"), ("no shadow", "without_shadow")):
        print(f"  {name:14}" + "  ".join(f"{k} {v:.3f}" for k, v in out[key]["cpu_ms_per_request"].items()))
    print(f"shadow queue drained after each window in {out['drain_after_window_s']} s")
    f = out["shadow_figures"]
    if f:
        print(
            f"shadow figures (warm-up included): {f['requests']} requests compared, {f['dropped']} dropped, "
            f"{f['failed']} failed; agreement {f['agreement']:.4f}; largest probability difference mean "
            f"{f['probability_diff']['mean']:.4g}, P99 {f['probability_diff']['p99']:.4g}; call latency primary "
            f"mean {f['latency_s']['primary']['mean'] * 1e3:.2f} ms P99 {f['latency_s']['primary']['p99'] * 1e3:.2f} "
            f"ms, shadow mean {f['latency_s']['shadow']['mean'] * 1e3:.2f} ms P99 "
            f"{f['latency_s']['shadow']['p99'] * 1e3:.2f} ms"
        )
        if out["shadow_calls"]:
            print(f"  {out['shadow_calls']} shadow calls: {f['requests'] / out['shadow_calls']:.1f} requests per call")


if __name__ == "__main__":
    main()
