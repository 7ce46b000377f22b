"""The served form of GraphSAGE: fixed-fanout dense tensors instead of scatter over edge lists.

With a fixed fanout per hop the neighbourhood of a batch is a regular tree, so every aggregation
is a reshape plus a masked reduction. That exports cleanly to ONNX (Gather, ReduceSum/Max, LSTM)
and runs well in ONNX Runtime and TensorRT, where PyG's scatter-based SAGEConv does not.

Parameter names equal PyG's ``SAGEConv`` (``convs.{i}.lin_l``, ``lin_r``, ``lin`` for the
pooling projection, ``aggr_module.lstm``), so a trained PyG state dict loads unchanged.

The input is the level-compacted FeatureTensor (``common.feature_tensor``): each hop holds
neighbours of the previous hop's *real* nodes only, so work scales with real nodes, not with
the padded tree (on the demo graph most of a padded [25, 10] tree is padding: ``python
bench/bench_features.py``, section "layout", prints the bytes of both). Neighbour sets
are materialised as ``[nodes, k, C]`` blocks whose padding rows are exactly zero (a gather from
the representations extended by one zero row), which every aggregator below relies on.

Semantics per aggregator, equal to PyG on the same sampled tree:
- mean: sum of real neighbours / max(count, 1) (0 for no neighbours, as PyG's scatter mean).
- pool: max over relu(W x_j + b) of real neighbours; masked padding contributes 0, which never
  beats a relu output, and gives PyG's 0 for an empty set.
- lstm: an LSTM over the neighbours in sample order, zero-padded to the fanout, last output.

Inputs: ``features [U, F]``, ``idx0 [B]``, then ``idx{d} [S_{d-1}, k_d]`` int32 (-1 = pad).
Outputs: ``logits [B, C]``, ``probs [B, C]`` (softmax or sigmoid), ``embedding [B, H]``.

The premean input (``PremeanInputs``, mean aggregator, L >= 2): the last hop arrives aggregated.
The first layer's mean over a last-level node's neighbours is linear in their raw features, so
the FeatureRunner sends that mean instead of the rows and their index, once per distinct
(node, seed) of level L-1: ``idx{L-1}`` points at those entries, ``last_rows [E]`` gives each
entry's row and ``last_mean [E, F]`` its mean (``common.feature_tensor``). Same function, fewer
bytes (the last hop holds most rows), no gather over them, and level L-1 computed once per entry.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from runners.graphsage.model_config import ModelConfig


class _LSTMAggregator(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(dim, dim, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        lead, (k, c) = x.shape[:-2], x.shape[-2:]
        out, _ = self.lstm(x.reshape(-1, k, c))
        return out[:, -1].reshape(*lead, c)


class DenseSAGELayer(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, aggregator: str) -> None:
        super().__init__()
        self.aggregator = aggregator
        if aggregator == "pool":
            self.lin = nn.Linear(in_dim, in_dim, bias=True)
        if aggregator == "lstm":
            self.aggr_module = _LSTMAggregator(in_dim)
        self.lin_l = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)

    def aggregate(self, nbr: Tensor, mask: Tensor) -> Tensor:
        """``nbr``: [n, k, C] with zero rows at padding; ``mask``: [n, k] (1 = real)."""
        if self.aggregator == "mean":
            return nbr.sum(-2) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        if self.aggregator == "pool":
            return (torch.relu(self.lin(nbr)) * mask.unsqueeze(-1)).amax(-2)
        return self.aggr_module(nbr)

    def forward(self, root: Tensor, nbr: Tensor, mask: Tensor) -> Tensor:
        return self.combine(root, self.aggregate(nbr, mask))

    def combine(self, root: Tensor, aggregated: Tensor) -> Tensor:
        return self.lin_l(aggregated) + self.lin_r(root)

    @property
    def projects_first(self) -> bool:
        """Mean and narrower out than in (the classifier layer): project the neighbours, then
        average. The mean is linear, so W (sum x / c) + b == (sum W x) / c + b, and the gathered
        block is [n, k, out] instead of [n, k, in] (10 vs 128 columns on the demo model: ONNX
        Runtime's Gather + ReduceSum were a large share of a bulk forward pass: ``python
        bench/bench_model.py`` times the pass, ONNX Runtime's profiler would show the split)."""
        return self.aggregator == "mean" and self.lin_l.out_features < self.lin_l.in_features

    def forward_projected(self, root: Tensor, nxt: Tensor, slot_rows: Tensor, mask: Tensor) -> Tensor:
        """``forward`` for ``projects_first`` layers: ``nxt`` [S, in] the next hop's real rows,
        ``slot_rows`` [n, k] each slot's row among them (S = padding)."""
        projected = torch.nn.functional.linear(nxt, self.lin_l.weight)
        nbr = torch.cat([projected, projected.new_zeros(1, projected.shape[1])])[slot_rows]
        mean = nbr.sum(-2) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        return mean + self.lin_l.bias + self.lin_r(root)


class DenseGraphSAGE(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dims = [cfg.in_dim] + [cfg.hidden_dim] * (cfg.num_layers - 1) + [cfg.num_classes]
        self.convs = nn.ModuleList(DenseSAGELayer(dims[i], dims[i + 1], cfg.aggregator) for i in range(cfg.num_layers))

    def forward(self, features: Tensor, *index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if len(index) != self.cfg.num_layers + 1:
            raise ValueError(f"expected {self.cfg.num_layers + 1} index tensors, got {len(index)}")
        return self.run(features, index, None)

    def run(
        self, features: Tensor, index: tuple[Tensor, ...] | list[Tensor], premean: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``premean``: (last_rows, last_mean); ``index`` then stops at ``idx{L-1}``, whose
        entries point at last_rows (the premean input)."""
        levels = [idx.long() for idx in index]
        masks = [lv >= 0 for lv in levels[1:]]  # masks[d]: neighbours of the real nodes of hop d
        fmasks = [m.to(features.dtype) for m in masks]
        # Rows of the real nodes of every hop but the last (roots of the first layer).
        real = [levels[0]] + [lv.reshape(-1)[m.reshape(-1)] for lv, m in zip(levels[1:-1], masks)]
        # Padded slot -> row among the next hop's real nodes, or the appended zero row.
        slot_rows = [_slot_rows(m) for m in masks]
        padded_ids = [torch.where(m, lv, features.shape[0]) for lv, m in zip(levels[1:], masks)]
        last_mean = None
        if premean is not None:  # level L-1 holds entries: one node per distinct (node, seed)
            last_rows, last_mean = premean[0].long(), premean[1]
            real.append(last_rows)
            slot_rows[-1] = torch.where(masks[-1], levels[-1], last_rows.shape[0])
            padded_ids[-1] = torch.where(masks[-1], last_rows[levels[-1].clamp(min=0)], features.shape[0])
        with_zero = torch.cat([features, features.new_zeros(1, features.shape[1])])

        h = [features[ids] for ids in real]
        embedding = h[0]
        for layer_no, module in enumerate(self.convs):
            conv = cast(DenseSAGELayer, module)
            out = []
            for d in range(len(self.convs) - layer_no):
                if layer_no == 0 and last_mean is not None and d == len(self.convs) - 1:
                    out.append(conv.combine(h[d], last_mean))
                    continue
                if layer_no == 0:
                    nbr = with_zero[padded_ids[d]]
                elif conv.projects_first:
                    out.append(conv.forward_projected(h[d], h[d + 1], slot_rows[d], fmasks[d]))
                    continue
                else:
                    nxt = h[d + 1]
                    nbr = torch.cat([nxt, nxt.new_zeros(1, nxt.shape[1])])[slot_rows[d]]
                out.append(conv(h[d], nbr, fmasks[d]))
            h = out
            if layer_no < len(self.convs) - 1:
                h = [torch.relu(x) for x in h]
                embedding = h[0]
        logits = h[0]
        probs = torch.softmax(logits, -1) if self.cfg.task == "multiclass" else torch.sigmoid(logits)
        return logits, probs, embedding


def _slot_rows(mask: Tensor) -> Tensor:
    """[n, k] mask -> [n, k] row of each real slot among the real slots (row-major), and the
    count of real slots (the zero row appended after them) for padding."""
    flat = mask.reshape(-1).long()
    rows = torch.cumsum(flat, 0) - 1
    return torch.where(mask.reshape(-1), rows, flat.sum()).reshape(mask.shape)


class PremeanInputs(nn.Module):
    """The same network with the premean input: ``features, idx0..idx{L-1}, last_rows,
    last_mean`` (the exported signature of ``model_premean.onnx``). Mean aggregator and L >= 2
    only: the mean is linear in the raw features, pool and LSTM are not."""

    def __init__(self, dense: DenseGraphSAGE) -> None:
        super().__init__()
        if not supports_premean(dense.cfg):
            raise ValueError(f"the premean input needs the mean aggregator and 2+ layers, not {dense.cfg}")
        self.dense = dense

    def forward(self, features: Tensor, *inputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if len(inputs) != self.dense.cfg.num_layers + 2:
            raise ValueError(f"expected {self.dense.cfg.num_layers} index tensors, last_rows and last_mean")
        return self.dense.run(features, inputs[:-2], (inputs[-2], inputs[-1]))


def supports_premean(cfg: ModelConfig) -> bool:
    return cfg.aggregator == "mean" and cfg.num_layers >= 2
