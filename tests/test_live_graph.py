"""runners.feature.graph.LiveGraph: updates over the memory-mapped base, validated whole, and the
sampler's answers over base + overlay equal those over a snapshot rebuilt from scratch."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from runners.feature.graph import BatchRejected, LiveGraph
from runners.feature.sampling import sample_tree
from runners.feature.tree_layout import PremeanTree
from tests.graphs import small_graph

F = 128  # small_graph's feature dim


def graph(directed: bool = False, capacity: int = 0) -> LiveGraph:
    snap = copy.copy(small_graph(400, 3000, seed=3))
    snap.directed = directed
    return LiveGraph(snap, capacity)


def feats(x: float) -> list[float]:
    return [float(x)] * F


def random_batches(g: LiveGraph, rng: np.random.Generator, batches: int, size: int) -> list[list[dict]]:
    """Valid batches of every op kind, hubs included, each checked by ``validate`` as it is built."""
    out = []
    next_id = g.base.num_nodes
    hubs = np.argsort(-g.base.degrees())[:5]
    for _ in range(batches):
        ops: list[dict] = []
        while len(ops) < size:
            present = np.flatnonzero(g.present)
            kind = rng.choice(["add_node", "set_features", "add_edge", "add_edge", "remove_edge", "remove_node"])
            if kind == "add_node":
                op = {"op": "add_node", "id": next_id, "features": feats(rng.random()), "label": int(rng.integers(3))}
                next_id += 1
            elif kind == "set_features":
                op = {"op": "set_features", "id": int(rng.choice(present)), "features": feats(rng.random())}
            elif kind == "add_edge":
                src = int(rng.choice(hubs)) if rng.random() < 0.3 else int(rng.choice(present))
                op = {"op": "add_edge", "src": src, "dst": int(rng.choice(present))}
            elif kind == "remove_edge":
                src = int(rng.choice(present))
                nbrs = g.neighbours(src)
                if nbrs.size == 0:
                    continue
                op = {"op": "remove_edge", "src": src, "dst": int(rng.choice(nbrs))}
            else:
                op = {"op": "remove_node", "id": int(rng.choice(present))}
            try:
                g.validate([op])
            except BatchRejected:
                continue
            g.apply([op], g.sequence)  # built against the state after each op: a valid sequence
            ops.append(op)
        out.append(ops)
    return out


@pytest.mark.parametrize("directed", [False, True])
def test_sampling_over_base_and_overlay_equals_sampling_the_compacted_snapshot(directed):
    rng = np.random.default_rng(7)
    scratch = graph(directed)
    batches = random_batches(scratch, rng, batches=30, size=20)
    g = graph(directed)
    for seq, ops in enumerate(batches, 1):
        g.validate(ops)
        g.apply(ops, seq)
    assert g.sequence == 30 and g.stats().edges > 0
    compacted = g.materialize()
    compacted.validate()
    targets = np.flatnonzero(g.present).astype(np.int64)
    for seed in (1, 2, 99):
        live = sample_tree(g.base.indptr, g.base.indices, targets, (25, 10), seed=seed, overlay=g.overlay)
        rebuilt = sample_tree(compacted.indptr, compacted.indices, targets, (25, 10), seed=seed)
        for a, b in zip(live, rebuilt):
            np.testing.assert_array_equal(a, b)
        sampled = np.concatenate([layer.reshape(-1) for layer in live])
        assert g.contains(sampled[sampled >= 0]).all()  # never a removed node
    seeds = np.arange(targets.size, dtype=np.int64)
    live_pm = PremeanTree.sample(g.base.indptr, g.base.indices, targets, (25, 10), seeds, overlay=g.overlay)
    rebuilt_pm = PremeanTree.sample(compacted.indptr, compacted.indices, targets, (25, 10), seeds)
    np.testing.assert_array_equal(live_pm.unique, rebuilt_pm.unique)
    np.testing.assert_array_equal(live_pm.last_index, rebuilt_pm.last_index)
    np.testing.assert_array_equal(g.rows(targets), compacted.features[targets])
    # The compacted snapshot, served with no overlay, answers the same again.
    again = LiveGraph(compacted, g.capacity)
    assert again.sequence == 30
    np.testing.assert_array_equal(again.present[: compacted.num_nodes], g.present[: compacted.num_nodes])


def test_an_added_edge_is_sampled_by_a_node_under_the_fanout_and_both_ends_hold_it():
    g = graph()
    degrees = g.base.degrees()
    low = int(np.flatnonzero((degrees > 0) & (degrees < 5))[0])
    other = int(np.flatnonzero(~np.isin(np.arange(g.base.num_nodes), g.neighbours(low)))[-1])
    ops = [{"op": "add_edge", "src": low, "dst": other}]
    g.validate(ops)
    g.apply(ops, 1)
    hop1 = sample_tree(g.base.indptr, g.base.indices, np.array([low]), (25, 10), seed=5, overlay=g.overlay)[1][0]
    assert other in hop1.tolist()
    assert low in g.neighbours(other).tolist()  # undirected: both lists
    assert list(g.neighbours(low)[:-1]) == list(g.base.indices[g.base.indptr[low] : g.base.indptr[low + 1]])


def test_a_new_node_gets_features_and_edges_and_a_removed_one_leaves_no_trace():
    g = graph(capacity=1000)
    new = 500
    ops = [
        {"op": "add_node", "id": new, "features": feats(0.5), "label": 1},
        {"op": "add_edge", "src": new, "dst": 3},
        {"op": "add_edge", "src": 7, "dst": new},
    ]
    g.validate(ops)
    g.apply(ops, 1)
    assert g.contains(np.array([new, 499]))[()].tolist() == [True, False]
    assert sorted(g.neighbours(new).tolist()) == [3, 7] and new in g.neighbours(3)
    np.testing.assert_array_equal(g.rows(np.array([new]))[0], np.float32(0.5))
    versions = g.feature_versions(np.array([new, 3]))
    assert versions.tolist() == [1, 0]
    g.validate([{"op": "remove_node", "id": 3}])
    g.apply([{"op": "remove_node", "id": 3}], 2)
    assert not g.contains(np.array([3]))[0] and g.neighbours(3).size == 0
    assert 3 not in g.neighbours(new).tolist()
    assert not any(3 in g.neighbours(int(u)).tolist() for u in np.flatnonzero(g.present))
    snap = g.materialize()
    assert snap.num_nodes == new + 1 and not snap.present[3] and snap.labels[new] == 1 and snap.labels[499] == -1


@pytest.mark.parametrize(
    "ops, index, field, reason",
    [
        ([{"op": "add_edge", "src": 1, "dst": 10**9}], 0, "dst", "must be a node id in [0, 800)"),
        ([{"op": "add_edge", "src": 1, "dst": 600}], 0, "dst", "node 600 is not in the graph"),
        ([{"op": "add_node", "id": 2, "features": [0.0] * F}], 0, "id", "exists already"),
        ([{"op": "add_node", "id": 900, "features": [0.0] * F}], 0, "id", "must be a node id in [0, 800)"),
        ([{"op": "set_features", "id": 1, "features": [0.0] * 3}], 0, "features", "must be 128 numbers, got 3"),
        ([{"op": "set_features", "id": 1, "features": [float("nan")] * F}], 0, "features", "finite"),
        ([{"op": "set_features", "id": 1, "features": [float("inf")] * F}], 0, "features", "finite"),
        (
            [{"op": "add_node", "id": 700, "features": [0.0] * F}, {"op": "add_edge", "src": 700, "dst": 700}],
            1,
            "dst",
            "two different nodes",
        ),
        ([{"op": "remove_node", "id": 5}, {"op": "add_edge", "src": 5, "dst": 6}], 1, "src", "not in the graph"),
        (
            [
                {"op": "add_edge", "src": 1, "dst": 2},
                {"op": "remove_edge", "src": 1, "dst": 2},
                {"op": "remove_edge", "src": 1, "dst": 2},
            ],
            2,
            "dst",
            "no edge 1 -> 2",
        ),
        ([{"op": "add_node", "id": 700, "features": [0.0] * F, "label": 99}], 0, "label", "class index"),
        ([{"op": "add_edge", "src": 1}], 0, "dst", "missing"),
        ([{"op": "merge_nodes", "id": 1}], 0, "op", "must be one of"),
        ([{"op": "add_edge", "src": True, "dst": 2}], 0, "src", "node id"),
    ],
)
def test_a_bad_batch_names_the_op_and_field_and_changes_nothing(ops, index, field, reason):
    g = graph()
    before = (g.present.copy(), g.stats())
    with pytest.raises(BatchRejected) as info:
        g.validate(ops)
    assert (info.value.index, info.value.field) == (index, field) and reason in info.value.reason, str(info.value)
    assert str(info.value).startswith(f"op {index} (")
    assert (g.present == before[0]).all() and g.stats() == before[1] and g.sequence == 0


def test_a_batch_sees_its_own_earlier_ops():
    g = graph()
    ops = [
        {"op": "add_node", "id": 600, "features": feats(1)},
        {"op": "add_edge", "src": 600, "dst": 1},
        {"op": "remove_edge", "src": 1, "dst": 600},
        {"op": "add_edge", "src": 600, "dst": 2},
        {"op": "remove_node", "id": 600},
        {"op": "add_node", "id": 600, "features": feats(2)},
        {"op": "add_edge", "src": 600, "dst": 3},
    ]
    g.validate(ops)
    g.apply(ops, 1)
    assert g.neighbours(600).tolist() == [3] and 600 not in g.neighbours(2).tolist()
    np.testing.assert_array_equal(g.rows(np.array([600]))[0], np.float32(2))


def test_a_list_that_outgrows_its_segment_moves_and_its_neighbours_keep_theirs():
    g = graph(capacity=1000)
    low = [v for v in range(50) if g.base.degrees()[v] == 1][:2]  # segments of room 4, side by side
    a, b = low
    g.apply([{"op": "add_edge", "src": b, "dst": 100}], 1)
    before_b = g.neighbours(b).tolist()
    adds = [{"op": "add_edge", "src": a, "dst": 200 + i} for i in range(40)]  # several moves
    g.validate(adds)
    g.apply(adds, 2)
    assert g.neighbours(a).tolist()[-40:] == [200 + i for i in range(40)]
    assert g.neighbours(b).tolist() == before_b
    assert all(a in g.neighbours(200 + i).tolist() for i in range(40))
    snap = g.materialize()
    for v in (a, b, 100, 239):
        assert snap.indices[snap.indptr[v] : snap.indptr[v + 1]].tolist() == g.neighbours(v).tolist()
