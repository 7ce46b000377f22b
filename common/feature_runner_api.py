"""The FeatureRunner's API: its endpoints, their types, the errors its callers act on, and the
typed client the gateway uses.

``predict``'s body is a ``PredictBatch``: call options + the node ids (and per-node seeds) as
int64 arrays in one raw body (``wire.envelope(options, wire.pack({"node_ids"[, "seeds"]}))``).
Keyword arguments through BentoML's client were pickled and written in chunks, a visible share of
the gateway's busy time on bulk requests (the ``gateway_bulk256`` py-spy profile of ``python -m
bench.suite``), and JSON lists of ids cost a pydantic pass per call. The answer is the model
runner's ``common.wire`` message as it came (with the explanation's arrays when asked for).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from common import wire
from common.endpoints import NO_BODY, Binary, Endpoint, JsonDocument, JsonModel
from common.errors import ApiError, KindOfError
from common.feature_tensor import FeatureTensor, FeatureTensorError, decode, encode
from common.graph_ops import MAX_NODE_ID, GraphUpdateAck, NodeId
from common.model_runner_api import PACKED
from common.remote import Transport
from common.settings import TRANSPORT_DTYPES, TransportDtype

SERVICE = "FeatureRunner"
Seed = Annotated[StrictInt, Field(ge=0, le=MAX_NODE_ID)]
# The explanation's arrays beside the answer's (``common.wire``), first axis the targets.
EXPLANATION_ARRAYS = ("explain_hop1", "explain_hop2", "explain_classes", "explain_influence")


def random_seed() -> int:
    """A seed for a request that sent none (63 bits: a non-negative int64 on the wire)."""
    return secrets.randbits(63)


# -- the errors the callers act on ----------------------------------------------------------------


class ModelRunnerUnavailable(KindOfError):
    """The model runner behind the FeatureRunner failed or was late: the FeatureRunner is
    healthy, the answer is the model runner's to give (the gateway counts it against the model
    runner's breaker, and the client gets it as it is)."""

    status_code = 503
    headers_of_kind: ClassVar[dict[str, str]] = {"Retry-After": "1"}


class NotAppliedYet(KindOfError):
    """A prediction's ``min_sequence`` is not applied by the worker that took it within the
    wait: retry shortly (no failure of the FeatureRunner)."""

    status_code = 503
    headers_of_kind: ClassVar[dict[str, str]] = {"Retry-After": "1"}


class ExplainTooLarge(KindOfError):
    """More node ids than one explained request may carry (``GSAGE_EXPLAIN_MAX_NODES``)."""

    status_code = 413


def check_explain_size(nodes: int, limit: int) -> None:
    """Raise ``ExplainTooLarge`` naming the limit when ``nodes`` is over it."""
    if nodes > limit:
        raise ExplainTooLarge(
            f"explain: {nodes} node ids in one request; at most {limit} per explained request "
            f"(GSAGE_EXPLAIN_MAX_NODES): each costs one more tree per hop-1 neighbour",
            param="node_ids",
        )


# -- predict -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class PredictBatch:
    """Node ids to predict (one client request, or the gateway's merge of several), each with
    its seed. ``min_sequence``: answer once this graph update is applied (0: now). ``explain``:
    also the neighbourhood and each hop-1 neighbour's influence. ``layout``: the model input
    layout asked for (the shadow canary asks for its primary's); None: the FeatureRunner's choice."""

    node_ids: np.ndarray
    seeds: np.ndarray
    model: str
    fanout: tuple[int, ...] | None = None
    embedding: bool = False
    dtype: TransportDtype = "float32"
    min_sequence: int = 0
    explain: bool = False
    layout: str | None = None

    @classmethod
    def of(cls, node_ids: Sequence[int], seeds: Sequence[int] | int, model: str, **options: Any) -> PredictBatch:
        ids = np.asarray(node_ids, dtype=np.int64)
        per_node = np.full(ids.shape, seeds, np.int64) if isinstance(seeds, int) else np.asarray(seeds, np.int64)
        fanout = options.pop("fanout", None)
        return cls(ids, per_node, model, tuple(fanout) if fanout else None, **options)

    @property
    def seed(self) -> int | None:
        """The one seed of every node, if they share one (one client request)."""
        if self.seeds.size and (self.seeds == self.seeds[0]).all():
            return int(self.seeds[0])
        return None


def encode_predict(batch: PredictBatch) -> bytes:
    arrays = {"node_ids": batch.node_ids}
    options: dict[str, Any] = {
        "model": batch.model,
        "embedding": batch.embedding,
        "dtype": batch.dtype,
        "fanout": list(batch.fanout) if batch.fanout else None,
        "seed": batch.seed,
    }
    if options["seed"] is None:
        arrays["seeds"] = batch.seeds
    if batch.min_sequence:
        options["min_sequence"] = int(batch.min_sequence)
    if batch.explain:
        options["explain"] = True
    if batch.layout is not None:
        options["layout"] = batch.layout
    return wire.pack(arrays, prefix=wire.envelope_head(options))


def _bad(reason: str) -> ApiError:
    return ApiError(400, f"bad predict request: {reason}")


def decode_predict(body: bytes) -> PredictBatch:
    """The container and the types; the values are checked where the graph is known
    (``NeighbourhoodBuilder.validate``)."""
    try:
        options, payload = wire.open_envelope(body)
        _, arrays = wire.unpack(payload)
    except wire.WireError as exc:
        raise _bad(str(exc)) from exc
    ids, seeds = arrays.pop("node_ids", None), arrays.pop("seeds", None)
    if ids is None or arrays or ids.ndim != 1 or ids.dtype != np.int64:
        raise _bad("expected an int64 node_ids array (and an int64 seeds array) and nothing else")
    if seeds is not None and (seeds.dtype != np.int64 or seeds.shape != ids.shape):
        raise _bad("seeds must be int64, one per node id")
    seed = options.get("seed")
    if (seeds is None) == (seed is None) or (
        seed is not None and (not isinstance(seed, int) or isinstance(seed, bool))
    ):
        raise _bad("one integer seed in the options, or a seeds array, not both")
    model, embedding, dtype = options.get("model"), options.get("embedding"), options.get("dtype", "float32")
    if not isinstance(model, str) or not isinstance(embedding, bool) or dtype not in TRANSPORT_DTYPES:
        raise _bad(f"options: model must be a string, embedding a bool, dtype one of {list(TRANSPORT_DTYPES)}")
    min_sequence = options.get("min_sequence", 0)
    if not isinstance(min_sequence, int) or isinstance(min_sequence, bool) or min_sequence < 0:
        raise _bad("options: min_sequence must be an integer >= 0")
    explain, layout, fanout = options.get("explain", False), options.get("layout"), options.get("fanout")
    if not isinstance(explain, bool) or (layout is not None and not isinstance(layout, str)):
        raise _bad("options: explain must be a bool, layout a string or absent")
    if fanout is not None and (not isinstance(fanout, list) or not all(isinstance(k, int) for k in fanout)):
        raise _bad("options: fanout must be a list of integers or absent")
    return PredictBatch(
        ids,
        np.full(ids.shape, seed, np.int64) if seeds is None else seeds,
        model,
        tuple(fanout) if fanout else None,
        embedding,
        dtype,
        min_sequence,
        explain,
        layout,
    )


PREDICT_BODY = Binary(encode_predict, decode_predict, "wire.envelope(options, wire.pack({node_ids[, seeds]}))")


# -- features ------------------------------------------------------------------------------------


class FeaturesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_ids: list[NodeId] = Field(min_length=1)
    fanout: list[Annotated[StrictInt, Field(ge=1, le=1024)]] | None = Field(None, max_length=8)
    seed: Seed | None = Field(None, description="Deterministic sampling.")
    dtype: TransportDtype = "float32"
    seeds: list[Seed] | None = Field(None, description="One per node: requests merged with their own seeds.")
    layout: str | None = Field(None, description="The input layout (`levels-v1`, `premean-v1`); default levels.")


def _decode_tensor(body: bytes) -> FeatureTensor:
    try:
        return decode(body)
    except FeatureTensorError as exc:
        raise ApiError(502, f"bad FeatureTensor from the FeatureRunner: {exc}") from exc


FEATURE_TENSOR = Binary(encode, _decode_tensor, "an encoded FeatureTensor (common.feature_tensor)")


# -- graph updates ---------------------------------------------------------------------------------


class CompactRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    upto: StrictInt | None = Field(
        None, ge=0, le=MAX_NODE_ID, description="Fold the log up to this sequence (default: all of it)."
    )


class GraphOpsBody:
    """``{"ops": [...]}`` read with orjson and no pydantic pass: the ops are validated once, op by
    op against the graph (``LiveGraph.validate``); the container is checked here."""

    media_type = "application/json"

    def encode(self, ops: list[dict[str, Any]]) -> bytes:
        return orjson.dumps({"ops": ops})

    def decode(self, body: bytes) -> list[dict[str, Any]]:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"invalid JSON: {exc}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("ops"), list) or set(doc) != {"ops"}:
            raise ApiError(400, 'expected {"ops": [...]}', param="ops")
        ops: list[dict[str, Any]] = doc["ops"]
        return ops

    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"ops": {"type": "array", "items": {"type": "object"}}},
            "required": ["ops"],
            "additionalProperties": False,
        }


PREDICT = Endpoint(
    "predict",
    "/predict",
    PREDICT_BODY,
    PACKED,
    "Sample, fetch and run the model: the model runner's answer (and the explanation).",
)
FEATURES = Endpoint(
    "features", "/features", JsonModel(FeaturesRequest), FEATURE_TENSOR, "Sample and fetch: the FeatureTensor itself."
)
INFO = Endpoint(
    "info",
    "/info",
    NO_BODY,
    JsonDocument("snapshot, fanout limits and cache counters"),
    "The snapshot served, the fanout limits and cache counters per level.",
)
GRAPH_UPDATE = Endpoint(
    "graph_update",
    "/graph_update",
    GraphOpsBody(),
    JsonModel(GraphUpdateAck),
    "Validate a batch of graph updates whole, append it durably to the update log, apply it.",
    idempotent=False,
)
GRAPH_STATUS = Endpoint(
    "graph_status",
    "/graph_status",
    NO_BODY,
    JsonDocument("the log's head and every worker's applied sequence, lag and overlay"),
    "The update log's head and every worker's applied sequence, lag and overlay.",
)
GRAPH_COMPACT = Endpoint(
    "graph_compact",
    "/graph_compact",
    JsonModel(CompactRequest),
    JsonDocument("the new snapshot"),
    "Fold the update log into a new graph snapshot that every worker then switches to.",
    idempotent=False,
)
ENDPOINTS: tuple[Endpoint[Any, Any], ...] = (PREDICT, FEATURES, INFO, GRAPH_UPDATE, GRAPH_STATUS, GRAPH_COMPACT)
# What the endpoints answer besides a result (the OpenAPI document's error responses).
ERRORS = {
    400: "a malformed body, or a batch of ops that is not one",
    401: "no accepted service token",
    404: "a node id that is not a node, or an unknown version",
    406: "an Accept that excludes the answer",
    409: "the update log is behind the snapshot",
    413: "too many ops, or too many ids to explain",
    415: "a body of another media type",
    422: "a batch of ops that does not apply to the graph, too many node ids, a min_sequence never issued",
    503: "the model runner or the update log unavailable, an update not applied yet, starting, overloaded",
}


class FeatureRunnerApi:
    """The FeatureRunner as its callers see it, wherever it runs (``common.remote``)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    async def predict(self, batch: PredictBatch) -> wire.Packed:
        return await self.transport.call(PREDICT, batch)

    async def features(self, request: FeaturesRequest) -> FeatureTensor:
        return await self.transport.call(FEATURES, request)

    async def info(self) -> dict[str, Any]:
        return await self.transport.call(INFO, None)

    async def graph_update(self, ops: list[dict[str, Any]]) -> GraphUpdateAck:
        return await self.transport.call(GRAPH_UPDATE, ops)

    async def graph_status(self) -> dict[str, Any]:
        return await self.transport.call(GRAPH_STATUS, None)

    async def graph_compact(self, request: CompactRequest) -> dict[str, Any]:
        return await self.transport.call(GRAPH_COMPACT, request)

    async def start(self) -> None:
        await self.transport.start()

    async def close(self) -> None:
        await self.transport.close()
