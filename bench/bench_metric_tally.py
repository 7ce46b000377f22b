"""The hot path's metric updates, one by one against the metric tally (``common.metric_tally``), in
prometheus_client's multiprocess mode as BentoML runs it (prints numbers, never asserts).

    python bench/bench_metric_tally.py [--requests 20000] [--rounds 5]

A "request" makes the updates one single-node request of the co-located app makes: the gateway's
answer (a counter, a histogram), BentoML's request count and duration, the FeatureRunner's batch
(six stage histograms, three lookup counters, the batch size, the tensor's bytes) and the model
runner's batch (a counter, three histograms, the request counter). Each side runs its requests on
one event loop, in interleaved rounds; the tally's side includes its flushes (one per period).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _children() -> tuple[list[Any], list[Any]]:
    from prometheus_client import Counter, Histogram

    from common.metrics import LATENCY_BUCKETS, SIZE_BUCKETS

    stage = Histogram("b_stage_seconds", "s", ["stage"], buckets=LATENCY_BUCKETS)
    lookups = Counter("b_lookups", "l", ["level"])
    histograms = [
        Histogram("b_gateway_seconds", "g", ["model", "outcome"], buckets=LATENCY_BUCKETS).labels("m", "ok"),
        Histogram("b_request_duration", "r", ["endpoint"]).labels("/predict"),
        *(stage.labels(s) for s in ("sample", "l1", "l2", "fetch", "assemble", "l1_fill")),
        Histogram("b_feature_targets", "t", buckets=SIZE_BUCKETS),
        Histogram("b_feature_bytes", "b", buckets=(1e3, 4e3, 16e3, 64e3, 256e3, 1e6)),
        Histogram("b_model_targets", "t", buckets=SIZE_BUCKETS),
        Histogram("b_model_queue", "q", buckets=LATENCY_BUCKETS),
        Histogram("b_model_compute", "c", buckets=LATENCY_BUCKETS),
    ]
    counters = [
        Counter("b_gateway_requests", "g", ["model", "outcome"]).labels("m", "ok"),
        Counter("b_request_total", "r", ["endpoint"]).labels("/predict"),
        *(lookups.labels(level) for level in ("l1", "l2", "origin")),
        Counter("b_model_batches", "b"),
        Counter("b_model_requests", "r", ["model", "backend"]).labels("m", "onnx"),
    ]
    return histograms, counters


async def _run(n: int, histograms: list[Any], counters: list[Any], tally: Any) -> tuple[float, float]:
    """(wall us, CPU us) per request."""
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(n):
        value = 0.0001 + (i % 97) * 1e-5
        if tally is None:
            for h in histograms:
                h.observe(value)
            for c in counters:
                c.inc()
        else:
            for h in histograms:
                tally.observe(h, value)
            for c in counters:
                tally.inc(c)
        if i % 256 == 0:
            await asyncio.sleep(0)  # let the tally's timer fire, as between requests
    if tally is not None:
        tally.flush()
    return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as multiproc_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir  # before prometheus_client is imported
        from common.metric_tally import Tally

        histograms, counters = _children()
        tally = Tally()
        sides: dict[str, list[tuple[float, float]]] = {"one by one": [], "tally": []}
        for r in range(args.rounds):
            order = [("one by one", None), ("tally", tally)]
            for name, t in order if r % 2 == 0 else order[::-1]:
                sides[name].append(asyncio.run(_run(args.requests, histograms, counters, t)))
    updates = len(histograms) + len(counters)
    print(
        f"{updates} updates per request ({len(histograms)} observations, {len(counters)} increments), multiprocess mode"
    )
    medians = {}
    for name, runs in sides.items():
        medians[name] = statistics.median(cpu for _, cpu in runs)
        print(
            f"{name:10s}  {statistics.median(w for w, _ in runs):6.2f} us wall, {medians[name]:6.2f} us CPU per request"
        )
    print(f"tally / one by one: {medians['tally'] / medians['one by one']:.3f}x CPU")


if __name__ == "__main__":
    main()
