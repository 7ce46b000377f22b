"""GraphSAGERunner: the separately scaled BentoML service that runs the model. Pure compute.

It receives FeatureTensors and never fetches features. Concurrent requests are merged by an
adaptive batcher (one batch in flight per worker; a batch holding several versions runs one
forward pass per version). Large forward passes run in one worker thread so the event loop keeps
accepting requests while ONNX Runtime computes (it releases the GIL); small ones (at most
``inline_forward_max_targets`` targets) run on the event loop, where the thread hand-off would
cost more than it frees (``python bench/bench_model.py`` times the forward pass per batch size).

Why not BentoML's ``batchable=True``: it concatenates one numpy argument by rows, but a
deduplicated FeatureTensor needs its indices rebased per request and a batch must be split by
model version; the batcher here does both and reports queue and compute time separately.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import bentoml

from common import wire
from common.bento.serving import prepare_service_module
from common.bento.direct_api import OCTET_STREAM, BinaryBody, DirectApi, ServiceInstance, answers_errors
from common.batching import AdaptiveBatcher, BatchStats
from common.errors import ApiError
from common.feature_tensor import FeatureTensorError, decode
from common.metrics import labelled
from common.service_auth import ServiceGuard
from common.settings import runner_service_options, settings
from runners.graphsage.inference import InferenceItem, ModelRegistry, check_compatible, run_batch
from runners.graphsage.admin_state import AdminState
from runners.graphsage.metrics import model_metrics

prepare_service_module()  # timeout fix, quiet client errors, the shared service token

log = logging.getLogger("graphsage.model")
_instance = ServiceInstance()


@bentoml.service(name="GraphSAGERunner", **runner_service_options(settings().model_workers))
class GraphSAGERunner:
    def __init__(self) -> None:
        cfg = settings()
        self.registry = ModelRegistry(cfg.backend, cfg.intra_op_threads)
        for tag in cfg.model_tags:
            loaded = self.registry.load(tag)
            log.info("GraphSAGERunner: loaded %s (%s)", loaded.artifacts.tag, loaded.backend.name)
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="forward")
        self._inline_max = cfg.inline_forward_max_targets
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="loader")
        self.batcher: AdaptiveBatcher[InferenceItem, dict] = AdaptiveBatcher(
            self._forward, max_batch_size=cfg.max_batch_targets, max_delay_s=cfg.max_batch_delay_ms / 1000,
            size_of=lambda item: item.tensor.num_targets, on_batch=self._observe,
        )
        self.admin_state = AdminState.for_this_service()
        self._sync_interval_s = cfg.model_sync_interval_s
        self._sync_task: asyncio.Task[None] | None = None
        _instance.set(self)
        # Start-up objects out of the collector's reach: gen-2 collections over them paused BentoML
        # workers (no benchmark times the pauses; gc.callbacks under python -m bench.suite would).
        gc.freeze()

    async def _forward(self, items: list[InferenceItem]) -> list[dict]:
        if sum(item.tensor.num_targets for item in items) <= self._inline_max:
            return run_batch(self.registry, items)
        return await asyncio.get_running_loop().run_in_executor(self._compute, run_batch, self.registry, items)

    @staticmethod
    def _observe(stats: BatchStats) -> None:
        m = model_metrics()
        m.batches.inc()
        m.batch_targets.observe(stats.last_batch_units)
        m.queue.observe(stats.last_batch_queue_s)
        m.compute.observe(stats.last_batch_compute_s)

    @bentoml.on_startup
    async def start_sync(self) -> None:
        self._sync_task = asyncio.get_running_loop().create_task(self._sync_forever())

    @bentoml.on_shutdown
    async def close(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
        self._loader.shutdown(wait=False, cancel_futures=True)
        self._compute.shutdown(wait=True)  # a forward pass in flight finishes

    async def _sync_forever(self) -> None:
        """Apply the admin calls other workers of this service received (``admin_state``)."""
        while True:
            await asyncio.sleep(self._sync_interval_s)
            try:
                await self.sync_admin_state()
            except Exception:  # noqa: BLE001 - a bad version must not stop the loop; logged
                log.exception("applying the admin state failed")

    async def sync_admin_state(self) -> None:
        versions = self.admin_state.changes()
        for tag, action in (versions or {}).items():
            if action == "unloaded":
                if self.registry.unload(tag):
                    log.info("unloaded %s (admin call to another worker)", tag)
            elif self.registry.get_loaded(tag) is None:
                try:
                    loaded = await self._load(tag)
                except ApiError as exc:
                    log.warning("admin load of %s not applied here: %s", tag, exc.message)
                    continue
                log.info("loaded %s (admin call to another worker)", loaded.artifacts.tag)

    async def _load(self, tag: str):
        loaded = self.registry.get_loaded(tag)
        if loaded is not None:  # the common case: no hop through the loader thread
            return loaded
        return await asyncio.get_running_loop().run_in_executor(self._loader, self.registry.load, tag)  # UnknownVersion: 404

    @bentoml.api
    @answers_errors
    async def infer(self, request: BinaryBody, /) -> BinaryBody:
        """Run a model on an encoded FeatureTensor. The body is ``wire.envelope({"model": tag,
        "embedding": bool}, tensor)``; returns logits/probs (and embedding) packed with
        ``common.wire``, meta: the exact model tag, backend, precision, task and the input layout it ran on."""
        return await self.infer_body(request)

    async def infer_body(self, request: bytes) -> bytes:
        """``infer``'s work (what ``common.bento.direct_api`` answers it with)."""
        try:
            options, tensor = wire.open_envelope(request)
            model = options.get("model", "graphsage:latest")
            embedding = options.get("embedding", False)
            if not isinstance(model, str) or not isinstance(embedding, bool):
                raise FeatureTensorError("envelope options: model must be a string, embedding a bool")
            ft = decode(tensor)
        except (wire.WireError, FeatureTensorError) as exc:
            raise ApiError(400, f"bad FeatureTensor: {exc}") from exc
        loaded = await self._load(model)
        check_compatible(loaded, ft)  # IncompatibleInput: 422
        result = await self.batcher.submit(InferenceItem(loaded.artifacts.tag, ft, embedding, loaded))
        labelled(model_metrics().requests, result["model"], result["backend"]).inc()
        arrays = {k: result[k] for k in ("logits", "probs", "embedding") if k in result}
        return wire.pack(arrays, {k: result[k] for k in ("model", "backend", "precision", "task", "layout")})

    @bentoml.api
    @answers_errors
    async def load(self, tag: str) -> dict:
        """Hot-load a version (idempotent): into this worker now, into this service's other
        workers within ``GSAGE_MODEL_SYNC_INTERVAL_S``."""
        loaded = await self._load(tag)
        await asyncio.to_thread(self.admin_state.record, loaded.artifacts.tag, "loaded")
        return loaded.describe()

    @bentoml.api
    @answers_errors
    async def unload(self, tag: str) -> dict:
        """Unload a version from every worker of this service (this one now)."""
        resolved = self.registry.get_loaded(tag)
        unloaded = self.registry.unload(tag)
        await asyncio.to_thread(self.admin_state.record, resolved.artifacts.tag if resolved else tag, "unloaded")
        return {"tag": tag, "unloaded": unloaded}

    @bentoml.api
    @answers_errors
    async def models(self) -> dict:
        return {"loaded": self.registry.loaded(), "batches": vars(self.batcher.stats), "worker_pid": os.getpid()}


GraphSAGERunner.add_asgi_middleware(ServiceGuard)  # outermost: no pickle, no call without the token
if settings().direct_api:
    GraphSAGERunner.add_asgi_middleware(DirectApi, routes={"/infer": (_instance.handler("infer_body"), OCTET_STREAM)},
                                        server_name="GraphSAGERunner")
