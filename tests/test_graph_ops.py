"""The graph-update op vocabulary is defined once (``common.graph_ops.OPS``): the proto, the HTTP
model, the edge check, the gRPC mapping and the graph's validator must all agree with it."""

from __future__ import annotations

import pytest

from common.graph_ops import BY_NAME, OP_MODELS, OP_NAMES, OPS, BatchRejected, GraphUpdate, check_shape
from runners.feature.graph import LiveGraph
from services.grpc_server import ops_from_proto, pb
from tests.graphs import small_graph

PROTO_TYPES = {"node": "int64", "features": "float"}  # label: an optional int32 and a repeated int32
F = small_graph().feature_dim
NEIGHBOUR = int(small_graph().indices[small_graph().indptr[1]])  # node 1's first neighbour


def example(spec) -> dict:
    """A valid op of each kind on the small graph (nodes 1 and 2 exist, 5000 does not)."""
    values = {
        "add_node": {"id": 5000, "features": [0.5] * F, "label": 1},
        "set_features": {"id": 1, "features": [1.0] * F},
        "add_edge": {"src": 1, "dst": 2},
        "remove_edge": {"src": 1, "dst": NEIGHBOUR},
        "remove_node": {"id": 2},
    }
    return {"op": spec.name, **values[spec.name]}


def test_the_proto_holds_exactly_the_ops_and_their_fields():
    oneof = pb.GraphOp.DESCRIPTOR.oneofs_by_name["op"]
    assert [f.name for f in oneof.fields] == list(OP_NAMES)
    type_names = {v: k.lower()[5:] for k, v in vars(type(oneof.fields[0])).items() if k.startswith("TYPE_")}
    for field in oneof.fields:
        spec, message = BY_NAME[field.name], field.message_type
        proto = {f.name: (type_names[f.type], f.is_repeated) for f in message.fields}
        for op_field in spec.fields:
            if op_field.kind == "label":
                assert proto.pop("label") == ("int32", False) and proto.pop("labels") == ("int32", True)
            else:
                assert proto.pop(op_field.name) == (PROTO_TYPES[op_field.kind], op_field.kind == "features"), op_field
        assert proto == {}, (spec.name, proto)  # nothing the vocabulary does not have


def test_the_http_model_is_the_vocabulary():
    schema = GraphUpdate.model_json_schema()
    variants = schema["properties"]["ops"]["items"]["discriminator"]["mapping"]
    assert sorted(variants) == sorted(OP_NAMES)
    for model, spec in zip(OP_MODELS, OPS):
        assert set(model.model_fields) == spec.names
        required = {name for name, info in model.model_fields.items() if info.is_required()}
        assert required == {"op", *spec.required}
        assert GraphUpdate.model_validate({"ops": [example(spec)]}).ops[0].op == spec.name


@pytest.mark.parametrize("spec", OPS, ids=OP_NAMES)
def test_the_edge_check_and_the_validator_refuse_the_same_missing_fields(spec):
    graph = LiveGraph(small_graph())
    graph.validate([example(spec)])
    check_shape([example(spec)])
    for name in spec.required:
        broken = {k: v for k, v in example(spec).items() if k != name}
        for check in (check_shape, graph.validate):
            with pytest.raises(BatchRejected) as info:
                check([broken])
            assert info.value.field == name and info.value.param == f"ops.0.{name}"
    with pytest.raises(BatchRejected, match="is not a field of"):
        check_shape([{**example(spec), "surprise": 1}])


@pytest.mark.parametrize("spec", OPS, ids=OP_NAMES)
def test_grpc_carries_each_op_as_http_does(spec):
    op = example(spec)
    body = {k: v for k, v in op.items() if k != "op"}
    message = pb.UpdateGraphRequest(
        ops=[pb.GraphOp(**{spec.name: getattr(pb, type(getattr(pb.GraphOp(), spec.name)).__name__)(**body)})]
    )
    assert ops_from_proto(message) == [op]
    if "label" in body:  # a multilabel node's tags
        tags = pb.UpdateGraphRequest(ops=[pb.GraphOp(add_node=pb.AddNode(id=5000, features=[0.5], labels=[0, 2]))])
        assert ops_from_proto(tags)[0]["label"] == [0, 2]
