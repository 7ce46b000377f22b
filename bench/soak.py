"""Soak: the composed app (three processes, Redis L2) at a steady open-loop rate below
saturation for a bounded time; reports errors, P99 per minute (drift) and per-process memory
growth. Not a test: it prints numbers and writes bench/results/soak.json.

    python bench/soak.py --minutes 10 --rate 150
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
from pathlib import Path

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.app import SplitApp, build_demo_store  # noqa: E402
from harness.redis_servers import RedisServer  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "soak.json"


def rss_by_service(app: SplitApp) -> dict[str, float]:
    out = {}
    for svc in (app.gateway, app.feature, app.model):
        procs = [psutil.Process(svc.proc.pid), *psutil.Process(svc.proc.pid).children(recursive=True)]
        out[svc.name] = sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20
    return out


async def open_loop(url: str, rate: float, seconds: float, window_s: float, on_window) -> Counter:
    """Requests at a fixed arrival rate (not waiting for answers); a summary every window."""
    outcomes: Counter = Counter()
    latencies: list[float] = []
    rng = np.random.default_rng(0)
    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=256)) as client:
        async def one(node: int) -> None:
            t = time.perf_counter()
            try:
                r = await client.post(url, json={"node_ids": [node]})
                outcomes[r.status_code if r.status_code != 200 or not r.json()["degraded"] else "degraded"] += 1
                latencies.append(time.perf_counter() - t)
            except httpx.HTTPError as exc:
                outcomes[type(exc).__name__] += 1

        started = time.perf_counter()
        next_window, tasks, n = started + window_s, set(), 0
        while (now := time.perf_counter()) < started + seconds:
            due = started + n / rate
            if due > now:
                await asyncio.sleep(due - now)
            task = asyncio.create_task(one(int(rng.zipf(1.5)) % 4000))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
            if time.perf_counter() >= next_window:
                on_window(latencies, outcomes)
                latencies = []
                next_window += window_s
        await asyncio.gather(*tasks)
        on_window(latencies, outcomes)
    return outcomes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=150.0, help="requests per second (below saturation)")
    p.add_argument("--window", type=float, default=60.0, help="seconds per reported window")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="gsage-soak-")
    home = os.path.join(work, "bentoml")
    print("building a small model store ...", flush=True)
    build_demo_store(home)
    redis = RedisServer(os.path.join(work, "redis")).start()
    app = SplitApp(home, {"GSAGE_REDIS_URL": redis.url, "GSAGE_GRPC_PORT": "0"}).start()
    windows: list[dict] = []
    try:
        httpx.post(app.gateway.url + "/predict", json={"node_ids": [1]}, timeout=10)
        first_rss = rss_by_service(app)

        def on_window(lat: list[float], outcomes: Counter) -> None:
            row = {"t_s": round(len(windows) * args.window + args.window, 1), "requests": len(lat),
                   "p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 2) if lat else None,
                   "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 2) if lat else None,
                   "errors_so_far": sum(v for k, v in outcomes.items() if k != 200),
                   "rss_mib": {k: round(v, 1) for k, v in rss_by_service(app).items()}}
            windows.append(row)
            print(json.dumps(row), flush=True)

        outcomes = asyncio.run(open_loop(app.gateway.url + "/predict", args.rate, args.minutes * 60, args.window, on_window))
        last_rss = rss_by_service(app)
    finally:
        app.stop()
        redis.stop()
    p99 = [w["p99_ms"] for w in windows if w["p99_ms"] is not None]
    summary = {
        "minutes": args.minutes, "rate_per_s": args.rate, "outcomes": {str(k): v for k, v in outcomes.items()},
        "errors": sum(v for k, v in outcomes.items() if k != 200),
        "p99_first_window_ms": p99[0] if p99 else None, "p99_last_window_ms": p99[-1] if p99 else None,
        "memory_growth_pct": {k: round((last_rss[k] / first_rss[k] - 1) * 100, 1) for k in first_rss},
        # After the first window the caches (L1 up to GSAGE_L1_BYTES) are warm: growth from there is drift.
        "memory_growth_after_first_window_pct": {
            k: round((last_rss[k] / windows[0]["rss_mib"][k] - 1) * 100, 1) for k in first_rss} if windows else {},
        "rss_start_mib": first_rss, "rss_end_mib": last_rss, "windows": windows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "windows"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
