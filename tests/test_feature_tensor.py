import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import wire
from common.feature_tensor import (
    PREMEAN,
    FeatureTensor,
    FeatureTensorError,
    decode,
    encode,
    padded_nbytes,
    to_padded,
)
from runners.feature.sampling import sample_tree
from runners.feature.tree_layout import PremeanTree, compact, premean
from tests.graphs import small_graph


def _tensor(dtype=np.float32):
    g = small_graph()
    tree = sample_tree(g.indptr, g.indices, np.arange(0, 300, 3), (25, 10), seed=9)
    unique, index = compact(tree)
    return g, tree, FeatureTensor(features=g.features[unique].astype(dtype), index=index, snapshot="graph-snapshot:x")


def test_compact_reproduces_every_slot():
    g, tree, ft = _tensor()
    unique, _ = compact(tree)
    np.testing.assert_array_equal(np.sort(unique), np.unique(np.concatenate([t[t >= 0] for t in tree])))
    for t, idx in zip(tree, to_padded(ft.index)):
        assert ((t >= 0) == (idx >= 0)).all()
        np.testing.assert_array_equal(unique[idx[idx >= 0]], t[t >= 0])
    assert ft.nbytes() < padded_nbytes(tree, g.feature_dim) / 2


def test_levels_hold_only_children_of_real_nodes():
    _, tree, ft = _tensor()
    assert ft.index[1].shape == (tree[0].size, 25)
    assert ft.index[2].shape == (int((tree[1] >= 0).sum()), 10)
    ft.validate()
    with pytest.raises(FeatureTensorError, match="one row per real node"):
        FeatureTensor(ft.features, [ft.index[0], ft.index[1], ft.index[2][:-1]]).validate()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_round_trip(dtype):
    _, _, ft = _tensor(dtype)
    back = decode(encode(ft))
    assert back.snapshot == ft.snapshot and back.fanout == (25, 10)
    np.testing.assert_array_equal(back.features, ft.features)
    for a, b in zip(back.index, ft.index):
        np.testing.assert_array_equal(a, b)


def _premean_tensor(dtype=np.float32, seeds=9):
    g, tree, ft = _tensor()
    rows, inner, last_rows, last_mean = premean(ft.features, ft.index, seeds)
    return g, tree, ft, FeatureTensor(rows.astype(dtype), inner, ft.snapshot, last_rows, last_mean.astype(dtype), 10)


def test_premean_keeps_the_inner_levels_and_averages_each_distinct_hop1_node_once():
    g, tree, ft, pm = _premean_tensor()
    pm.validate()
    assert pm.layout == PREMEAN and pm.fanout == (25, 10) and len(pm.index) == 2
    # the kept rows are exactly the nodes of levels 0..1, as a prefix of the full rows
    unique, _ = compact(tree)
    assert set(unique[: pm.features.shape[0]]) == set(np.concatenate([tree[0], tree[1][tree[1] >= 0]]))
    np.testing.assert_array_equal(pm.features, ft.features[: pm.features.shape[0]])
    # one entry per distinct hop-1 node (one seed here): each slot points at its node's entry
    hop1 = tree[1].reshape(-1)
    real = hop1[hop1 >= 0]
    assert pm.last_rows.size == np.unique(real).size < real.size  # repeats exist and were merged
    slot_entries = pm.index[1].reshape(-1)
    np.testing.assert_array_equal(unique[pm.last_rows[slot_entries[slot_entries >= 0]]], real)
    # an entry's mean is its node's hop-2 sample mean, 0 for none; repeated slots sampled alike
    hop2 = tree[2].reshape(hop1.size, -1)[hop1 >= 0]
    want = {}
    for node, r in zip(real, hop2):
        assert want.setdefault(node, tuple(r)) == tuple(r)  # what makes merging them exact
    for e, row in enumerate(pm.last_rows):
        r = np.array(want[unique[row]])
        np.testing.assert_allclose(
            pm.last_mean[e], g.features[r[r >= 0]].mean(0) if (r >= 0).any() else 0, rtol=1e-6, atol=1e-6
        )
    assert pm.nbytes() < 0.7 * ft.nbytes()  # on the small test graph; ~3x fewer rows on the demo graph
    # a node without neighbours (a directed graph's sink) averages to 0, as the dense model's mean
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    i32 = lambda a: np.array(a, dtype=np.int32)  # noqa: E731
    kept, inner, last_rows, means = premean(rows, [i32([0]), i32([[1, 0]]), i32([[2, 3], [-1, -1]])], 0)
    np.testing.assert_array_equal(means, [[7.5, 8.5, 9.5], [0, 0, 0]])
    assert kept.shape[0] == 2 and len(inner) == 2 and last_rows.tolist() == [1, 0]


def test_premean_keeps_pairs_with_different_seeds_apart():
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    i32 = lambda a: np.array(a, dtype=np.int32)  # noqa: E731
    index = [i32([0, 0]), i32([[1], [1]]), i32([[2], [3]])]  # node 1 under both targets, sampled apart
    _, inner, last_rows, means = premean(rows, index, np.array([5, 6]))
    assert last_rows.tolist() == [1, 1] and inner[1].tolist() == [[0], [1]]
    np.testing.assert_array_equal(means, [[6, 7, 8], [9, 10, 11]])
    _, inner, last_rows, _ = premean(rows, [index[0], index[1], i32([[2], [2]])], np.array([5, 5]))
    assert last_rows.tolist() == [1] and inner[1].tolist() == [[0], [0]]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_premean_round_trip_and_rejections(dtype):
    *_, pm = _premean_tensor(dtype)
    back = decode(encode(pm))
    assert back.layout == PREMEAN and back.fanout == pm.fanout and back.last_fanout == 10
    np.testing.assert_array_equal(back.last_mean, pm.last_mean)
    np.testing.assert_array_equal(back.last_rows, pm.last_rows)
    np.testing.assert_array_equal(back.features, pm.features)
    with pytest.raises(FeatureTensorError, match="one row per entry"):
        FeatureTensor(
            pm.features, pm.index, last_rows=pm.last_rows, last_mean=pm.last_mean[:-1], last_fanout=10
        ).validate()
    with pytest.raises(FeatureTensorError, match="outside last_rows"):
        FeatureTensor(
            pm.features, pm.index, last_rows=pm.last_rows[:-1], last_mean=pm.last_mean[:-1], last_fanout=10
        ).validate()
    with pytest.raises(FeatureTensorError, match="last_rows points outside"):
        FeatureTensor(
            pm.features[:2],
            [np.zeros(1, np.int32), pm.index[1][:1]],
            last_rows=pm.last_rows,
            last_mean=pm.last_mean,
            last_fanout=10,
        ).validate()
    with pytest.raises(FeatureTensorError, match="last hop's fanout"):
        FeatureTensor(pm.features, pm.index, last_rows=pm.last_rows, last_mean=pm.last_mean).validate()
    with pytest.raises(FeatureTensorError, match="at least one last-hop entry"):  # ONNX's gathers need one
        FeatureTensor(
            pm.features,
            [pm.index[0], np.full_like(pm.index[1], -1)],
            last_rows=pm.last_rows[:0],
            last_mean=pm.last_mean[:0],
            last_fanout=10,
        ).validate()
    arrays = {"features": pm.features, "idx0": pm.index[0], "idx1": pm.index[1]}
    with pytest.raises(FeatureTensorError, match="carries last_rows and last_mean"):  # premean declared, nothing sent
        decode(wire.pack({**arrays, "last_mean": pm.last_mean}, {"layout": PREMEAN, "last_fanout": 10}))
    other = np.float32 if dtype == np.float16 else np.float16
    with pytest.raises(FeatureTensorError, match="dtype of features"):
        decode(
            wire.pack(
                {**arrays, "last_rows": pm.last_rows, "last_mean": pm.last_mean.astype(other)},
                {"layout": PREMEAN, "last_fanout": 10},
            )
        )


def test_rejects_inconsistent_tensors():
    _, _, ft = _tensor()
    bad = FeatureTensor(features=ft.features[:3], index=ft.index)
    with pytest.raises(FeatureTensorError, match="outside features"):
        decode(encode(bad))
    with pytest.raises(FeatureTensorError, match="magic"):
        decode(b"nope" + encode(ft)[4:])
    with pytest.raises(FeatureTensorError, match="trailing"):
        decode(encode(ft) + b"\0")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_decoder_never_fails_otherwise_on_random_bytes(blob):
    try:
        decode(b"GSW1" + blob)
    except FeatureTensorError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_decoder_survives_mutations(data):
    _, _, ft = _tensor()
    blob = bytearray(encode(ft))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, min(len(blob) - 1, 400)))
        blob[pos] = data.draw(st.integers(0, 255))
    try:
        decode(bytes(blob))
    except FeatureTensorError:
        pass


def test_envelope_round_trip_and_rejections():
    _, _, ft = _tensor(np.float16)
    blob = encode(ft)
    options, payload = wire.open_envelope(wire.envelope({"model": "graphsage:v1", "embedding": True}, blob))
    assert options == {"model": "graphsage:v1", "embedding": True}
    np.testing.assert_array_equal(decode(payload).features, ft.features)
    for bad, match in [
        (b"", "magic"),
        (blob, "magic"),
        (b"GSE1" + b"\xff\xff\xff\x7f", "out of range"),
        (b"GSE1\x03\0\0\0{x}", "bad header"),
        (b"GSE1\x02\0\0\0[]", "JSON object"),
    ]:
        with pytest.raises(wire.WireError, match=match):
            wire.open_envelope(bad)


@pytest.mark.parametrize("fanout", [(25, 10), (4, 3), (4, 3, 2)])
@pytest.mark.parametrize("per_target_seeds", [False, True])
def test_premean_tree_is_the_layout_of_the_fully_sampled_tree_byte_for_byte(fanout, per_target_seeds):
    """The FeatureRunner samples the last hop once per distinct entry; the tensor must be exactly
    ``premean`` of the full tree (same ids in the same order, same index, same means)."""
    g = small_graph()
    rng = np.random.default_rng(5)
    isolated = np.flatnonzero(np.diff(g.indptr) == 0)[:5]  # no neighbour: no last hop at all
    connected = np.flatnonzero(np.diff(g.indptr) > 0)[:1]
    cases = [
        rng.choice(g.num_nodes // 20, size=int(rng.integers(1, 200))) for _ in range(8)
    ]  # repeats: shared hop-1 nodes
    for targets in cases + [isolated, np.concatenate([isolated, connected])]:
        seeds = (
            rng.integers(0, 3, targets.size) * 7919
            if per_target_seeds  # merged requests: a few seeds
            else np.full(targets.size, int(rng.integers(2**62)), np.int64)
        ).astype(np.int64)
        unique, index = compact(sample_tree(g.indptr, g.indices, targets, fanout, seed=seeds))
        want = premean(g.features[unique], index, seeds)
        tree = PremeanTree.sample(g.indptr, g.indices, targets, fanout, seeds)
        np.testing.assert_array_equal(tree.unique, unique)
        got = tree.tensor_parts(g.features[tree.unique])
        np.testing.assert_array_equal(got[0], want[0])
        assert len(got[1]) == len(want[1]) == len(fanout)
        for a, b in zip(got[1], want[1]):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(got[2], want[2])
        np.testing.assert_array_equal(got[3], want[3])
        assert got[2].dtype == np.int32 and tree.last_rows.size <= int((index[-2] >= 0).sum())


def test_a_packed_message_reads_the_same_made_here_and_off_the_wire():
    """``Packed.of`` (in-process callers) keeps the arrays and packs only for the wire; what a
    reader sees is the same either way, and the bytes are those of ``wire.pack``."""
    arrays = {"probs": np.arange(12, dtype=np.float32).reshape(3, 4), "ids": np.array([7, 8, 9], np.int64)}
    meta = {"model": "graphsage:v1", "precision": "fp32", "layout": "tree"}
    local = wire.Packed.of(arrays, meta)
    assert local.arrays["probs"] is arrays["probs"]  # not packed for an in-process reader
    remote = wire.Packed(local.data)
    assert local.data == wire.pack(arrays, meta)
    assert remote.meta == local.meta == meta
    for name in arrays:
        a, b = remote.arrays[name], local.arrays[name]
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
