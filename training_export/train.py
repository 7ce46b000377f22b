"""Training: GraphSAGE (PyG) on mini-batches from the serving sampler, plus a features-only baseline.

Metrics: accuracy (multiclass) or micro-F1 (multilabel) on the validation and test splits; the
features-only MLP is trained on the same splits so that the gain from the graph is measured.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from runners.feature.sampling import sample_tree
from runners.feature.snapshot import GraphSnapshot
from runners.graphsage.model_config import ModelConfig
from training_export.pyg_model import PygGraphSAGE, mfg_tensors


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    epochs: int = 3
    batch_size: int = 512
    lr: float = 0.005
    weight_decay: float = 5e-4
    max_train_nodes: int | None = None  # cap for quick runs; None = the whole split
    eval_nodes: int | None = None  # cap on val/test nodes evaluated; None = all
    seed: int = 0
    threads: int = 2


def _batches(nodes: np.ndarray, size: int, rng: np.random.Generator | None) -> Iterator[np.ndarray]:
    order = rng.permutation(nodes) if rng is not None else nodes
    for lo in range(0, order.size, size):
        yield order[lo : lo + size]


def _loss_fn(task: str) -> Callable[[Tensor, Tensor], Tensor]:
    return nn.functional.cross_entropy if task == "multiclass" else nn.functional.binary_cross_entropy_with_logits


def _targets(snapshot: GraphSnapshot, nodes: np.ndarray) -> Tensor:
    y = np.asarray(snapshot.labels[nodes])
    return torch.from_numpy(y.astype(np.int64 if snapshot.task == "multiclass" else np.float32))


def score(task: str, logits: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy (multiclass) or micro-F1 (multilabel, threshold 0 on logits)."""
    if task == "multiclass":
        return float((logits.argmax(1) == labels).mean())
    pred = logits > 0
    tp = float((pred & (labels > 0)).sum())
    return 2 * tp / max(float(pred.sum() + (labels > 0).sum()), 1.0)


def _limit(nodes: np.ndarray, cap: int | None, seed: int) -> np.ndarray:
    if cap is None or nodes.size <= cap:
        return np.asarray(nodes)
    return np.sort(np.random.default_rng(seed).choice(nodes, size=cap, replace=False))


def predict_graphsage(
    model: PygGraphSAGE, snapshot: GraphSnapshot, nodes: np.ndarray, seed: int, batch_size: int = 1024
) -> np.ndarray:
    model.eval()
    out = []
    with torch.no_grad():
        for i, batch in enumerate(_batches(nodes, batch_size, None)):
            tree = sample_tree(snapshot.indptr, snapshot.indices, batch, model.cfg.fanout, seed=seed + i)
            logits, _ = model(*mfg_tensors(tree, snapshot.feature_rows()))
            out.append(logits.numpy())
    return np.concatenate(out) if out else np.zeros((0, model.cfg.num_classes), np.float32)


def train_graphsage(
    snapshot: GraphSnapshot, cfg: ModelConfig, spec: TrainSpec = TrainSpec(), progress: bool = True
) -> tuple[PygGraphSAGE, dict[str, float]]:
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    model = PygGraphSAGE(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    loss_fn = _loss_fn(cfg.task)
    train_nodes = _limit(snapshot.train, spec.max_train_nodes, spec.seed)
    started = time.perf_counter()
    step = 0
    for epoch in range(spec.epochs):
        model.train()
        bar = tqdm(
            list(_batches(train_nodes, spec.batch_size, rng)),
            desc=f"train {cfg.aggregator} epoch {epoch + 1}/{spec.epochs}",
            disable=not progress,
            unit="batch",
        )
        for batch in bar:
            tree = sample_tree(snapshot.indptr, snapshot.indices, batch, cfg.fanout, seed=spec.seed * 1_000_003 + step)
            logits, _ = model(*mfg_tensors(tree, snapshot.feature_rows()))
            loss = loss_fn(logits, _targets(snapshot, batch))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            bar.set_postfix(loss=f"{loss.item():.3f}")
    metrics = {"train_seconds": round(time.perf_counter() - started, 1)}
    for split in ("val", "test"):
        nodes = _limit(getattr(snapshot, split), spec.eval_nodes, spec.seed + 1)
        logits = predict_graphsage(model, snapshot, nodes, seed=spec.seed + 17)
        metrics[f"{split}_score"] = round(score(cfg.task, logits, np.asarray(snapshot.labels[nodes])), 4)
    return model.eval(), metrics


def train_features_only(
    snapshot: GraphSnapshot, cfg: ModelConfig, spec: TrainSpec = TrainSpec(), progress: bool = True
) -> dict[str, float]:
    """The baseline: an MLP of the same width on each node's own features, no neighbours."""
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    mlp = nn.Sequential(
        nn.Linear(cfg.in_dim, cfg.hidden_dim),
        nn.ReLU(),
        nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden_dim, cfg.num_classes),
    )
    opt = torch.optim.Adam(mlp.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    loss_fn = _loss_fn(cfg.task)
    train_nodes = _limit(snapshot.train, spec.max_train_nodes, spec.seed)
    for _ in tqdm(range(spec.epochs * 3), desc="train features-only baseline", disable=not progress, unit="epoch"):
        mlp.train()
        for batch in _batches(train_nodes, spec.batch_size, rng):
            x = torch.from_numpy(np.asarray(snapshot.features[batch]))
            loss = loss_fn(mlp(x), _targets(snapshot, batch))
            opt.zero_grad()
            loss.backward()
            opt.step()
    mlp.eval()
    metrics = {}
    with torch.no_grad():
        for split in ("val", "test"):
            nodes = _limit(getattr(snapshot, split), spec.eval_nodes, spec.seed + 1)
            logits = mlp(torch.from_numpy(np.asarray(snapshot.features[nodes]))).numpy()
            metrics[f"{split}_score"] = round(score(cfg.task, logits, np.asarray(snapshot.labels[nodes])), 4)
    return metrics
