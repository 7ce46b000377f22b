"""The graph-update op vocabulary, defined once.

An update batch is a list of ops, each a JSON object (the update log carries them as they are):

    {"op": "add_node", "id": 100123, "features": [...], "label": 3}     label optional
    {"op": "set_features", "id": 17, "features": [...]}
    {"op": "add_edge", "src": 17, "dst": 100123}
    {"op": "remove_edge", "src": 17, "dst": 5}
    {"op": "remove_node", "id": 5}                                       its edges go too

``OPS`` holds each op's fields and their kinds. From it come the public HTTP models
(``GraphUpdate``, in the OpenAPI document), the cheap check at the gateway (``check_shape``:
known ops, every required field, no other), the gRPC mapping (``services.grpc_server``; a test
holds the proto's messages to ``OPS``) and the rules the FeatureRunner validates a batch by
against the graph, once, where the graph is known (``runners.feature.graph.LiveGraph.validate``).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, create_model

from common.errors import ApiError

MAX_NODE_ID = 2**63 - 1
NodeId = Annotated[StrictInt, Field(ge=0, le=MAX_NODE_ID)]
Features = Annotated[list[Annotated[float, Field(allow_inf_nan=False)]], Field(min_length=1, max_length=65536)]
Label = StrictInt | list[StrictInt] | None

FieldKind = Literal["node", "features", "label"]
_ANNOTATIONS: dict[str, Any] = {"node": NodeId, "features": Features, "label": Label}


@dataclasses.dataclass(frozen=True)
class OpField:
    name: str
    kind: FieldKind
    required: bool = True
    description: str = ""


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    fields: tuple[OpField, ...]
    description: str

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.required)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(["op", *(f.name for f in self.fields)])


OPS: tuple[OpSpec, ...] = (
    OpSpec(
        "add_node",
        (
            OpField(
                "id", "node", description="The new node's id (the caller's id space, below the configured capacity)."
            ),
            OpField("features", "features", description="Its feature vector (the snapshot's width)."),
            OpField("label", "label", required=False, description="Its class (or tags), for training."),
        ),
        "Add a node with its features.",
    ),
    OpSpec("set_features", (OpField("id", "node"), OpField("features", "features")), "Replace a node's features."),
    OpSpec(
        "add_edge",
        (
            OpField("src", "node"),
            OpField("dst", "node", description="An undirected graph gets the edge in both directions."),
        ),
        "Add an edge.",
    ),
    OpSpec("remove_edge", (OpField("src", "node"), OpField("dst", "node")), "Remove every copy of an edge."),
    OpSpec(
        "remove_node",
        (OpField("id", "node", description="The node and all its edges go; predicting it answers 404."),),
        "Remove a node and its edges.",
    ),
)
BY_NAME: dict[str, OpSpec] = {spec.name: spec for spec in OPS}
OP_NAMES: tuple[str, ...] = tuple(BY_NAME)
NODE_FIELDS: tuple[str, ...] = tuple(sorted({f.name for s in OPS for f in s.fields if f.kind == "node"}))


class BatchRejected(ApiError):
    """A batch of updates that cannot be applied (HTTP 422): the op at ``index``, its ``field``,
    why; ``param`` is ``ops.<index>.<field>``."""

    def __init__(self, index: int, op: str, field: str, reason: str, status: int = 422) -> None:
        super().__init__(
            status, f"op {index} ({op}): {field}: {reason}", type="batch_rejected", param=f"ops.{index}.{field}"
        )
        self.index, self.op, self.field, self.reason = index, op, field, reason


def check_shape(ops: Any) -> list[dict[str, Any]]:
    """The cheap check at the edge: a non-empty list of objects, each a known op with every
    field it requires and no other. Values are the graph's to judge (``LiveGraph.validate``)."""
    if not isinstance(ops, list) or not ops:
        raise ApiError(400, "ops: a batch needs a non-empty list of ops", param="ops")
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or op.get("op") not in BY_NAME:
            kind = op.get("op") if isinstance(op, dict) else type(op).__name__
            raise BatchRejected(i, str(kind), "op", f"must be one of {list(OP_NAMES)}", status=400)
        spec = BY_NAME[op["op"]]
        for name in spec.required:
            if name not in op:
                raise BatchRejected(i, spec.name, name, "missing", status=400)
        extra = sorted(set(op) - spec.names)
        if extra:
            raise BatchRejected(i, spec.name, extra[0], f"is not a field of {spec.name}", status=400)
    return ops


def _op_model(spec: OpSpec) -> type[BaseModel]:
    fields: dict[str, Any] = {"op": (Literal[spec.name], Field(description=spec.description))}
    for f in spec.fields:
        default = ... if f.required else None
        fields[f.name] = (_ANNOTATIONS[f.kind], Field(default, description=f.description or None))
    name = "".join(part.capitalize() for part in spec.name.split("_"))
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)


OP_MODELS: tuple[type[BaseModel], ...] = tuple(_op_model(spec) for spec in OPS)
GraphOp = Annotated[Union[OP_MODELS], Field(discriminator="op")]  # type: ignore[valid-type]  # noqa: UP007


class GraphUpdate(BaseModel):
    """``POST /graph/updates``: validated whole, applied atomically, in order."""

    model_config = ConfigDict(extra="forbid")

    ops: list[GraphOp] = Field(min_length=1, description="Validated whole, applied atomically, in order.")


class GraphUpdateAck(BaseModel):
    accepted: int = Field(description="Ops in the batch, all applied.")
    sequence: int = Field(description="The batch's place in the update log: pass it as `min_sequence` to read it.")
