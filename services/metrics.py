"""Prometheus metrics of the gateway: per-version request counts and latency, breaker state."""

from __future__ import annotations

import functools
from types import SimpleNamespace

from common.metrics import LATENCY_BUCKETS


@functools.lru_cache(maxsize=1)
def gateway_metrics() -> SimpleNamespace:
    import bentoml

    m = bentoml.metrics
    return SimpleNamespace(
        requests=m.Counter(name="gateway_requests_total", documentation="Predict requests by version and outcome",
                           labelnames=["model", "outcome"]),
        latency=m.Histogram(name="gateway_request_seconds", documentation="End-to-end predict latency by version",
                            labelnames=["model", "outcome"], buckets=LATENCY_BUCKETS),
        graph_updates=m.Counter(name="gateway_graph_updates_accepted_total",
                                documentation="Graph update ops accepted (durable in the update log)", labelnames=["op"]),
        breaker=m.Gauge(name="gateway_breaker_state", documentation="Circuit breaker: 0 closed, 1 half-open, 2 open",
                        labelnames=["dependency"], multiprocess_mode="livemax"),
    )
