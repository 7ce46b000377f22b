"""The sampler in plain numpy: the oracle that ``runners.feature.sampling``'s compiled kernel must equal
bit for bit (the same splitmix64 draws, the same Floyd steps). Not used by the services."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PAD = -1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_NODE_MUL = np.uint64(0xD6E8FEB86659FD93)
_STEP_MUL = np.uint64(0xA0761D6478BD642F)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def uniforms(seed, nodes: np.ndarray, hop: int, steps: int) -> np.ndarray:
    """``[len(nodes), steps]`` floats in [0, 1), each a pure function of (seed, node, hop, step)."""
    with np.errstate(over="ignore"):
        seeds = np.broadcast_to(np.asarray(seed, dtype=np.int64) & 0x7FFF_FFFF_FFFF_FFFF, nodes.shape)
        key = _splitmix64(seeds.astype(np.uint64)) ^ (nodes.astype(np.uint64) * _NODE_MUL)
        step_keys = (np.arange(steps, dtype=np.uint64) + np.uint64(hop * 1_000_003 + 1)) * _STEP_MUL
        bits = _splitmix64(key[:, None] ^ step_keys[None, :]) >> np.uint64(11)
    return bits.astype(np.float64) * (1.0 / (1 << 53))


def floyd_offsets(deg: np.ndarray, draws: np.ndarray, k: int) -> np.ndarray:
    chosen = np.empty((deg.size, k), dtype=np.int64)
    for step in range(k):
        j = deg - k + step
        t = (draws[:, step] * (j + 1)).astype(np.int64)
        seen = (chosen[:, :step] == t[:, None]).any(axis=1)
        chosen[:, step] = np.where(seen, j, t)
    return chosen


def sample_neighbours(indptr, indices, nodes, fanout: int, seed, hop: int = 0) -> np.ndarray:
    nodes = np.asarray(nodes, dtype=np.int64).reshape(-1)
    out = np.full((nodes.size, fanout), PAD, dtype=np.int64)
    if nodes.size == 0 or fanout == 0:
        return out
    real = nodes >= 0
    safe = np.where(real, nodes, 0)
    start = indptr[safe].astype(np.int64)
    deg = np.where(real, indptr[safe + 1] - start, 0)
    take_all = (deg > 0) & (deg <= fanout)
    if take_all.any():
        rows = np.flatnonzero(take_all)
        cols = np.arange(fanout)
        valid = cols[None, :] < deg[rows, None]
        pos = np.where(valid, start[rows, None] + cols[None, :], 0)
        out[rows] = np.where(valid, indices[pos], PAD)
    hubs = np.flatnonzero(deg > fanout)
    if hubs.size:
        hub_seeds = seed[hubs] if isinstance(seed, np.ndarray) else seed
        draws = uniforms(hub_seeds, nodes[hubs], hop, fanout)
        out[hubs] = indices[start[hubs, None] + floyd_offsets(deg[hubs], draws, fanout)]
    return out


def sample_tree(indptr, indices, targets, fanouts: Sequence[int], seed) -> list[np.ndarray]:
    layers = [np.asarray(targets, dtype=np.int64).reshape(-1)]
    per_target = np.asarray(seed, dtype=np.int64) if isinstance(seed, np.ndarray) else None
    for hop, k in enumerate(fanouts):
        prev = layers[-1]
        hop_seed = (
            int(seed)
            if per_target is None
            else np.broadcast_to(per_target.reshape((-1,) + (1,) * (prev.ndim - 1)), prev.shape).reshape(-1)
        )
        nxt = sample_neighbours(indptr, indices, prev.reshape(-1), int(k), hop_seed, hop)
        layers.append(nxt.reshape(prev.shape + (int(k),)))
    return layers
