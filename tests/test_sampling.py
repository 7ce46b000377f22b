import numpy as np
import pytest

from runners.feature.sampling import PAD, sample_neighbours, sample_tree
from tests.graphs import small_graph


def _adjacency(g, v):
    return g.indices[g.indptr[v] : g.indptr[v + 1]]


@pytest.fixture(scope="module")
def graph():
    return small_graph()


def test_samples_only_real_neighbours_without_repeats(graph):
    nodes = np.arange(graph.num_nodes)
    out = sample_neighbours(graph.indptr, graph.indices, nodes, 25, seed=3)
    for v in range(0, graph.num_nodes, 7):
        row = out[v]
        real = row[row != PAD]
        assert set(real.tolist()) <= set(_adjacency(graph, v).tolist())
        assert len(set(real.tolist())) == real.size, "a neighbour was sampled twice"
        assert real.size == min(25, _adjacency(graph, v).size)
        assert (row[real.size :] == PAD).all(), "padding must follow the real neighbours"


def test_takes_all_neighbours_when_degree_within_fanout(graph):
    deg = graph.degrees()
    low = np.flatnonzero((deg > 0) & (deg <= 10))[:200]
    out = sample_neighbours(graph.indptr, graph.indices, low, 10, seed=1)
    for v, row in zip(low, out):
        assert sorted(row[row != PAD].tolist()) == sorted(_adjacency(graph, v).tolist())


def test_uniform_over_many_draws_for_a_hub(graph):
    hub = int(np.argmax(graph.degrees()))
    nbrs = _adjacency(graph, hub)
    k, draws = 10, 3000
    counts = {int(n): 0 for n in nbrs}
    for seed in range(draws):
        for n in sample_neighbours(graph.indptr, graph.indices, np.array([hub]), k, seed=seed)[0]:
            counts[int(n)] += 1
    expected = draws * k / nbrs.size
    observed = np.array(list(counts.values()), dtype=float)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    dof = nbrs.size - 1
    # chi-square with `dof` degrees of freedom: mean dof, sd sqrt(2 dof); 6 sd is a loose bound.
    assert chi2 < dof + 6 * np.sqrt(2 * dof), (chi2, dof)


def test_deterministic_by_seed_and_independent_of_batch(graph):
    hubs = np.argsort(-graph.degrees())[:20]
    a = sample_tree(graph.indptr, graph.indices, hubs, (25, 10), seed=42)
    b = sample_tree(graph.indptr, graph.indices, hubs, (25, 10), seed=42)
    c = sample_tree(graph.indptr, graph.indices, hubs, (25, 10), seed=43)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert any((x != y).any() for x, y in zip(a, c)), "another seed should change the sample of hubs"
    # A node's neighbourhood does not depend on which other nodes share the batch.
    alone = sample_tree(graph.indptr, graph.indices, hubs[3:4], (25, 10), seed=42)
    for x, y in zip(alone, a):
        np.testing.assert_array_equal(x[0], y[3])


def test_tree_shapes_and_padding_propagates(graph):
    isolated = np.flatnonzero(graph.degrees() == 0)[:2]
    tree = sample_tree(graph.indptr, graph.indices, np.concatenate([isolated, [0, 1]]), (5, 3), seed=0)
    assert [t.shape for t in tree] == [(4,), (4, 5), (4, 5, 3)]
    assert (tree[1][: isolated.size] == PAD).all() and (tree[2][: isolated.size] == PAD).all()
    assert ((tree[1] == PAD)[..., None] <= (tree[2] == PAD)).all(), "children of padding must be padding"


def test_per_target_seeds_equal_separate_calls(graph):
    hubs = np.argsort(-graph.degrees())[:6]
    seeds = np.array([1, 1, 2, 3, 5, 8])
    merged = sample_tree(graph.indptr, graph.indices, hubs, (25, 10), seed=seeds)
    for i, (v, s) in enumerate(zip(hubs, seeds)):
        alone = sample_tree(graph.indptr, graph.indices, np.array([v]), (25, 10), seed=int(s))
        for x, y in zip(alone, merged):
            np.testing.assert_array_equal(x[0], y[i])


def test_kernel_equals_the_numpy_reference(graph):
    """The compiled kernel must draw exactly what the documented numpy algorithm draws: hubs and
    low-degree nodes, padding, one seed or one per target, several fanouts."""
    from tests import sampling_reference as ref

    rng = np.random.default_rng(7)
    deg = graph.degrees()
    hubs = np.argsort(-deg)[:30]
    mixed = np.concatenate([hubs, rng.integers(0, graph.num_nodes, 200), np.flatnonzero(deg == 0)[:3]])
    for fanout in ((25, 10), (1, 1), (5, 3, 2)):
        for seed in (0, int(rng.integers(2**62)), rng.integers(0, 2**63 - 1, mixed.size)):
            got = sample_tree(graph.indptr, graph.indices, mixed, fanout, seed=seed)
            want = ref.sample_tree(graph.indptr, graph.indices, mixed, fanout, seed=seed)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
    nodes = np.concatenate([hubs, [PAD, PAD], hubs[:3]])
    np.testing.assert_array_equal(
        sample_neighbours(graph.indptr, graph.indices, nodes, 25, seed=9, hop=1),
        ref.sample_neighbours(graph.indptr, graph.indices, nodes, 25, seed=9, hop=1),
    )


def test_a_node_samples_the_same_alone_and_in_a_large_batch(graph):
    hubs = np.flatnonzero(np.diff(graph.indptr) > 25)[:40]
    big = sample_neighbours(graph.indptr, graph.indices, hubs, 25, seed=11)
    for i, v in enumerate(hubs[:5]):
        alone = sample_neighbours(graph.indptr, graph.indices, np.array([v]), 25, seed=11)
        np.testing.assert_array_equal(alone[0], big[i])


def test_the_gateway_never_loads_the_sampling_kernels():
    """The gateway imports the runner classes (``bentoml.depends``); numba/LLVM must stay out."""
    import subprocess
    import sys

    code = "import sys, services.gateway; assert 'numba' not in sys.modules, 'numba imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_read_only_ids_and_seeds_reuse_the_compiled_kernel(graph):
    """Ids and seeds decoded from a request body are read-only views: a numba type of their own,
    whose first call compiled a second kernel mid-traffic (a 300-480 ms stall at c=32)."""
    from runners.feature.kernels import sample_level

    nodes = np.arange(20, dtype=np.int64)
    seeds = np.arange(20, dtype=np.int64) * 7
    want = sample_neighbours(graph.indptr, graph.indices, nodes, 5, seeds)
    compiled = len(sample_level.signatures)
    frozen_nodes, frozen_seeds = np.frombuffer(nodes.tobytes(), np.int64), np.frombuffer(seeds.tobytes(), np.int64)
    assert not frozen_nodes.flags.writeable and not frozen_seeds.flags.writeable
    for n, s in (
        (frozen_nodes, seeds),
        (nodes, frozen_seeds),
        (frozen_nodes, frozen_seeds),
        (nodes, np.broadcast_to(np.int64(3), nodes.shape)),
    ):
        got = sample_neighbours(graph.indptr, graph.indices, n, 5, s)
        if s is seeds or s is frozen_seeds:
            np.testing.assert_array_equal(got, want)
    assert len(sample_level.signatures) == compiled, sample_level.signatures
