"""FeatureRunner: the separately scaled BentoML service that turns node ids into FeatureTensors.

Sampling over the memory-mapped CSR, features through L1 (process LRU) -> L2 (Redis, optional)
-> origin (the snapshot). Concurrent requests are merged by an adaptive batcher so that
sampling and fetching run vectorised over many targets. No torch in this process.

``predict`` hands the FeatureTensor straight to the GraphSAGERunner and returns its answer: the
feature bytes cross one process boundary instead of two (FeatureRunner -> gateway -> model
runner), which was most of the gateway's CPU per bulk request (the per-process CPU cost per
request in ``python -m bench.suite``'s report).
``features`` returns the tensor itself (tools, tests, other callers). ``predict`` with ``explain``
also answers each target's neighbourhood and each hop-1 neighbour's influence, from one model call
over the request's trees and their leave-one-out variants (``runners.feature.explain``).
"""

from __future__ import annotations

import asyncio
import gc
import logging

import bentoml
import numpy as np
import orjson

from common import predict_request, wire
from common.bento.serving import prepare_service_module
from common.bento.dependencies import connect
from common.bento.direct_api import JSON, OCTET_STREAM, BinaryBody, DirectApi, ServiceInstance, answers_errors
from common.batching import AdaptiveBatcher
from common.errors import ApiError
from common.feature_tensor import PREMEAN, FeatureTensor, encode
from common.metrics import labelled
from common.remote import UPSTREAM_FAILED, RunnerRejected, WaitBudget, failure_reason
from common.service_auth import ServiceGuard, ServiceTokens
from common.settings import runner_service_options, settings
from runners.feature.cache.tiered import build_feature_store
from runners.feature.explain import explain, with_variants
from runners.feature.metrics import feature_metrics, graph_observer
from runners.feature.graph import LiveGraph
from runners.feature.live import GraphKeeper
from runners.feature.neighbourhood import FeatureRequest, NeighbourhoodBuilder
from runners.feature.update_log import LogUnavailable, RedisUpdateLog, update_log_from
from runners.feature.snapshot import load_snapshot
from runners.graphsage.service import GraphSAGERunner

prepare_service_module()  # timeout fix, quiet client errors, the shared service token

log = logging.getLogger("graphsage.feature")
_instance = ServiceInstance()


@bentoml.service(name="FeatureRunner", **runner_service_options(settings().feature_workers))
class FeatureRunner:
    model_runner = bentoml.depends(GraphSAGERunner)

    def __init__(self) -> None:
        cfg = settings()
        self.model = connect(type(self).model_runner, ServiceTokens.from_settings(cfg), timeout_s=cfg.runner_timeout_s,
                             retry_pauses_s=cfg.connection_retry_pauses_s)
        self._infer_timeout_s = cfg.model_call_timeout_s
        self._premean_enabled = cfg.premean
        self._premean_min_targets = cfg.premean_min_targets
        self._explain_max_nodes = cfg.explain_max_nodes
        self._takes_premean: dict[str, bool] = {}  # model tag -> the model runner said so
        self.snapshot = load_snapshot(cfg.snapshot_tag)
        graph = LiveGraph(self.snapshot, cfg.graph_capacity)
        self.store = build_feature_store(cfg, self.snapshot.features, self.snapshot.tag, graph)
        self.store.on_fill = labelled(feature_metrics().stage, "l1_fill").observe
        self.builder = NeighbourhoodBuilder(graph, self.store, cfg.fanout, cfg.runner_call_max_nodes,
                                            cfg.scan_min_targets)
        self.update_log = update_log_from(cfg.graph_log_kind, cfg.graph_log_path, cfg.graph_log_url, cfg.redis_ca_file,
                                          cfg.graph_log_key)
        self.keeper = GraphKeeper(graph, self.update_log, on_swap=self._serve, on_rows_changed=self.store.invalidate,
                                  poll_interval_s=cfg.graph_poll_interval_ms / 1000, max_ops=cfg.graph_max_ops,
                                  capacity=cfg.graph_capacity, observer=graph_observer())
        self._min_sequence_wait_s = cfg.min_sequence_wait_s
        self.batcher: AdaptiveBatcher[FeatureRequest, FeatureTensor] = AdaptiveBatcher(
            self._build, max_batch_size=max(cfg.max_batch_targets, cfg.runner_call_max_nodes),
            size_of=lambda r: int(r.node_ids.size),
        )
        self._warm_task: asyncio.Task[int] | None = None
        self._l2_errors_seen = 0
        log.info("FeatureRunner: %s (%d nodes, %d edges), L2 %s", self.snapshot.tag, self.snapshot.num_nodes,
                 self.snapshot.num_edges, cfg.redis_url or "off")
        _instance.set(self)
        # Start-up objects out of the collector's reach: gen-2 collections over them paused BentoML
        # workers (no benchmark times the pauses; gc.callbacks under python -m bench.suite would).
        gc.freeze()

    @bentoml.on_startup
    async def start_graph(self) -> None:
        """Bring the graph up to date before serving (a restart: snapshot + the log after it),
        then follow the update log."""
        await self.keeper.start()
        log.info("graph at update %d (%s)", self.keeper.graph.sequence, self.update_log)
        if isinstance(self.update_log, RedisUpdateLog):
            # The log is the only copy of the updates since the snapshot: say so at start if its
            # server may evict or forget them (a cache's configuration), rather than after a loss.
            await self.update_log.check_durability()

    @bentoml.on_shutdown
    async def close(self) -> None:
        """Send the write-back buffered for Redis (bounded by its timeout), close the connections."""
        await self.keeper.close()
        await self.store.close()
        await self.model.close()
        await self.update_log.close()

    def _serve(self, graph: LiveGraph) -> None:
        """A compaction's graph takes over (called under the keeper's lock, between batches)."""
        self.builder.graph = graph
        self.store.rebind(graph)
        self.snapshot = graph.base

    async def _build(self, requests: list[FeatureRequest]) -> list[FeatureTensor]:
        if self._warm_task is None and settings().warm_nodes > 0:
            hot = np.argsort(-self.snapshot.degrees())[: settings().warm_nodes]
            self._warm_task = asyncio.get_running_loop().create_task(self.store.warm(hot))
        async with self.keeper.lock:  # one graph state per batch: updates wait for it, it for them
            out = await self.builder.build(requests)
        self._observe()
        return out

    def _observe(self) -> None:
        m, t = feature_metrics(), self.builder.last
        labelled(m.stage, "sample").observe(t.sample_s)
        labelled(m.stage, "l1").observe(t.fetch.l1_s)
        if t.fetch.l2_s:
            labelled(m.stage, "l2").observe(t.fetch.l2_s)
        if t.fetch.origin_s:
            labelled(m.stage, "origin").observe(t.fetch.origin_s)
        # The whole retrieval of the batch (L1 + L2 + origin): its P99 is the SLO, and a sum of the
        # levels' P99s would only bound it from above.
        labelled(m.stage, "fetch").observe(t.fetch.l1_s + t.fetch.l2_s + t.fetch.origin_s)
        labelled(m.stage, "assemble").observe(t.assemble_s)
        labelled(m.lookups, "l1").inc(t.fetch.l1_hits)
        labelled(m.lookups, "l2").inc(t.fetch.l2_hits)
        labelled(m.lookups, "origin").inc(t.fetch.origin_hits)
        m.batch_targets.observe(t.targets)
        if t.fetch.scan:
            m.scans.inc()
        if self.store.l2 is not None and self.store.l2.errors != self._l2_errors_seen:
            errors = self.store.l2.errors  # counters live in the level; export the increase
            m.l2_errors.inc(errors - self._l2_errors_seen)
            self._l2_errors_seen = errors

    async def _tensor(self, node_ids: list[int] | np.ndarray, fanout: list[int] | None, seed: int | None, dtype: str,
                      seeds: list[int] | np.ndarray | None, premean: bool = False) -> FeatureTensor:
        request = self.builder.validate(node_ids, fanout, seed, dtype, seeds, premean)  # raises InvalidRequest
        return await self.batcher.submit(request)

    @bentoml.api
    @answers_errors
    async def features(self, node_ids: list[int], fanout: list[int] | None = None, seed: int | None = None,
                       dtype: str = "float32", seeds: list[int] | None = None, premean: bool = False) -> BinaryBody:
        """Sample and fetch; returns the encoded FeatureTensor (``common.feature_tensor``).
        ``seeds`` (one per node) lets a caller merge requests that carry different seeds;
        ``premean``: the premean layout (the last hop as its means, for mean models)."""
        blob = encode(await self._tensor(node_ids, fanout, seed, dtype, seeds, premean))
        feature_metrics().bytes.observe(len(blob))
        return blob

    @bentoml.api
    @answers_errors
    async def predict(self, request: BinaryBody, /) -> BinaryBody:
        """``features``, then the GraphSAGERunner's ``infer`` on the tensor; returns its answer
        as it came (``common.wire``: logits, probs, embedding). The body is
        ``common.predict_request`` (options + int64 node ids and seeds). The model runner's 4xx
        answers (unknown version, incompatible tensor) pass through; when it is down or slower
        than ``Settings.model_call_timeout_s``, the answer is 502, never this runner's own 5xx.

        A version that takes the premean input (mean aggregator) gets it for requests of at
        least ``premean_min_targets`` nodes: far fewer bytes on bulk requests (``python
        bench/bench_premean.py`` prints both layouts' bytes per batch size)."""
        return await self.predict_body(request)

    async def predict_body(self, request: bytes) -> bytes:
        """``predict``'s work (what ``common.bento.direct_api`` answers it with)."""
        try:
            options, node_ids, seeds = predict_request.decode(request)
        except predict_request.BadPredictRequest as exc:
            raise ApiError(400, f"bad predict request: {exc}") from exc
        if options.get("min_sequence"):  # read-your-writes; NotApplied after the wait
            await self.keeper.wait_for(options["min_sequence"], self._min_sequence_wait_s)
        if options.get("explain"):
            return await self._explained(node_ids, options.get("fanout"), options.get("seed"),
                                         options.get("dtype", "float32"), seeds, options["model"], options["embedding"])
        return await self._predict(node_ids, options.get("fanout"), options.get("seed"), options.get("dtype", "float32"),
                                   seeds, options["model"], options["embedding"], options.get("premean"))

    async def _predict(self, node_ids: np.ndarray, fanout: list[int] | None, seed: int | None, dtype: str,
                       seeds: np.ndarray | None, model: str, embedding: bool, asked: bool | None = None) -> bytes:
        """``asked``: the caller's layout (``predict_request.encode``'s ``premean``), else by size."""
        # One budget for every model runner call of this request, spent only while waiting on it.
        budget = WaitBudget(self._infer_timeout_s)
        wanted = asked if asked is not None else node_ids.size >= self._premean_min_targets
        premean = self._premean_enabled and wanted and await self._premean_for(model, budget)
        for attempt in ((True, False) if premean else (False,)):  # premean first, full rows if refused
            ft = await self._tensor(node_ids, fanout, seed, dtype, seeds, attempt)
            try:
                return await self._infer(ft, model, embedding, budget)
            except RunnerRejected as exc:
                if not (attempt and exc.status == 422):
                    raise ApiError(exc.status, str(exc)) from exc
                # The version behind the tag changed since it was asked (e.g. :latest after a
                # model runner restart): ask again next time, answer this one in full rows.
                log.info("%s refused the premean input (%s); sending full rows", model, exc)
                self._takes_premean.pop(model, None)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _explained(self, node_ids: np.ndarray, fanout: list[int] | None, seed: int | None, dtype: str,
                         seeds: np.ndarray | None, model: str, embedding: bool) -> bytes:
        """``_predict`` with the explanation: the request's trees (the level layout: each slot a
        row index to leave out) and one variant per real hop-1 slot go to the model runner as one
        tensor, one forward pass. The answer holds the request's rows, and the explanation's
        arrays (``Explanation.arrays``) beside them."""
        predict_request.check_explain_size(node_ids.size, self._explain_max_nodes)
        ft = await self._tensor(node_ids, fanout, seed, dtype, seeds)
        variants = with_variants(ft)
        try:
            answer = await self._infer(variants.tensor, model, embedding, WaitBudget(self._infer_timeout_s))
        except RunnerRejected as exc:
            raise ApiError(exc.status, str(exc)) from exc
        meta, arrays = wire.unpack(answer)
        explanation = explain(ft, variants, arrays["probs"], meta.get("task") == "multilabel")
        ours = {k: arrays[k][: variants.originals] for k in ("logits", "probs", "embedding") if k in arrays}
        return wire.pack({**ours, **explanation.arrays()}, meta)

    async def _infer(self, ft: FeatureTensor, model: str, embedding: bool, budget: WaitBudget) -> bytes:
        """The model runner's answer on ``ft``: its 4xx raised as ``RunnerRejected``, any other
        failure as this runner's 502 (the gateway tells the two runners apart by it)."""
        body = encode(ft, prefix=wire.envelope_head({"model": model, "embedding": embedding}))
        feature_metrics().bytes.observe(len(body))
        try:
            return await budget.wait(self.model.call_bytes("infer", body))
        except RunnerRejected:
            raise
        except Exception as exc:  # noqa: BLE001 - anything else: the model runner is unavailable
            raise ApiError(UPSTREAM_FAILED, f"model runner unavailable: {failure_reason(exc)}") from exc

    async def _premean_for(self, model: str, budget: WaitBudget) -> bool:
        """Does ``model`` take the premean input? Asked of the model runner once per tag (its
        ``load`` is idempotent and loads the version if needed); its 4xx (unknown version) is
        raised, any failure answers False uncached (the model call will report it)."""
        known = self._takes_premean.get(model)
        if known is not None:
            return known
        try:
            info = await budget.wait(self.model.call_json("load", {"tag": model}))
        except RunnerRejected as exc:
            raise ApiError(exc.status, str(exc)) from exc
        except Exception:  # noqa: BLE001
            return False
        takes = PREMEAN in (info.get("input_layouts") or [])
        self._takes_premean[model] = takes
        return takes

    @bentoml.api
    @answers_errors
    async def info(self) -> dict:
        """The snapshot served, the fanout limits and cache counters per level."""
        return {"graph_snapshot": self.snapshot.tag, "num_nodes": self.snapshot.num_nodes,
                "num_edges": self.snapshot.num_edges, "feature_dim": self.snapshot.feature_dim,
                "graph_sequence": self.keeper.graph.sequence,
                "max_fanout": list(self.builder.max_fanout), "cache": self.store.stats(),
                "batches": vars(self.batcher.stats)}

    @bentoml.api
    @answers_errors
    async def graph_update(self, ops: list[dict]) -> dict:
        """Apply a batch of graph updates (``runners.feature.graph``): validated whole against the
        graph as the log has it, appended durably to the update log, applied here; every other
        worker applies it from the log. Answers ``{"accepted": N, "sequence": S}``."""
        return await self._graph_update(ops)

    async def graph_update_body(self, body: bytes) -> bytes:
        """``graph_update``'s work from the raw JSON body (what ``common.bento.direct_api``
        answers it with): the ops are checked op by op by ``LiveGraph.validate``, so BentoML's
        pydantic pass over every op and feature value would only be paid twice."""
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"invalid JSON: {exc}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("ops"), list) or set(doc) != {"ops"}:
            raise ApiError(400, 'expected {"ops": [...]}')
        return orjson.dumps(await self._graph_update(doc["ops"]))

    async def _graph_update(self, ops: list[dict]) -> dict:
        try:
            entry = await self.keeper.submit(ops)  # BatchRejected, TooManyOps, LogBehind: ApiErrors
        except LogUnavailable as exc:
            raise ApiError.unavailable(f"update log unavailable, nothing was accepted: {exc}", 1.0) from exc
        return {"accepted": len(ops), "sequence": entry.sequence}

    @bentoml.api
    @answers_errors
    async def graph_status(self) -> dict:
        """The update log's head and every worker's applied sequence, lag and overlay."""
        out: dict = {"this_worker": self.keeper.worker, "capacity": self.keeper.graph.capacity,
                     "directed": self.keeper.graph.directed, "last_compaction": self.keeper.last_compaction}
        try:
            out["log"] = {"kind": settings().graph_log_kind, "head": await self.update_log.head()}
            workers = await self.update_log.statuses()
        except LogUnavailable as exc:
            out["log"] = {"kind": settings().graph_log_kind, "error": str(exc)}
            workers = {}
        workers[self.keeper.worker] = {**workers.get(self.keeper.worker, {}), **self.keeper.status()}
        head = out["log"].get("head", self.keeper.head)
        for status in workers.values():
            status["lag_entries"] = max(0, head - int(status.get("applied", 0)))
        out["workers"] = workers
        return out

    @bentoml.api
    @answers_errors
    async def graph_compact(self, upto: int | None = None) -> dict:
        """Fold the update log (up to ``upto``, default all of it) into a new graph snapshot that
        every worker then switches to (no request fails, no answer changes)."""
        try:
            return await self.keeper.compact(upto)
        except LogUnavailable as exc:
            raise ApiError.unavailable(f"update log unavailable: {exc}", 1.0) from exc


FeatureRunner.add_asgi_middleware(ServiceGuard)  # outermost: no pickle, no call without the token
if settings().direct_api:
    FeatureRunner.add_asgi_middleware(DirectApi, routes={"/predict": (_instance.handler("predict_body"), OCTET_STREAM),
                                                         "/graph_update": (_instance.handler("graph_update_body"), JSON)},
                                      server_name="FeatureRunner")
