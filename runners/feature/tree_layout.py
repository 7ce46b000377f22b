"""The FeatureRunner's side of the FeatureTensor (``common.feature_tensor`` is the contract): a
sampled tree compacted level by level (``compact``), the premean layout (``premean``, its
definition on a fully sampled tree) and ``PremeanTree`` (the same tensor, sampled as the layout
needs it). Training and export build their inputs with the same functions, so a model sees
exactly what the FeatureRunner sends.

The compiled kernels (numba) are imported inside the functions: the gateway imports the runner
classes (for ``bentoml.depends``) and must not load numba.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


def compact(tree: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """A sampled padded tree -> (distinct node ids, level-compacted int32 index into them).
    The ids come in order of first appearance (targets first), not sorted."""
    from runners.feature.kernels import distinct_positions  # numba: only processes that compact load it

    flat = np.concatenate([t.reshape(-1) for t in tree]).astype(np.int64, copy=False)
    unique, positions = distinct_positions(flat)
    index, offset, parent_real = [], 0, None
    for t in tree:
        level = positions[offset : offset + t.size]
        offset += t.size
        if parent_real is None:
            index.append(level)
        else:
            index.append(level.reshape(-1, t.shape[-1])[parent_real])
        parent_real = level >= 0
    return unique, index


def premean(
    rows: np.ndarray, index: Sequence[np.ndarray], seeds: np.ndarray
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]:
    """A compacted tree (L >= 2 hops) -> the premean layout: (the rows of levels 0..L-1, the index
    without its last level and with level L-1 pointing at distinct (node, seed) entries,
    ``last_rows`` int32, ``last_mean`` float32). ``seeds``: the seed of each target.

    The layout's definition, on a fully sampled tree. The FeatureRunner builds the same tensor
    without sampling the last hop of repeated entries (``PremeanTree``); tests hold the two equal.
    The kept rows are a prefix of ``rows``: ``compact`` numbers ids in order of first appearance,
    level by level, so every id of levels 0..L-1 comes before the ids first seen in the last."""
    from runners.feature.kernels import mean_rows  # numba: only processes that compact load it

    if len(index) < 3:
        raise ValueError("the premean layout needs at least 2 hops")
    inner, last = list(index[:-1]), index[-1]
    entries, first, slot_rows, _ = _entries(inner, seeds)
    last_rows = slot_rows[first].astype(np.int32)
    means = np.zeros((first.size, rows.shape[1]), np.float32)
    mean_rows(np.ascontiguousarray(rows, dtype=np.float32), np.ascontiguousarray(last[first]), means)
    inner[-1] = entries
    kept = 1 + max([int(i.max()) for i in inner[:-1] if i.size] + [int(last_rows.max()) if last_rows.size else -1])
    return rows[:kept], inner, last_rows, means


def _entries(
    inner: Sequence[np.ndarray], seeds: np.ndarray | int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (node, seed) entries of the last level of a compacted tree ``inner`` (levels
    0..L-1): (that level as entry numbers, -1 at padding; each entry's first real slot; each real
    slot's row; each real slot's seed), entries numbered in order of first appearance."""
    from runners.feature.kernels import distinct_first

    slot_seeds = np.broadcast_to(np.asarray(seeds, dtype=np.int64), inner[0].shape)
    for level in inner[1:]:  # the seed of each real slot, level by level (row-major)
        slot_seeds = np.repeat(slot_seeds, level.shape[1])[level.reshape(-1) >= 0]
    slots = inner[-1].reshape(-1)
    real = slots >= 0
    slot_rows = slots[real].astype(np.int64)
    if not slot_seeds.size or (slot_seeds == slot_seeds[0]).all():
        # One seed (a single request), or no real slot at all (every target isolated): the row
        # alone tells the pairs apart.
        key = slot_rows
    else:
        ranks = np.unique(slot_seeds, return_inverse=True)[1].astype(np.int64)
        key = slot_rows * (int(ranks.max()) + 1) + ranks
    _, entry, first = distinct_first(key)  # each slot's entry; each entry's first slot
    entries = np.full(slots.shape, -1, np.int32)
    entries[real] = entry
    return entries.reshape(inner[-1].shape), first, slot_rows, slot_seeds


@dataclasses.dataclass
class PremeanTree:
    """A premean neighbourhood sampled as the layout needs it: levels 0..L-1 in full, the last
    hop once per distinct (node, seed) entry of level L-1 (a repeated entry has the same sample:
    sampling hashes (seed, node, hop, step)). For a batch of Zipf targets that skips a good part
    of the second-hop lists and most of the slots to compact (``python bench/bench_premean.py``
    times the build, FeatureRunner side).

    ``unique``: the distinct ids, levels 0..L-1 first (``kept`` of them), in the order ``compact``
    gives the full tree, so the tensor is byte for byte ``premean`` of the full tree."""

    unique: np.ndarray
    inner: list[np.ndarray]  # idx0..idx{L-1}, the last as entry numbers
    last_rows: np.ndarray  # [E] int32: each entry's row
    last_index: np.ndarray  # [E, k_L] int32: each entry's sampled neighbours' rows, -1 = padding
    kept: int

    @classmethod
    def sample(
        cls,
        indptr: np.ndarray,
        indices: np.ndarray,
        targets: np.ndarray,
        fanouts: Sequence[int],
        seeds: np.ndarray,
        overlay: Any = None,
    ) -> PremeanTree:
        from runners.feature.kernels import distinct_positions
        from runners.feature.sampling import sample_neighbours, sample_tree

        if len(fanouts) < 2:
            raise ValueError("the premean layout needs at least 2 hops")
        tree = sample_tree(indptr, indices, targets, fanouts[:-1], seed=seeds, overlay=overlay)
        inner_ids, inner = compact(tree)
        entries, first, slot_rows, slot_seeds = _entries(inner, seeds)
        # Each entry's sample as sample_tree would draw it at its first slot (same node, seed, hop).
        last = sample_neighbours(
            indptr,
            indices,
            inner_ids[slot_rows[first]],
            int(fanouts[-1]),
            slot_seeds[first],
            hop=len(fanouts) - 1,
            overlay=overlay,
        )
        unique, positions = distinct_positions(np.concatenate([inner_ids, last.reshape(-1)]))
        last_index = positions[inner_ids.size :].reshape(last.shape)
        inner[-1] = entries
        return cls(unique, inner, slot_rows[first].astype(np.int32), last_index, int(inner_ids.size))

    def tensor_parts(self, rows: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]:
        """``premean``'s result from the rows of ``unique``."""
        from runners.feature.kernels import mean_rows

        means = np.zeros((self.last_rows.size, rows.shape[1]), np.float32)
        mean_rows(np.ascontiguousarray(rows, dtype=np.float32), self.last_index, means)
        return rows[: self.kept], list(self.inner), self.last_rows, means
