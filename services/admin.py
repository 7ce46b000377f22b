"""The gateway's admin core, for HTTP and gRPC alike (no transport here): routing changes (weights,
promote behind a shadow agreement bar, rollback, a shadow version), compaction of the update log,
the shadow canary's report, and what each runner has loaded.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from common.errors import ApiError
from common.feature_runner_api import CompactRequest, FeatureRunnerApi
from common.model_runner_api import ModelRunnerApi
from services.promotion import PromotionBar, require_agreement
from services.protocol import RoutingChange
from services.routing import RoutingTable, normalise_version
from services.shadow import ShadowCanary

log = logging.getLogger("graphsage.gateway")


class CompactionNotConfirmed(ApiError):
    def __init__(self, reason: str) -> None:
        super().__init__(
            503,
            f"compaction not confirmed ({reason}); GET /graph/status says whether it happened",
            {"Retry-After": "5"},
            type="compaction_not_confirmed",
        )


class Admin:
    def __init__(
        self,
        routing: RoutingTable,
        shadow: ShadowCanary,
        feature: FeatureRunnerApi,
        model: ModelRunnerApi,
        *,
        compaction_timeout_s: float,
        describe_timeout_s: float,
    ) -> None:
        self.routing = routing
        self.shadow = shadow
        self.feature = feature
        self.model = model
        self.compaction_timeout_s = compaction_timeout_s
        self.describe_timeout_s = describe_timeout_s

    async def change_routing(self, change: RoutingChange) -> dict[str, Any]:
        """Apply ``change`` (a ``RoutingError`` or ``PromotionRefused`` is the answer); every
        gateway worker sees it within a second; the model runner pre-loads the versions now in
        use, shadows included."""
        try:
            self._apply(change)
        except OSError as exc:  # e.g. a routing file mounted read-only from a ConfigMap
            raise ApiError(
                409,
                f"routing file not writable here ({exc.strerror}); change it where it is managed",
                type="routing_file_read_only",
            ) from exc
        for tag in sorted(self.routing.versions_in_use()):
            try:
                await self.model.load(tag)
            except Exception as exc:
                log.warning("pre-loading %s failed: %s", tag, exc)
        return self.routing.to_json()

    def _apply(self, change: RoutingChange) -> None:
        model = change.model or self.routing.default_model
        if change.action == "set_weights":
            if not change.weights:
                raise ApiError(400, "set_weights needs weights: {version: weight}", param="weights")
            self.routing.set_weights(model, change.weights)
        elif change.action == "promote":
            if not change.version:
                raise ApiError(400, "promote needs a version", param="version")
            if change.min_agreement is not None or change.min_compared is not None:
                bar = PromotionBar(change.min_agreement or 0.0, change.min_compared or 0)
                require_agreement(
                    self.shadow.figures(),
                    normalise_version(model, change.version),
                    bar,
                    primaries=self.routing.routes_in_use(model),
                )  # PromotionRefused: 409
            self.routing.promote(model, change.version)
        elif change.action == "set_shadow":
            if not change.version:
                raise ApiError(400, "set_shadow needs a version", param="version")
            self.routing.set_shadow(model, change.version, 1.0 if change.share is None else change.share)
        elif change.action == "clear_shadow":
            self.routing.clear_shadow(model)
        else:
            self.routing.rollback(model)

    async def compact(self, request: CompactRequest) -> dict[str, Any]:
        """Fold the update log into a new graph snapshot; every FeatureRunner worker switches to
        it with no failed request and no changed answer."""
        try:
            return await asyncio.wait_for(self.feature.graph_compact(request), self.compaction_timeout_s)
        except TimeoutError as exc:
            raise CompactionNotConfirmed("timeout") from exc

    def shadow_report(self) -> dict[str, Any]:
        """The shadow of each model and every (primary, shadow) pair's figures, every gateway
        worker's added up (``services.shadow``)."""
        shadows = {m: s.to_json() for m in self.routing.models() if (s := self.routing.shadow(m)) is not None}
        return {"shadows": shadows, **self.shadow.report()}

    async def describe_models(self) -> dict[str, Any]:
        """The routing table, what the model runner has loaded and the FeatureRunner serves; a
        runner that is down is reported, not raised."""
        out: dict[str, Any] = {"routing": self.routing.to_json()}
        calls = {"model_runner": self.model.models(), "feature_runner": self.feature.info()}
        for name, call in calls.items():
            try:
                answer = await asyncio.wait_for(call, self.describe_timeout_s)
                out[name] = answer.model_dump() if hasattr(answer, "model_dump") else answer
            except Exception as exc:
                out[name] = {"error": f"unavailable: {getattr(exc, 'type', type(exc).__name__)}"}
        return out
