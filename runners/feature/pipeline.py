"""The FeatureRunner's core, without BentoML: the endpoints of ``common.feature_runner_api``.

Node ids -> sampled neighbourhood (``NeighbourhoodBuilder``: the live graph, the tiered feature
store) -> FeatureTensor -> the GraphSAGERunner's ``infer``, whose answer goes back as it came: the
tensor crosses one process boundary (FeatureRunner -> model runner), never two (it used to travel
back through the gateway, most of the gateway's CPU per bulk request in ``python -m
bench.suite``'s per-process CPU cost). Concurrent requests are merged by an adaptive batcher, so
sampling and fetching run vectorised over many targets.

- **The input layout** of a version is read once from its model-store entry (the export records
  ``input_layouts``): a version that takes the premean layout gets it for requests of at least
  ``premean_min_targets`` nodes (far fewer bytes on bulk requests; ``python
  bench/bench_premean.py``), unless the caller asks for a layout (the shadow canary asks for its
  primary's). The version is resolved to its exact tag here, and the model runner is called with
  that tag, so both sides agree on what ``graphsage:latest`` was.
- **The model runner's failures**: its own refusals (an incompatible tensor) are passed on as they
  came; when it is down or slower than ``model_call_timeout_s`` (counted only while waiting on
  it), the answer is ``ModelRunnerUnavailable``, never a failure of this runner's own.
- **The living graph** (``GraphKeeper``): updates validated once against the graph and appended to
  the update log before they are acknowledged; a prediction with ``min_sequence`` waits for that
  update (``NotAppliedYet`` after ``min_sequence_wait_s``).
- **Explained predictions**: the request's trees and their leave-one-out variants in one model
  call (``runners.feature.explain``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Protocol

import numpy as np

from common import wire
from common.batching import AdaptiveBatcher
from common.bento.store import StoreEntryNotFound, get_entry
from common.errors import ApiError
from common.feature_runner_api import (
    CompactRequest,
    FeaturesRequest,
    ModelRunnerUnavailable,
    PredictBatch,
    check_explain_size,
)
from common.feature_tensor import LAYOUT, PREMEAN, FeatureTensor
from common.graph_ops import GraphUpdateAck
from common.model_runner_api import InferCall, ModelRunnerApi, UnknownVersion
from common.remote import WaitBudget, failure_reason
from runners.feature.authority import FeaturesUnavailable
from runners.feature.cache.tiered import TieredFeatureStore
from runners.feature.explain import explain, with_variants
from runners.feature.graph import LiveGraph
from runners.feature.live import GraphKeeper
from runners.feature.neighbourhood import BatchTimings, FeatureRequest, NeighbourhoodBuilder
from runners.feature.update_log import LogUnavailable, UpdateLog

log = logging.getLogger("graphsage.feature")


class FeatureObserver(Protocol):
    """Where the pipeline reports (Prometheus in the service; nothing in tests)."""

    def batch(self, timings: BatchTimings, l2_errors: int) -> None: ...

    def tensor_bytes(self, size: int) -> None: ...


class _Quiet:
    def batch(self, timings: BatchTimings, l2_errors: int) -> None:
        return None

    def tensor_bytes(self, size: int) -> None:
        return None


@dataclasses.dataclass(frozen=True)
class PipelineLimits:
    """What the pipeline itself decides by (the settings' values, handed in by the service)."""

    premean: bool = True
    premean_min_targets: int = 16
    explain_max_nodes: int = 16
    min_sequence_wait_s: float = 1.0
    model_call_timeout_s: float = 1.5
    warm_nodes: int = 0
    max_batch_targets: int = 2048
    graph_log_kind: str = "file"


class ModelVersions:
    """Each requested tag's exact tag and input layouts, from the model store, read once
    (``graphsage:latest`` is pinned to the version it named at the first request, as the model
    runner pins it)."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, tuple[str, ...]]] = {}

    def resolve(self, tag: str) -> tuple[str, tuple[str, ...]]:
        known = self._known.get(tag)
        if known is None:
            try:
                entry = get_entry(tag)
            except StoreEntryNotFound as exc:
                raise UnknownVersion(f"model {tag!r} is not in the model store") from exc
            layouts = tuple(entry.metadata.get("input_layouts") or [LAYOUT])
            known = self._known[tag] = (entry.tag, layouts)
        return known


class FeaturePipeline:
    def __init__(
        self,
        keeper: GraphKeeper,
        store: TieredFeatureStore,
        builder: NeighbourhoodBuilder,
        model: ModelRunnerApi,
        update_log: UpdateLog,
        limits: PipelineLimits,
        versions: ModelVersions | None = None,
        observer: FeatureObserver | None = None,
    ) -> None:
        self.keeper = keeper
        keeper.on_swap = self.serve  # a compaction's graph takes over here
        self.store = store
        self.builder = builder
        self.model = model
        self.update_log = update_log
        self.limits = limits
        self.versions = versions or ModelVersions()
        self._observer = observer or _Quiet()
        self.batcher: AdaptiveBatcher[FeatureRequest, FeatureTensor] = AdaptiveBatcher(
            self._build, max_batch_size=limits.max_batch_targets, size_of=lambda r: int(r.node_ids.size)
        )
        self._warm_task: asyncio.Task[int] | None = None
        self._l2_errors_seen = 0

    @property
    def graph(self) -> LiveGraph:
        return self.keeper.graph

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bring the graph up to date before serving (a restart: snapshot + the log after it),
        then follow the update log. The model runner first, where it runs in this process."""
        await self.model.start()
        await self.store.start()  # cluster mode: the cluster holds this snapshot's rows, verified
        await self.keeper.start()
        log.info("graph at update %d (%s)", self.graph.sequence, self.update_log)
        check = getattr(self.update_log, "check_durability", None)
        if check is not None:
            # The log is the only copy of the updates since the snapshot: say so at start if its
            # server may evict or forget them (a cache's configuration), rather than after a loss.
            await check()

    async def close(self) -> None:
        """Send the write-back buffered for Redis (bounded by its timeout), close the connections."""
        await self.keeper.close()
        await self.store.close()
        await self.model.close()
        await self.update_log.close()

    def serve(self, graph: LiveGraph) -> None:
        """A compaction's graph takes over (the keeper calls it under its lock, between batches)."""
        self.builder.graph = graph
        self.store.rebind(graph)

    # -- the endpoints ---------------------------------------------------------------------------

    async def predict(self, batch: PredictBatch) -> wire.Packed:
        if batch.min_sequence:  # read-your-writes; NotAppliedYet after the wait
            await self.keeper.wait_for(batch.min_sequence, self.limits.min_sequence_wait_s)
        tag, layouts = self.versions.resolve(batch.model)
        if batch.explain:
            return await self._explained(batch, tag)
        wanted = batch.layout or (PREMEAN if batch.node_ids.size >= self.limits.premean_min_targets else LAYOUT)
        premean = wanted == PREMEAN and self.limits.premean and PREMEAN in layouts
        ft = await self._tensor(batch.node_ids, batch.fanout, batch.seeds, batch.dtype, premean)
        return await self._infer(InferCall(ft, tag, batch.embedding), WaitBudget(self.limits.model_call_timeout_s))

    async def features(self, request: FeaturesRequest) -> FeatureTensor:
        """Sample and fetch; the FeatureTensor itself (tools, tests, other callers)."""
        seeds = np.asarray(request.seeds, np.int64) if request.seeds is not None else None
        validated = self.builder.validate(
            request.node_ids, request.fanout, request.seed, request.dtype, seeds, request.layout == PREMEAN
        )
        ft = await self.batcher.submit(validated)
        return ft

    async def info(self) -> dict[str, Any]:
        """The snapshot served, the fanout limits and cache counters per level."""
        base = self.graph.base
        return {
            "graph_snapshot": base.tag,
            "num_nodes": base.num_nodes,
            "num_edges": base.num_edges,
            "feature_dim": base.feature_dim,
            "graph_sequence": self.graph.sequence,
            "max_fanout": list(self.builder.max_fanout),
            "cache": self.store.stats(),
            "batches": vars(self.batcher.stats),
        }

    async def graph_update(self, ops: list[dict[str, Any]]) -> GraphUpdateAck:
        """Validated whole against the graph as the log has it, appended durably to the update
        log, applied here; every other worker applies it from the log."""
        try:
            entry = await self.keeper.submit(ops)  # BatchRejected, TooManyOps, LogBehind: ApiErrors
        except LogUnavailable as exc:
            raise ApiError.unavailable(
                f"update log unavailable, nothing was accepted: {exc}", 1.0, type="update_log_unavailable"
            ) from exc
        except FeaturesUnavailable as exc:
            raise FeaturesUnavailable(f"{exc.message}; nothing was accepted") from exc
        return GraphUpdateAck(accepted=len(ops), sequence=entry.sequence)

    async def graph_status(self) -> dict[str, Any]:
        """The update log's head and every worker's applied sequence, lag and overlay."""
        kind = self.limits.graph_log_kind
        out: dict[str, Any] = {
            "this_worker": self.keeper.worker,
            "capacity": self.graph.capacity,
            "directed": self.graph.directed,
            "last_compaction": self.keeper.last_compaction,
        }
        try:
            out["log"] = {"kind": kind, "head": await self.update_log.head()}
            workers = await self.update_log.statuses()
        except LogUnavailable as exc:
            out["log"] = {"kind": kind, "error": str(exc)}
            workers = {}
        workers[self.keeper.worker] = {**workers.get(self.keeper.worker, {}), **self.keeper.status()}
        head = out["log"].get("head", self.keeper.head)
        for status in workers.values():
            status["lag_entries"] = max(0, head - int(status.get("applied", 0)))
        out["workers"] = workers
        return out

    async def graph_compact(self, request: CompactRequest) -> dict[str, Any]:
        """Fold the update log (up to ``upto``, default all of it) into a new graph snapshot that
        every worker then switches to (no request fails, no answer changes)."""
        try:
            return await self.keeper.compact(request.upto)
        except LogUnavailable as exc:
            raise ApiError.unavailable(f"update log unavailable: {exc}", 1.0, type="update_log_unavailable") from exc

    # -- work --------------------------------------------------------------------------------------

    async def _tensor(
        self, node_ids: np.ndarray, fanout: tuple[int, ...] | None, seeds: np.ndarray, dtype: str, premean: bool = False
    ) -> FeatureTensor:
        request = self.builder.validate(node_ids, fanout, None, dtype, seeds, premean)  # raises InvalidRequest
        return await self.batcher.submit(request)

    async def _build(self, requests: list[FeatureRequest]) -> list[FeatureTensor]:
        if self._warm_task is None and self.limits.warm_nodes > 0:
            hot = np.argsort(-self.graph.base.degrees())[: self.limits.warm_nodes]
            self._warm_task = asyncio.get_running_loop().create_task(self.store.warm(hot))
        async with self.keeper.lock:  # one graph state per batch: updates wait for it, it for them
            out = await self.builder.build(requests)
        errors = self.store.l2.errors if self.store.l2 is not None else 0
        self._observer.batch(self.builder.last, errors - self._l2_errors_seen)
        self._l2_errors_seen = errors
        return out

    async def _explained(self, batch: PredictBatch, tag: str) -> wire.Packed:
        """The request's trees (the level layout: each slot a row index to leave out) and one
        variant per real hop-1 slot go to the model runner as one tensor, one forward pass. The
        answer holds the request's rows, and the explanation's arrays beside them."""
        check_explain_size(batch.node_ids.size, self.limits.explain_max_nodes)
        ft = await self._tensor(batch.node_ids, batch.fanout, batch.seeds, batch.dtype)
        variants = with_variants(ft)
        answer = await self._infer(
            InferCall(variants.tensor, tag, batch.embedding), WaitBudget(self.limits.model_call_timeout_s)
        )
        meta, arrays = answer.unpack()
        explanation = explain(ft, variants, arrays["probs"], meta.get("task") == "multilabel")
        ours: dict[str, np.ndarray] = {
            k: arrays[k][: variants.originals] for k in ("logits", "probs", "embedding") if k in arrays
        }
        return wire.Packed.of({**ours, **explanation.arrays()}, meta)

    async def _infer(self, call: InferCall, budget: WaitBudget) -> wire.Packed:
        """The model runner's answer: its refusals (4xx) as they came; any other failure, or
        running out of ``budget``, is ``ModelRunnerUnavailable``."""
        self._observer.tensor_bytes(call.tensor.nbytes())
        try:
            return await budget.wait(self.model.infer(call))
        except ApiError as exc:
            if exc.status < 500:
                raise
            raise ModelRunnerUnavailable(f"model runner unavailable: {exc.message}") from exc
        except Exception as exc:
            raise ModelRunnerUnavailable(f"model runner unavailable: {failure_reason(exc)}") from exc
