"""The gateway's core: what every front end (HTTP, gRPC) calls, one method per public endpoint
(``services.api``), over the prediction, graph-update and admin cores. No transport here, and
no BentoML: a test drives it with fakes of the runners.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from common.errors import ApiError
from common.feature_runner_api import CompactRequest, check_explain_size
from common.graph_ops import GraphUpdateAck
from services.admin import Admin
from services.answer import Answer
from services.graph_updates import GraphUpdates
from services.prediction import PredictionCore
from services.protocol import PredictRequest, RoutingChange


class GatewayObserver(Protocol):
    """Where the core reports (Prometheus in the service; nothing in tests)."""

    def answered(self, model: str, outcome: str, seconds: float | None) -> None: ...

    def breakers(self, feature_state: int, model_state: int) -> None: ...


class _Quiet:
    def answered(self, model: str, outcome: str, seconds: float | None) -> None:
        return None

    def breakers(self, feature_state: int, model_state: int) -> None:
        return None


class TooManyNodes(ApiError):
    def __init__(self, nodes: int, limit: int) -> None:
        super().__init__(
            413,
            f"{nodes} node ids; at most {limit} per request (GSAGE_MAX_NODES_PER_REQUEST)",
            type="too_many_nodes",
            param="node_ids",
        )


class GatewayCore:
    def __init__(
        self,
        prediction: PredictionCore,
        graph: GraphUpdates,
        admin: Admin,
        *,
        max_nodes_per_request: int,
        explain_max_nodes: int,
        reload: Callable[[], None] = lambda: None,
        reload_interval_s: float = 1.0,
        observer: GatewayObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``reload``: picks up routing changes and key-file changes; called at most once per
        ``reload_interval_s`` (``clock``) on the request path."""
        self.prediction = prediction
        self.graph = graph
        self.admin = admin
        self.max_nodes_per_request = max_nodes_per_request
        self.explain_max_nodes = explain_max_nodes
        self._reload = reload
        self._reload_interval_s = reload_interval_s
        self._observer = observer or _Quiet()
        self._clock = clock
        self._next_reload = 0.0

    def reload_files(self) -> None:
        now = self._clock()
        if now >= self._next_reload:
            self._next_reload = now + self._reload_interval_s
            self._reload()

    # -- the endpoints ---------------------------------------------------------------------------

    async def predict(self, req: PredictRequest) -> Answer:
        self.reload_files()
        if len(req.node_ids) > self.max_nodes_per_request:
            raise TooManyNodes(len(req.node_ids), self.max_nodes_per_request)
        if req.explain:
            check_explain_size(len(req.node_ids), self.explain_max_nodes)  # ExplainTooLarge: 413
        started = time.perf_counter()
        try:
            answer = await self.prediction.predict(req)
        except ApiError as exc:  # routing's own (an unknown model or version) included
            self._observer.answered(req.model, str(exc.status), None)
            raise
        finally:
            self._observer.breakers(
                self.prediction.feature_breaker.state_value, self.prediction.model_breaker.state_value
            )
        self._observer.answered(answer.model, "degraded" if answer.degraded else "ok", time.perf_counter() - started)
        return answer

    async def graph_update(self, ops: list[dict[str, Any]]) -> GraphUpdateAck:
        return await self.graph.update(ops)

    async def graph_status(self) -> dict[str, Any]:
        return await self.graph.status()

    async def change_routing(self, change: RoutingChange) -> dict[str, Any]:
        return await self.admin.change_routing(change)

    async def compact(self, request: CompactRequest) -> dict[str, Any]:
        return await self.admin.compact(request)

    async def models(self) -> dict[str, Any]:
        self.reload_files()
        return await self.admin.describe_models()

    async def shadow(self) -> dict[str, Any]:
        self.reload_files()
        return self.admin.shadow_report()
