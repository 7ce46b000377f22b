"""Explained predictions: the neighbourhood each target was answered from, and the influence of
each hop-1 neighbour on the answer. Numpy only (the FeatureRunner's side; no torch here).

Leaving a neighbour out: for target ``b`` and each real hop-1 slot ``j`` of its sampled tree, a
*variant* tree is the same tree with slot ``j`` and its whole subtree removed and the later slots
moved up, a padding slot appended: exactly the tree the sampler gives a node whose neighbour list
lacks that neighbour (real neighbours first, ``-1`` after them, as for a degree under the fanout).
Every aggregator (mean, pool, LSTM) then leaves the neighbour out of both layers it reaches: the
target's first-layer aggregation over raw hop-1 features and the second layer's aggregation over
hop-1 representations. It is PyG's answer on the sampled message-flow graph without that edge
(``tests/test_explain.py`` checks it per aggregator).

All variants travel with the original trees in one FeatureTensor (targets ``0..B-1`` the
originals, then the variants, target-major, slot order), over the same deduplicated rows, so the
model runner answers them in one forward pass; ``influence`` then reads the answer.

Sign: ``influence = p(class | tree) - p(class | tree without the neighbour)``: positive when the
neighbour pushed the answer towards the class, negative when it pulled away. The class is the
predicted one (multiclass) or every label (multilabel).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from common.feature_runner_api import EXPLANATION_ARRAYS
from common.feature_tensor import FeatureTensor, to_padded

PAD = -1  # runners.feature.sampling.PAD


@dataclasses.dataclass(frozen=True)
class Variants:
    """The originals and their leave-one-out variants in one tensor."""

    tensor: FeatureTensor  # targets [0, originals) the originals, then one per (target, slot)
    originals: int
    target: np.ndarray  # [V] int64: the original target of each variant
    slot: np.ndarray  # [V] int64: the hop-1 slot it leaves out
    fanout1: int  # hop-1 slots per target


def with_variants(ft: FeatureTensor) -> Variants:
    """``ft`` (the level layout, one hop at least) plus one variant per real hop-1 slot."""
    if ft.last_mean is not None:
        raise ValueError("explain needs the level layout (the premean one has no rows to leave out)")
    if len(ft.index) < 2:
        raise ValueError("explain needs at least one hop")
    padded = to_padded(ft.index)
    k1 = int(padded[1].shape[1])
    target, slot = np.nonzero(padded[1] >= 0)
    # Variant v reads its slots from the original's in this order; k1 is the appended padding.
    order = np.arange(k1)[None, :] + (np.arange(k1)[None, :] >= slot[:, None])
    levels = [np.concatenate([padded[0], padded[0][target]])]
    for level in padded[1:]:
        extended = np.concatenate([level, np.full_like(level[:, :1], PAD)], axis=1)
        levels.append(np.concatenate([level, extended[target[:, None], order]]))
    index = [levels[0].astype(np.int32)]
    for parent, level in itertools.pairwise(levels):
        index.append(np.ascontiguousarray(level.reshape(-1, level.shape[-1])[parent.reshape(-1) >= 0], np.int32))
    tensor = dataclasses.replace(ft, index=index)
    return Variants(tensor, ft.num_targets, target.astype(np.int64), slot.astype(np.int64), k1)


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Per original target: its sampled neighbourhood (ids) and each hop-1 neighbour's influence."""

    hop1: np.ndarray  # [B, k1] int64 node ids, -1: an empty slot (degree under the fanout)
    hop2: np.ndarray  # [B, k1, k2] int64 (k2 = 0 for a one-hop model), -1 as above
    classes: np.ndarray  # [B, C'] int32: the classes the influences are of
    influence: np.ndarray  # [B, k1, C'] float32, NaN at empty slots

    def arrays(self) -> dict[str, np.ndarray]:
        """The explanation's arrays as they travel (``common.wire``) beside the answer's."""
        return dict(zip(EXPLANATION_ARRAYS, (self.hop1, self.hop2, self.classes, self.influence)))


def neighbourhood(ft: FeatureTensor) -> tuple[np.ndarray, np.ndarray]:
    """The node ids of hop 1 ``[B, k1]`` and hop 2 ``[B, k1, k2]`` of ``ft`` (``-1`` at empty
    slots); needs the rows' ids (``FeatureTensor.node_ids``, set where the tensor was built)."""
    if ft.node_ids is None:
        raise ValueError("the tensor carries no node ids (only the FeatureRunner's own tensors do)")
    padded = to_padded(ft.index)
    ids = np.asarray(ft.node_ids, dtype=np.int64)
    as_ids = [np.where(level >= 0, ids[np.maximum(level, 0)], PAD) for level in padded[1:3]]
    if len(as_ids) == 1:
        as_ids.append(np.empty(as_ids[0].shape + (0,), np.int64))
    return as_ids[0], as_ids[1]


def influence(probs: np.ndarray, variants: Variants, multilabel: bool) -> tuple[np.ndarray, np.ndarray]:
    """From the model's ``probs`` on ``variants.tensor``: (classes ``[B, C']``, influence
    ``[B, k1, C']``); the predicted class for multiclass, every label for multilabel."""
    b, num_classes = variants.originals, probs.shape[1]
    original, variant = probs[:b], probs[b:]
    if multilabel:
        classes = np.broadcast_to(np.arange(num_classes, dtype=np.int32), (b, num_classes))
    else:
        classes = original.argmax(1).astype(np.int32)[:, None]
    ours = np.take_along_axis(original, classes, 1)
    without = np.take_along_axis(variant, classes[variants.target], 1)
    out = np.full((b, variants.fanout1, classes.shape[1]), np.nan, np.float32)
    out[variants.target, variants.slot] = ours[variants.target] - without
    return np.ascontiguousarray(classes), out


def explain(ft: FeatureTensor, variants: Variants, probs: np.ndarray, multilabel: bool) -> Explanation:
    """The explanation of ``ft``'s targets from the model's answer on ``variants``."""
    hop1, hop2 = neighbourhood(ft)
    classes, change = influence(probs, variants, multilabel)
    return Explanation(hop1, hop2, classes, change)
