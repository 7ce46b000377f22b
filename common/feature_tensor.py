"""FeatureTensor: what the FeatureRunner hands the GraphSAGERunner, and its wire encoding.

Layout (deduplicated rows, tree compacted level by level; chosen by measurement over the
padded tree, see ``bench/bench_features.py``):

- ``features``  [U, F] float32 or float16: one row per distinct node of the whole batch.
- ``index[0]``  [B] int32: the targets' rows.
- ``index[d]``  [S_{d-1}, k_d] int32 for hop d >= 1: the sampled neighbours of every *real*
  node of level d-1 (in row-major order), ``-1`` as padding when a node has fewer neighbours
  than the fanout. ``S_0 = B`` and ``S_d`` is the number of entries >= 0 in ``index[d]``.

A padded [25, 10] tree carries 276 feature rows per target and 250 second-hop slots although
the demo graph's mean degree is 10; here each distinct row travels once, padding only as int32
indices, and a padded first-hop slot has no second-hop row at all, so neither the bytes nor the
model's work grow with padding.

The premean layout (``PREMEAN``; mean aggregator, L >= 2 hops; see ``runners.graphsage.dense_model``):
the last hop arrives aggregated, and the level before it deduplicated. ``features`` holds the rows
of levels 0..L-1 only and ``index`` stops at ``idx{L-1}``, whose entries point at the *distinct*
(node, seed) pairs of level L-1 (a node sampled twice with one seed has the same neighbours
both times: sampling hashes (seed, node, hop, step)). Per distinct pair: ``last_rows [E]`` its
row and ``last_mean [E, F]`` the mean of its sampled neighbours' rows; ``last_fanout`` is the
last hop's k. On the demo graph a Zipf 256-target request carries far fewer rows
(``python bench/bench_premean.py`` prints the encoded bytes of both layouts per batch size).

Built by the FeatureRunner (``runners.feature.tree_layout``: ``compact``, ``premean``, ``PremeanTree``).
Encoding: ``common.wire`` (a JSON header + aligned raw buffers; zero-copy decode, no pickle).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from common import wire

# The model input contract this layout implies; stored with every exported model and checked at
# load, so a model exported for another layout is refused instead of failing inside a batch.
LAYOUT = "levels-v1"
PREMEAN = "premean-v1"


class FeatureTensorError(ValueError):
    """A FeatureTensor that is malformed or inconsistent."""


@dataclasses.dataclass
class FeatureTensor:
    features: np.ndarray
    index: list[np.ndarray]
    snapshot: str = ""
    # The premean layout: per distinct (node, seed) of the last indexed level, its row and mean.
    last_rows: np.ndarray | None = None
    last_mean: np.ndarray | None = None
    last_fanout: int = 0
    # The node id of each row, where the tensor was built (the FeatureRunner: an explained answer
    # names its neighbours). Never encoded: the model needs rows, not ids.
    node_ids: np.ndarray | None = None

    @property
    def layout(self) -> str:
        return LAYOUT if self.last_mean is None else PREMEAN

    @property
    def num_targets(self) -> int:
        return int(self.index[0].shape[0])

    @property
    def fanout(self) -> tuple[int, ...]:
        ks = tuple(int(a.shape[1]) for a in self.index[1:])
        return ks if self.last_mean is None else ks + (self.last_fanout,)

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    def validate(self) -> None:
        if self.features.ndim != 2:
            raise FeatureTensorError(f"features must be 2-D, got shape {self.features.shape}")
        if not self.index or self.index[0].ndim != 1:
            raise FeatureTensorError("index[0] must hold the targets' rows, shape [B]")
        if self.index[0].size and int(self.index[0].min()) < 0:
            raise FeatureTensorError("target slots cannot be padding")
        rows = self.features.shape[0]
        premean = self.last_rows is not None and self.last_mean is not None
        if premean:
            self._validate_premean(rows)
        entries = self.last_rows.size if self.last_rows is not None else 0
        parents = self.index[0].shape[0]
        for depth, idx in enumerate(self.index):
            if depth and (idx.ndim != 2 or idx.shape[0] != parents):
                raise FeatureTensorError(
                    f"index[{depth}] must be [{parents}, k{depth}] (one row per real node of hop {depth - 1}), got {idx.shape}"
                )
            bound, what = (entries, "last_rows") if premean and depth == len(self.index) - 1 else (rows, "features")
            if idx.size and (int(idx.max()) >= bound or int(idx.min()) < -1):
                raise FeatureTensorError(f"index[{depth}] points outside {what} [0, {bound})")
            parents = int((idx >= 0).sum())

    def _validate_premean(self, rows: int) -> None:
        if len(self.index) < 2 or self.last_rows is None or self.last_mean is None or self.last_rows.ndim != 1:
            raise FeatureTensorError("a premean tensor has at least idx0 and idx1, and last_rows [E]")
        if not self.last_rows.size:
            raise FeatureTensorError(
                "a premean tensor needs at least one last-hop entry (send the level layout "
                "when no target has a neighbour)"
            )
        if self.last_mean.shape != (self.last_rows.size, self.features.shape[1]):
            raise FeatureTensorError(
                f"last_mean must be [{self.last_rows.size}, {self.features.shape[1]}] (one row per "
                f"entry of last_rows), got {self.last_mean.shape}"
            )
        if self.last_rows.size and (int(self.last_rows.min()) < 0 or int(self.last_rows.max()) >= rows):
            raise FeatureTensorError(f"last_rows points outside features [0, {rows})")
        if self.last_fanout < 1:
            raise FeatureTensorError("a premean tensor needs the last hop's fanout")

    def nbytes(self) -> int:
        extra = [a.nbytes for a in (self.last_rows, self.last_mean) if a is not None]
        return int(self.features.nbytes + sum(a.nbytes for a in self.index) + sum(extra))


def to_padded(index: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The inverse of the level compaction: per hop ``[B, k1, ..., kd]`` rows, -1 = padding."""
    out = [np.asarray(index[0])]
    for idx in index[1:]:
        prev = out[-1]
        full = np.full(prev.shape + (idx.shape[1],), -1, dtype=np.int32)
        full.reshape(-1, idx.shape[1])[prev.reshape(-1) >= 0] = idx
        out.append(full)
    return out


def padded_nbytes(tree: Sequence[np.ndarray], feature_dim: int, itemsize: int = 4) -> int:
    """Bytes of the same tree in the padded layout (every slot carries a full feature row)."""
    return int(sum(t.size for t in tree) * feature_dim * itemsize)


def encode(ft: FeatureTensor, prefix: bytes = b"") -> bytes:
    """``prefix``: bytes written in front in the same copy (the model runner's request envelope)."""
    arrays = {"features": ft.features, **{f"idx{d}": idx for d, idx in enumerate(ft.index)}}
    meta: dict[str, Any] = {"snapshot": ft.snapshot}
    if ft.last_rows is not None and ft.last_mean is not None:
        arrays.update(last_rows=ft.last_rows, last_mean=ft.last_mean)
        meta.update(layout=PREMEAN, last_fanout=ft.last_fanout)
    return wire.pack(arrays, meta, prefix)


def decode(blob: bytes | bytearray | memoryview) -> FeatureTensor:
    """Parse an encoded FeatureTensor; raises FeatureTensorError on anything malformed."""
    try:
        meta, arrays = wire.unpack(blob)
    except wire.WireError as exc:
        raise FeatureTensorError(str(exc)) from exc
    features = arrays.pop("features", None)
    layout = meta.get("layout", LAYOUT)
    last_mean, last_rows = arrays.pop("last_mean", None), arrays.pop("last_rows", None)
    if layout not in (LAYOUT, PREMEAN) or {last_mean is None, last_rows is None} != {layout == LAYOUT}:
        raise FeatureTensorError(f"layout {layout!r}: {PREMEAN} carries last_rows and last_mean, {LAYOUT} neither")
    index = [arrays.pop(f"idx{d}") for d in range(len(arrays)) if f"idx{d}" in arrays]
    if features is None or not index or arrays:
        raise FeatureTensorError("expected arrays features, idx0, idx1, ... (last_mean) and nothing else")
    if features.dtype.kind != "f" or any(a.dtype != np.int32 for a in index):
        raise FeatureTensorError("features must be float and index arrays int32")
    last_fanout = meta.get("last_fanout", 0)
    if last_mean is not None and (
        last_rows is None
        or last_mean.dtype != features.dtype
        or last_rows.dtype != np.int32
        or not isinstance(last_fanout, int)
    ):
        raise FeatureTensorError("last_mean must have the dtype of features, last_rows int32, last_fanout an integer")
    ft = FeatureTensor(
        features=features,
        index=index,
        snapshot=str(meta.get("snapshot", "")),
        last_rows=last_rows,
        last_mean=last_mean,
        last_fanout=last_fanout if last_mean is not None else 0,
    )
    ft.validate()
    return ft
