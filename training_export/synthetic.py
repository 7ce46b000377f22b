"""A synthetic social graph, deterministic by seed.

- Power-law degrees with hubs: each node has a Pareto-distributed propensity; edge endpoints are
  drawn proportionally to it (Chung-Lu style), so a few nodes collect thousands of neighbours.
- Communities with homophily: a fraction ``homophily`` of edges stays inside the source's
  community.
- Features: a community centroid plus strong per-node noise, so a node's own features predict its
  label only weakly while the mean over its (mostly same-community) neighbours predicts it well:
  the labels need the graph.
- Labels: the community (multiclass) or a community-dependent set of tags (multilabel).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tqdm.auto import tqdm

from runners.feature.snapshot import GraphSnapshot


@dataclasses.dataclass(frozen=True)
class SyntheticGraphSpec:
    num_nodes: int = 100_000
    num_edges: int = 1_000_000  # directed CSR entries (each undirected pair counts twice)
    feature_dim: int = 128
    num_classes: int = 10
    homophily: float = 0.8
    power_law_exponent: float = 2.2
    feature_signal: float = 0.12  # centroid scale against unit noise per dimension
    task: str = "multiclass"
    num_labels: int = 16  # multilabel only
    train_fraction: float = 0.6
    val_fraction: float = 0.2
    seed: int = 0


def generate(spec: SyntheticGraphSpec = SyntheticGraphSpec(), progress: bool = True) -> GraphSnapshot:
    if spec.num_nodes < 2 or spec.num_edges < 2:
        raise ValueError("a graph needs at least 2 nodes and 2 edges")
    rng = np.random.default_rng(spec.seed)
    steps = tqdm(total=4, desc="synthetic graph", disable=not progress, unit="step")

    community = rng.choice(spec.num_classes, size=spec.num_nodes, p=rng.dirichlet(np.full(spec.num_classes, 5.0)))
    propensity = _pareto(rng, spec.num_nodes, spec.power_law_exponent)
    steps.update(1)

    src, dst = _edges(rng, community, propensity, spec)
    indptr, indices = _to_csr(src, dst, spec.num_nodes)
    steps.update(1)

    features = _features(rng, community, spec)
    steps.update(1)

    labels = community.astype(np.int64) if spec.task == "multiclass" else _tags(rng, community, spec)
    train, val, test = _splits(rng, spec)
    steps.update(1)
    steps.close()

    return GraphSnapshot(
        indptr=indptr,
        indices=indices,
        features=features,
        labels=labels,
        train=train,
        val=val,
        test=test,
        task=spec.task,
        source=f"synthetic(seed={spec.seed})",
        directed=False,  # a social graph: an update's edge goes in both lists
        extra={"generator": dataclasses.asdict(spec)},
    )


def _pareto(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    # P(w > x) = x^-(exponent-1): a power-law degree distribution with exponent ``exponent``.
    return (1.0 - rng.random(n)) ** (-1.0 / (exponent - 1.0))


def _edges(
    rng: np.random.Generator, community: np.ndarray, propensity: np.ndarray, spec: SyntheticGraphSpec
) -> tuple[np.ndarray, np.ndarray]:
    """Distinct directed edges, symmetric before trimming to exactly ``num_edges``."""
    n = spec.num_nodes
    order = np.argsort(community, kind="stable")
    cum = np.cumsum(propensity[order])
    total = cum[-1]
    bounds = np.searchsorted(community[order], np.arange(spec.num_classes + 1))
    low = np.concatenate([[0.0], cum])[bounds[:-1]]
    high = cum[np.maximum(bounds[1:] - 1, 0)]

    keys = np.empty(0, dtype=np.int64)
    while keys.size < spec.num_edges:
        pairs = int((spec.num_edges - keys.size) * 0.55) + 16
        s = order[np.minimum(np.searchsorted(cum, rng.random(pairs) * total, "right"), n - 1)]
        inside = rng.random(pairs) < spec.homophily
        c = community[s]
        u = np.where(inside, low[c] + rng.random(pairs) * (high[c] - low[c]), rng.random(pairs) * total)
        d = order[np.minimum(np.searchsorted(cum, u, "right"), n - 1)]
        keep = s != d
        s, d = s[keep], d[keep]
        new = np.concatenate([s * n + d, d * n + s])
        keys = np.union1d(keys, new)
    if keys.size > spec.num_edges:
        keys = np.sort(rng.choice(keys, size=spec.num_edges, replace=False))
    return keys // n, keys % n


def _to_csr(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst.astype(np.int32)  # keys were sorted, so rows are contiguous


def _features(rng: np.random.Generator, community: np.ndarray, spec: SyntheticGraphSpec) -> np.ndarray:
    centroids = rng.standard_normal((spec.num_classes, spec.feature_dim)).astype(np.float32)
    features = np.empty((spec.num_nodes, spec.feature_dim), dtype=np.float32)
    chunk = 262_144
    for lo in range(0, spec.num_nodes, chunk):
        hi = min(lo + chunk, spec.num_nodes)
        rng.standard_normal((hi - lo, spec.feature_dim), dtype=np.float32, out=features[lo:hi])
        features[lo:hi] += spec.feature_signal * centroids[community[lo:hi]]
    return features


def _tags(rng: np.random.Generator, community: np.ndarray, spec: SyntheticGraphSpec) -> np.ndarray:
    profile = np.full((spec.num_classes, spec.num_labels), 0.03)
    for c in range(spec.num_classes):
        profile[c, rng.choice(spec.num_labels, size=3, replace=False)] = 0.85
    return (rng.random((spec.num_nodes, spec.num_labels)) < profile[community]).astype(np.uint8)


def _splits(rng: np.random.Generator, spec: SyntheticGraphSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    perm = rng.permutation(spec.num_nodes)
    a = int(spec.num_nodes * spec.train_fraction)
    b = a + int(spec.num_nodes * spec.val_fraction)
    return np.sort(perm[:a]), np.sort(perm[a:b]), np.sort(perm[b:])
