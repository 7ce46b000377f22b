"""A lean HTTP load generator: asyncio + aiohttp, closed loop and open loop, always bounded.

    closed loop: ``concurrency`` workers each send the next request as soon as the last one
                 answered (throughput is the outcome, latency the price).
    open loop:   requests start at a fixed arrival rate whatever the server does; latency is
                 measured from the *scheduled* start, so a stalled server is not hidden
                 (no coordinated omission). In-flight requests are capped; an arrival that finds
                 the cap full is counted as ``dropped`` (an error), never queued silently.

Every run stops at ``duration_s`` or ``max_requests``, whichever comes first; requests still in
flight at the end get ``timeout_s`` to finish. Results: P50/P90/P99/P99.9, req/s, nodes/s,
errors by status (``exc:<Type>`` for transport errors), ``degraded`` answers; with ``classify``,
also ``outcomes``: a count per label it gives each answer (tests: the answering model version,
``degraded``, or the error), with the first message seen per label.

CLI (for ad-hoc runs against any ``/predict``)::

    python -m harness.load --url http://127.0.0.1:3000/predict --concurrency 8 \
        --duration 10 --nodes 1 --dist zipf --num-nodes 100000
    python -m harness.load --url ... --rate 200 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import numpy as np

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9}
DEGRADED = b'"degraded":true'


class Outcomes(Counter):
    """Outcome counts of a load run, with the first message seen for each outcome that is not a
    full answer (the error body, the degraded reason): a failed assertion then says why."""

    def __init__(self) -> None:
        super().__init__()
        self.first_message: dict[str, str] = {}

    def add(self, outcome: str, message: str | None = None) -> None:
        self[outcome] += 1
        if message is not None:
            self.first_message.setdefault(outcome, message[:300])

    def __repr__(self) -> str:
        return f"{super().__repr__()}, first messages: {self.first_message}"


Classify = Callable[[str, bytes], tuple[str, "str | None"]]


def answer_outcome(status: str, body: bytes) -> tuple[str, str | None]:
    """A ``/predict`` answer's outcome: the model version that answered in full, ``degraded``, or
    the error (its status, or ``exc:<Type>``) with its text."""
    if status != "200":
        return status, body.decode("utf-8", "replace")
    doc = json.loads(body)
    if doc.get("degraded"):
        return "degraded", doc.get("degraded_reason") or ""
    return doc["model"], None


@dataclasses.dataclass
class LoadResult:
    mode: str  # closed | open
    concurrency: int | None
    rate: float | None
    nodes_per_request: int
    latencies_s: np.ndarray  # successful requests only
    errors: dict[str, int]
    degraded: int
    elapsed_s: float
    sent: int
    outcomes: Outcomes | None = None  # with ``classify``

    @property
    def ok(self) -> int:
        return int(self.latencies_s.size)

    @classmethod
    def pooled(cls, parts: Sequence[LoadResult]) -> LoadResult:
        """Several windows of one scenario as one: latencies together, counts and time summed."""
        first = parts[0]
        errors: Counter[str] = Counter()
        for p in parts:
            errors.update(p.errors)
        return cls(
            first.mode,
            first.concurrency,
            first.rate,
            first.nodes_per_request,
            np.concatenate([p.latencies_s for p in parts]),
            dict(errors),
            sum(p.degraded for p in parts),
            sum(p.elapsed_s for p in parts),
            sum(p.sent for p in parts),
        )

    def summary(self) -> dict[str, Any]:
        ms = self.latencies_s * 1e3
        out: dict[str, Any] = {
            "mode": self.mode,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "nodes_per_request": self.nodes_per_request,
            "sent": self.sent,
            "ok": self.ok,
            "errors": dict(self.errors),
            "error_count": int(sum(self.errors.values())),
            "degraded": self.degraded,
            "elapsed_s": round(self.elapsed_s, 3),
            "req_per_s": self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0,
        }
        out["nodes_per_s"] = out["req_per_s"] * self.nodes_per_request
        if ms.size:
            for name, q in PERCENTILES.items():
                out[f"{name}_ms"] = float(np.percentile(ms, q))
            out["mean_ms"] = float(ms.mean())
            out["max_ms"] = float(ms.max())
        return out

    def cdf(self, points: int = 200) -> dict[str, list[float]]:
        """A down-sampled empirical CDF (ms, fraction) for plots."""
        ms = np.sort(self.latencies_s * 1e3)
        if not ms.size:
            return {"ms": [], "q": []}
        q = np.unique(np.concatenate([np.linspace(0, 1, points), 1 - np.logspace(-4, -1, 40)]))
        return {"ms": np.quantile(ms, q).round(4).tolist(), "q": q.round(6).tolist()}


def _session(limit: int, timeout_s: float, headers: dict[str, str] | None = None) -> aiohttp.ClientSession:
    conn = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, force_close=False, ttl_dns_cache=None)
    return aiohttp.ClientSession(
        connector=conn,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    outcomes: Outcomes | None = None,
    classify: Classify | None = None,
) -> tuple[str | None, bool]:
    """(error key or None, degraded); with ``classify``, the answer's outcome counted too."""
    try:
        async with session.post(url, data=body) as resp:
            data = await resp.read()
            status = str(resp.status)
    except TimeoutError:
        status, data = "exc:Timeout", b""
    except aiohttp.ClientError as exc:
        status, data = f"exc:{type(exc).__name__}", repr(exc).encode()
    if outcomes is not None and classify is not None:
        outcomes.add(*classify(status, data))
    if status != "200":
        return status, False
    return None, DEGRADED in data[:200] or DEGRADED in data[-200:]


async def closed_loop(
    url: str,
    bodies: Sequence[bytes],
    concurrency: int,
    duration_s: float,
    max_requests: int = 1_000_000,
    timeout_s: float = 10.0,
    nodes_per_request: int = 1,
    warmup_requests: int = 0,
    headers: dict[str, str] | None = None,
    classify: Classify | None = None,
) -> LoadResult:
    """``concurrency`` workers back to back; bounded by ``duration_s`` and ``max_requests``.

    The warm-up (not counted) sends ``warmup_requests`` in rounds of ``concurrency`` at once, so
    that the timed part finds every connection it uses open.
    """
    outcomes = Outcomes() if classify is not None else None
    async with _session(concurrency, timeout_s, headers) as session:
        for first in range(0, warmup_requests, concurrency):  # connection set-up and first-call costs
            await asyncio.gather(
                *(
                    _one(session, url, bodies[i % len(bodies)])
                    for i in range(first, min(first + concurrency, warmup_requests))
                )
            )
        lat: list[float] = []
        errors: Counter[str] = Counter()
        degraded = 0
        sent = 0
        start = time.perf_counter()
        stop_at = start + duration_s

        async def worker() -> None:
            nonlocal sent, degraded
            while sent < max_requests and time.perf_counter() < stop_at:
                body = bodies[sent % len(bodies)]
                sent += 1
                t = time.perf_counter()
                err, deg = await _one(session, url, body, outcomes, classify)
                if err is None:
                    lat.append(time.perf_counter() - t)
                    degraded += deg
                else:
                    errors[err] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return LoadResult(
        "closed", concurrency, None, nodes_per_request, np.asarray(lat), dict(errors), degraded, elapsed, sent, outcomes
    )


async def open_loop(
    url: str,
    bodies: Sequence[bytes],
    rate: float,
    duration_s: float,
    max_requests: int = 1_000_000,
    timeout_s: float = 10.0,
    nodes_per_request: int = 1,
    max_in_flight: int = 512,
    poisson: bool = True,
    seed: int = 0,
    headers: dict[str, str] | None = None,
    classify: Classify | None = None,
) -> LoadResult:
    """Arrivals at ``rate``/s (Poisson or evenly spaced); latency from the scheduled start."""
    rng = np.random.default_rng(seed)
    n = int(min(max_requests, max(1, rate * duration_s)))
    gaps = rng.exponential(1.0 / rate, n) if poisson else np.full(n, 1.0 / rate)
    offsets = np.cumsum(gaps) - gaps[0]
    lat: list[float] = []
    errors: Counter[str] = Counter()
    degraded = 0
    in_flight = 0
    tasks: set[asyncio.Task[None]] = set()

    outcomes = Outcomes() if classify is not None else None
    async with _session(max_in_flight, timeout_s, headers) as session:

        async def fire(body: bytes, scheduled: float) -> None:
            nonlocal in_flight, degraded
            try:
                err, deg = await _one(session, url, body, outcomes, classify)
                if err is None:
                    lat.append(time.perf_counter() - scheduled)
                    degraded += deg
                else:
                    errors[err] += 1
            finally:
                in_flight -= 1

        start = time.perf_counter()
        sent = 0
        for i, off in enumerate(offsets):
            scheduled = start + off
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if in_flight >= max_in_flight:
                errors["dropped"] += 1
                continue
            in_flight += 1
            sent += 1
            task = asyncio.get_running_loop().create_task(fire(bodies[i % len(bodies)], scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(list(tasks), timeout=timeout_s + 1)
        elapsed = max(time.perf_counter() - start, 1e-9)
    return LoadResult(
        "open", None, rate, nodes_per_request, np.asarray(lat), dict(errors), degraded, elapsed, sent, outcomes
    )


def main() -> None:
    from harness.workload import bodies as make_bodies
    from harness.workload import make_dist

    p = argparse.ArgumentParser(description="closed/open-loop load on POST /predict")
    p.add_argument("--url", required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--rate", type=float, default=0.0, help="open loop at this arrival rate (req/s)")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--max-requests", type=int, default=100_000)
    p.add_argument("--nodes", type=int, default=1, help="node ids per request")
    p.add_argument("--dist", choices=("zipf", "uniform"), default="zipf")
    p.add_argument("--num-nodes", type=int, default=100_000)
    p.add_argument("--timeout", type=float, default=10.0)
    a = p.parse_args()
    pool = make_bodies(make_dist(a.dist, a.num_nodes, 1), a.nodes, 2000)
    if a.rate > 0:
        res = asyncio.run(open_loop(a.url, pool, a.rate, a.duration, a.max_requests, a.timeout, a.nodes))
    else:
        res = asyncio.run(
            closed_loop(
                a.url,
                pool,
                a.concurrency,
                a.duration,
                a.max_requests,
                a.timeout,
                a.nodes,
                warmup_requests=min(20, a.max_requests),
            )
        )
    print(json.dumps(res.summary(), indent=2))


if __name__ == "__main__":
    main()
