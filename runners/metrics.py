"""Prometheus metrics of the runners (served on each service's ``/metrics`` by BentoML).

Created lazily so that importing a runner module for tests needs no metrics registry. Stage
latencies are histograms; queue time and compute time are separate (as Triton reports them);
request and batch counters give the mean batch size as their ratio.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

# Fine around 1 ms: the feature-retrieval SLO (P99 <= 1 ms) is read from these buckets.
LATENCY_BUCKETS = (0.0002, 0.0005, 0.00075, 0.001, 0.00125, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015,
                   0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


_children: dict[tuple[Any, tuple[str, ...]], Any] = {}


def labelled(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)`` (values in ``labelnames`` order), made once and reused.
    ``labels()`` takes a lock and validates its arguments on every call: labels + observe 2.45 us
    vs 1.39 us for a kept child (multiprocess mode, as BentoML runs it); a request makes ~15 such
    calls across the three services. Label values here are bounded (stages, levels, model tags
    times outcomes), and so is this map."""
    key = (metric, values)  # the metric itself, not id(): an id can be reused once freed
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


@functools.lru_cache(maxsize=1)
def feature_metrics() -> SimpleNamespace:
    import bentoml

    m = bentoml.metrics
    return SimpleNamespace(
        stage=m.Histogram(name="feature_stage_seconds", documentation="FeatureRunner stage latency",
                          labelnames=["stage"], buckets=LATENCY_BUCKETS),
        lookups=m.Counter(name="feature_lookups_total", documentation="Feature rows served per cache level",
                          labelnames=["level"]),
        bytes=m.Histogram(name="feature_response_bytes",
                          documentation="Encoded FeatureTensor bytes per request (to the model runner or the caller)",
                          buckets=(1e3, 4e3, 16e3, 64e3, 256e3, 1e6, 4e6, 16e6)),
        batch_targets=m.Histogram(name="feature_batch_targets", documentation="Targets per merged batch",
                                  buckets=SIZE_BUCKETS),
        l2_errors=m.Counter(name="feature_l2_errors", documentation="L2 (Redis) failures (timeouts, refused, moved) served from origin"),
        scans=m.Counter(name="feature_scan_batches", documentation="Batches fetched as scans: the snapshot only, no cache read or fill"),
    )


@functools.lru_cache(maxsize=1)
def model_metrics() -> SimpleNamespace:
    import bentoml

    m = bentoml.metrics
    return SimpleNamespace(
        batch_targets=m.Histogram(name="graphsage_batch_targets", documentation="Targets per forward pass",
                                  buckets=SIZE_BUCKETS),
        queue=m.Histogram(name="graphsage_queue_seconds", documentation="Time a request waited for its batch",
                          buckets=LATENCY_BUCKETS),
        compute=m.Histogram(name="graphsage_compute_seconds", documentation="Forward-pass time per batch",
                            buckets=LATENCY_BUCKETS),
        requests=m.Counter(name="graphsage_requests_total", documentation="Requests per model version and backend",
                           labelnames=["model", "backend"]),
        batches=m.Counter(name="graphsage_batches_total", documentation="Forward passes"),
    )
