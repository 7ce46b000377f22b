"""The GraphSAGERunner's core, without BentoML: the endpoints of ``common.model_runner_api``.

It receives FeatureTensors and never fetches features. Concurrent requests are merged by an
adaptive batcher (one batch in flight per worker; a batch holding several versions runs one
forward pass per version). Large forward passes run in one worker thread so the event loop keeps
accepting requests while ONNX Runtime computes (it releases the GIL); small ones (at most
``inline_forward_max_targets`` targets) run on the event loop, where the thread hand-off would
cost more than it frees (``python bench/bench_model.py`` times the forward pass per batch size).

Why not BentoML's ``batchable=True``: it concatenates one numpy argument by rows, but a
deduplicated FeatureTensor needs its indices rebased per request and a batch must be split by
model version; the batcher here does both and reports queue and compute time separately.

An admin ``load`` or ``unload`` reaches one worker; the others apply it from the shared
``AdminState`` within ``model_sync_interval_s``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from common import wire
from common.batching import AdaptiveBatcher, BatchStats
from common.errors import ApiError
from common.model_runner_api import InferCall, LoadRequest, ModelInfo, ModelsReport, Unloaded
from common.settings import ModelRunnerSection
from runners.graphsage.admin_state import AdminState
from runners.graphsage.inference import InferenceItem, LoadedModel, ModelRegistry, check_compatible, run_batch

log = logging.getLogger("graphsage.model")
ANSWER_META = ("model", "backend", "precision", "task", "layout")


class ModelRunnerObserver(Protocol):
    """Where the core reports (Prometheus in the service; nothing in tests)."""

    def batch(self, stats: BatchStats) -> None: ...

    def answered(self, model: str, backend: str) -> None: ...


class _Quiet:
    def batch(self, stats: BatchStats) -> None:
        return None

    def answered(self, model: str, backend: str) -> None:
        return None


class ModelRunnerCore:
    def __init__(
        self,
        registry: ModelRegistry,
        admin_state: AdminState,
        cfg: ModelRunnerSection,
        observer: ModelRunnerObserver | None = None,
    ) -> None:
        self.registry = registry
        self.admin_state = admin_state
        self._observer = observer or _Quiet()
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="forward")
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="loader")
        self._inline_max = cfg.inline_forward_max_targets
        self._sync_interval_s = cfg.model_sync_interval_s
        self._sync_task: asyncio.Task[None] | None = None
        self.batcher: AdaptiveBatcher[InferenceItem, dict[str, Any]] = AdaptiveBatcher(
            self._forward,
            max_batch_size=cfg.max_batch_targets,
            max_delay_s=cfg.max_batch_delay_ms / 1000,
            size_of=lambda item: item.tensor.num_targets,
            on_batch=self._observer.batch,
        )

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._sync_task = asyncio.get_running_loop().create_task(self._sync_forever())

    async def close(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
        self._loader.shutdown(wait=False, cancel_futures=True)
        self._compute.shutdown(wait=True)  # a forward pass in flight finishes

    async def _sync_forever(self) -> None:
        while True:
            await asyncio.sleep(self._sync_interval_s)
            try:
                await self.sync_admin_state()
            except Exception:
                log.exception("applying the admin state failed")

    async def sync_admin_state(self) -> None:
        """Apply the admin calls other workers of this service received."""
        for tag, action in (self.admin_state.changes() or {}).items():
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

    # -- the endpoints ---------------------------------------------------------------------------

    async def infer(self, call: InferCall) -> wire.Packed:
        loaded = await self._load(call.model)
        check_compatible(loaded, call.tensor)  # IncompatibleInput: 422
        result = await self.batcher.submit(InferenceItem(loaded.artifacts.tag, call.tensor, call.embedding, loaded))
        self._observer.answered(result["model"], result["backend"])
        arrays: dict[str, np.ndarray] = {k: result[k] for k in ("logits", "probs", "embedding") if k in result}
        return wire.Packed.of(arrays, {k: result[k] for k in ANSWER_META})

    async def load(self, request: LoadRequest) -> ModelInfo:
        loaded = await self._load(request.tag)
        await asyncio.to_thread(self.admin_state.record, loaded.artifacts.tag, "loaded")
        return ModelInfo(**loaded.describe())

    async def unload(self, request: LoadRequest) -> Unloaded:
        resolved = self.registry.get_loaded(request.tag)
        unloaded = self.registry.unload(request.tag)
        await asyncio.to_thread(
            self.admin_state.record, resolved.artifacts.tag if resolved else request.tag, "unloaded"
        )
        return Unloaded(tag=request.tag, unloaded=unloaded)

    async def models(self) -> ModelsReport:
        return ModelsReport(
            loaded=[ModelInfo(**d) for d in self.registry.loaded()],
            batches=vars(self.batcher.stats),
            worker_pid=os.getpid(),
        )

    # -- work --------------------------------------------------------------------------------------

    async def _load(self, tag: str) -> LoadedModel:
        loaded = self.registry.get_loaded(tag)
        if loaded is not None:  # the common case: no hop through the loader thread
            return loaded
        return await asyncio.get_running_loop().run_in_executor(self._loader, self.registry.load, tag)  # UnknownVersion

    async def _forward(self, items: list[InferenceItem]) -> list[dict[str, Any]]:
        if sum(item.tensor.num_targets for item in items) <= self._inline_max:
            return run_batch(self.registry, items)
        return await asyncio.get_running_loop().run_in_executor(self._compute, run_batch, self.registry, items)
