"""Request and response types of the public API, shared by the HTTP and gRPC front ends (the
graph-update types are the op vocabulary's, ``common.graph_ops``; the error body is
``common.errors.ErrorBody``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from common.graph_ops import MAX_NODE_ID, NodeId

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
Version = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$")]


def _nullable_as_type_list(schema: dict[str, Any]) -> None:
    """Spell each optional property ``{"type": [T, "null"], ...}`` instead of pydantic's
    ``{"anyOf": [{"type": T, ...}, {"type": "null"}]}`` (the same JSON Schema 2020-12 meaning).

    BentoML 1.4 flattens ``anyOf`` to its first member wherever it inlines a schema
    (``_bentoml_sdk.method._flatten_field``: ``/schema.json`` and the OpenAPI request and response
    bodies), so the ``null`` was lost there: BentoML's own client then decoded a ``null`` ``labels``
    or ``embedding`` as an array (``_bentoml_impl.serde.GenericSerde._decode`` iterates every
    ``type: array``) and raised, and the document put ``default: null`` on a plain string. With the
    type list nothing is left to flatten, and that decoder passes the value through unchanged.
    A type list is OpenAPI 3.1, the version ``common.bento.openapi`` declares for ``/docs.json``.
    """
    for name, prop in schema.get("properties", {}).items():
        variants = prop.get("anyOf")
        if not variants or len(variants) != 2 or {"type": "null"} not in variants:
            continue
        inner = next(v for v in variants if v != {"type": "null"})
        # A $ref, an enum or a union has no single type to extend: left as pydantic wrote it.
        if not isinstance(inner.get("type"), str) or "enum" in inner or "const" in inner:
            continue
        rest = {k: v for k, v in prop.items() if k != "anyOf"}
        schema["properties"][name] = {**inner, "type": [inner["type"], "null"], **rest}


class _Model(BaseModel):
    # Inherited by BentoML's IODescriptor subclasses of these models, which build its schemas.
    model_config = ConfigDict(json_schema_extra=_nullable_as_type_list)


class PredictRequest(_Model):
    model_config = ConfigDict(extra="forbid")

    node_ids: list[NodeId] = Field(min_length=1, description="Target node ids (duplicates allowed).")
    model: Name = Field("graphsage", description="Model name in the routing table.")
    version: Version | None = Field(None, description="Pin a version (`<v>` or `graphsage:<v>`); wins over routing.")
    fanout: list[Annotated[StrictInt, Field(ge=1, le=1024)]] | None = Field(
        None, max_length=8, description="Per-hop fanout, at most the configured maximum."
    )
    routing_key: str | None = Field(None, max_length=256, description="Sticky canary/A-B assignment key.")
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_NODE_ID)] | None = Field(
        None, description="Deterministic neighbour sampling."
    )
    embedding: StrictBool = Field(False, description="Also return each node's final embedding.")
    min_sequence: Annotated[StrictInt, Field(ge=0, le=MAX_NODE_ID)] | None = Field(
        None,
        description="Read your writes: answer once the graph update with this sequence "
        "(from `POST /graph/updates`) is applied (503 with Retry-After if not soon).",
    )
    explain: StrictBool = Field(
        False,
        description="Also return each node's sampled neighbourhood and each hop-1 "
        "neighbour's influence (at most `GSAGE_EXPLAIN_MAX_NODES` node ids).",
    )


class ExplainedNeighbour(_Model):
    node_id: int = Field(description="A hop-1 neighbour the model saw (the list is in sample order, slot by slot).")
    influence: list[float] = Field(
        description="Per class of `classes`: its probability minus its probability with "
        "this neighbour (and its own neighbours) left out; > 0: pushed towards it."
    )
    hop2: list[int] = Field(description="This neighbour's sampled neighbours (hop 2), in sample order.")
    hop2_empty: int = Field(
        description="Its hop-2 slots left empty (its degree is under the hop-2 fanout): the last ones."
    )


class Explanation(_Model):
    classes: list[int] = Field(
        description="The classes the influences are of: the predicted one (multiclass), every label (multilabel)."
    )
    neighbours: list[ExplainedNeighbour] = Field(description="The node's hop-1 neighbours as sampled.")
    empty_slots: int = Field(
        description="Hop-1 slots left empty (the node's degree is under the fanout): the last ones."
    )


class NodePrediction(_Model):
    node_id: int
    label: int | None = Field(
        None, description="Arg-max class (multiclass), or null when degraded without a cached answer."
    )
    labels: list[int] | None = Field(None, description="Classes with probability >= 0.5 (multilabel).")
    score: float | None = Field(None, description="Probability of `label` (multiclass) or the top tag (multilabel).")
    probabilities: list[float] = Field(default_factory=list)
    embedding: list[float] | None = None
    stale: bool = Field(False, description="A cached earlier answer served while a runner is down.")
    explanation: Explanation | None = Field(
        None, description="With `explain`: the neighbourhood the answer came from; absent otherwise and when degraded."
    )


class PredictResponse(_Model):
    model: str = Field(description="The exact graphsage:<version> that answered.")
    precision: str = Field(
        description="The precision the model runner served this answer at: `fp32` or `int8` "
        "(GSAGE_PRECISION, where the version's INT8 graph passed its accuracy guard). "
        "A degraded answer says the precision of the answers it repeats, `mixed` when "
        "they differ, `none` when it repeats none; `unknown`: the model runner did "
        "not say."
    )
    degraded: bool = False
    degraded_reason: str | None = None
    predictions: list[NodePrediction]


class RoutingChange(_Model):
    model_config = ConfigDict(extra="forbid")

    action: Literal["set_weights", "promote", "rollback", "set_shadow", "clear_shadow"]
    model: Name | None = Field(None, description="Model name; default: the routing table's default model.")
    weights: dict[Version, Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = Field(
        None, max_length=16, description="set_weights: {version: weight}, any scale (90/10 = 0.9/0.1)."
    )
    version: Version | None = Field(
        None, description="promote: the version that gets all traffic; set_shadow: the shadow version."
    )
    share: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = Field(
        None, description="set_shadow: the share of answered requests the shadow also scores (default 1)."
    )
    min_agreement: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = Field(
        None,
        description="promote: refuse (409) unless the version, as the shadow, agreed on at least this "
        "share of predictions ...",
    )
    min_compared: Annotated[StrictInt, Field(ge=0)] | None = Field(
        None, description="... over at least this many compared predictions."
    )
