"""FeatureTensor: what the FeatureRunner hands the GraphSAGERunner, and its wire encoding.

Layout (deduplicated, chosen by measurement over the padded tree, see ``bench/bench_layouts.py``):

- ``features``  [U, F] float32 or float16: one row per distinct node of the whole batch.
- ``index[d]``  int32 rows into ``features`` for every slot of hop ``d``:
  ``[B]``, ``[B, k1]``, ``[B, k1, k2]``; ``-1`` marks padding (a node with fewer neighbours than
  the fanout), so the mask is ``index[d] >= 0``.

A padded [25, 10] tree carries 276 feature rows per target although the demo graph's mean
degree is 10; deduplication ships each distinct row once and padding only as 4-byte indices.

Encoding: ``runners.wire`` (a JSON header + aligned raw buffers; zero-copy decode, no pickle).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from runners import wire


class FeatureTensorError(ValueError):
    """A FeatureTensor that is malformed or inconsistent."""


@dataclasses.dataclass
class FeatureTensor:
    features: np.ndarray
    index: list[np.ndarray]
    snapshot: str = ""

    @property
    def num_targets(self) -> int:
        return int(self.index[0].shape[0])

    @property
    def fanout(self) -> tuple[int, ...]:
        return tuple(int(a.shape[-1]) for a in self.index[1:])

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    def validate(self) -> None:
        if self.features.ndim != 2:
            raise FeatureTensorError(f"features must be 2-D, got shape {self.features.shape}")
        if not self.index:
            raise FeatureTensorError("index needs at least the target layer")
        batch = self.index[0].shape[0]
        for depth, idx in enumerate(self.index):
            if idx.ndim != depth + 1 or idx.shape[0] != batch:
                raise FeatureTensorError(f"index[{depth}] must be [B{', k' * depth}] with B={batch}, got {idx.shape}")
            if depth and idx.shape[:-1] != self.index[depth - 1].shape:
                raise FeatureTensorError(f"index[{depth}] shape {idx.shape} does not extend {self.index[depth - 1].shape}")
            if idx.size and (int(idx.max()) >= self.features.shape[0] or int(idx.min()) < -1):
                raise FeatureTensorError(f"index[{depth}] points outside features [0, {self.features.shape[0]})")
        if self.index[0].size and int(self.index[0].min()) < 0:
            raise FeatureTensorError("target slots cannot be padding")

    def nbytes(self) -> int:
        return int(self.features.nbytes + sum(a.nbytes for a in self.index))


def compact(tree: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Deduplicate the node ids of a sampled tree: (distinct ids, per-hop int32 index into them)."""
    flat = np.concatenate([t.reshape(-1) for t in tree])
    real = flat >= 0
    unique, inverse = np.unique(flat[real], return_inverse=True)
    positions = np.full(flat.shape, -1, dtype=np.int32)
    positions[real] = inverse.astype(np.int32)
    index, offset = [], 0
    for t in tree:
        index.append(positions[offset : offset + t.size].reshape(t.shape))
        offset += t.size
    return unique, index


def padded_nbytes(tree: Sequence[np.ndarray], feature_dim: int, itemsize: int = 4) -> int:
    """Bytes of the same tree in the padded layout (every slot carries a full feature row)."""
    return int(sum(t.size for t in tree) * feature_dim * itemsize)


def encode(ft: FeatureTensor) -> bytes:
    arrays = {"features": ft.features, **{f"idx{d}": idx for d, idx in enumerate(ft.index)}}
    return wire.pack(arrays, {"snapshot": ft.snapshot})


def decode(blob: bytes | bytearray | memoryview) -> FeatureTensor:
    """Parse an encoded FeatureTensor; raises FeatureTensorError on anything malformed."""
    try:
        meta, arrays = wire.unpack(blob)
    except wire.WireError as exc:
        raise FeatureTensorError(str(exc)) from exc
    features = arrays.pop("features", None)
    index = [arrays.pop(f"idx{d}") for d in range(len(arrays)) if f"idx{d}" in arrays]
    if features is None or not index or arrays:
        raise FeatureTensorError("expected arrays features, idx0, idx1, ... and nothing else")
    if features.dtype.kind != "f" or any(a.dtype != np.int32 for a in index):
        raise FeatureTensorError("features must be float and index arrays int32")
    ft = FeatureTensor(features=features, index=index, snapshot=str(meta.get("snapshot", "")))
    ft.validate()
    return ft
