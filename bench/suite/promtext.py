"""Scrape a service's ``/metrics`` and diff two scrapes: per-histogram count, sum, mean and a
bucket-interpolated quantile of the observations made between them."""

from __future__ import annotations

import math
from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, tuple[tuple[str, str], ...]]  # (histogram name, labels without "le")


def scrape(url: str, timeout_s: float = 5.0) -> dict:
    """{"hist": {key: {"sum", "count", "buckets": {le: cumulative}}}, "counter": {key: value}}"""
    text = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout_s).text
    hist: dict[Key, dict] = defaultdict(lambda: {"sum": 0.0, "count": 0.0, "buckets": {}})
    counters: dict[Key, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            if fam.type == "histogram":
                h = hist[(fam.name, labels)]
                if s.name.endswith("_bucket"):
                    h["buckets"][float(s.labels["le"])] = s.value
                elif s.name.endswith("_sum"):
                    h["sum"] = s.value
                elif s.name.endswith("_count"):
                    h["count"] = s.value
            elif fam.type in ("counter", "gauge") and not s.name.endswith("_created"):
                counters[(s.name, labels)] = s.value
    return {"hist": dict(hist), "counter": counters}


def _quantile(buckets: dict[float, float], q: float) -> float | None:
    """Prometheus-style ``histogram_quantile`` over cumulative (le -> count) buckets."""
    edges = sorted(buckets)
    if not edges:
        return None
    total = buckets[edges[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_edge, prev_count = 0.0, 0.0
    for le in edges:
        c = buckets[le]
        if c >= rank:
            if math.isinf(le):
                return prev_edge  # beyond the last finite bucket: its lower edge
            if c == prev_count:
                return le
            return prev_edge + (le - prev_edge) * (rank - prev_count) / (c - prev_count)
        prev_edge, prev_count = le, c
    return edges[-1]


def diff(before: dict, after: dict, name: str, **labels: str) -> dict | None:
    """Observations of histogram ``name`` between two scrapes, summed over the series whose
    labels include ``labels``: count, mean_s, p50_s, p99_s (bucket-interpolated), and the
    fraction of observations <= each bucket edge."""
    count = total = 0.0
    buckets: dict[float, float] = defaultdict(float)
    for (hname, hl), h in after["hist"].items():
        if hname != name or any(dict(hl).get(k) != v for k, v in labels.items()):
            continue
        b = before["hist"].get((hname, hl), {"sum": 0.0, "count": 0.0, "buckets": {}})
        count += h["count"] - b["count"]
        total += h["sum"] - b["sum"]
        for le, c in h["buckets"].items():
            buckets[le] += c - b["buckets"].get(le, 0.0)
    if count <= 0:
        return None
    return {
        "count": int(count),
        "sum_s": total,
        "mean_s": total / count,
        "p50_s": _quantile(buckets, 0.50),
        "p99_s": _quantile(buckets, 0.99),
        "le_fraction": {str(le): buckets[le] / count for le in sorted(buckets) if not math.isinf(le)},
    }


def counter_diff(before: dict, after: dict, name: str, **labels: str) -> float:
    total = 0.0
    for (cname, cl), v in after["counter"].items():
        if cname != name or any(dict(cl).get(k) != val for k, val in labels.items()):
            continue
        total += v - before["counter"].get((cname, cl), 0.0)
    return total
