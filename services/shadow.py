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

The figures and their files live in ``services.shadow_stats``; the gate of ``promote
--min-agreement A --min-compared N`` in ``services.promotion``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import numpy as np

from common import wire
from common.breaker import BreakerOpen, CircuitBreaker
from common.feature_runner_api import PredictBatch
from common.remote import failure_reason
from common.settings import TransportDtype
from services.answer import Answer
from services.protocol import PredictRequest
from services.shadow_stats import (
    Comparison,
    PairKey,
    PairStats,
    compare,
    load_stats,
    merge_stats,
    pairs_report,
    stats_doc,
    write_json,
)

log = logging.getLogger("graphsage.shadow")

# FeatureRunner.predict, as the prediction core calls it: a batch -> the model runner's answer.
PredictCall = Callable[[PredictBatch], Awaitable[wire.Packed]]


class ShadowTarget(Protocol):
    """What the routing table says of a model's shadow (``services.routing.Shadow``)."""

    @property
    def version(self) -> str: ...

    @property
    def share(self) -> float: ...


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
            write_json(self.stats_path, stats_doc(self.pairs))
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
