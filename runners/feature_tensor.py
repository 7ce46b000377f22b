"""FeatureTensor: what the FeatureRunner hands the GraphSAGERunner, and its wire encoding.

Layout (deduplicated, chosen by measurement over the padded tree, see ``bench/bench_layouts.py``):

- ``features``  [U, F] float32 or float16: one row per distinct node of the whole batch.
- ``index[d]``  int32 rows into ``features`` for every slot of hop ``d``:
  ``[B]``, ``[B, k1]``, ``[B, k1, k2]``; ``-1`` marks padding (a node with fewer neighbours than
  the fanout), so the mask is ``index[d] >= 0``.

A padded [25, 10] tree carries 276 feature rows per target although the demo graph's mean
degree is 10; deduplication ships each distinct row once and padding only as 4-byte indices.

Encoding: ``b"GSFT"`` + u32 header length + JSON header (snapshot tag, dtypes, shapes) + the raw
array buffers, each 8-byte aligned. Decoding makes zero-copy views with ``np.frombuffer``.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Sequence

import numpy as np

MAGIC = b"GSFT"
_ALIGN = 8
_DTYPES = {"float32", "float16", "int32"}
MAX_HEADER_BYTES = 64 * 1024


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
    arrays = [ft.features, *ft.index]
    header = json.dumps(
        {
            "snapshot": ft.snapshot,
            "arrays": [{"dtype": str(a.dtype), "shape": list(a.shape)} for a in arrays],
        }
    ).encode()
    parts = [MAGIC, struct.pack("<I", len(header)), header]
    offset = len(MAGIC) + 4 + len(header)
    for a in arrays:
        pad = -offset % _ALIGN
        parts.append(b"\0" * pad)
        data = np.ascontiguousarray(a).tobytes()
        parts.append(data)
        offset += pad + len(data)
    return b"".join(parts)


def decode(blob: bytes | bytearray | memoryview) -> FeatureTensor:
    """Parse an encoded FeatureTensor; raises FeatureTensorError on anything malformed."""
    view = memoryview(blob)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise FeatureTensorError("not a FeatureTensor (bad magic)")
    (hlen,) = struct.unpack("<I", view[4:8])
    if hlen > MAX_HEADER_BYTES or 8 + hlen > len(view):
        raise FeatureTensorError("header length out of range")
    try:
        header = json.loads(bytes(view[8 : 8 + hlen]))
        specs = header["arrays"]
        snapshot = str(header.get("snapshot", ""))
    except (ValueError, KeyError, TypeError) as exc:
        raise FeatureTensorError(f"bad header: {exc}") from exc
    if not isinstance(specs, list) or len(specs) < 2:
        raise FeatureTensorError("header must list features and at least one index array")
    arrays, offset = [], 8 + hlen
    for spec in specs:
        arr, offset = _read_array(view, offset, spec)
        arrays.append(arr)
    if offset != len(view):
        raise FeatureTensorError(f"{len(view) - offset} trailing bytes")
    ft = FeatureTensor(features=arrays[0], index=arrays[1:], snapshot=snapshot)
    if ft.features.dtype == np.int32 or any(a.dtype != np.int32 for a in ft.index):
        raise FeatureTensorError("features must be float and index arrays int32")
    ft.validate()
    return ft


def _read_array(view: memoryview, offset: int, spec: object) -> tuple[np.ndarray, int]:
    if not isinstance(spec, dict) or spec.get("dtype") not in _DTYPES:
        raise FeatureTensorError(f"array spec must name a dtype in {sorted(_DTYPES)}")
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape) or len(shape) > 8:
        raise FeatureTensorError(f"bad shape {shape!r}")
    dtype = np.dtype(spec["dtype"])
    offset += -offset % _ALIGN
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    end = offset + count * dtype.itemsize
    if end > len(view):
        raise FeatureTensorError("array data runs past the end of the message")
    return np.frombuffer(view[offset:end], dtype=dtype).reshape(shape), end
