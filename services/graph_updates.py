"""The gateway's graph-update core, for HTTP and gRPC alike (no transport here).

A batch is checked for its shape at the edge (``common.graph_ops.check_shape``: known ops, their
fields), then the FeatureRunner validates it whole against the graph, appends it durably to the
update log and applies it; the acknowledgement comes back once it is durable. What the
FeatureRunner refused reaches the client as it said it. When the outcome is unknown (the
connection was lost after the batch was sent, or the deadline passed), the answer says so: the
batch may or may not have been applied, and ``GET /graph/status`` tells which.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from common.errors import ApiError
from common.feature_runner_api import FeatureRunnerApi
from common.graph_ops import GraphUpdateAck, check_shape
from common.remote import ServiceUnavailable, failure_reason


class UpdateNotConfirmed(ApiError):
    def __init__(self, reason: str) -> None:
        super().__init__(
            503,
            f"graph update not confirmed ({reason}); it may or may not have been applied: read "
            "/graph/status before sending it again",
            {"Retry-After": "1"},
            type="update_not_confirmed",
        )


class GraphUpdates:
    def __init__(
        self,
        feature: FeatureRunnerApi,
        update_timeout_s: float,
        status_timeout_s: float,
        accepted: Callable[[str, int], None] = lambda op, n: None,
    ) -> None:
        """``accepted``: called per op kind of every acknowledged batch (a metric)."""
        self.feature = feature
        self.update_timeout_s = update_timeout_s
        self.status_timeout_s = status_timeout_s
        self._accepted = accepted

    async def update(self, ops: list[dict[str, Any]]) -> GraphUpdateAck:
        check_shape(ops)
        try:
            ack = await asyncio.wait_for(self.feature.graph_update(ops), self.update_timeout_s)
        except ServiceUnavailable as exc:
            if exc.sent:
                raise UpdateNotConfirmed(exc.message) from exc
            raise
        except TimeoutError as exc:
            raise UpdateNotConfirmed(failure_reason(exc)) from exc
        for op, n in Counter(op["op"] for op in ops).items():
            self._accepted(op, n)
        return ack

    async def status(self) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(self.feature.graph_status(), self.status_timeout_s)
        except TimeoutError as exc:
            raise ApiError.unavailable("feature runner unavailable: timeout", 1.0, type="service_unavailable") from exc
