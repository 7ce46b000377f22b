"""The FeatureRunner.predict body (``common.feature_runner_api.PredictBatch``) and the seeds it carries."""

import numpy as np
import pytest

from common import wire
from common.errors import ApiError
from common.feature_runner_api import PredictBatch, decode_predict, encode_predict
from common.settings import Settings
from runners.feature.cache.tiered import build_feature_store
from runners.feature.neighbourhood import InvalidRequest, NeighbourhoodBuilder
from tests.graphs import small_graph


def test_one_seed_travels_once_several_as_an_array():
    body = encode_predict(PredictBatch.of([4, 5, 4], 9, "m:1", embedding=True, dtype="float16"))
    options, payload = wire.open_envelope(body)
    assert options == {"model": "m:1", "embedding": True, "dtype": "float16", "fanout": None, "seed": 9}
    assert list(wire.unpack(payload)[1]) == ["node_ids"]
    back = decode_predict(body)
    np.testing.assert_array_equal(back.node_ids, [4, 5, 4])
    np.testing.assert_array_equal(back.seeds, [9, 9, 9])
    assert (back.seed, back.model, back.embedding, back.dtype) == (9, "m:1", True, "float16")
    two = decode_predict(
        encode_predict(
            PredictBatch.of(
                [4, 5], [2**63 - 1, 0], "m", fanout=[5, 3], layout="premean-v1", min_sequence=4, explain=True
            )
        )
    )
    assert (
        two.seed is None
        and two.fanout == (5, 3)
        and (two.layout, two.min_sequence, two.explain) == ("premean-v1", 4, True)
    )
    np.testing.assert_array_equal(two.seeds, [2**63 - 1, 0])


@pytest.mark.parametrize(
    "body",
    [
        b"",
        wire.envelope({"model": "m", "embedding": False, "seed": 1}, b"GSW1"),
        wire.envelope({"model": "m", "embedding": False, "seed": 1}, wire.pack({"node_ids": np.zeros(2, np.int32)})),
        wire.envelope(
            {"model": "m", "embedding": False},
            wire.pack({"node_ids": np.zeros(2, np.int64), "seeds": np.zeros(3, np.int64)}),
        ),
        wire.envelope({"model": 7, "embedding": False, "seed": 1}, wire.pack({"node_ids": np.zeros(2, np.int64)})),
        wire.envelope(
            {"model": "m", "embedding": False, "seed": 1},
            wire.pack({"node_ids": np.zeros(2, np.int64), "x": np.zeros(1)}),
        ),
        wire.envelope({"model": "m", "embedding": False}, wire.pack({"node_ids": np.zeros(2, np.int64)})),  # no seed
        wire.envelope(
            {"model": "m", "embedding": False, "seed": 1, "dtype": "int8"},
            wire.pack({"node_ids": np.zeros(2, np.int64)}),
        ),
    ],
)
def test_malformed_bodies_are_refused(body):
    with pytest.raises(ApiError) as info:
        decode_predict(body)
    assert info.value.status == 400 and info.value.message.startswith("bad predict request: ")


def test_seed_arrays_are_validated_like_lists():
    g = small_graph()
    cfg = Settings()
    b = NeighbourhoodBuilder(
        g, build_feature_store(cfg.feature_cache, cfg.redis, g.features, "graph-snapshot:t"), (25, 10)
    )
    ids = np.array([1, 2], np.int64)
    assert b.validate(ids, seeds=np.array([3, 2**63 - 1], np.int64)).seeds.tolist() == [3, 2**63 - 1]
    for bad in (np.array([-1, 2], np.int64), np.array([1], np.int64), np.array([1, 2], np.int32)):
        with pytest.raises(InvalidRequest, match="seeds"):
            b.validate(ids, seeds=bad)
