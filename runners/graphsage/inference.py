"""The GraphSAGERunner's core, without BentoML: loaded versions and batched forward passes.

- ``ModelRegistry``: several ``graphsage:<version>`` loaded at once; hot-load (on an admin call,
  on a routing change, or on the first request naming a stored version) and unload, no restart.
- ``run_batch``: FeatureTensors of many requests become one tensor computation per version (and
  layout): feature rows are concatenated, indices rebased, smaller fanouts padded up to the model's.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from common.bento.store import StoreEntryNotFound
from common.errors import KindOfError
from common.feature_tensor import LAYOUT, PREMEAN, FeatureTensor
from common.model_runner_api import UnknownVersion
from runners.graphsage.backends import Backend, load_backend
from runners.graphsage.model_artifacts import ModelArtifacts, load_artifacts

log = logging.getLogger("graphsage.model")


class IncompatibleInput(KindOfError):
    """A FeatureTensor that does not fit the version it names (feature dim, depth, fanout)."""

    status_code = 422


@dataclasses.dataclass
class LoadedModel:
    artifacts: ModelArtifacts
    backend: Backend
    loaded_at: float

    @property
    def input_layouts(self) -> list[str]:
        return [LAYOUT, PREMEAN] if self.backend.supports_premean else [LAYOUT]

    def describe(self) -> dict[str, Any]:
        cfg = self.artifacts.config
        return {
            "tag": self.artifacts.tag,
            "backend": self.backend.name,
            "precision": self.backend.precision,
            "load_check": getattr(self.backend, "load_check", None),
            "aggregator": cfg.aggregator,
            "fanout": list(cfg.fanout),
            "feature_dim": cfg.in_dim,
            "num_classes": cfg.num_classes,
            "task": cfg.task,
            "graph_snapshot": self.artifacts.metadata.get("graph_snapshot"),
            "input_layouts": self.input_layouts,
            "loaded_at": self.loaded_at,
        }


@dataclasses.dataclass
class InferenceItem:
    model: str
    tensor: FeatureTensor
    want_embedding: bool = False
    # The version as resolved before the item was queued: a batch never looks a model up (nor
    # loads one from disk), and an unload meanwhile does not fail the items already queued.
    loaded: LoadedModel | None = None


class ModelRegistry:
    def __init__(self, backend: str = "onnx", threads: int = 1, precision: str = "fp32") -> None:
        """``precision``: ``fp32`` or ``int8`` (where a version allows it: ``backends``)."""
        self.backend_kind = backend
        self.threads = threads
        self.precision = precision
        self._models: dict[str, LoadedModel] = {}
        self._aliases: dict[str, str] = {}  # e.g. graphsage:latest -> graphsage:<v>
        self._lock = threading.Lock()

    def get_loaded(self, tag: str) -> LoadedModel | None:
        """The version ``tag`` names if it is loaded already (no I/O), else None."""
        return self._models.get(self._aliases.get(tag, tag))

    def load(self, tag: str) -> LoadedModel:
        """Load a version (idempotent); ``:latest`` resolves to the newest stored version."""
        loaded = self.get_loaded(tag)
        if loaded is not None:
            return loaded
        with self._lock:
            try:
                artifacts = load_artifacts(tag)
            except StoreEntryNotFound as exc:
                raise UnknownVersion(f"model {tag!r} is not in the model store") from exc
            layout = artifacts.metadata.get("input_layout")
            if layout != LAYOUT:
                raise UnknownVersion(
                    f"model {artifacts.tag} was exported for input layout {layout!r}, this runner "
                    f"serves {LAYOUT!r}: re-export it (python -m training_export train)"
                )
            loaded = self._register(artifacts)
            if tag != artifacts.tag:
                self._aliases[tag] = artifacts.tag
            return loaded

    def preload(self, tags: Sequence[str]) -> None:
        """Load the versions a process serves from its start (``GSAGE_MODEL_TAGS``)."""
        for tag in tags:
            loaded = self.load(tag)
            log.info("loaded %s (%s)", loaded.artifacts.tag, loaded.backend.name)

    def register(self, artifacts: ModelArtifacts) -> LoadedModel:
        """Serve these artifacts under their tag (idempotent); ``load`` finds them in the store."""
        with self._lock:
            return self._register(artifacts)

    def _register(self, artifacts: ModelArtifacts) -> LoadedModel:
        if artifacts.tag not in self._models:
            backend = load_backend(artifacts, self.backend_kind, self.threads, self.precision)
            self._models[artifacts.tag] = LoadedModel(artifacts, backend, time.time())
        return self._models[artifacts.tag]

    def unload(self, tag: str) -> bool:
        with self._lock:
            resolved = self._aliases.pop(tag, tag)
            for alias in [a for a, t in self._aliases.items() if t == resolved]:
                del self._aliases[alias]
            return self._models.pop(resolved, None) is not None

    def loaded(self) -> list[dict[str, Any]]:
        return [m.describe() for m in list(self._models.values())]

    def tags(self) -> set[str]:
        return set(self._models)


def check_compatible(model: LoadedModel, ft: FeatureTensor) -> None:
    cfg = model.artifacts.config
    if ft.layout not in model.input_layouts:
        raise IncompatibleInput(
            f"{model.artifacts.tag} takes {model.input_layouts}, not a {ft.layout} tensor "
            f"(the premean input needs a mean-aggregator model exported with it)"
        )
    if ft.feature_dim != cfg.in_dim:
        raise IncompatibleInput(f"{model.artifacts.tag} expects {cfg.in_dim}-dim features, got {ft.feature_dim}")
    if len(ft.fanout) != len(cfg.fanout):
        raise IncompatibleInput(
            f"{model.artifacts.tag} has {len(cfg.fanout)} hops, the request sampled {len(ft.fanout)}"
        )
    if any(k > m for k, m in zip(ft.fanout, cfg.fanout)):
        raise IncompatibleInput(
            f"{model.artifacts.tag} has fanout {list(cfg.fanout)}, the request sampled {list(ft.fanout)}"
        )


@dataclasses.dataclass
class Batch:
    features: np.ndarray
    index: list[np.ndarray]
    premean: tuple[np.ndarray, np.ndarray] | None  # (last_rows, last_mean)
    bounds: list[int]  # each tensor's targets: [bounds[i], bounds[i + 1])


def merge(tensors: list[FeatureTensor], fanout: tuple[int, ...]) -> Batch:
    """One batch of tensors of one layout: concatenated feature rows, rebased indices (premean:
    the entries of the last indexed level rebased by entries, ``last_rows`` by rows), each
    tensor's target span.

    Levels concatenate as they are: a level's rows follow the real nodes of the level above in
    order, so per-request blocks stay aligned. A smaller fanout is padded up with -1 columns.
    Rows stay float16 when every tensor is (the backend widens them, faster than numpy does);
    any other mix becomes float32.
    """
    premean = tensors[0].last_mean is not None
    if any((t.last_mean is not None) != premean for t in tensors):
        raise ValueError("a batch holds tensors of one layout")
    # One tensor (every bulk request): its rows as they arrived, not a copy of them.
    features = tensors[0].features if len(tensors) == 1 else np.concatenate([t.features for t in tensors])
    if features.dtype != np.float16:
        features = features.astype(np.float32, copy=False)
    offsets = np.cumsum(np.array([0] + [t.features.shape[0] for t in tensors[:-1]]))
    entry_offsets = np.cumsum(np.array([0] + [_entries(t) for t in tensors[:-1]])) if premean else offsets
    index, last = [], len(tensors[0].index) - 1
    for depth in range(last + 1):
        parts = []
        for t, off in zip(tensors, entry_offsets if premean and depth == last else offsets):
            idx = t.index[depth]
            rebased = np.where(idx >= 0, idx + np.int32(off), idx) if off else idx
            if depth and idx.shape[1] < fanout[depth - 1]:
                rebased = np.pad(rebased, [(0, 0), (0, fanout[depth - 1] - idx.shape[1])], constant_values=-1)
            parts.append(rebased)
        index.append(np.concatenate(parts).astype(np.int32, copy=False))
    bounds = list(np.cumsum([0] + [t.num_targets for t in tensors]))
    extra = None
    if premean:
        rows = [_premean_parts(t) for t in tensors]
        last_rows = np.concatenate([r + np.int32(off) for (r, _), off in zip(rows, offsets)])
        last_mean = rows[0][1] if len(rows) == 1 else np.concatenate([m for _, m in rows])
        extra = (last_rows.astype(np.int32, copy=False), last_mean.astype(features.dtype, copy=False))
    return Batch(features, index, extra, bounds)


def _premean_parts(tensor: FeatureTensor) -> tuple[np.ndarray, np.ndarray]:
    """A premean tensor's ``last_rows`` and ``last_mean`` (both or neither: ``common.feature_tensor``)."""
    if tensor.last_rows is None or tensor.last_mean is None:
        raise ValueError("a batch holds tensors of one layout")
    return tensor.last_rows, tensor.last_mean


def _entries(tensor: FeatureTensor) -> int:
    return 0 if tensor.last_rows is None else int(tensor.last_rows.size)


def run_batch(registry: ModelRegistry, items: list[InferenceItem]) -> list[dict[str, Any]]:
    """Run every item, one forward pass per model version; results in the order of ``items``.
    Only versions already loaded run (the item's, else the registry's): nothing is read from disk
    here, inside a batch; an item naming a version not loaded raises ``UnknownVersion``."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    models: dict[str, LoadedModel] = {}
    for i, item in enumerate(items):
        model = item.loaded or registry.get_loaded(item.model)
        if model is None:
            raise UnknownVersion(f"model {item.model!r} is not loaded")
        models[model.artifacts.tag] = model
        groups[model.artifacts.tag, item.tensor.layout].append(i)
    results: list[dict[str, Any]] = [{} for _ in items]
    for (tag, _), positions in groups.items():
        model = models[tag]
        batch = merge([items[i].tensor for i in positions], model.artifacts.config.fanout)
        logits, probs, embedding = model.backend.run(batch.features, batch.index, batch.premean)
        for n, i in enumerate(positions):
            lo, hi = batch.bounds[n], batch.bounds[n + 1]
            results[i] = {
                "model": model.artifacts.tag,
                "backend": model.backend.name,
                "precision": model.backend.precision,
                "task": model.artifacts.config.task,
                "layout": items[i].tensor.layout,
                "logits": logits[lo:hi],
                "probs": probs[lo:hi],
                **({"embedding": embedding[lo:hi]} if items[i].want_embedding else {}),
            }
    return results
