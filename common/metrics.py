"""Prometheus helpers shared by the services (each serves its metrics on ``/metrics`` through
BentoML): histogram buckets and cached labelled children. Each service defines its own metrics
lazily (``<service>/metrics.py``), so that importing a core module for tests needs no registry."""

from __future__ import annotations

from typing import Any

# Fine around 1 ms: the feature-retrieval SLO (P99 <= 1 ms) is read from these buckets.
LATENCY_BUCKETS = (
    0.0002,
    0.0005,
    0.00075,
    0.001,
    0.00125,
    0.0015,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


_children: dict[tuple[Any, tuple[str, ...]], Any] = {}


def labelled(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)`` (values in ``labelnames`` order), made once and reused.
    ``labels()`` takes a lock and validates its arguments on every call, and a request makes
    about fifteen such calls across the three services; no benchmark isolates it (a ``timeit`` of
    labels + observe against a kept child's observe, in multiprocess mode as BentoML runs it,
    would). Label values here are bounded (stages, levels, model tags times outcomes), and so is
    this map."""
    key = (metric, values)  # the metric itself, not id(): an id can be reused once freed
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child
