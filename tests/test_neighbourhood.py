"""NeighbourhoodBuilder: request validation, build output, batch merging, determinism.

Fast unit tests (no server, no Redis): a builder over ``tests.graphs.small_graph()`` with the
default feature store (L1 + origin).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from common.feature_tensor import PREMEAN, FeatureTensor, decode, encode, to_padded
from common.settings import Settings
from runners.feature.neighbourhood import FeatureRequest, InvalidRequest, NeighbourhoodBuilder, TooManyNodes
from runners.feature.sampling import PAD, sample_tree
from runners.feature.tree_layout import premean
from tests.graphs import feature_store, small_graph

MAX_FANOUT = (25, 10)
MAX_NODES = 64


@pytest.fixture(scope="module")
def graph():
    return small_graph()


def make_builder(graph, scan_min_targets: int = 0, **settings) -> NeighbourhoodBuilder:
    store = feature_store(Settings(**settings), graph.features, "graph-snapshot:test")
    return NeighbourhoodBuilder(graph, store, MAX_FANOUT, max_nodes=MAX_NODES, scan_min_targets=scan_min_targets)


@pytest.fixture
def builder(graph):
    return make_builder(graph)


def build(builder, requests: list[FeatureRequest]) -> list[FeatureTensor]:
    return asyncio.run(builder.build(requests))


def build_one(builder, *args, **kwargs) -> FeatureTensor:
    return build(builder, [builder.validate(*args, **kwargs)])[0]


def materialise(ft: FeatureTensor) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per hop: (mask, features of every slot with zeros at padding), as float64."""
    out = []
    for idx in to_padded(ft.index):
        mask = idx >= 0
        rows = ft.features[np.where(mask, idx, 0)].astype(np.float64)
        rows[~mask] = 0.0
        out.append((mask, rows))
    return out


def expected(graph, ids, fanout, seed) -> list[tuple[np.ndarray, np.ndarray]]:
    """The same thing straight from the sampler and the snapshot's feature matrix."""
    tree = sample_tree(graph.indptr, graph.indices, np.asarray(ids, dtype=np.int64), fanout, seed=seed)
    out = []
    for layer in tree:
        mask = layer != PAD
        rows = graph.features[np.where(mask, layer, 0)].astype(np.float64)
        rows[~mask] = 0.0
        out.append((mask, rows))
    return out


def assert_same_tensor(a: FeatureTensor, b: FeatureTensor) -> None:
    assert a.features.dtype == b.features.dtype
    np.testing.assert_array_equal(a.features, b.features)
    assert len(a.index) == len(b.index)
    for x, y in zip(a.index, b.index):
        assert x.dtype == y.dtype == np.int32
        np.testing.assert_array_equal(x, y)
    assert a.snapshot == b.snapshot


def hub(graph, min_degree: int = 100) -> int:
    deg = graph.degrees()
    node = int(np.argmax(deg))
    assert deg[node] >= min_degree
    return node


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "node_ids, match",
    [
        ([3000], r"node ids \[3000\] are not in the graph"),  # within the capacity (6000), not a node
        ([6000], r"unknown node ids \[6000\].*0\.\.5999"),
        ([0, 5, 10**6], r"unknown node ids \[1000000\]"),
        ([-1], r"unknown node ids \[-1\]"),
        ([1, -7, 2], r"unknown node ids \[-7\]"),
        ([1.0], "integers"),
        ([1, 2.5], "integers"),
        (["1"], "integers"),
        ([True], "integers"),
        ([False, 1], "integers"),
        ([None], "integers"),
        ([[1, 2]], "integers"),
        ([2**63], "out of range"),
        ([], "empty"),
        ((), "empty"),
        (np.array([], dtype=np.int64), "empty"),
        (np.array([1.0, 2.0]), "integers"),
        (np.array([True]), "integers"),
        (np.array([6000]), "unknown node ids"),
        ("1,2,3", "list of integers"),
        (7, "list of integers"),
        (None, "list of integers"),
        ({"a": 1}, "list of integers"),
    ],
)
def test_bad_node_ids(builder, node_ids, match):
    with pytest.raises(InvalidRequest, match=match):
        builder.validate(node_ids)


def test_oversized_request(builder):
    builder.validate(list(range(MAX_NODES)))  # exactly at the limit is fine
    with pytest.raises(TooManyNodes, match=f"{MAX_NODES + 1} node ids.*limit is {MAX_NODES}"):
        builder.validate(list(range(MAX_NODES + 1)))
    assert issubclass(TooManyNodes, InvalidRequest)


@pytest.mark.parametrize(
    "fanout, match",
    [
        ([26, 10], "outside 1..\\[25, 10\\]"),
        ([25, 11], "outside"),
        ([1000, 1000], "outside"),
        ([25], "must be 2 integers"),
        ([25, 10, 5], "must be 2 integers"),
        ([], "must be 2 integers"),
        ([0, 10], "outside"),
        ([25, 0], "outside"),
        ([-1, 10], "outside"),
        ([25.0, 10], "integers"),
        ([25, 10.5], "integers"),
        (["25", "10"], "integers"),
        ([True, 10], "integers"),
        ([None, 10], "integers"),
        ("25", "integers"),
        (25, "fanout"),
    ],
)
def test_bad_fanout(builder, fanout, match):
    with pytest.raises(InvalidRequest, match=match):
        builder.validate([1, 2], fanout=fanout)


@pytest.mark.parametrize("dtype", ["float64", "int8", "bfloat16", "", None, "FLOAT32"])
def test_bad_dtype(builder, dtype):
    with pytest.raises(InvalidRequest, match="dtype must be one of"):
        builder.validate([1], dtype=dtype)


@pytest.mark.parametrize("seed", [-1, 2**63, 2**64, True, False, 1.0, 3.5, "7", [1]])
def test_bad_seed(builder, seed):
    with pytest.raises(InvalidRequest, match=r"seed must be an integer in \[0, 2\^63\)"):
        builder.validate([1], seed=seed)


def test_good_requests_are_normalised(builder):
    r = builder.validate([5, 5, 0, 2999], fanout=[3, 1], seed=0, dtype="float16")
    assert r.node_ids.dtype == np.int64 and r.node_ids.tolist() == [5, 5, 0, 2999]
    assert r.fanout == (3, 1) and r.seed == 0 and r.dtype == "float16"
    r = builder.validate(np.array([1, 2], dtype=np.int32), fanout=(np.int64(25), 10), seed=2**63 - 1)
    assert r.node_ids.dtype == np.int64 and r.fanout == (25, 10) and r.seed == 2**63 - 1
    r = builder.validate([1])
    assert r.fanout == MAX_FANOUT and 0 <= r.seed < 2**63 and r.dtype == "float32"


# --- build output ------------------------------------------------------------------------------


@pytest.mark.parametrize("fanout", [(25, 10), (5, 3), (1, 1)])
def test_build_reproduces_sampled_tree_features(graph, builder, fanout):
    deg = graph.degrees()
    ids = [hub(graph), int(np.flatnonzero(deg == 0)[0]), int(np.flatnonzero(deg == 1)[0]), 17, 17, 2999]
    ft = build_one(builder, ids, fanout=list(fanout), seed=1234)
    ft.validate()
    assert ft.num_targets == len(ids)
    assert ft.fanout == fanout
    assert ft.feature_dim == graph.feature_dim
    assert ft.features.dtype == np.float32
    assert [a.dtype for a in ft.index] == [np.int32] * (len(fanout) + 1)
    # One row per distinct real node, no duplicates.
    assert len({row.tobytes() for row in ft.features}) == ft.features.shape[0]
    for (mask, rows), (want_mask, want_rows) in zip(materialise(ft), expected(graph, ids, fanout, 1234)):
        np.testing.assert_array_equal(mask, want_mask)
        np.testing.assert_array_equal(rows, want_rows)
    # A node without neighbours is all padding below it (and has no rows at hop 2).
    padded = to_padded(ft.index)
    assert (padded[1][1] == -1).all() and (padded[2][1] == -1).all()


def test_build_float16_transport(graph, builder):
    ids = [hub(graph), 3, 4]
    f32 = build_one(builder, ids, fanout=[25, 10], seed=9)
    f16 = build_one(builder, ids, fanout=[25, 10], seed=9, dtype="float16")
    assert f16.features.dtype == np.float16
    assert f16.features.nbytes * 2 == f32.features.nbytes
    for a, b in zip(f16.index, f32.index):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(f16.features, f32.features.astype(np.float16))
    for (_, rows16), (_, rows) in zip(materialise(f16), expected(graph, ids, (25, 10), 9)):
        np.testing.assert_allclose(rows16, rows, rtol=1e-3, atol=1e-3)
    # The wire round trip keeps the dtype and the values.
    back = decode(encode(f16))
    assert_same_tensor(back, f16)


def test_build_stats(graph, builder):
    ft = build_one(builder, [1, 2, 3], fanout=[5, 2], seed=4)
    t = builder.last
    assert t.targets == 3
    assert t.distinct_nodes == ft.features.shape[0]
    assert t.fetch.n == t.distinct_nodes
    assert t.fetch.l1_hits + t.fetch.l2_hits + t.fetch.origin_hits == t.fetch.n
    assert t.sample_s >= 0 and t.assemble_s >= 0


# --- batch merging -----------------------------------------------------------------------------


def merge_cases(graph):
    h = hub(graph)
    return [
        ([h, 1, 2], [25, 10], 11, "float32"),
        ([h, 2, 2, 3], [25, 10], 12, "float32"),  # overlaps the first, duplicate id, other seed
        ([h, 1, 2], [25, 10], 11, "float16"),  # the first again, float16
        ([h, 5], [5, 3], 11, "float32"),  # other fanout, same seed as the first
        ([7, 7, 7], [25, 10], 13, "float32"),
        ([h], [1, 1], 0, "float32"),
    ]


def test_merged_batch_equals_each_request_alone(graph):
    cases = merge_cases(graph)
    merged_builder = make_builder(graph)
    requests = [merged_builder.validate(ids, fanout=f, seed=s, dtype=d) for ids, f, s, d in cases]
    merged = build(merged_builder, requests)
    assert len(merged) == len(requests)
    for (ids, f, s, d), got in zip(cases, merged):
        alone = build_one(make_builder(graph), ids, fanout=f, seed=s, dtype=d)
        assert_same_tensor(got, alone)
        for (mask, rows), (want_mask, want_rows) in zip(materialise(got), expected(graph, ids, f, s)):
            np.testing.assert_array_equal(mask, want_mask)
            if d == "float32":
                np.testing.assert_array_equal(rows, want_rows)
    # Merging in another order changes nothing either.
    reordered = build(make_builder(graph), requests[::-1])[::-1]
    for a, b in zip(merged, reordered):
        assert_same_tensor(a, b)


def test_premean_requests_get_the_full_tensor_premeaned_in_merged_batches_too(graph):
    cases = merge_cases(graph)
    b = make_builder(graph)
    requests = [
        b.validate(ids, fanout=f, seed=s, dtype=d, premean=i % 2 == 0) for i, (ids, f, s, d) in enumerate(cases)
    ]
    for i, (req, got) in enumerate(zip(requests, build(b, requests))):
        ids, f, s, d = cases[i]
        full = build_one(make_builder(graph), ids, fanout=f, seed=s)  # float32 rows
        if not req.premean:
            assert got.layout != PREMEAN
            continue
        rows, inner, last_rows, last_mean = premean(full.features, full.index, s)
        assert got.layout == PREMEAN and got.fanout == full.fanout and got.features.dtype == np.dtype(d)
        np.testing.assert_array_equal(got.features, rows.astype(d))
        np.testing.assert_array_equal(got.last_rows, last_rows)
        np.testing.assert_array_equal(got.last_mean, last_mean.astype(d))
        for a, w in zip(got.index, inner):
            np.testing.assert_array_equal(a, w)
        assert decode(encode(got)).layout == PREMEAN


def test_premean_request_of_isolated_targets_gets_the_level_layout(graph):
    """Targets with no neighbour leave a premean tree without entries; the builder sends the same
    tree in the level layout instead of failing (once: ValueError on the empty seeds)."""
    isolated = np.flatnonzero(np.diff(graph.indptr) == 0)[:3].tolist()
    assert len(isolated) == 3, "the test graph needs isolated nodes"
    connected = int(np.flatnonzero(np.diff(graph.indptr) > 0)[0])
    b = make_builder(graph)
    for seeds in (None, [1, 2, 3]):
        got = build_one(b, isolated, seed=5, seeds=seeds, premean=True)
        want = build_one(make_builder(graph), isolated, seed=5, seeds=seeds)
        assert got.layout != PREMEAN
        assert_same_tensor(got, want)
    # One connected target among them: the premean layout, as usual.
    assert build_one(b, isolated + [connected], seed=5, premean=True).layout == PREMEAN


def test_shared_nodes_are_fetched_once(graph):
    cases = merge_cases(graph)
    builder = make_builder(graph)
    requests = [builder.validate(ids, fanout=f, seed=s, dtype=d) for ids, f, s, d in cases]
    # Distinct node ids per request, straight from the sampler.
    per_request = []
    for ids, f, s, _ in cases:
        tree = sample_tree(graph.indptr, graph.indices, np.asarray(ids), f, seed=s)
        per_request.append(set(np.concatenate([t.reshape(-1) for t in tree]).tolist()) - {PAD})
    union = set().union(*per_request)
    assert len(union) < sum(map(len, per_request)), "the cases must overlap"

    fts = build(builder, requests)
    for ft, nodes in zip(fts, per_request):
        assert ft.features.shape[0] == len(nodes)
    t = builder.last
    assert t.targets == sum(len(c[0]) for c in cases)
    assert t.distinct_nodes == len(union)
    # A cold store: every distinct node is one origin read, each exactly once.
    assert (t.fetch.n, t.fetch.l1_hits, t.fetch.l2_hits, t.fetch.origin_hits) == (len(union), 0, 0, len(union))
    stats = builder.store.stats()
    assert stats["origin"]["hits"] == len(union)
    assert stats["l1"]["misses"] == len(union) and stats["l1"]["entries"] == len(union)
    assert "l2" not in stats

    # The same batch again is all L1 hits, still one lookup per distinct node.
    again = build(builder, requests)
    t = builder.last
    assert (t.fetch.n, t.fetch.l1_hits, t.fetch.origin_hits) == (len(union), len(union), 0)
    assert builder.store.stats()["origin"]["hits"] == len(union)
    for a, b in zip(fts, again):
        assert_same_tensor(a, b)


def test_l1_disabled_gives_the_same_tensors(graph):
    cases = merge_cases(graph)
    warm, cold = make_builder(graph), make_builder(graph, l1_bytes=0)
    for b in (warm, cold):
        reqs = [b.validate(ids, fanout=f, seed=s, dtype=d) for ids, f, s, d in cases]
        build(b, reqs)  # warm the L1 of ``warm``
    reqs = [warm.validate(ids, fanout=f, seed=s, dtype=d) for ids, f, s, d in cases]
    for a, b in zip(build(warm, reqs), build(cold, reqs)):
        assert_same_tensor(a, b)
    assert cold.last.fetch.l1_hits == 0 and cold.last.fetch.origin_hits == cold.last.distinct_nodes


def test_batches_from_scan_min_targets_on_are_scans_with_the_same_tensors(graph):
    scanning, plain = make_builder(graph, scan_min_targets=8), make_builder(graph)
    small = [scanning.validate([1, 2, 3], seed=4)]
    big = [scanning.validate(list(range(10, 15)), seed=5), scanning.validate([7, 8, 9], seed=6)]  # 8 targets
    for reqs, is_scan in ((small, False), (big, True)):
        for a, b in zip(build(scanning, reqs), build(plain, reqs)):
            assert_same_tensor(a, b)
        assert scanning.last.fetch.scan is is_scan and not plain.last.fetch.scan
    assert len(scanning.store.l1) < len(plain.store.l1)  # the scan filled no cache


# --- determinism -------------------------------------------------------------------------------


def test_same_seed_same_tensor(graph):
    h = hub(graph)
    ids = [h, 10, 20, 30, h]
    a = build_one(make_builder(graph), ids, fanout=[25, 10], seed=77)
    b = build_one(make_builder(graph), ids, fanout=[25, 10], seed=77)
    assert_same_tensor(a, b)


def test_different_seed_different_sample_for_hubs(graph):
    deg = graph.degrees()
    hubs = np.flatnonzero(deg > 25)[:20].tolist()
    builder = make_builder(graph)
    a = build_one(builder, hubs, fanout=[25, 10], seed=1)
    b = build_one(builder, hubs, fanout=[25, 10], seed=2)

    def hop1_rows(ft: FeatureTensor) -> list[set[bytes]]:
        # Index positions are request-local: compare the feature rows behind them instead.
        return [{ft.features[i].tobytes() for i in row if i >= 0} for row in to_padded(ft.index)[1]]

    ra, rb = hop1_rows(a), hop1_rows(b)
    assert all(len(x) == 25 for x in ra + rb), "a hub's hop-1 sample is full"
    differ = sum(x != y for x, y in zip(ra, rb))
    assert differ >= len(hubs) - 1, "another seed must give another sample for nearly every hub"

    # A node of degree <= fanout takes all its neighbours: hop 1 does not depend on the seed.
    low = int(np.flatnonzero((deg > 0) & (deg <= 25))[0])
    x = build_one(builder, [low], fanout=[25, 10], seed=1)
    y = build_one(builder, [low], fanout=[25, 10], seed=2)
    assert hop1_rows(x) == hop1_rows(y)


def test_seed_in_merged_batch_matches_its_own(graph):
    """Two requests for the same hub with different seeds in one batch keep their own samples."""
    h = hub(graph)
    builder = make_builder(graph)
    r1 = builder.validate([h], seed=100)
    r2 = builder.validate([h], seed=200)
    a, b = build(builder, [r1, r2])
    assert_same_tensor(a, build_one(make_builder(graph), [h], seed=100))
    assert_same_tensor(b, build_one(make_builder(graph), [h], seed=200))
    ma, mb = materialise(a), materialise(b)
    assert not np.array_equal(ma[1][1], mb[1][1])


def test_the_builder_prepares_float16_narrowing_before_the_first_request(graph, monkeypatch):
    """Building ONNX Runtime's Cast session imports onnx and onnxruntime (0.5 s here): a first
    float16 request that paid it left its model call no time on a slow machine (CI's 503)."""
    from runners.feature import narrowing

    monkeypatch.setattr(narrowing, "_session", None)
    make_builder(graph)
    assert narrowing._session is not None
