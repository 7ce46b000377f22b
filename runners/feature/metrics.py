"""Prometheus metrics of the FeatureRunner (served on its ``/metrics`` by BentoML).

Created lazily so that importing the service's core for tests needs no metrics registry. Stage latencies are
histograms (sample, L1, L2, origin, fetch, assemble).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from common.metrics import LATENCY_BUCKETS, SIZE_BUCKETS


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
