"""GraphSAGE in PyTorch Geometric, trained on message-flow graphs built from our own sampler.

PyG's NeighborLoader needs pyg-lib or torch-sparse (no wheels for this torch), and training must
sample exactly as serving does, so mini-batches come from ``runners.feature.sampling.sample_tree``.
A sampled tree becomes one bipartite edge set per depth (hop d+1 slots -> hop d slots); each
SAGEConv layer runs once per depth, like PyG's "trim to layer" message-flow graphs.

Every slot of the tree is its own node (a node sampled twice appears twice), which is the exact
computation the dense served model performs; ``training_export.export`` checks that they agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.nn import SAGEConv
from torch_geometric.nn.aggr import LSTMAggregation

from runners.graphsage.model_config import ModelConfig


class PaddedLSTMAggregation(LSTMAggregation):
    """PyG's LSTM aggregation, zero-padded to the hop's fanout rather than the batch's longest
    neighbour list, so that a node's output does not depend on which nodes share its batch."""

    pad_to: int | None = None

    def forward(
        self,
        x: Tensor,
        index: Tensor | None = None,
        ptr: Tensor | None = None,
        dim_size: int | None = None,
        dim: int = -2,
        max_num_elements: int | None = None,
    ) -> Tensor:
        return super().forward(x, index, ptr, dim_size, dim, max_num_elements=self.pad_to)


def _conv(in_dim: int, out_dim: int, aggregator: str) -> SAGEConv:
    if aggregator == "mean":
        return SAGEConv(in_dim, out_dim, aggr="mean")
    if aggregator == "pool":
        return SAGEConv(in_dim, out_dim, aggr="max", project=True)
    return SAGEConv(in_dim, out_dim, aggr=PaddedLSTMAggregation(in_dim, in_dim))


class PygGraphSAGE(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dims = [cfg.in_dim] + [cfg.hidden_dim] * (cfg.num_layers - 1) + [cfg.num_classes]
        self.convs = nn.ModuleList(_conv(dims[i], dims[i + 1], cfg.aggregator) for i in range(cfg.num_layers))
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, xs: Sequence[Tensor], edges: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """``xs[d]``: features of the hop-d slots; ``edges[d]``: [2, n_{d+1}] hop d+1 -> hop d.
        Returns (logits of the targets, embedding of the targets before the last layer)."""
        h = list(xs)
        embedding = h[0]
        for layer_no, conv in enumerate(self.convs):
            out = []
            for d in range(len(h) - 1):
                if isinstance(conv.aggr_module, PaddedLSTMAggregation):
                    conv.aggr_module.pad_to = self.cfg.fanout[d]
                out.append(conv((h[d + 1], h[d]), edges[d], size=(h[d + 1].shape[0], h[d].shape[0])))
            if layer_no < len(self.convs) - 1:
                out = [self.dropout(torch.relu(x)) for x in out]
                embedding = out[0]
            h = out
        return h[0], embedding


def tree_to_mfg(tree: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A sampled tree -> (node ids of the real slots per hop, edge_index per depth).

    Real slots keep their order, so each hop's edges are sorted by destination, as PyG's LSTM
    aggregation requires, and each neighbour list keeps the sampler's order.
    """
    ids = [np.asarray(tree[0], dtype=np.int64)]
    rank_prev = np.arange(ids[0].size)
    edges = []
    for t in tree[1:]:
        k = t.shape[-1]
        flat = t.reshape(-1)
        real = np.flatnonzero(flat >= 0)
        parent = rank_prev[real // k]
        ids.append(flat[real])
        edges.append(np.stack([np.arange(real.size), parent]))
        rank = np.full(flat.size, -1, dtype=np.int64)
        rank[real] = np.arange(real.size)
        rank_prev = rank
    return ids, edges


def mfg_tensors(tree: Sequence[np.ndarray], features: np.ndarray) -> tuple[list[Tensor], list[Tensor]]:
    """Gather the features of every real slot and build the torch inputs of ``PygGraphSAGE``."""
    ids, edges = tree_to_mfg(tree)
    xs = [torch.from_numpy(np.ascontiguousarray(features[i], dtype=np.float32)) for i in ids]
    return xs, [torch.from_numpy(e) for e in edges]
