"""Uniform neighbour sampling over a CSR adjacency, compiled (numba) and run over a whole batch.

The CSR is the precomputed neighbour list. For a node of degree ``d`` and fanout ``k``:
``d <= k`` takes every neighbour; ``d > k`` draws ``k`` distinct offsets with Robert Floyd's
algorithm (``k`` steps), so a hub's adjacency is never scanned.

Randomness is counter-based: the draw for (seed, node, hop, step) is a hash (splitmix64), not the
state of a generator. A node's sample therefore depends only on the request seed, never on which
other nodes share the batch: merging concurrent requests leaves every request's neighbourhood
unchanged, and the same ids, fanout and seed always give the same neighbourhood.

Why compiled: the numpy version of this loop cost dozens of numpy calls per request whatever its size;
the kernel does the same arithmetic, bit for bit the same samples, in a fraction of the time
(``runners/feature/kernels.py``; ``tests/sampling_reference.py`` is the numpy version, kept as the
test oracle). ``python bench/bench_model.py`` times sample + compact per batch size.

Output (``sample_tree``): one array per hop, ``[B]``, ``[B, k1]``, ``[B, k1, k2]`` ..., node ids
as int64 with ``-1`` as padding; in every row the real neighbours come first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from common.feature_runner_api import random_seed

PAD = -1
Seeds = int | np.ndarray  # one seed for all nodes, or one per node


@dataclasses.dataclass(frozen=True)
class AdjacencyOverlay:
    """Neighbour lists that replace the base CSR's for some nodes (``runners.feature.graph``):
    node v's list is ``arena[offset[v]:offset[v] + degree[v]]`` where ``offset[v] >= 0``."""

    offset: np.ndarray  # int64 [capacity], -1: the base CSR's list
    degree: np.ndarray  # int64 [capacity]
    arena: np.ndarray  # the base CSR's index dtype


_EMPTY: dict[np.dtype, AdjacencyOverlay] = {}


def _no_overlay(indices: np.ndarray) -> AdjacencyOverlay:
    """Empty overlay arrays (the kernel's types), made once per index dtype."""
    empty = _EMPTY.get(indices.dtype)
    if empty is None:
        empty = _EMPTY[indices.dtype] = AdjacencyOverlay(
            np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, indices.dtype)
        )
    return empty


def sample_neighbours(
    indptr: np.ndarray,
    indices: np.ndarray,
    nodes: np.ndarray,
    fanout: int,
    seed: Seeds,
    hop: int = 0,
    overlay: AdjacencyOverlay | None = None,
) -> np.ndarray:
    """Sample up to ``fanout`` distinct neighbours of each node; ``[len(nodes), fanout]`` int64.

    ``nodes`` may hold ``PAD`` entries; their rows are all ``PAD``. ``seed``: an int, or an array
    with one seed per node (requests with different seeds merged into one call). ``overlay``: the
    lists the graph's updates changed (None: the base CSR alone).
    """
    nodes = np.ascontiguousarray(nodes, dtype=np.int64).reshape(-1)
    out = np.empty((nodes.size, fanout), dtype=np.int64)
    if nodes.size == 0 or fanout == 0:
        return out
    if isinstance(seed, np.ndarray):
        seeds = np.ascontiguousarray(seed, dtype=np.int64).reshape(-1)
        if seeds.size != nodes.size:
            raise ValueError(f"need one seed per node: {seeds.size} vs {nodes.size}")
    else:
        seeds = np.full(nodes.size, int(seed), dtype=np.int64)
    # A read-only array (np.frombuffer of a request body, np.broadcast_to) is a numba type of its
    # own: the first such call compiled a second specialization in the middle of traffic, stalling
    # every request in flight (seen on the first merged batch at c=32 under python -m bench.suite).
    # Copying a few ids is cheap by comparison.
    nodes, seeds = _writable(nodes), _writable(seeds)
    # Imported here: processes that never sample (the gateway imports the runner classes for
    # ``bentoml.depends``) never load numba.
    from runners.feature.kernels import sample_level

    ov = overlay or _no_overlay(indices)
    sample_level(indptr, indices, ov.offset, ov.degree, ov.arena, nodes, seeds, int(fanout), int(hop), out)
    return out


def sample_tree(
    indptr: np.ndarray,
    indices: np.ndarray,
    targets: np.ndarray,
    fanouts: Sequence[int],
    seed: Seeds | None = None,
    overlay: AdjacencyOverlay | None = None,
) -> list[np.ndarray]:
    """Sample the multi-hop neighbourhood of ``targets``: ``[targets, hop1, hop2, ...]``.

    ``seed``: None (random), an int, or one seed per target; a node sampled under a target
    inherits that target's seed.
    """
    seed = random_seed() if seed is None else seed
    layers = [np.asarray(targets, dtype=np.int64).reshape(-1)]
    if isinstance(seed, np.ndarray):
        seeds = np.asarray(seed, dtype=np.int64)
        if seeds.shape != layers[0].shape:
            raise ValueError(f"need one seed per target: {seeds.shape} vs {layers[0].shape}")
    else:
        seeds = np.full(layers[0].shape, int(seed), dtype=np.int64)
    for hop, k in enumerate(fanouts):
        prev = layers[-1]
        nxt = sample_neighbours(indptr, indices, prev.reshape(-1), int(k), seeds, hop, overlay)
        layers.append(nxt.reshape(prev.shape + (int(k),)))
        seeds = np.repeat(seeds, int(k))
    return layers


def _writable(a: np.ndarray) -> np.ndarray:
    return a if a.flags.writeable else a.copy()
