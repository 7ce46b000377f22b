"""Baseline B5: the app's work in one process behind a minimal ASGI server, as a user's own
hand-written one-process service would be: uvicorn and one route, no BentoML, no hops.

``POST /predict`` with the gateway's body (``{"node_ids": [...], "seed": 5}``, a seed drawn per
request when none is given) runs what the three services run for it, with the same code and settings
(``GSAGE_*`` from the environment, as the app's services get them): the FeatureRunner's
``NeighbourhoodBuilder`` over its tiered store (L1, Redis L2 when ``GSAGE_REDIS_URL`` is set, the
memory-mapped snapshot), the input layout the FeatureRunner would choose for the version, then
the model runner's ``run_batch`` (ONNX Runtime, the configured intra-op threads), and answers a
JSON body of the gateway's shape (one entry per node: id, label, probabilities). What it does
not do is what the split app adds: auth, routing, breakers, the hops and their encodings, the
batchers. Under uvicorn's defaults it logs a line per request, as the BentoML sides of the suite do
(``procs.AsgiProc``). ``/readyz`` and ``/metrics`` (empty) let the suite start and scrape it as it does the
BentoML services.

    BENTOML_HOME=/tmp/gsage-bench-home python -m uvicorn bench.suite.one_process:app --port 3005
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import numpy as np

from common.feature_tensor import PREMEAN
from common.settings import load_settings
from runners.feature.cache.tiered import build_feature_store
from runners.feature.neighbourhood import NeighbourhoodBuilder
from runners.feature.snapshot import load_snapshot
from runners.graphsage.inference import InferenceItem, ModelRegistry, run_batch

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
JSON_HEADERS = [(b"content-type", b"application/json")]


class OneProcess:
    """The work of one prediction request, all in this process (loaded once, at the first
    request or at uvicorn's lifespan start)."""

    def __init__(self) -> None:
        cfg = load_settings()
        snapshot = load_snapshot(cfg.snapshot_tag)
        self.registry = ModelRegistry(cfg.backend, cfg.intra_op_threads, cfg.precision)
        self.loaded = self.registry.load(cfg.model_tags[0] if cfg.model_tags else "graphsage:latest")
        store = build_feature_store(cfg.feature_cache, cfg.redis, snapshot.features, snapshot.tag)
        fanout = cfg.fanout or tuple(self.loaded.artifacts.config.fanout)
        self.builder = NeighbourhoodBuilder(snapshot, store, fanout, cfg.runner_call_max_nodes, cfg.scan_min_targets)
        self.premean_min_targets = cfg.premean_min_targets if cfg.premean else None
        self.takes_premean = PREMEAN in self.loaded.input_layouts
        self.rng = random.Random()

    async def predict(self, body: bytes) -> bytes:
        doc = json.loads(body)
        node_ids = doc["node_ids"]
        seed = doc.get("seed")
        seed = self.rng.getrandbits(62) if seed is None else int(seed)
        premean = (
            self.takes_premean and self.premean_min_targets is not None and len(node_ids) >= self.premean_min_targets
        )
        request = self.builder.validate(node_ids, None, seed, premean=premean)
        (tensor,) = await self.builder.build([request])
        (result,) = run_batch(self.registry, [InferenceItem(self.loaded.artifacts.tag, tensor, loaded=self.loaded)])
        probs = np.asarray(result["probs"])
        labels = probs.argmax(axis=1)
        predictions = [
            {"node_id": int(n), "label": int(lab), "probs": row.tolist()}
            for n, lab, row in zip(node_ids, labels, probs, strict=True)
        ]
        return json.dumps({"model": self.loaded.artifacts.tag, "predictions": predictions}).encode()


class App:
    """Raw ASGI: ``POST /predict``, ``GET /readyz``, ``GET /metrics``."""

    def __init__(self) -> None:
        self.work: OneProcess | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        if method == "POST" and path == "/predict" and self.work is not None:
            await _answer(send, 200, await self.work.predict(await read_body(receive)))
        elif method == "GET" and path in ("/readyz", "/livez"):
            await _answer(send, 200 if self.work is not None else 503, b"{}")
        elif method == "GET" and path == "/metrics":
            await _answer(send, 200, b"", [(b"content-type", b"text/plain")])
        else:
            await _answer(send, 404, b'{"error": "not found"}')

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.work = OneProcess()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


async def read_body(receive: Receive) -> bytes:
    """An ASGI request's whole body."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = JSON_HEADERS) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


app = App()
