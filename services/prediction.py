"""The gateway's prediction logic, shared by the HTTP and gRPC front ends (no transport here).

route -> FeatureRunner (timeout + breaker) -> GraphSAGERunner (timeout + breaker) -> response.
When the FeatureRunner is down, the answer is degraded, never an error: each node's last answer
from this gateway (marked ``stale``) or, for nodes never answered, a null label; when the
GraphSAGERunner is down, a 503 that clears as soon as it returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from runners import wire
from runners.batching import AdaptiveBatcher
from runners.sampling import random_seed
from services.breaker import BreakerOpen, CircuitBreaker
from services.answer import Answer, from_wire
from services.protocol import PredictRequest

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


# A killed worker leaves several pooled keep-alive connections to it; a retry can draw another one
# before the event loop has seen its close (a 503 in 1 of 4 runs of tests/test_faults.py with one
# retry). The last retry waits a moment, by which time the dead connections are discarded.
CONNECTION_RETRY_PAUSES_S = (0.0, 0.02)


def rejecting_client_errors(fn: Callable[..., Awaitable[bytes]]) -> Callable[..., Awaitable[bytes]]:
    """Wrap a runner call: its 4xx answers raise ``RunnerRejected``, and a connection lost
    mid-call (a worker killed, a pooled connection closed) is retried: calls are idempotent."""

    async def call(**kwargs: Any) -> bytes:
        for attempt in range(len(CONNECTION_RETRY_PAUSES_S) + 1):
            try:
                return await fn(**kwargs)
            except Exception as exc:
                status = remote_status(exc)
                if status is not None and 400 <= status < 500:
                    raise RunnerRejected(status, _message(exc)) from exc
                if attempt < len(CONNECTION_RETRY_PAUSES_S) and _connection_lost(exc):
                    log.info("runner connection lost (%s); retrying", type(exc).__name__)
                    await asyncio.sleep(CONNECTION_RETRY_PAUSES_S[attempt])
                    continue
                raise
        raise AssertionError("unreachable")

    return call


class StaleAnswers:
    """The last answer per (model tag, node): the degraded response when features are down.

    Rows are kept as numpy views of the answers they came from; a node answered again moves to the
    young end, the oldest entries leave past ``capacity``."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._data: dict[tuple[str, int], tuple[np.ndarray, np.ndarray | None, bool]] = {}

    def put(self, tag: str, answer: Answer) -> None:
        """Keep ``answer``'s rows under ``tag``, the version as routed (what a degraded request
        resolves to)."""
        keys = [(tag, n) for n in answer.node_ids]
        data = self._data
        for key in keys:  # re-insertion moves a key to the young end of the dict's order
            data.pop(key, None)
        emb = answer.embedding if answer.embedding is not None else itertools.repeat(None)
        data.update(zip(keys, zip(answer.probs, emb, itertools.repeat(answer.multilabel))))
        for key in list(itertools.islice(iter(data), max(0, len(data) - self.capacity))):
            del data[key]

    def get(self, model: str, node_id: int) -> tuple[np.ndarray, np.ndarray | None, bool] | None:
        return self._data.get((model, node_id))

    def degraded(self, model: str, node_ids: list[int], reason: str) -> Answer:
        """Each node's last answer (stale) where there is one; the rest unknown."""
        cached = [self.get(model, n) for n in node_ids]
        known = np.array([c is not None for c in cached], dtype=bool)
        first = next((c for c in cached if c is not None), None)
        width = first[0].shape[0] if first is not None else 0
        probs = np.zeros((len(node_ids), width), dtype=np.float32)
        for i, c in enumerate(cached):
            if c is not None:
                probs[i] = c[0]
        return Answer(model, list(node_ids), probs, multilabel=first[2] if first is not None else False,
                      embedding=[c[1] if c is not None else None for c in cached], degraded=True,
                      degraded_reason=reason, known=known, stale=True)


@dataclasses.dataclass(eq=False)
class _Call:
    req: PredictRequest
    tag: str
    seed: int

    @property
    def group(self) -> tuple[str, tuple[int, ...] | None, bool]:
        return self.tag, tuple(self.req.fanout) if self.req.fanout else None, self.req.embedding


class PredictionCore:
    """Concurrent requests are coalesced: each batch (per version, fanout and embedding flag)
    costs one FeatureRunner call and one GraphSAGERunner call instead of two per request. Each
    request keeps its own seed (``seeds`` per node), so merging changes no answer."""

    def __init__(self, router: Router, features: FeaturesCall, infer: InferCall, feature_breaker: CircuitBreaker,
                 model_breaker: CircuitBreaker, timeout_s: float, stale: StaleAnswers | None = None,
                 max_merge_nodes: int = 1024, max_inflight: int = 4) -> None:
        self.router = router
        self._features = rejecting_client_errors(features)
        self._infer = rejecting_client_errors(infer)
        self.feature_breaker = feature_breaker
        self.model_breaker = model_breaker
        self.timeout_s = timeout_s
        self.stale = stale or StaleAnswers()
        self.coalescer: AdaptiveBatcher[_Call, Answer | ApiError] = AdaptiveBatcher(
            self._run_merged, max_batch_size=max_merge_nodes, size_of=lambda c: len(c.req.node_ids),
            max_concurrent=max_inflight)

    def route(self, req: PredictRequest) -> str:
        version = req.version
        if version is not None and ":" not in version:
            version = f"{req.model}:{version}"
        return self.router.choose(req.model, version, req.routing_key)

    async def predict(self, req: PredictRequest) -> Answer:
        call = _Call(req, self.route(req), req.seed if req.seed is not None else random_seed())
        outcome = await self.coalescer.submit(call)
        if isinstance(outcome, ApiError):
            raise outcome
        return outcome

    async def _run_merged(self, calls: list[_Call]) -> list[Answer | ApiError]:
        groups: dict[tuple, list[_Call]] = defaultdict(list)
        for call in calls:
            groups[call.group].append(call)
        answers = await asyncio.gather(*(self._run_group(g) for g in groups.values()))
        by_call = {id(c): a for g, ans in zip(groups.values(), answers) for c, a in zip(g, ans)}
        return [by_call[id(c)] for c in calls]

    async def _one_by_one(self, calls: list[_Call]) -> list[Answer | ApiError]:
        """A runner rejected a merged call: isolate the request(s) at fault."""
        return [a for answers in await asyncio.gather(*(self._run_group([c]) for c in calls)) for a in answers]

    async def _run_group(self, calls: list[_Call]) -> list[Answer | ApiError]:
        first = calls[0]
        node_ids = [n for c in calls for n in c.req.node_ids]
        seeds = [c.seed for c in calls for _ in c.req.node_ids]
        try:
            blob = await self.feature_breaker.call(
                self._features, node_ids=node_ids, fanout=first.req.fanout, seeds=seeds,
                timeout_s=self.timeout_s, ignore=(RunnerRejected,))
        except RunnerRejected as exc:
            return await self._one_by_one(calls) if len(calls) > 1 else [ApiError(exc.status, str(exc))]
        except Exception as exc:  # noqa: BLE001 - anything else: the runner is unavailable
            return [self._degraded(c.tag, c.req, exc) for c in calls]
        try:
            packed = await self.model_breaker.call(
                self._infer, tensor=blob, model=first.tag, embedding=first.req.embedding,
                timeout_s=self.timeout_s, ignore=(RunnerRejected,))
        except RunnerRejected as exc:
            if exc.status == 404:
                return [ApiError(404, f"unknown model version {first.tag!r}") for _ in calls]
            return await self._one_by_one(calls) if len(calls) > 1 else [ApiError(exc.status, str(exc))]
        except Exception as exc:  # noqa: BLE001
            retry = exc.retry_after_s if isinstance(exc, BreakerOpen) else 1.0
            log.warning("GraphSAGERunner unavailable: %s", _reason(exc))
            headers = {"Retry-After": str(max(1, int(np.ceil(retry))))}
            return [ApiError(503, f"model runner unavailable: {_reason(exc)}", headers) for _ in calls]
        meta, arrays = wire.unpack(packed)
        out: list[Answer | ApiError] = []
        lo = 0
        for c in calls:
            hi = lo + len(c.req.node_ids)
            answer = from_wire(c.req.node_ids, meta, {k: v[lo:hi] for k, v in arrays.items()})
            self.stale.put(c.tag, answer)
            out.append(answer)
            lo = hi
        return out

    def _degraded(self, tag: str, req: PredictRequest, exc: BaseException) -> Answer:
        reason = f"feature runner unavailable: {_reason(exc)}"
        log.warning(reason)
        return self.stale.degraded(tag, req.node_ids, reason)


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
