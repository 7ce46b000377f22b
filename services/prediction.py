"""The gateway's prediction logic, shared by the HTTP and gRPC front ends (no transport here).

route -> FeatureRunner.predict, which samples, fetches and hands the FeatureTensor to the
GraphSAGERunner itself (the tensor never travels through the gateway) -> response. The gateway
keeps a breaker per runner; the FeatureRunner's errors say which of the two failed
(``ModelRunnerUnavailable``: the model runner behind it). When the FeatureRunner is down, the answer
is degraded, never an error: each node's last answer from this gateway (marked ``stale``) or, for
nodes never answered, a null label; when the GraphSAGERunner is down, a 503 that clears as soon as
it returns. Every error a runner answered reaches the client as it was raised (kind, status,
message, ``Retry-After``): nothing is translated here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from common import wire
from common.batching import AdaptiveBatcher
from common.breaker import BreakerOpen, CircuitBreaker
from common.errors import ApiError, retry_after
from common.feature_runner_api import ModelRunnerUnavailable, NotAppliedYet, PredictBatch, random_seed
from common.remote import failure_reason
from common.settings import CoalescingSection, TransportDtype
from services.answer import PRECISION_MIXED, PRECISION_NONE, Answer, from_wire
from services.protocol import PredictRequest

if TYPE_CHECKING:
    from services.shadow import ShadowCanary

log = logging.getLogger("graphsage.gateway")

# FeatureRunner.predict: a batch of node ids -> the model runner's answer.
PredictCall = Callable[[PredictBatch], Awaitable[wire.Packed]]


class Router(Protocol):
    def choose(self, model: str, version: str | None, routing_key: str | None) -> str: ...


_Columns = tuple[np.ndarray, "np.ndarray | None", bool, str]  # an answer's probs, embedding, multilabel, precision
_ROWS = 1 << 32  # a kept row is (answer number) * _ROWS + row: one int per node


class _Generation:
    def __init__(self) -> None:
        self.rows: dict[str, dict[int, int]] = {}  # tag -> node -> answer number * _ROWS + row
        self.answers: list[_Columns] = []
        self.size = 0


class StaleAnswers:
    """The last answer per (model tag, node): the degraded response when features are down.

    Two generations per tag: a put writes into the young one, and once it holds ``capacity / 2``
    rows it becomes the old one (the previous old one is dropped). So a node answered within the
    last ``capacity / 2`` rows is always found, and at most ``capacity`` rows are kept. A node
    maps to one int (which answer, which row), so a put is one C-level dict update that allocates
    nothing the garbage collector tracks: the per-node loop over tuples it replaces was a large
    share of the gateway's CPU under bulk load (the ``gateway_bulk256`` py-spy profile of
    ``python -m bench.suite``). Rows stay numpy views of the answers they came from."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._young = _Generation()
        self._old = _Generation()

    def put(self, tag: str, answer: Answer) -> None:
        """Keep ``answer``'s rows under ``tag``, the version as routed (what a degraded request
        resolves to)."""
        young, n = self._young, len(answer.node_ids)
        base = len(young.answers) * _ROWS
        embedding = answer.embedding if isinstance(answer.embedding, np.ndarray) else None  # a fresh answer's
        young.answers.append((answer.probs, embedding, answer.multilabel, answer.precision))
        young.rows.setdefault(tag, {}).update(zip(answer.node_ids, range(base, base + n)))
        young.size += n
        if young.size >= max(1, self.capacity // 2):
            self._old, self._young = young, _Generation()

    def __len__(self) -> int:
        """Rows kept (a node in both generations counts twice)."""
        return sum(len(rows) for gen in (self._young, self._old) for rows in gen.rows.values())

    def get(self, model: str, node_id: int) -> tuple[np.ndarray, np.ndarray | None, bool, str] | None:
        """The node's last row: probabilities, embedding, multilabel, and its answer's precision."""
        for gen in (self._young, self._old):
            at = gen.rows.get(model, {}).get(node_id)
            if at is not None:
                (probs, embedding, multilabel, precision), row = gen.answers[at // _ROWS], at % _ROWS
                return probs[row], embedding[row] if embedding is not None else None, multilabel, precision
        return None

    def degraded(self, model: str, node_ids: list[int], reason: str) -> Answer:
        """Each node's last answer (stale) where there is one; the rest unknown. Its precision
        is that of the rows it repeats: ``mixed`` when they were served at different ones (a
        restart with another ``GSAGE_PRECISION`` between them), ``none`` when it repeats none."""
        cached = [self.get(model, n) for n in node_ids]
        known = np.array([c is not None for c in cached], dtype=bool)
        first = next((c for c in cached if c is not None), None)
        width = first[0].shape[0] if first is not None else 0
        probs = np.zeros((len(node_ids), width), dtype=np.float32)
        for i, c in enumerate(cached):
            if c is not None:
                probs[i] = c[0]
        precisions = {c[3] for c in cached if c is not None}
        precision = precisions.pop() if len(precisions) == 1 else PRECISION_MIXED if precisions else PRECISION_NONE
        return Answer(
            model,
            list(node_ids),
            probs,
            multilabel=first[2] if first is not None else False,
            embedding=[c[1] if c is not None else None for c in cached],
            degraded=True,
            degraded_reason=reason,
            known=known,
            stale=True,
            precision=precision,
        )


@dataclasses.dataclass(eq=False)
class _Call:
    req: PredictRequest
    tag: str
    seed: int

    @property
    def group(self) -> tuple[str, tuple[int, ...] | None, bool, int]:
        # An explained request is a call of its own: its forward pass grows with every hop-1
        # neighbour, and the FeatureRunner bounds it per request (GSAGE_EXPLAIN_MAX_NODES).
        return (
            self.tag,
            tuple(self.req.fanout) if self.req.fanout else None,
            self.req.embedding,
            id(self) if self.req.explain else 0,
        )


class PredictionCore:
    """Concurrent requests are coalesced: each batch (per version, fanout and embedding flag; an
    explained request alone) costs one FeatureRunner.predict call (which makes one GraphSAGERunner call) instead of one
    per request. Each request keeps its own seed (``seeds`` per node), so merging changes no
    answer."""

    def __init__(
        self,
        router: Router,
        predict: PredictCall,
        feature_breaker: CircuitBreaker,
        model_breaker: CircuitBreaker,
        timeout_s: float,
        coalescing: CoalescingSection | None = None,
        *,
        stale: StaleAnswers | None = None,
        min_sequence_wait_s: float = 1.0,
        transport_dtype: TransportDtype = "float32",
        shadow: ShadowCanary | None = None,
    ) -> None:
        """``timeout_s``: the deadline of one FeatureRunner.predict call, its own model call
        included (which the FeatureRunner bounds by a shorter one, so it can say which failed)."""
        coalescing = coalescing or CoalescingSection()
        self.router = router
        self._predict = predict
        self.feature_breaker = feature_breaker
        self.model_breaker = model_breaker
        self.timeout_s = timeout_s
        self.min_sequence_wait_s = min_sequence_wait_s  # a request's wait for its min_sequence, on top
        self.transport_dtype = transport_dtype
        self.shadow = shadow  # scores answered requests with the routing table's shadow version, off this path
        self.stale = stale or StaleAnswers()
        self.coalescer: AdaptiveBatcher[_Call, Answer | ApiError] = AdaptiveBatcher(
            self._run_merged,
            max_batch_size=coalescing.coalesce_max_nodes,
            size_of=lambda c: len(c.req.node_ids),
            max_concurrent=coalescing.coalesce_max_inflight,
            overlap_ratio=coalescing.coalesce_overlap_ratio,
        )

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
        groups: dict[tuple[Any, ...], list[_Call]] = defaultdict(list)
        for call in calls:
            groups[call.group].append(call)
        if len(groups) == 1:  # the common case: in this task, the answers already in the calls' order
            return await self._run_group(calls)
        answers = await asyncio.gather(*(self._run_group(g) for g in groups.values()))
        by_call = {id(c): a for g, ans in zip(groups.values(), answers) for c, a in zip(g, ans)}
        return [by_call[id(c)] for c in calls]

    async def _one_by_one(self, calls: list[_Call]) -> list[Answer | ApiError]:
        """A runner rejected a merged call: isolate the request(s) at fault."""
        return [a for answers in await asyncio.gather(*(self._run_group([c]) for c in calls)) for a in answers]

    async def _run_group(self, calls: list[_Call]) -> list[Answer | ApiError]:
        first = calls[0]
        if not self.model_breaker.allow():  # no call at all: the model runner is known down
            return self._model_unavailable(
                calls,
                ModelRunnerUnavailable("model runner unavailable: circuit open"),
                self.model_breaker.retry_after_s(),
            )
        batch = PredictBatch.of(
            [n for c in calls for n in c.req.node_ids],
            [c.seed for c in calls for _ in c.req.node_ids],
            first.tag,
            fanout=first.req.fanout,
            embedding=first.req.embedding,
            dtype=self.transport_dtype,
            min_sequence=max(c.req.min_sequence or 0 for c in calls),
            explain=first.req.explain,
        )
        started = time.perf_counter()
        try:
            packed = await self.feature_breaker.call(
                self._predict,
                batch,
                answered=_feature_runner_answered,
                timeout_s=self.timeout_s + self.min_sequence_wait_s * any(c.req.min_sequence for c in calls),
            )
        except ModelRunnerUnavailable as exc:  # the FeatureRunner's words, as it said them
            self.model_breaker.record_failure()
            return self._model_unavailable(calls, exc)
        except ApiError as exc:
            if not _feature_runner_answered(exc):  # down, unreachable, refusing our token: degraded
                self.model_breaker.release_probe()
                return [self._degraded(c.tag, c.req, exc) for c in calls]
            self.model_breaker.release_probe()  # the input (or a min_sequence) was at fault
            if len(calls) > 1:  # one caller's input must not fail the others
                return await self._one_by_one(calls)
            return [exc]
        except Exception as exc:
            self.model_breaker.release_probe()
            return [self._degraded(c.tag, c.req, exc) for c in calls]
        self.model_breaker.record_success()
        meta, arrays = packed.unpack()
        out: list[Answer | ApiError] = []
        lo = 0
        for c in calls:
            hi = lo + len(c.req.node_ids)
            answer = from_wire(c.req.node_ids, meta, {k: v[lo:hi] for k, v in arrays.items()})
            self.stale.put(c.tag, answer)
            out.append(answer)
            lo = hi
        if self.shadow is not None:  # only queued here: the shadow's call never delays these answers
            self.shadow.offer(
                first.tag,
                [(c.req, c.seed, a) for c, a in zip(calls, out) if isinstance(a, Answer)],
                time.perf_counter() - started,
                meta.get("layout"),
            )
        return out

    @staticmethod
    def _model_unavailable(
        calls: list[_Call], exc: ApiError, retry_after_s: float | None = None
    ) -> list[Answer | ApiError]:
        log.warning(exc.message)
        if retry_after_s is not None:
            exc.headers = retry_after(retry_after_s)
        return [exc for _ in calls]

    def _degraded(self, tag: str, req: PredictRequest, exc: BaseException) -> Answer:
        reason = f"feature runner unavailable: {_reason(exc)}"
        log.warning(reason)
        return self.stale.degraded(tag, req.node_ids, reason)


def _feature_runner_answered(exc: BaseException) -> bool:
    """The FeatureRunner answered (no failure of its own): a refusal of the input, an update not
    applied yet, or the model runner behind it down."""
    return isinstance(exc, (ModelRunnerUnavailable, NotAppliedYet)) or (isinstance(exc, ApiError) and exc.status < 500)


def _reason(exc: BaseException) -> str:
    return "circuit open" if isinstance(exc, BreakerOpen) else failure_reason(exc)
