"""Prometheus metrics of the GraphSAGERunner (served on its ``/metrics`` by BentoML).

Created lazily so that importing the service's core for tests needs no metrics registry. Queue time and compute time are
separate (as Triton reports them); request and batch counters give the mean batch size as
their ratio.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from common.batching import BatchStats
from common.metric_tally import TALLY
from common.metrics import LATENCY_BUCKETS, SIZE_BUCKETS, labelled


@functools.lru_cache(maxsize=1)
def model_metrics() -> SimpleNamespace:
    import bentoml

    m = bentoml.metrics
    return SimpleNamespace(
        batch_targets=m.Histogram(
            name="graphsage_batch_targets", documentation="Targets per forward pass", buckets=SIZE_BUCKETS
        ),
        queue=m.Histogram(
            name="graphsage_queue_seconds", documentation="Time a request waited for its batch", buckets=LATENCY_BUCKETS
        ),
        compute=m.Histogram(
            name="graphsage_compute_seconds", documentation="Forward-pass time per batch", buckets=LATENCY_BUCKETS
        ),
        requests=m.Counter(
            name="graphsage_requests_total",
            documentation="Requests per model version and backend",
            labelnames=["model", "backend"],
        ),
        batches=m.Counter(name="graphsage_batches_total", documentation="Forward passes"),
    )


class PrometheusObserver:
    """``runners.graphsage.core.ModelRunnerObserver`` on these metrics."""

    def batch(self, stats: BatchStats) -> None:
        m, tally = model_metrics(), TALLY
        tally.inc(m.batches)
        tally.observe(m.batch_targets, stats.last_batch_units)
        tally.observe(m.queue, stats.last_batch_queue_s)
        tally.observe(m.compute, stats.last_batch_compute_s)

    def answered(self, model: str, backend: str) -> None:
        TALLY.inc(labelled(model_metrics().requests, model, backend))
