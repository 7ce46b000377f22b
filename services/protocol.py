"""Request and response types of the public API, shared by the HTTP and gRPC front ends."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

MAX_NODE_ID = 2**63 - 1
NodeId = Annotated[StrictInt, Field(ge=0, le=MAX_NODE_ID)]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
Version = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$")]


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_ids: list[NodeId] = Field(min_length=1, description="Target node ids (duplicates allowed).")
    model: Name = Field("graphsage", description="Model name in the routing table.")
    version: Version | None = Field(None, description="Pin a version (`<v>` or `graphsage:<v>`); wins over routing.")
    fanout: list[Annotated[StrictInt, Field(ge=1, le=1024)]] | None = Field(
        None, max_length=8, description="Per-hop fanout, at most the configured maximum.")
    routing_key: str | None = Field(None, max_length=256, description="Sticky canary/A-B assignment key.")
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_NODE_ID)] | None = Field(
        None, description="Deterministic neighbour sampling.")
    embedding: StrictBool = Field(False, description="Also return each node's final embedding.")


class NodePrediction(BaseModel):
    node_id: int
    label: int | None = Field(None, description="Arg-max class (multiclass), or null when degraded without a cached answer.")
    labels: list[int] | None = Field(None, description="Classes with probability >= 0.5 (multilabel).")
    score: float | None = Field(None, description="Probability of `label` (multiclass) or the top tag (multilabel).")
    probabilities: list[float] = Field(default_factory=list)
    embedding: list[float] | None = None
    stale: bool = Field(False, description="A cached earlier answer served while a runner is down.")


class PredictResponse(BaseModel):
    model: str = Field(description="The exact graphsage:<version> that answered.")
    degraded: bool = False
    degraded_reason: str | None = None
    predictions: list[NodePrediction]


class ErrorResponse(BaseModel):
    error: str
    status: int


class RoutingChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["set_weights", "promote", "rollback"]
    model: Name | None = Field(None, description="Model name; default: the routing table's default model.")
    weights: dict[Version, Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = Field(
        None, max_length=16, description="set_weights: {version: weight}, any scale (90/10 = 0.9/0.1).")
    version: Version | None = Field(None, description="promote: the version that gets all traffic.")
