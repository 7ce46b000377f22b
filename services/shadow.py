"""Shadow canary: score a candidate version on exactly the neighbourhood the primary saw.

The routing table may name, per model, a shadow version and a share (``services.routing``,
``Shadow``). After the prediction core has answered a request from the primary, it ``offer``s
the request here: the same node ids, fanout, ``min_sequence`` and *seed* (the client's, or the one
the core drew for the request), so the FeatureRunner samples the same neighbourhood for the
shadow version and any difference is the model's, not sampling noise.

Off the response path, by construction:

- ``offer`` only appends to a bounded queue (``queue_size`` requests) and never waits; a request
  that finds it full is dropped and counted (``dropped``). The primary's answer is computed
  before the offer and only read here.
- ``max_inflight`` worker tasks take what waits (at most ``max_nodes`` nodes, so several
  requests make one FeatureRunner call, each keeping its own seed per node, as the core's
  coalescer does) and call the FeatureRunner with the shadow version. A worker starts a call
  once ``batch_nodes`` nodes wait or the oldest request has waited ``linger_s``: no answer waits
  on the shadow, so it trades its own latency for fewer, larger calls, and a call's fixed cost
  (two HTTP hops, a batch in the model runner) is shared by many requests
  (``python bench/bench_shadow.py`` prints the requests per call beside the cost).
- The shadow has a breaker of its own and never touches the primary's: a failing shadow
  version costs its own calls (counted as ``failed``) and nothing else.

Statistics per (primary, shadow) pair (``PairStats``), over compared predictions (one per node of
a compared request):

- ``agreement``: the share of predictions whose labels agree. Multiclass: the same arg-max.
  Multilabel: the same *set* of labels at the 0.5 threshold (``services.answer``), the strict
  reading; the confusion is then per label (``both``, ``primary_only``, ``shadow_only``,
  ``neither``), from which each label's own agreement follows.
- the largest probability difference per prediction (``max |p - q|`` over the classes): its mean
  (exact) and its P99 (``LogHistogram``: fixed log-spaced bins, 20 per decade from 1e-7 to 1, and
  a bin of exact zeros; the P99 reported is the upper edge of the bin that holds the 99th
  percentile by nearest rank, so it over-states the exact value by at most 12%, and reads 0 when
  at least 99% of the predictions were identical). Fixed bins rather than a reservoir: constant
  memory, deterministic, and two workers' figures add up exactly.
- the confusion matrix of labels (rows the primary's label, columns the shadow's);
- each side's latency: the FeatureRunner call that answered the primary (as the core made it,
  possibly merged with other requests) and the shadow's call, mean and P99 (the same bins over
  1e-5..100 s).

The FeatureRunner chooses a version's input layout by the size of a call, and the shadow's calls
merge more requests than the primary's. So the model runner's answer names the input layout it
ran on, and the shadow asks the FeatureRunner for that layout (requests of different layouts go
in separate calls; the layout is passed on as named, never interpreted here): a version shadowing
itself differs by the float32 rounding of another batch shape at most, not by another layout's
rounding.

Figures are per gateway worker; with a stats directory (``stats_path``, beside the routing file
by default), each worker writes its own file about once per ``flush_interval_s`` (no fsync: they
are statistics), and ``report``, ``GET /admin/shadow`` and the routing CLI add every worker's
figures up (``load_stats``). Files stay after a worker exits: figures accumulate per pair for the
life of the directory. Across replicas on other hosts, Prometheus adds the same counters up
(``services.metrics.ShadowPrometheus``).

``require_agreement`` is the gate of ``promote --min-agreement A --min-compared N``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import json
import logging
import math
import os
import random
import socket
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from common import wire
from common.breaker import BreakerOpen, CircuitBreaker
from common.errors import KindOfError
from common.feature_runner_api import PredictBatch
from common.remote import failure_reason
from common.settings import TransportDtype
from services.answer import MULTILABEL_THRESHOLD, Answer
from services.protocol import PredictRequest

log = logging.getLogger("graphsage.shadow")

# FeatureRunner.predict, as the prediction core calls it: a batch -> the model runner's answer.
PredictCall = Callable[[PredictBatch], Awaitable[wire.Packed]]
PairKey = tuple[str, str]  # (primary tag, shadow tag)

DIFF_EDGES = np.concatenate([[0.0], np.logspace(-7, 0, 141)])  # exact zeros, then 20 bins per decade
LATENCY_EDGES = np.logspace(-5, 2, 141)  # seconds
P99 = 0.99


class ShadowTarget(Protocol):
    """What the routing table says of a model's shadow (``services.routing.Shadow``)."""

    version: str
    share: float


class PromotionRefused(KindOfError):
    """``promote`` with an agreement bar the shadow's figures do not meet."""

    status_code = 409


# -- statistics -------------------------------------------------------------------------------------


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
            **{
                name: getattr(self, name)
                for name in (
                    "requests",
                    "predictions",
                    "agreed",
                    "dropped",
                    "failed",
                    "incompatible",
                    "last_error",
                    "task",
                )
            },
            "confusion": self.confusion.tolist() if self.confusion is not None else None,
            "diff": self.diff.to_json(),
            "primary_latency": self.primary_latency.to_json(),
            "shadow_latency": self.shadow_latency.to_json(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PairStats:
        s = cls(
            **{
                name: doc[name]
                for name in (
                    "requests",
                    "predictions",
                    "agreed",
                    "dropped",
                    "failed",
                    "incompatible",
                    "last_error",
                    "task",
                )
            }
        )
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


# -- the stats files ----------------------------------------------------------------------------------


def stats_dir(configured: str, routing_file: str) -> str | None:
    """Where the workers' figures go: the setting, else ``<routing file>.shadow`` beside a routing
    file, else nowhere (each worker's figures stay its own)."""
    return configured or (f"{routing_file}.shadow" if routing_file else None)


def _stats_doc(pairs: Mapping[PairKey, PairStats]) -> dict[str, Any]:
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


def _write_json(path: str, doc: Any) -> None:
    """Readers see the old file or the new one (a rename), without an fsync: statistics."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


# -- the promotion gate --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PromotionBar:
    min_agreement: float = 0.0
    min_compared: int = 0


def candidate_figures(
    pairs: Mapping[PairKey, PairStats], version: str, primaries: Iterable[str] | None = None
) -> tuple[PairStats, list[str]]:
    """``version``'s figures as a shadow of the other versions (only of ``primaries`` when given:
    the versions it would replace), added up; and those primaries."""
    allowed = set(primaries) if primaries is not None else None
    total, against = PairStats(), []
    for (primary, shadow), stats in sorted(pairs.items()):
        if shadow == version and primary != version and (allowed is None or primary in allowed):
            total.merge(stats)
            against.append(primary)
    return total, against


def require_agreement(
    pairs: Mapping[PairKey, PairStats], version: str, bar: PromotionBar, primaries: Iterable[str] | None = None
) -> PairStats:
    """Raise ``PromotionRefused`` (naming the figures) unless ``version``, as a shadow, agreed
    with the primaries on at least ``bar.min_agreement`` of at least ``bar.min_compared``
    predictions; returns the figures."""
    figures, against = candidate_figures(pairs, version, primaries)
    agreement = figures.agreement
    if figures.predictions >= bar.min_compared and (agreement or 0.0) >= bar.min_agreement:
        return figures
    shown = f"{agreement:.4f}" if agreement is not None else "none"
    raise PromotionRefused(
        f"promote {version} refused: agreement {shown} over {figures.predictions} predictions compared "
        f"({figures.agreed} agreed) as the shadow of {', '.join(against) or 'no primary'}; "
        f"the bar is agreement >= {bar.min_agreement} over >= {bar.min_compared} predictions"
    )


# -- the canary -------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Job:
    primary: str
    shadow: str
    node_ids: list[int]
    seed: int
    fanout: tuple[int, ...] | None
    min_sequence: int
    probs: np.ndarray
    multilabel: bool
    primary_s: float
    queued_at: float
    layout: str | None  # the primary's input layout (None: not said; the FeatureRunner chooses)


class ShadowObserver(Protocol):
    """Where the canary reports as it counts (Prometheus in the gateway)."""

    def compared(
        self,
        primary: str,
        shadow: str,
        comparison: Comparison,
        confusion: np.ndarray,
        primary_s: np.ndarray,
        shadow_s: float,
    ) -> None: ...

    def counted(self, primary: str, shadow: str, outcome: str, requests: int) -> None: ...


class ShadowCanary:
    def __init__(
        self,
        route: Callable[[str], ShadowTarget | None],
        predict: PredictCall,
        *,
        queue_size: int = 1024,
        max_inflight: int = 1,
        max_nodes: int = 2048,
        batch_nodes: int = 1,
        linger_s: float = 0.0,
        timeout_s: float = 2.0,
        transport_dtype: TransportDtype = "float32",
        breaker: CircuitBreaker | None = None,
        stats_path: str | None = None,
        flush_interval_s: float = 1.0,
        observer: ShadowObserver | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``route``: a primary tag -> its model's shadow (or None). ``predict``: the
        FeatureRunner call (never through the primary's breakers). ``stats_path``: this worker's
        stats file (``worker_stats_path``), None: figures in memory only. ``clock``: seconds, for
        the shadow's latency and the flushes (a test passes its loop's)."""
        self._route = route
        self._predict = predict
        self.queue_size = queue_size
        self.max_inflight = max_inflight
        self.max_nodes = max_nodes
        self.batch_nodes = batch_nodes
        self.linger_s = linger_s
        self._waiting_nodes = 0
        self.timeout_s = timeout_s
        self.transport_dtype = transport_dtype
        self.breaker = breaker or CircuitBreaker("shadow", clock=clock)
        self.stats_path = stats_path
        self.flush_interval_s = flush_interval_s
        self._observer = observer
        self._rng = rng or random.Random()
        self._clock = clock
        self.pairs: dict[PairKey, PairStats] = {}
        self._waiting: deque[_Job] = deque()
        self._wake = asyncio.Event()
        self._settled = asyncio.Event()
        self._busy = 0
        self._workers: list[asyncio.Task[None]] = []
        self._dirty = False
        self._last_flush = clock()
        self.calls = 0  # shadow calls answered (requests compared / calls: how well they merge)

    # -- the core's hook: never waits, never raises --------------------------------------------------

    def offer(
        self,
        tag: str,
        answered: Sequence[tuple[PredictRequest, int, Answer]],
        primary_s: float,
        layout: str | None = None,
    ) -> None:
        """Queue the shadow of requests the primary ``tag`` answered in one call of
        ``primary_s`` seconds on the input ``layout`` (the model runner's answer says it):
        (request, the seed it was sampled with, its answer)."""
        try:
            target = self._route(tag)
            if target is None or target.share <= 0:
                return
            now = self._clock()
            for req, seed, answer in answered:
                if answer.degraded or (target.share < 1 and self._rng.random() >= target.share):
                    continue
                if len(self._waiting) >= self.queue_size:
                    self._count(tag, target.version, "dropped", 1)
                    continue
                self._waiting.append(
                    _Job(
                        tag,
                        target.version,
                        list(req.node_ids),
                        seed,
                        tuple(req.fanout) if req.fanout else None,
                        req.min_sequence or 0,
                        answer.probs,
                        answer.multilabel,
                        primary_s,
                        now,
                        layout,
                    )
                )
                self._waiting_nodes += len(req.node_ids)
            if self._waiting:
                self._start_workers()
                self._wake.set()
        except Exception:
            log.exception("shadow offer failed")

    # -- workers -------------------------------------------------------------------------------------

    def _start_workers(self) -> None:
        self._workers = [w for w in self._workers if not w.done()]
        while len(self._workers) < self.max_inflight:
            self._workers.append(asyncio.get_running_loop().create_task(self._work()))

    async def _work(self) -> None:
        while True:
            while not self._waiting:
                self._wake.clear()
                due = self._dirty and self.stats_path is not None
                try:
                    await asyncio.wait_for(self._wake.wait(), self.flush_interval_s if due else None)
                except TimeoutError:
                    self.flush()
            await self._linger()
            if not self._waiting:  # another worker took them while this one lingered
                continue
            jobs = self._take()
            self._busy += 1
            try:
                await self._run(jobs)
            except Exception:
                log.exception("shadow batch failed")
            finally:
                self._busy -= 1
                if not self._waiting and not self._busy:
                    self._settled.set()
            if self.stats_path is not None and self._clock() - self._last_flush >= self.flush_interval_s:
                self.flush()

    async def _linger(self) -> None:
        """Until ``batch_nodes`` nodes wait or the oldest request has waited ``linger_s``: the
        shadow is off the response path, so it trades its own latency for fewer, larger calls."""
        while self._waiting and self._waiting_nodes < self.batch_nodes:
            left = self._waiting[0].queued_at + self.linger_s - self._clock()
            if left <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                return

    def _take(self) -> list[_Job]:
        jobs = [self._waiting.popleft()]
        nodes = len(jobs[0].node_ids)
        while self._waiting and nodes + len(self._waiting[0].node_ids) <= self.max_nodes:
            nodes += len(self._waiting[0].node_ids)
            jobs.append(self._waiting.popleft())
        self._waiting_nodes -= nodes
        return jobs

    async def _run(self, jobs: list[_Job]) -> None:
        groups: dict[tuple[str, tuple[int, ...] | None, str | None], list[_Job]] = {}
        for job in jobs:
            groups.setdefault((job.shadow, job.fanout, job.layout), []).append(job)
        for (shadow, fanout, layout), group in groups.items():
            await self._run_group(shadow, fanout, layout, group)

    async def _run_group(
        self, shadow: str, fanout: tuple[int, ...] | None, layout: str | None, group: list[_Job]
    ) -> None:
        started = self._clock()
        batch = PredictBatch.of(
            [n for j in group for n in j.node_ids],
            [j.seed for j in group for _ in j.node_ids],
            shadow,
            fanout=fanout,
            dtype=self.transport_dtype,
            min_sequence=max(j.min_sequence for j in group),
            layout=layout,
        )
        try:
            packed = await self.breaker.call(self._predict, batch, timeout_s=self.timeout_s)
            meta, arrays = packed.unpack()
        except Exception as exc:
            # While its breaker is open, the failure that opened it stays the one reported.
            reason = None if isinstance(exc, BreakerOpen) else f"{failure_reason(exc)}: {exc}"[:300]
            for job in group:
                self._count(job.primary, shadow, "failed", 1, reason)
            return
        shadow_s = self._clock() - started
        self.calls += 1
        probs, multilabel = arrays["probs"], meta.get("task") == "multilabel"
        matched: dict[str, list[tuple[_Job, np.ndarray]]] = {}
        lo = 0
        for job in group:
            hi = lo + len(job.node_ids)
            if self._compatible(job, probs[lo:hi], multilabel):
                matched.setdefault(job.primary, []).append((job, probs[lo:hi]))
            lo = hi
        for primary, pairs in matched.items():
            self._record(primary, shadow, pairs, multilabel, shadow_s)

    def _compatible(self, job: _Job, probs: np.ndarray, multilabel: bool) -> bool:
        if probs.shape == job.probs.shape and multilabel == job.multilabel:
            return True

        def kind(m: bool, width: int) -> str:
            return f"{width} {'multilabel' if m else 'multiclass'} outputs"

        self._count(
            job.primary,
            job.shadow,
            "incompatible",
            1,
            f"the shadow answers {kind(multilabel, probs.shape[-1])}"
            f", the primary {kind(job.multilabel, job.probs.shape[-1])}",
        )
        return False

    def _record(
        self, primary: str, shadow: str, answered: list[tuple[_Job, np.ndarray]], multilabel: bool, shadow_s: float
    ) -> None:
        """One comparison over the rows of every request the call answered: the numpy work is
        per call, not per request."""
        comparison = compare(
            np.concatenate([job.probs for job, _ in answered]),
            np.concatenate([rows for _, rows in answered]),
            multilabel,
        )
        primary_s = np.array([job.primary_s for job, _ in answered])
        confusion = self._stats(primary, shadow).add(comparison, primary_s, shadow_s)
        self._dirty = True
        if self._observer is not None:
            self._observer.compared(primary, shadow, comparison, confusion, primary_s, shadow_s)

    def _stats(self, primary: str, shadow: str) -> PairStats:
        stats = self.pairs.get((primary, shadow))
        if stats is None:
            stats = self.pairs[(primary, shadow)] = PairStats()
        return stats

    def _count(self, primary: str, shadow: str, outcome: str, requests: int, error: str | None = None) -> None:
        stats = self._stats(primary, shadow)
        setattr(stats, outcome, getattr(stats, outcome) + requests)
        if error is not None:
            stats.last_error = error
        self._dirty = True
        if self._observer is not None:
            self._observer.counted(primary, shadow, outcome, requests)

    # -- figures -------------------------------------------------------------------------------------

    def figures(self) -> dict[PairKey, PairStats]:
        """Every worker's pairs added up: this one's in memory, the others' from the stats files."""
        directory = os.path.dirname(self.stats_path) if self.stats_path else None
        return merge_stats([self.pairs, *load_stats(directory, exclude=self.stats_path)])

    def report(self) -> dict[str, Any]:
        directory = os.path.dirname(self.stats_path) if self.stats_path else None
        others = load_stats(directory, exclude=self.stats_path)
        return {
            "queue": {"size": self.queue_size, "waiting": len(self._waiting), "in_flight": self._busy},
            "calls": self.calls,
            "breaker": self.breaker.state.name.lower(),
            "workers_reporting": 1 + len(others),
            "pairs": pairs_report(merge_stats([self.pairs, *others])),
        }

    def flush(self) -> None:
        """Write this worker's figures to its stats file (when it has one and they changed)."""
        self._last_flush = self._clock()
        if self.stats_path is None or not self._dirty:
            return
        self._dirty = False
        try:
            os.makedirs(os.path.dirname(self.stats_path), exist_ok=True)
            _write_json(self.stats_path, _stats_doc(self.pairs))
        except OSError as exc:  # e.g. a read-only volume: the figures stay this worker's
            log.warning("shadow figures not written to %s (%s); they stay in this worker", self.stats_path, exc)
            self.stats_path = None

    async def drain(self) -> None:
        """Return once every queued shadow request has been called and counted."""
        while self._waiting or self._busy:
            self._settled.clear()
            await self._settled.wait()

    async def aclose(self) -> None:
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        self.flush()


def worker_stats_path(directory: str | None) -> str | None:
    """This worker's own file in ``directory``: host, process and a random part (process ids
    repeat across containers that share a volume)."""
    if not directory:
        return None
    return os.path.join(directory, f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
