"""Soak: the composed app (three processes, Redis L2) at a steady open-loop rate below
saturation for a bounded time; reports errors, P99 per minute (drift) and per-process memory
growth. Not a test: it prints numbers and writes bench/results/soak.json.

    python bench/soak.py --minutes 10 --rate 150
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.app import SplitApp, build_demo_store
from harness.load import LoadResult, Outcomes, answer_outcome, open_loop
from harness.redis_servers import RedisServer

OUT = Path(__file__).resolve().parent / "results" / "soak.json"


def rss_by_service(app: SplitApp) -> dict[str, float]:
    out = {}
    for svc in (app.gateway, app.feature, app.model):
        procs = [psutil.Process(svc.proc.pid), *psutil.Process(svc.proc.pid).children(recursive=True)]
        out[svc.name] = sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20
    return out


async def soak(
    url: str, rate: float, seconds: float, window_s: float, on_window: Callable[[LoadResult], None]
) -> Outcomes:
    """Zipf single-node requests at a fixed arrival rate (``harness.load.open_loop``), one window
    after another; ``on_window`` gets each window's result. Returns the outcomes of all."""
    bodies = [json.dumps({"node_ids": [int(v) % 4000]}).encode() for v in np.random.default_rng(0).zipf(1.5, 20_000)]
    total = Outcomes()
    for window in range(max(1, math.ceil(seconds / window_s))):
        result = await open_loop(
            url, bodies, rate, min(window_s, seconds - window * window_s), seed=window, classify=answer_outcome
        )
        total.update(result.outcomes or {})
        on_window(result)
    return total


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

        errors = 0

        def on_window(result: LoadResult) -> None:
            nonlocal errors
            summary = result.summary()
            errors += summary["error_count"]
            row = {
                "t_s": round(len(windows) * args.window + args.window, 1),
                "requests": summary["sent"],
                "p50_ms": round(summary["p50_ms"], 2) if "p50_ms" in summary else None,
                "p99_ms": round(summary["p99_ms"], 2) if "p99_ms" in summary else None,
                "errors_so_far": errors,
                "rss_mib": {k: round(v, 1) for k, v in rss_by_service(app).items()},
            }
            windows.append(row)
            print(json.dumps(row), flush=True)

        outcomes = asyncio.run(soak(app.gateway.url + "/predict", args.rate, args.minutes * 60, args.window, on_window))
        last_rss = rss_by_service(app)
    finally:
        app.stop()
        redis.stop()
    p99 = [w["p99_ms"] for w in windows if w["p99_ms"] is not None]
    summary = {
        "minutes": args.minutes,
        "rate_per_s": args.rate,
        "outcomes": dict(outcomes),
        "errors": sum(v for k, v in outcomes.items() if not k.startswith("graphsage:")),
        "p99_first_window_ms": p99[0] if p99 else None,
        "p99_last_window_ms": p99[-1] if p99 else None,
        "memory_growth_pct": {k: round((last_rss[k] / first_rss[k] - 1) * 100, 1) for k in first_rss},
        # After the first window the caches (L1 up to GSAGE_L1_BYTES) are warm: growth from there is drift.
        "memory_growth_after_first_window_pct": {
            k: round((last_rss[k] / windows[0]["rss_mib"][k] - 1) * 100, 1) for k in first_rss
        }
        if windows
        else {},
        "rss_start_mib": first_rss,
        "rss_end_mib": last_rss,
        "windows": windows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "windows"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
