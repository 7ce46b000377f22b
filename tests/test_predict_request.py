"""The FeatureRunner.predict body (``common.predict_request``) and the seeds it carries."""

import numpy as np
import pytest

from common import predict_request

from common import wire
from runners.feature.cache.tiered import build_feature_store
from common.settings import Settings
from runners.feature.neighbourhood import InvalidRequest, NeighbourhoodBuilder
from tests.graphs import small_graph


def test_one_seed_travels_once_several_as_an_array():
    options, ids, seeds = predict_request.decode(predict_request.encode([4, 5, 4], [9, 9, 9], None, "m:1", True, "float16"))
    assert options == {"model": "m:1", "embedding": True, "dtype": "float16", "fanout": None, "seed": 9} and seeds is None
    np.testing.assert_array_equal(ids, [4, 5, 4])
    options, ids, seeds = predict_request.decode(predict_request.encode([4, 5], [2**63 - 1, 0], [5, 3], "m", False, "f"))
    assert options["seed"] is None and options["fanout"] == [5, 3]
    np.testing.assert_array_equal(seeds, [2**63 - 1, 0])


@pytest.mark.parametrize("body", [
    b"",
    wire.envelope({"model": "m", "embedding": False}, b"GSW1"),
    wire.envelope({"model": "m", "embedding": False}, wire.pack({"node_ids": np.zeros(2, np.int32)})),
    wire.envelope({"model": "m", "embedding": False}, wire.pack({"node_ids": np.zeros(2, np.int64),
                                                                 "seeds": np.zeros(3, np.int64)})),
    wire.envelope({"model": 7, "embedding": False}, wire.pack({"node_ids": np.zeros(2, np.int64)})),
    wire.envelope({"model": "m", "embedding": False}, wire.pack({"node_ids": np.zeros(2, np.int64), "x": np.zeros(1)})),
])
def test_malformed_bodies_are_refused(body):
    with pytest.raises(predict_request.BadPredictRequest):
        predict_request.decode(body)


def test_seed_arrays_are_validated_like_lists():
    g = small_graph()
    b = NeighbourhoodBuilder(g, build_feature_store(Settings(), g.features, "graph-snapshot:t"), (25, 10))
    ids = np.array([1, 2], np.int64)
    assert b.validate(ids, seeds=np.array([3, 2**63 - 1], np.int64)).seeds.tolist() == [3, 2**63 - 1]
    for bad in (np.array([-1, 2], np.int64), np.array([1], np.int64), np.array([1, 2], np.int32)):
        with pytest.raises(InvalidRequest, match="seeds"):
            b.validate(ids, seeds=bad)
