"""The gateway's prediction logic, shared by the HTTP and gRPC front ends (no transport here).

route -> FeatureRunner (timeout + breaker) -> GraphSAGERunner (timeout + breaker) -> response.
When the FeatureRunner is down, the answer is degraded, never an error: each node's last answer
from this gateway (marked ``stale``) or, for nodes never answered, a null label; when the
GraphSAGERunner is down, a 503 that clears as soon as it returns.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from runners import wire
from services.breaker import BreakerOpen, CircuitBreaker
from services.protocol import NodePrediction, PredictRequest, PredictResponse

log = logging.getLogger("graphsage.gateway")

FeaturesCall = Callable[..., Awaitable[bytes]]
InferCall = Callable[..., Awaitable[bytes]]


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class Router(Protocol):
    def choose(self, model: str, version: str | None, routing_key: str | None) -> str: ...


def remote_status(exc: BaseException) -> int | None:
    """The HTTP status a dependency answered with, if the exception carries one."""
    code = getattr(exc, "error_code", None)
    try:
        return int(code) if code is not None else None
    except (TypeError, ValueError):
        return None


class RunnerRejected(Exception):
    """A runner answered 4xx: it is healthy, the input was wrong (not a breaker failure)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _connection_lost(exc: BaseException) -> bool:
    import aiohttp

    return isinstance(exc, (ConnectionError, aiohttp.ClientConnectionError)) and not isinstance(
        exc, aiohttp.ClientConnectorError)  # refused: the runner is down, no point retrying


def rejecting_client_errors(fn: Callable[..., Awaitable[bytes]]) -> Callable[..., Awaitable[bytes]]:
    """Wrap a runner call: its 4xx answers raise ``RunnerRejected``, and a connection lost
    mid-call (a worker killed, a pooled connection closed) is retried once: calls are idempotent."""

    async def call(**kwargs: Any) -> bytes:
        for attempt in (1, 2):
            try:
                return await fn(**kwargs)
            except Exception as exc:
                status = remote_status(exc)
                if status is not None and 400 <= status < 500:
                    raise RunnerRejected(status, _message(exc)) from exc
                if attempt == 1 and _connection_lost(exc):
                    log.info("runner connection lost (%s); retrying once", type(exc).__name__)
                    continue
                raise
        raise AssertionError("unreachable")

    return call


class StaleAnswers:
    """The last answer per (model tag, node): the degraded response when features are down."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._data: OrderedDict[tuple[str, int], NodePrediction] = OrderedDict()

    def put(self, model: str, predictions: list[NodePrediction]) -> None:
        for p in predictions:
            self._data[(model, p.node_id)] = p
            self._data.move_to_end((model, p.node_id))
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def get(self, model: str, node_id: int) -> NodePrediction | None:
        return self._data.get((model, node_id))


def to_predictions(node_ids: list[int], meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[NodePrediction]:
    probs = arrays["probs"]
    emb = arrays.get("embedding")
    multilabel = meta.get("task") == "multilabel"
    top = probs.argmax(1)
    rows = probs.tolist()
    out = []
    for i, node in enumerate(node_ids):
        p = rows[i]
        out.append(NodePrediction(
            node_id=node,
            label=None if multilabel else int(top[i]),
            labels=[j for j, x in enumerate(p) if x >= 0.5] if multilabel else None,
            score=float(p[top[i]]),
            probabilities=p,
            embedding=emb[i].tolist() if emb is not None else None,
        ))
    return out


class PredictionCore:
    def __init__(self, router: Router, features: FeaturesCall, infer: InferCall, feature_breaker: CircuitBreaker,
                 model_breaker: CircuitBreaker, timeout_s: float, stale: StaleAnswers | None = None) -> None:
        self.router = router
        self._features = rejecting_client_errors(features)
        self._infer = rejecting_client_errors(infer)
        self.feature_breaker = feature_breaker
        self.model_breaker = model_breaker
        self.timeout_s = timeout_s
        self.stale = stale or StaleAnswers()

    def route(self, req: PredictRequest) -> str:
        version = req.version
        if version is not None and ":" not in version:
            version = f"{req.model}:{version}"
        return self.router.choose(req.model, version, req.routing_key)

    async def predict(self, req: PredictRequest) -> PredictResponse:
        tag = self.route(req)
        try:
            blob = await self.feature_breaker.call(
                self._features, node_ids=req.node_ids, fanout=req.fanout, seed=req.seed,
                timeout_s=self.timeout_s, ignore=(RunnerRejected,))
        except RunnerRejected as exc:
            raise ApiError(exc.status, str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - anything else: the runner is unavailable
            return self._degraded(tag, req, exc)
        try:
            packed = await self.model_breaker.call(
                self._infer, tensor=blob, model=tag, embedding=req.embedding,
                timeout_s=self.timeout_s, ignore=(RunnerRejected,))
        except RunnerRejected as exc:
            if exc.status == 404:
                raise ApiError(404, f"unknown model version {tag!r}") from exc
            raise ApiError(exc.status, str(exc)) from exc
        except Exception as exc:  # noqa: BLE001
            retry = exc.retry_after_s if isinstance(exc, BreakerOpen) else 1.0
            log.warning("GraphSAGERunner unavailable: %s", _reason(exc))
            raise ApiError(503, f"model runner unavailable: {_reason(exc)}",
                           {"Retry-After": str(max(1, int(np.ceil(retry))))}) from exc
        meta, arrays = wire.unpack(packed)
        predictions = to_predictions(req.node_ids, meta, arrays)
        self.stale.put(tag, predictions)  # keyed as routed: what a degraded request resolves to
        return PredictResponse(model=meta["model"], predictions=predictions)

    def _degraded(self, tag: str, req: PredictRequest, exc: BaseException) -> PredictResponse:
        reason = f"feature runner unavailable: {_reason(exc)}"
        log.warning(reason)
        out = []
        for node in req.node_ids:
            cached = self.stale.get(tag, node)
            out.append(cached.model_copy(update={"stale": True}) if cached else NodePrediction(node_id=node))
        return PredictResponse(model=tag, degraded=True, degraded_reason=reason, predictions=out)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, BreakerOpen):
        return "circuit open"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    return type(exc).__name__


def _message(exc: BaseException) -> str:
    """The runner's own error text: BentoML wraps it as JSON (``[{"error": ...}]``)."""
    text = str(exc) or type(exc).__name__
    try:
        body = json.loads(text)
        while isinstance(body, list) and body:
            body = body[0]
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            text = body["error"]
    except ValueError:
        pass
    return text[:500]
