"""The FeatureRunner's compiled inner loops (numba): neighbour sampling, tree compaction and the
last hop's mean (the premean FeatureTensor).

Both were numpy code whose cost was the number of numpy calls, not the arithmetic: dozens of calls per
request whatever its size. Compiled, one request's sampling costs a fraction of that, with
bit-for-bit the same samples (``tests/sampling_reference.py`` is the numpy algorithm, the oracle
of the tests); ``python bench/bench_model.py`` times sample + compact per batch size.

Imported inside the functions that use it (``runners.feature.sampling``, ``runners.feature.tree_layout.compact``): the gateway imports
the runner classes for ``bentoml.depends`` and must not load LLVM. Kernels are cached on disk
(``cache=True``, next to this file or in numba's user cache); ``NeighbourhoodBuilder`` runs them
once at start on the snapshot's own arrays (read-only memory maps are a type of their own).
"""

from __future__ import annotations

import numpy as np
from numba import njit

PAD = -1  # runners.feature.sampling.PAD (a numba global is frozen at compile time)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_NODE_MUL = np.uint64(0xD6E8FEB86659FD93)
_STEP_MUL = np.uint64(0xA0761D6478BD642F)
_SEED_MASK = np.int64(0x7FFF_FFFF_FFFF_FFFF)
_TO_UNIT = 1.0 / float(1 << 53)


@njit(cache=True, inline="always")
def _splitmix64(x: np.uint64) -> np.uint64:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@njit(cache=True, inline="always")
def _draw_row(
    src: np.ndarray,
    start: np.int64,
    deg: np.int64,
    v: np.int64,
    seed: np.int64,
    k: int,
    hop_key: np.uint64,
    chosen: np.ndarray,
    out: np.ndarray,
    i: int,
) -> None:
    """``out[i]`` from the neighbour list ``src[start:start + deg]`` of node ``v``."""
    if deg <= k:
        for c in range(k):
            out[i, c] = src[start + c] if c < deg else PAD
        return
    key = _splitmix64(np.uint64(seed & _SEED_MASK)) ^ (np.uint64(v) * _NODE_MUL)
    j = deg - k
    for step in range(k):
        bits = _splitmix64(key ^ ((np.uint64(step) + hop_key) * _STEP_MUL)) >> np.uint64(11)
        t = np.int64(np.float64(bits) * _TO_UNIT * (j + 1))
        for s in range(step):
            if chosen[s] == t:
                t = j
                break
        chosen[step] = t
        j += 1
    for c in range(k):
        out[i, c] = src[start + chosen[c]]


@njit(cache=True)
def sample_level(
    indptr: np.ndarray,
    indices: np.ndarray,
    ov_offset: np.ndarray,
    ov_degree: np.ndarray,
    ov_arena: np.ndarray,
    nodes: np.ndarray,
    seeds: np.ndarray,
    k: int,
    hop: int,
    out: np.ndarray,
) -> None:
    """``out[i]``: up to ``k`` distinct neighbours of ``nodes[i]``, real ones first, then PAD.

    A node's neighbour list is the base CSR's, unless the overlay has one for it
    (``ov_offset[v] >= 0``: ``ov_arena[ov_offset[v]:][:ov_degree[v]]``, the list after the graph's
    updates, in the order a compacted snapshot stores it); empty overlay arrays mean none.

    The draw of step s for node v is ``splitmix64(splitmix64(seed) ^ v * NODE_MUL ^ (s + hop *
    1_000_003 + 1) * STEP_MUL) >> 11`` scaled to [0, 1); Floyd's step s turns it into t in
    [0, deg - k + s] and takes deg - k + s instead when t was drawn before. It depends on the
    list's length and order only, so a list read from the overlay draws what the same list read
    from a compacted CSR draws.
    """
    chosen = np.empty(k, np.int64)
    hop_key = np.uint64(hop * 1_000_003 + 1)
    n_overlay = ov_offset.size
    for i in range(nodes.size):
        v = nodes[i]
        if v < 0:
            out[i, :] = PAD
            continue
        if v < n_overlay and ov_offset[v] >= 0:
            _draw_row(ov_arena, np.int64(ov_offset[v]), np.int64(ov_degree[v]), v, seeds[i], k, hop_key, chosen, out, i)
        else:
            start = np.int64(indptr[v])
            _draw_row(indices, start, np.int64(indptr[v + 1]) - start, v, seeds[i], k, hop_key, chosen, out, i)


@njit(cache=True)
def _distinct_positions(flat: np.ndarray, mark: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct ids >= 0 in order of first appearance, each entry's position among them or -1,
    each distinct id's first entry). ``mark`` is a scratch map id -> position, all -1 on entry
    and on return: one pass, where np.unique sorts every entry (and numba's sort is slower than
    numpy's; no benchmark compares them)."""
    distinct = np.empty(flat.size, np.int64)
    positions = np.empty(flat.size, np.int32)
    first = np.empty(flat.size, np.int64)
    count = 0
    for i in range(flat.size):
        v = flat[i]
        if v < 0:
            positions[i] = -1
            continue
        p = mark[v]
        if p < 0:
            p = count
            mark[v] = p
            distinct[count] = v
            first[count] = i
            count += 1
        positions[i] = p
    for r in range(count):
        mark[distinct[r]] = -1
    return distinct[:count], positions, first[:count]


_mark = np.full(0, -1, dtype=np.int32)


def distinct_positions(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct node ids of ``flat`` (first appearance first) and each entry's position among
    them, -1 at PAD: ``distinct[positions[i]] == flat[i]`` for every real entry."""
    distinct, positions, _ = distinct_first(flat)
    return distinct, positions


def distinct_first(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``distinct_positions`` and, per distinct id, the index of its first entry in ``flat``."""
    global _mark
    top = int(flat.max()) + 1 if flat.size else 0
    mark = _mark
    if mark.size < top:  # grows to the largest node id seen; a kernel call restores it to -1
        mark = _mark = np.full(max(top, 2 * mark.size), -1, dtype=np.int32)
    return _distinct_positions(flat, mark)


@njit(cache=True)
def mean_rows(rows: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` (zeros on entry) = the mean of ``rows[index[i, j]]`` over ``index[i, j] >= 0``,
    left 0 for none: the dense model's mean aggregation (sum / max(count, 1)), in one pass over
    the rows instead of a gathered [n, k, F] block."""
    width = rows.shape[1]
    for i in range(index.shape[0]):
        count = 0
        for j in range(index.shape[1]):
            r = index[i, j]
            if r < 0:
                continue
            count += 1
            for x in range(width):
                out[i, x] += rows[r, x]
        if count > 1:
            for x in range(width):
                out[i, x] /= count
