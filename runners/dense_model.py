"""The served form of GraphSAGE: fixed-fanout dense tensors instead of scatter over edge lists.

With a fixed fanout per hop the neighbourhood of a batch is a regular tree, so every aggregation
is a reshape plus a masked reduction. That exports cleanly to ONNX (Gather, ReduceSum/Max, LSTM)
and runs well in ONNX Runtime and TensorRT, where PyG's scatter-based SAGEConv does not.

Parameter names equal PyG's ``SAGEConv`` (``convs.{i}.lin_l``, ``lin_r``, ``lin`` for the
pooling projection, ``aggr_module.lstm``), so a trained PyG state dict loads unchanged.

Semantics per aggregator, equal to PyG on the same sampled tree:
- mean: sum of real neighbours / max(count, 1) (0 for no neighbours, as PyG's scatter mean).
- pool: max over relu(W x_j + b); padding contributes 0, which never beats a relu output, and
  gives PyG's 0 for an empty set.
- lstm: an LSTM over the neighbours in sample order, zero-padded to the fanout, last output.

Inputs: ``features [U, F]``, then one int32 index per hop (``[B]``, ``[B, k1]``, ...; -1 = pad).
Outputs: ``logits [B, C]``, ``probs [B, C]`` (softmax or sigmoid), ``embedding [B, H]``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from runners.model_config import ModelConfig


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
        m = mask.unsqueeze(-1)
        if self.aggregator == "mean":
            return (nbr * m).sum(-2) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        if self.aggregator == "pool":
            return (torch.relu(self.lin(nbr)) * m).amax(-2)
        return self.aggr_module(nbr * m)

    def forward(self, root: Tensor, nbr: Tensor, mask: Tensor) -> Tensor:
        return self.lin_l(self.aggregate(nbr, mask)) + self.lin_r(root)


class DenseGraphSAGE(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dims = [cfg.in_dim] + [cfg.hidden_dim] * (cfg.num_layers - 1) + [cfg.num_classes]
        self.convs = nn.ModuleList(
            DenseSAGELayer(dims[i], dims[i + 1], cfg.aggregator) for i in range(cfg.num_layers)
        )

    def forward(self, features: Tensor, *index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if len(index) != self.cfg.num_layers + 1:
            raise ValueError(f"expected {self.cfg.num_layers + 1} index tensors, got {len(index)}")
        masks = [(idx >= 0).to(features.dtype) for idx in index[1:]]
        h = [features[idx.clamp(min=0).long()] for idx in index]
        embedding = h[0]
        for layer_no, conv in enumerate(self.convs):
            h = [conv(h[d], h[d + 1], masks[d]) for d in range(len(h) - 1)]
            if layer_no < len(self.convs) - 1:
                h = [torch.relu(x) for x in h]
                embedding = h[0]
        logits = h[0]
        probs = torch.softmax(logits, -1) if self.cfg.task == "multiclass" else torch.sigmoid(logits)
        return logits, probs, embedding
