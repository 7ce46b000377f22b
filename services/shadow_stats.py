"""The shadow canary's figures per (primary, shadow) pair, and the files the workers share them by.

What is counted, and how (``PairStats`` over ``compare``'s verdict per prediction; P99s from
``LogHistogram``'s fixed log-spaced bins) is set out in ``services.shadow``. Each gateway worker
writes its own file (``worker_stats_path``) in a stats directory (``stats_dir``); ``load_stats``
reads every worker's and ``merge_stats`` adds them up exactly.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import os
import socket
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from services.answer import MULTILABEL_THRESHOLD

log = logging.getLogger("graphsage.shadow")

PairKey = tuple[str, str]  # (primary tag, shadow tag)

DIFF_EDGES = np.concatenate([[0.0], np.logspace(-7, 0, 141)])  # exact zeros, then 20 bins per decade
LATENCY_EDGES = np.logspace(-5, 2, 141)  # seconds
P99 = 0.99


class LogHistogram:
    """Counts over fixed bins: ``counts[0]`` holds values <= ``edges[0]``, ``counts[k]`` those in
    (``edges[k-1]``, ``edges[k]``]; values above the last edge count in the last bin. Also the
    exact count, sum and maximum. Two histograms over the same edges merge by adding."""

    def __init__(self, edges: np.ndarray) -> None:
        self.edges = edges
        self.counts = np.zeros(len(edges), dtype=np.int64)
        self.n = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64).ravel()
        if not values.size:
            return
        bins = np.minimum(np.searchsorted(self.edges, values, side="left"), len(self.edges) - 1)
        self.counts += np.bincount(bins, minlength=len(self.edges))
        self.n += int(values.size)
        self.total += float(values.sum())
        self.max = max(self.max, float(values.max()))

    def merge(self, other: LogHistogram) -> None:
        self.counts += other.counts
        self.n += other.n
        self.total += other.total
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bin that holds the ``q`` quantile (nearest rank); None when empty."""
        if self.n == 0:
            return None
        rank = max(1, math.ceil(round(q * self.n, 9)))  # round: 0.99 * 100 is 99.00000000000001
        return float(self.edges[int(np.searchsorted(np.cumsum(self.counts), rank))])

    def summary(self) -> dict[str, float | None]:
        return {
            "mean": self.total / self.n if self.n else None,
            "p99": self.quantile(P99),
            "max": self.max if self.n else None,
        }

    def to_json(self) -> dict[str, Any]:
        nonzero = np.flatnonzero(self.counts)
        return {
            "n": self.n,
            "sum": self.total,
            "max": self.max,
            "bins": {str(int(i)): int(self.counts[i]) for i in nonzero},
        }

    @classmethod
    def from_json(cls, edges: np.ndarray, doc: Mapping[str, Any]) -> LogHistogram:
        h = cls(edges)
        h.n, h.total, h.max = int(doc["n"]), float(doc["sum"]), float(doc["max"])
        for i, count in doc.get("bins", {}).items():
            h.counts[int(i)] = int(count)
        return h


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One compared request: per node, whether the labels agree and the largest probability
    difference; the labels of each side (multiclass ``[n]`` ints, multilabel ``[n, C]`` bools)."""

    agree: np.ndarray
    diff: np.ndarray
    primary_labels: np.ndarray
    shadow_labels: np.ndarray
    multilabel: bool
    classes: int

    def confusion(self) -> np.ndarray:
        """Multiclass ``[C, C]`` (primary label, shadow label); multilabel ``[C, 2, 2]`` (label,
        primary on, shadow on)."""
        c = self.classes
        if not self.multilabel:
            flat = self.primary_labels.astype(np.int64) * c + self.shadow_labels
            return np.bincount(flat, minlength=c * c).reshape(c, c)
        cells = (np.arange(c) * 4 + self.primary_labels * 2 + self.shadow_labels).ravel()
        return np.bincount(cells, minlength=c * 4).reshape(c, 2, 2)


def compare(primary: np.ndarray, shadow: np.ndarray, multilabel: bool) -> Comparison:
    """Compare two answers' probabilities ``[n, C]`` for the same nodes."""
    diff = np.abs(primary.astype(np.float64) - shadow.astype(np.float64)).max(1)
    if multilabel:
        p_on, s_on = primary >= MULTILABEL_THRESHOLD, shadow >= MULTILABEL_THRESHOLD
        return Comparison(
            (p_on == s_on).all(1), diff, p_on.astype(np.int64), s_on.astype(np.int64), True, primary.shape[1]
        )
    p_label, s_label = primary.argmax(1), shadow.argmax(1)
    return Comparison(p_label == s_label, diff, p_label, s_label, False, primary.shape[1])


# The plain fields of ``PairStats``, written to and read from a stats file as they are.
SCALAR_FIELDS = ("requests", "predictions", "agreed", "dropped", "failed", "incompatible", "last_error", "task")


@dataclasses.dataclass(eq=False)
class PairStats:
    """The figures of one (primary, shadow) pair; ``requests`` counts compared requests,
    ``predictions`` the nodes in them (the unit of ``agreement`` and of a promotion bar)."""

    requests: int = 0
    predictions: int = 0
    agreed: int = 0
    dropped: int = 0
    failed: int = 0
    incompatible: int = 0
    last_error: str | None = None
    task: str | None = None
    confusion: np.ndarray | None = None
    diff: LogHistogram = dataclasses.field(default_factory=lambda: LogHistogram(DIFF_EDGES))
    primary_latency: LogHistogram = dataclasses.field(default_factory=lambda: LogHistogram(LATENCY_EDGES))
    shadow_latency: LogHistogram = dataclasses.field(default_factory=lambda: LogHistogram(LATENCY_EDGES))

    @property
    def agreement(self) -> float | None:
        return self.agreed / self.predictions if self.predictions else None

    def add(self, comparison: Comparison, primary_s: np.ndarray, shadow_s: float) -> np.ndarray:
        """Count compared requests: ``comparison`` over all their rows, ``primary_s`` the primary's
        latency of each, ``shadow_s`` that of the one shadow call that answered them all; returns
        their confusion (for the metrics)."""
        delta = comparison.confusion()
        self._add_confusion("multilabel" if comparison.multilabel else "multiclass", delta)
        self.requests += int(primary_s.size)
        self.predictions += int(comparison.agree.size)
        self.agreed += int(comparison.agree.sum())
        self.diff.add(comparison.diff)
        self.primary_latency.add(primary_s)
        self.shadow_latency.add(np.full(primary_s.size, shadow_s))
        return delta

    def _add_confusion(self, task: str, delta: np.ndarray) -> None:
        if self.confusion is None or self.task != task:
            if self.confusion is not None:  # a tag's model never changes: a bug upstream, say so
                log.warning("shadow figures: task changed from %s to %s; confusion restarted", self.task, task)
            self.task, self.confusion = task, np.zeros_like(delta)
        if self.confusion.shape != delta.shape:  # the same: pad to the larger
            shape = tuple(max(a, b) for a, b in zip(self.confusion.shape, delta.shape))
            grown = np.zeros(shape, dtype=np.int64)
            grown[tuple(slice(0, s) for s in self.confusion.shape)] = self.confusion
            self.confusion = grown
        self.confusion[tuple(slice(0, s) for s in delta.shape)] += delta

    def merge(self, other: PairStats) -> None:
        for name in ("requests", "predictions", "agreed", "dropped", "failed", "incompatible"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.last_error = other.last_error or self.last_error
        if other.confusion is not None and other.task is not None:
            self._add_confusion(other.task, other.confusion)
        self.diff.merge(other.diff)
        self.primary_latency.merge(other.primary_latency)
        self.shadow_latency.merge(other.shadow_latency)

    def report(self) -> dict[str, Any]:
        """The JSON figures of ``GET /admin/shadow``."""
        return {
            "requests": self.requests,
            "predictions": self.predictions,
            "agreed": self.agreed,
            "agreement": self.agreement,
            "probability_diff": self.diff.summary(),
            "latency_s": {"primary": self.primary_latency.summary(), "shadow": self.shadow_latency.summary()},
            "confusion": self._confusion_report(),
            "dropped": self.dropped,
            "failed": self.failed,
            "incompatible": self.incompatible,
            "last_error": self.last_error,
        }

    def _confusion_report(self) -> dict[str, Any] | None:
        if self.confusion is None:
            return None
        if self.task == "multiclass":
            return {
                "task": "multiclass",
                "rows": "primary label",
                "columns": "shadow label",
                "matrix": self.confusion.tolist(),
            }
        per_label = []
        for label, cells in enumerate(self.confusion.tolist()):
            (neither, shadow_only), (primary_only, both) = cells
            total = neither + shadow_only + primary_only + both
            per_label.append(
                {
                    "label": label,
                    "both": both,
                    "primary_only": primary_only,
                    "shadow_only": shadow_only,
                    "neither": neither,
                    "agreement": (both + neither) / total if total else None,
                }
            )
        return {"task": "multilabel", "per_label": per_label}

    def to_json(self) -> dict[str, Any]:
        """Everything, for a stats file (``from_json`` reads it back)."""
        return {
            **{name: getattr(self, name) for name in SCALAR_FIELDS},
            "confusion": self.confusion.tolist() if self.confusion is not None else None,
            "diff": self.diff.to_json(),
            "primary_latency": self.primary_latency.to_json(),
            "shadow_latency": self.shadow_latency.to_json(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PairStats:
        s = cls(**{name: doc[name] for name in SCALAR_FIELDS})
        if doc.get("confusion") is not None:
            s.confusion = np.asarray(doc["confusion"], dtype=np.int64)
        s.diff = LogHistogram.from_json(DIFF_EDGES, doc["diff"])
        s.primary_latency = LogHistogram.from_json(LATENCY_EDGES, doc["primary_latency"])
        s.shadow_latency = LogHistogram.from_json(LATENCY_EDGES, doc["shadow_latency"])
        return s


def merge_stats(parts: Iterable[Mapping[PairKey, PairStats]]) -> dict[PairKey, PairStats]:
    """The pairs of several workers added up (the inputs are left as they are)."""
    out: dict[PairKey, PairStats] = {}
    for part in parts:
        for key, stats in part.items():
            out.setdefault(key, PairStats()).merge(stats)
    return out


def pairs_report(pairs: Mapping[PairKey, PairStats]) -> list[dict[str, Any]]:
    return [
        {"model": primary.rpartition(":")[0], "primary": primary, "shadow": shadow, **stats.report()}
        for (primary, shadow), stats in sorted(pairs.items())
    ]


def stats_dir(configured: str, routing_file: str) -> str | None:
    """Where the workers' figures go: the setting, else ``<routing file>.shadow`` beside a routing
    file, else nowhere (each worker's figures stay its own)."""
    return configured or (f"{routing_file}.shadow" if routing_file else None)


def stats_doc(pairs: Mapping[PairKey, PairStats]) -> dict[str, Any]:
    return {"pairs": [{"primary": p, "shadow": s, **stats.to_json()} for (p, s), stats in sorted(pairs.items())]}


def _read_stats_file(path: str) -> dict[PairKey, PairStats]:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return {(entry["primary"], entry["shadow"]): PairStats.from_json(entry) for entry in doc["pairs"]}


def load_stats(directory: str | None, exclude: str | None = None) -> list[dict[PairKey, PairStats]]:
    """Every worker's figures in ``directory`` (but the file ``exclude``); an unreadable file is
    skipped (logged): a half-written one cannot happen, a foreign one must not stop a report."""
    if not directory:
        return []
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        if exclude is not None and os.path.abspath(path) == os.path.abspath(exclude):
            continue
        try:
            out.append(_read_stats_file(path))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("shadow figures %s skipped: %s", path, exc)
    return out


def write_json(path: str, doc: Any) -> None:
    """Readers see the old file or the new one (a rename), without an fsync: statistics."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def worker_stats_path(directory: str | None) -> str | None:
    """This worker's own file in ``directory``: host, process and a random part (process ids
    repeat across containers that share a volume)."""
    if not directory:
        return None
    return os.path.join(directory, f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
