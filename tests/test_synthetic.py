import numpy as np

from training_export.synthetic import SyntheticGraphSpec, generate


def test_deterministic_by_seed():
    spec = SyntheticGraphSpec(num_nodes=2000, num_edges=20_000, seed=5)
    a, b = generate(spec, progress=False), generate(spec, progress=False)
    c = generate(SyntheticGraphSpec(num_nodes=2000, num_edges=20_000, seed=6), progress=False)
    for name in ("indptr", "indices", "features", "labels", "train"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.indices, c.indices)


def test_statistics_power_law_homophily_and_splits():
    g = generate(SyntheticGraphSpec(num_nodes=20_000, num_edges=200_000, seed=1), progress=False)
    g.validate()
    deg = g.degrees()
    assert g.num_edges == 200_000 and g.features.dtype == np.float32 and g.feature_dim == 128
    assert deg.max() > 20 * deg.mean(), "power-law degrees should produce hubs"
    assert np.median(deg) < deg.mean(), "heavy tail: median below mean"
    src = np.repeat(np.arange(g.num_nodes), deg)
    homophily = (g.labels[src] == g.labels[g.indices]).mean()
    assert homophily > 0.7
    assert not (src == g.indices).any(), "no self loops"
    keys = src * g.num_nodes + g.indices
    assert np.unique(keys).size == keys.size, "no duplicate edges"
    splits = np.concatenate([g.train, g.val, g.test])
    assert np.unique(splits).size == g.num_nodes


def test_multilabel_variant():
    g = generate(SyntheticGraphSpec(num_nodes=1000, num_edges=8000, task="multilabel", num_labels=12), progress=False)
    assert g.task == "multilabel" and g.labels.shape == (1000, 12) and g.labels.dtype == np.uint8
    assert 1.0 < g.labels.sum(1).mean() < 5.0
