"""The gateway's public HTTP surface: each route once, with the core method it calls and the
codecs of its body and answer (``common.endpoints``). The router answers them all; the OpenAPI
document at ``/docs.json`` documents them, every error answer as ``ErrorBody``.
"""

from __future__ import annotations

from typing import Any

import orjson

from common.endpoints import NO_BODY, Endpoint, JsonDocument, JsonModel
from common.errors import ApiError
from common.feature_runner_api import CompactRequest
from common.graph_ops import GraphUpdate, GraphUpdateAck
from services.answer import Answer
from services.protocol import PredictRequest, PredictResponse, RoutingChange

JSON = "application/json"


class AnswerJson:
    """An ``Answer`` rendered once, column-wise (``services.answer``); documented as ``PredictResponse``."""

    media_type = JSON

    def encode(self, answer: Answer) -> bytes:
        return answer.to_json()

    def decode(self, body: bytes) -> Any:
        """A caller's view of the answer: the ``PredictResponse`` it renders."""
        return PredictResponse.model_validate_json(body)

    def schema(self) -> dict[str, Any]:
        return PredictResponse.model_json_schema(ref_template="#/components/schemas/{model}")


class GraphUpdateBody:
    """``{"ops": [...]}`` read with orjson: the ops' shape is checked by the core
    (``common.graph_ops.check_shape``) and their values once, by the FeatureRunner, against the
    graph; documented as ``GraphUpdate``, the full model of the same definition."""

    media_type = JSON

    def encode(self, ops: list[dict[str, Any]]) -> bytes:
        return orjson.dumps({"ops": ops})

    def decode(self, body: bytes) -> list[dict[str, Any]]:
        try:
            doc = orjson.loads(body or b"{}")
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"invalid request: not JSON: {exc}") from None
        if not isinstance(doc, dict) or set(doc) - {"ops"}:
            raise ApiError(400, 'invalid request: expected {"ops": [...]} and nothing else', param="ops")
        ops: list[dict[str, Any]] = doc.get("ops")  # type: ignore[assignment]  # checked by check_shape
        return ops

    def schema(self) -> dict[str, Any]:
        return GraphUpdate.model_json_schema(ref_template="#/components/schemas/{model}")


PREDICT: Endpoint[PredictRequest, Answer] = Endpoint(
    "predict",
    "/predict",
    JsonModel(PredictRequest),
    AnswerJson(),
    "Per-node predictions for node_ids: label, score, probabilities, the exact graphsage:<version> "
    "that answered, degraded when features were unavailable; with explain, each node's neighbourhood.",
)
GRAPH_UPDATES = Endpoint(
    "graph_update",
    "/graph/updates",
    GraphUpdateBody(),
    JsonModel(GraphUpdateAck),
    "Add nodes, set features, add or remove edges and nodes (scope graph): validated whole, "
    "applied atomically, answered once durable; /predict with min_sequence reads it.",
    idempotent=False,
)
ROUTING = Endpoint(
    "change_routing",
    "/admin/routing",
    JsonModel(RoutingChange),
    JsonDocument("the routing table"),
    "Set weights, promote (optionally behind a shadow agreement bar), roll back, set or clear a shadow (scope admin).",
    idempotent=False,
)
COMPACT = Endpoint(
    "compact",
    "/admin/graph/compact",
    JsonModel(CompactRequest),
    JsonDocument("the new snapshot"),
    "Fold the update log into a new graph snapshot (scope admin); every FeatureRunner worker switches "
    "to it with no failed request and no changed answer.",
    idempotent=False,
)
MODELS = Endpoint(
    "models",
    "/models",
    NO_BODY,
    JsonDocument("routing, model_runner, feature_runner"),
    "The routing table and what each runner has loaded (scope predict).",
    method="GET",
)
GRAPH_STATUS = Endpoint(
    "graph_status",
    "/graph/status",
    NO_BODY,
    JsonDocument("log, workers, capacity, directed"),
    "The update log's head and each FeatureRunner worker's applied sequence, lag and overlay size (scope predict).",
    method="GET",
)
SHADOW = Endpoint(
    "shadow",
    "/admin/shadow",
    NO_BODY,
    JsonDocument("shadows, queue, pairs"),
    "The shadow canary's figures per (primary, shadow) pair (scope admin).",
    method="GET",
)
ENDPOINTS: tuple[Endpoint[Any, Any], ...] = (PREDICT, GRAPH_UPDATES, ROUTING, COMPACT, MODELS, GRAPH_STATUS, SHADOW)

# What the public routes answer besides a result (every one as ErrorBody, in the OpenAPI document).
ERRORS = {
    400: "bad input: the field and the reason (a duplicated header: its name)",
    401: "no key, or an unknown one",
    403: "a key without the route's scope",
    404: "an unknown model, version or node",
    406: "an Accept that excludes JSON",
    409: "a routing change refused (a promotion under its agreement bar)",
    413: "a body or an id list over its limit",
    415: "a body that is not JSON",
    422: "a graph update that does not apply, or a min_sequence never issued",
    429: "rate limited (Retry-After)",
    503: "a runner unavailable, an update not applied yet, overloaded (Retry-After)",
    504: "not answered in time",
}
