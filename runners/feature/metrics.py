"""Prometheus metrics of the FeatureRunner (served on its ``/metrics`` by BentoML).

Created lazily so that importing the service's core for tests needs no metrics registry. Stage latencies are
histograms (sample, L1, L2, origin, fetch, assemble).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from common.metric_tally import TALLY
from common.metrics import LATENCY_BUCKETS, SIZE_BUCKETS, labelled
from runners.feature.neighbourhood import BatchTimings


@functools.lru_cache(maxsize=1)
def feature_metrics() -> SimpleNamespace:
    import bentoml

    m = bentoml.metrics
    return SimpleNamespace(
        stage=m.Histogram(
            name="feature_stage_seconds",
            documentation="FeatureRunner stage latency",
            labelnames=["stage"],
            buckets=LATENCY_BUCKETS,
        ),
        lookups=m.Counter(
            name="feature_lookups_total", documentation="Feature rows served per cache level", labelnames=["level"]
        ),
        bytes=m.Histogram(
            name="feature_response_bytes",
            documentation="FeatureTensor array bytes per model call (what its encoding carries beside a small header)",
            buckets=(1e3, 4e3, 16e3, 64e3, 256e3, 1e6, 4e6, 16e6),
        ),
        batch_targets=m.Histogram(
            name="feature_batch_targets", documentation="Targets per merged batch", buckets=SIZE_BUCKETS
        ),
        l2_errors=m.Counter(
            name="feature_l2_errors", documentation="L2 (Redis) failures (timeouts, refused, moved) served from origin"
        ),
        scans=m.Counter(
            name="feature_scan_batches",
            documentation="Batches fetched as scans: the snapshot only, no cache read or fill",
        ),
    )


@functools.lru_cache(maxsize=1)
def graph_metrics() -> SimpleNamespace:
    import bentoml

    m = bentoml.metrics
    return SimpleNamespace(
        applied=m.Counter(
            name="graph_updates_applied_total",
            documentation="Graph update ops applied by this worker",
            labelnames=["op"],
        ),
        staleness=m.Histogram(
            name="graph_update_staleness_seconds",
            documentation="From an update's acknowledgement to this worker applying it",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        ),
        sequence=m.Gauge(
            name="graph_applied_sequence",
            documentation="The last update log entry this worker applied",
            multiprocess_mode="liveall",
        ),
        lag=m.Gauge(
            name="graph_lag_entries",
            documentation="Update log entries this worker has not applied yet",
            multiprocess_mode="liveall",
        ),
        lag_seconds=m.Gauge(
            name="graph_lag_seconds",
            documentation="Age of the oldest acknowledged update this "
            "worker has read and not applied yet (0: caught up)",
            multiprocess_mode="liveall",
        ),
        compaction=m.Histogram(
            name="graph_compaction_seconds",
            documentation="Compaction time: `compact` folds the log into a new snapshot, `switch` "
            "is a worker mapping it, replaying the entries after it and swapping",
            labelnames=["stage"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
        ),
        overlay=m.Gauge(
            name="graph_overlay_size",
            documentation="The overlay over the snapshot: nodes with their own "
            "neighbour list, list entries, feature rows, bytes",
            labelnames=["what"],
            multiprocess_mode="liveall",
        ),
    )


def graph_observer() -> Any:
    """The live graph's metrics hooks (``runners.feature.live.Observer``)."""
    from runners.feature.live import Observer

    m = graph_metrics()

    def state(status: dict[str, Any]) -> None:
        m.sequence.set(status["applied"])
        m.lag.set(status["lag_entries"])
        m.lag_seconds.set(status["lag_seconds"])
        for what in ("nodes", "edges", "feature_rows", "bytes"):
            m.overlay.labels(what).set(status["overlay"][what])

    return Observer(
        applied=lambda op, n: labelled(m.applied, op).inc(n),
        staleness=m.staleness.observe,
        state=state,
        lag_seconds=m.lag_seconds.set,
        compaction=lambda stage, seconds: labelled(m.compaction, stage).observe(seconds),
    )


class PrometheusObserver:
    """``runners.feature.pipeline.FeatureObserver`` on these metrics."""

    def batch(self, timings: BatchTimings, l2_errors: int) -> None:
        m, t, tally = feature_metrics(), timings, TALLY
        tally.observe(labelled(m.stage, "sample"), t.sample_s)
        tally.observe(labelled(m.stage, "l1"), t.fetch.l1_s)
        if t.fetch.l2_s:
            tally.observe(labelled(m.stage, "l2"), t.fetch.l2_s)
        if t.fetch.origin_s:
            tally.observe(labelled(m.stage, "origin"), t.fetch.origin_s)
        # The whole retrieval of the batch (L1 + L2 + origin): its P99 is the SLO, and a sum of the
        # levels' P99s would only bound it from above.
        tally.observe(labelled(m.stage, "fetch"), t.fetch.l1_s + t.fetch.l2_s + t.fetch.origin_s)
        tally.observe(labelled(m.stage, "assemble"), t.assemble_s)
        tally.inc(labelled(m.lookups, "l1"), t.fetch.l1_hits)
        tally.inc(labelled(m.lookups, "l2"), t.fetch.l2_hits)
        tally.inc(labelled(m.lookups, "origin"), t.fetch.origin_hits)
        tally.observe(m.batch_targets, t.targets)
        if t.fetch.scan:
            tally.inc(m.scans)
        if l2_errors:
            tally.inc(m.l2_errors, l2_errors)

    def tensor_bytes(self, size: int) -> None:
        TALLY.observe(feature_metrics().bytes, size)

    @staticmethod
    def l1_fill(seconds: float) -> None:
        TALLY.observe(labelled(feature_metrics().stage, "l1_fill"), seconds)
