"""The GraphSAGERunner's API: its endpoints, their types, and the typed client its callers use
(the FeatureRunner for inference, the gateway for admin calls).

``infer``'s body is ``wire.envelope({"model", "embedding"}, feature_tensor)`` (one raw body,
never JSON floats) and its answer a ``common.wire`` message: ``logits``, ``probs`` (and
``embedding``) with meta: the exact model tag, backend, precision, task and the input layout it
ran on. The admin calls are JSON.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from common import wire
from common.endpoints import NO_BODY, Binary, Endpoint, JsonModel
from common.errors import ApiError, KindOfError
from common.feature_tensor import FeatureTensor, FeatureTensorError, decode, encode
from common.remote import Transport

SERVICE = "GraphSAGERunner"
DEFAULT_MODEL = "graphsage:latest"
Tag = str


class UnknownVersion(KindOfError):
    """The model store has no such ``graphsage`` tag (or none this runner can serve)."""

    status_code = 404


@dataclasses.dataclass
class InferCall:
    """One FeatureTensor for ``model``; ``embedding``: also answer the final embedding."""

    tensor: FeatureTensor
    model: Tag = DEFAULT_MODEL
    embedding: bool = False


def _encode_infer(call: InferCall) -> bytes:
    return encode(call.tensor, prefix=wire.envelope_head({"model": call.model, "embedding": call.embedding}))


def _decode_infer(body: bytes) -> InferCall:
    try:
        options, tensor = wire.open_envelope(body)
        model, embedding = options.get("model", DEFAULT_MODEL), options.get("embedding", False)
        if not isinstance(model, str) or not isinstance(embedding, bool):
            raise FeatureTensorError("envelope options: model must be a string, embedding a bool")
        return InferCall(decode(tensor), model, embedding)
    except (wire.WireError, FeatureTensorError) as exc:
        raise ApiError(400, f"bad FeatureTensor: {exc}") from exc


def _decode_packed(body: bytes) -> wire.Packed:
    return wire.Packed(body)


PACKED = Binary(lambda p: p.data, _decode_packed, "a common.wire message: arrays and their meta")
INFER_BODY = Binary(_encode_infer, _decode_infer, "wire.envelope({model, embedding}, an encoded FeatureTensor)")


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tag: Tag = Field(min_length=1, max_length=200, description="`graphsage:<version>` (or `graphsage:latest`).")


class ModelInfo(BaseModel):
    tag: Tag
    backend: str
    precision: str
    load_check: Any = None
    aggregator: str
    fanout: list[int]
    feature_dim: int
    num_classes: int
    task: str
    graph_snapshot: str | None = None
    input_layouts: list[str]
    loaded_at: float


class Unloaded(BaseModel):
    tag: Tag
    unloaded: bool


class ModelsReport(BaseModel):
    loaded: list[ModelInfo]
    batches: dict[str, Any]
    worker_pid: int


INFER = Endpoint("infer", "/infer", INFER_BODY, PACKED, "Run a model on a FeatureTensor: logits and probabilities.")
LOAD = Endpoint(
    "load",
    "/load",
    JsonModel(LoadRequest),
    JsonModel(ModelInfo),
    "Hot-load a version (idempotent): into this worker now, the others within the sync interval.",
)
UNLOAD = Endpoint(
    "unload",
    "/unload",
    JsonModel(LoadRequest),
    JsonModel(Unloaded),
    "Unload a version from every worker of this service.",
)
MODELS = Endpoint("models", "/models", NO_BODY, JsonModel(ModelsReport), "The versions loaded and batch counters.")
ENDPOINTS: tuple[Endpoint[Any, Any], ...] = (INFER, LOAD, UNLOAD, MODELS)
# What the endpoints answer besides a result (the OpenAPI document's error responses).
ERRORS = {
    400: "a malformed body or FeatureTensor",
    401: "no accepted service token",
    404: "an unknown version",
    406: "an Accept that excludes the answer",
    415: "a body of another media type",
    422: "a FeatureTensor that does not fit the version (dimension, depth, fanout, layout)",
    503: "starting, or too many requests in flight",
}


class ModelRunnerApi:
    """The GraphSAGERunner as its callers see it, wherever it runs (``common.remote``)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    async def infer(self, call: InferCall) -> wire.Packed:
        return await self.transport.call(INFER, call)

    async def load(self, tag: Tag) -> ModelInfo:
        return await self.transport.call(LOAD, LoadRequest(tag=tag))

    async def unload(self, tag: Tag) -> Unloaded:
        return await self.transport.call(UNLOAD, LoadRequest(tag=tag))

    async def models(self) -> ModelsReport:
        return await self.transport.call(MODELS, None)

    async def start(self) -> None:
        await self.transport.start()

    async def close(self) -> None:
        await self.transport.close()
