"""Property tests of the public request schema: any JSON value is either a valid request or a
clear validation error, never anything else (the HTTP and gRPC front ends turn that into 4xx)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from common.feature_runner_api import CompactRequest
from services.protocol import MAX_NODE_ID, PredictRequest

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "node_ids": st.one_of(st.lists(st.integers(min_value=-5, max_value=2**64), max_size=5), json_values),
        "model": st.one_of(st.just("graphsage"), json_values),
        "version": json_values,
        "fanout": json_values,
        "routing_key": json_values,
        "seed": st.one_of(st.integers(-3, 2**64), json_values),
        "embedding": json_values,
    },
)


@settings(max_examples=200, deadline=None)
@given(fields)
def test_any_body_validates_or_fails_cleanly(body):
    try:
        req = PredictRequest.model_validate(body)
    except ValidationError as exc:
        assert exc.errors(), "a validation error names what is wrong"
        return
    assert req.node_ids and all(isinstance(n, int) and 0 <= n <= MAX_NODE_ID for n in req.node_ids)
    assert req.seed is None or 0 <= req.seed <= MAX_NODE_ID
    assert PredictRequest.model_validate_json(req.model_dump_json()) == req


@pytest.mark.parametrize(
    "body",
    [
        {"node_ids": [1.0]},
        {"node_ids": ["1"]},
        {"node_ids": [True]},
        {"node_ids": [-1]},
        {"node_ids": []},
        {"node_ids": [2**63]},
        {"node_ids": [1], "seed": 1.5},
        {"node_ids": [1], "fanout": [0, 1]},
        {"node_ids": [1], "extra": 1},
        {"node_ids": [1], "embedding": "yes"},
        {"node_ids": [1], "model": "a b"},
    ],
)
def test_rejected_bodies(body):
    with pytest.raises(ValidationError):
        PredictRequest.model_validate(body)


def test_nan_and_infinity_are_rejected_from_json():
    for raw in ('{"node_ids": [NaN]}', '{"node_ids": [1], "seed": Infinity}'):
        with pytest.raises(ValidationError):
            PredictRequest.model_validate_json(raw)
    assert PredictRequest.model_validate_json(json.dumps({"node_ids": [0, 0]})).node_ids == [0, 0]


@pytest.mark.parametrize("upto", [-1, 2**63, 1.0, "1", True])
def test_a_compaction_bound_outside_the_logs_sequences_is_refused(upto):
    # 2**63 and above would reach the runner call's JSON encoder, which has no such integers.
    with pytest.raises(ValidationError):
        CompactRequest.model_validate({"upto": upto})
    assert CompactRequest.model_validate({"upto": MAX_NODE_ID}).upto == MAX_NODE_ID
