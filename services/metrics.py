"""Prometheus metrics of the gateway: per-version request counts and latency, breaker state, and
the shadow canary's figures per (primary, shadow) pair."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from common.metric_tally import TALLY
from common.metrics import LATENCY_BUCKETS, labelled

# The largest probability difference of a compared prediction: 0 when a shadow is the same version.
DIFF_BUCKETS = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@functools.lru_cache(maxsize=1)
def gateway_metrics() -> SimpleNamespace:
    import bentoml

    m = bentoml.metrics
    return SimpleNamespace(
        requests=m.Counter(
            name="gateway_requests_total",
            documentation="Predict requests by version and outcome",
            labelnames=["model", "outcome"],
        ),
        latency=m.Histogram(
            name="gateway_request_seconds",
            documentation="End-to-end predict latency by version",
            labelnames=["model", "outcome"],
            buckets=LATENCY_BUCKETS,
        ),
        graph_updates=m.Counter(
            name="gateway_graph_updates_accepted_total",
            documentation="Graph update ops accepted (durable in the update log)",
            labelnames=["op"],
        ),
        breaker=m.Gauge(
            name="gateway_breaker_state",
            documentation="Circuit breaker: 0 closed, 1 half-open, 2 open",
            labelnames=["dependency"],
            multiprocess_mode="livemax",
        ),
    )


class GatewayPrometheus:
    """``services.core.GatewayObserver`` on the metrics above, and the accepted graph ops."""

    def __init__(self) -> None:
        self._breaker_states: tuple[int, int] | None = None  # as last set on the gauges

    def answered(self, model: str, outcome: str, seconds: float | None) -> None:
        m = gateway_metrics()
        TALLY.inc(labelled(m.requests, model, outcome))
        if seconds is not None:
            TALLY.observe(labelled(m.latency, model, outcome), seconds)

    def breakers(self, feature_state: int, model_state: int) -> None:
        """Called after every request; the gauges are set when a state differs from what they
        hold (each set is a write of the worker's metrics file under a lock)."""
        if (feature_state, model_state) == self._breaker_states:
            return
        m = gateway_metrics()
        labelled(m.breaker, "feature-runner").set(feature_state)
        labelled(m.breaker, "model-runner").set(model_state)
        self._breaker_states = (feature_state, model_state)

    @staticmethod
    def graph_ops(op: str, n: int) -> None:
        labelled(gateway_metrics().graph_updates, op).inc(n)


@functools.lru_cache(maxsize=1)
def shadow_metrics() -> SimpleNamespace:
    import bentoml

    m = bentoml.metrics
    pair = ["primary", "shadow"]
    return SimpleNamespace(
        requests=m.Counter(
            name="gateway_shadow_requests_total",
            labelnames=[*pair, "outcome"],
            documentation="Shadow requests: compared, dropped (queue full), failed, incompatible",
        ),
        predictions=m.Counter(
            name="gateway_shadow_predictions_total",
            labelnames=[*pair, "agree"],
            documentation="Compared predictions, by whether both versions gave the same label(s)",
        ),
        diff=m.Histogram(
            name="gateway_shadow_probability_diff",
            labelnames=pair,
            buckets=DIFF_BUCKETS,
            documentation="Largest probability difference of each compared prediction",
        ),
        latency=m.Histogram(
            name="gateway_shadow_call_seconds",
            labelnames=[*pair, "side"],
            buckets=LATENCY_BUCKETS,
            documentation="FeatureRunner call of each side of a compared request",
        ),
        confusion=m.Counter(
            name="gateway_shadow_confusion_total",
            labelnames=[*pair, "primary_label", "shadow_label"],
            documentation="Compared predictions by label on each side (multilabel: '<label>:on|off')",
        ),
    )


class ShadowPrometheus:
    """``services.shadow.ShadowObserver`` over the counters above."""

    def compared(
        self, primary: str, shadow: str, comparison: Any, confusion: Any, primary_s: Any, shadow_s: float
    ) -> None:
        """Requests compared together (one shadow call): ``primary_s`` each one's primary latency."""
        m = shadow_metrics()
        labelled(m.requests, primary, shadow, "compared").inc(len(primary_s))
        agreed = int(comparison.agree.sum())
        for agree, n in (("true", agreed), ("false", int(comparison.agree.size) - agreed)):
            if n:
                labelled(m.predictions, primary, shadow, agree).inc(n)
        diff = labelled(m.diff, primary, shadow)
        for value in comparison.diff.tolist():
            diff.observe(value)
        primary_side = labelled(m.latency, primary, shadow, "primary")
        shadow_side = labelled(m.latency, primary, shadow, "shadow")
        for seconds in primary_s.tolist():
            primary_side.observe(seconds)
            shadow_side.observe(shadow_s)
        for cell in zip(*confusion.nonzero()):
            labelled(m.confusion, primary, shadow, *_confusion_labels(cell, comparison.multilabel)).inc(
                int(confusion[cell])
            )

    def counted(self, primary: str, shadow: str, outcome: str, requests: int) -> None:
        labelled(shadow_metrics().requests, primary, shadow, outcome).inc(requests)


def _confusion_labels(cell: tuple[int, ...], multilabel: bool) -> tuple[str, str]:
    if not multilabel:
        return str(cell[0]), str(cell[1])
    label, primary_on, shadow_on = cell
    return f"{label}:{'on' if primary_on else 'off'}", f"{label}:{'on' if shadow_on else 'off'}"
