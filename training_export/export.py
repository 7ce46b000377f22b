"""Export: PyG model -> dense served model -> ONNX, parity check, save ``graphsage:<version>``.

Parity runs the PyG model, the dense torch model and ONNX Runtime on the same sampled
neighbourhoods and requires max |logit difference| <= 1e-4 and identical argmax.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from typing import Any

import numpy as np
import torch

from runners.dense_model import DenseGraphSAGE
from runners.feature_tensor import LAYOUT, compact
from runners.model_artifacts import CONFIG_FILE, MODEL_NAME, ONNX_FILE, STATE_DICT_FILE, TENSORRT_DIR
from runners.model_config import ModelConfig
from runners.sampling import sample_tree
from runners.snapshot import GraphSnapshot
from training_export.pyg_model import PygGraphSAGE, mfg_tensors

PARITY_TOLERANCE = 1e-4
OPSET = 17


class ParityError(RuntimeError):
    """The served form does not reproduce the trained model."""


def to_dense(model: PygGraphSAGE) -> DenseGraphSAGE:
    dense = DenseGraphSAGE(model.cfg)
    dense.load_state_dict(model.state_dict(), strict=True)
    return dense.eval()


def export_onnx(dense: DenseGraphSAGE, path: str) -> str:
    cfg = dense.cfg
    index_names = [f"idx{d}" for d in range(cfg.num_layers + 1)]
    # All-real example levels: level d has one row per slot of level d-1.
    example_index, rows = [torch.zeros(2, dtype=torch.int32)], 2
    for k in cfg.fanout:
        example_index.append(torch.zeros(rows, k, dtype=torch.int32))
        rows *= k
    dynamic = {"features": {0: "num_rows"}, **{n: {0: f"rows_{n}"} for n in index_names},
               "logits": {0: "batch"}, "probs": {0: "batch"}, "embedding": {0: "batch"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LSTM batch-size warnings of the TorchScript exporter
        torch.onnx.export(
            dense, (torch.zeros(4, cfg.in_dim), *example_index), path, dynamo=False, opset_version=OPSET,
            input_names=["features", *index_names], output_names=["logits", "probs", "embedding"],
            dynamic_axes=dynamic,
        )
    return path


def parity_targets(snapshot: GraphSnapshot, count: int, seed: int) -> np.ndarray:
    """Hubs (full fanout at every hop) plus random nodes (low degree, isolated nodes)."""
    deg = snapshot.degrees()
    hubs = np.argsort(-deg, kind="stable")[: max(count // 8, 1)]
    rest = np.random.default_rng(seed).choice(snapshot.num_nodes, size=max(count - hubs.size, 0), replace=False)
    return np.concatenate([hubs, rest]).astype(np.int64)


def check_parity(model: PygGraphSAGE, onnx_path: str, snapshot: GraphSnapshot, count: int = 256,
                 seed: int = 0) -> dict[str, Any]:
    """PyG vs dense torch vs ONNX Runtime on the same sampled trees."""
    import onnxruntime as ort

    model = model.eval()
    dense = to_dense(model)
    targets = parity_targets(snapshot, count, seed)
    tree = sample_tree(snapshot.indptr, snapshot.indices, targets, model.cfg.fanout, seed=seed)
    unique, index = compact(tree)
    feats = np.ascontiguousarray(snapshot.features[unique], dtype=np.float32)
    with torch.no_grad():
        ref, _ = model(*mfg_tensors(tree, snapshot.features))
        dense_logits, _, _ = dense(torch.from_numpy(feats), *[torch.from_numpy(i) for i in index])
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    feed = {"features": feats, **{f"idx{d}": idx for d, idx in enumerate(index)}}
    onnx_logits = session.run(["logits"], feed)[0]
    ref_np = ref.numpy()
    result = {
        "targets": int(targets.size),
        "max_abs_diff_torch": float(np.abs(ref_np - dense_logits.numpy()).max()),
        "max_abs_diff_onnx": float(np.abs(ref_np - onnx_logits).max()),
        "argmax_equal": bool((ref_np.argmax(1) == onnx_logits.argmax(1)).all()
                             and (ref_np.argmax(1) == dense_logits.numpy().argmax(1)).all()),
        "tolerance": PARITY_TOLERANCE,
    }
    result["passed"] = bool(result["argmax_equal"] and max(result["max_abs_diff_torch"], result["max_abs_diff_onnx"]) <= PARITY_TOLERANCE)
    return result


def save_model(model: PygGraphSAGE, snapshot_tag: str, metrics: dict[str, Any], parity: dict[str, Any],
               onnx_path: str | None = None, labels: dict[str, str] | None = None) -> str:
    """Write ``graphsage:<version>`` (ONNX, state dict, config, metadata); refuses failed parity."""
    import bentoml

    if not parity.get("passed"):
        raise ParityError(f"refusing to save a model that failed parity: {parity}")
    cfg: ModelConfig = model.cfg
    meta = {"config": cfg.to_dict(), "aggregator": cfg.aggregator, "fanout": list(cfg.fanout),
            "feature_dim": cfg.in_dim, "num_classes": cfg.num_classes, "task": cfg.task,
            "graph_snapshot": snapshot_tag, "metrics": metrics, "parity": parity,
            "tensorrt_engines": {}, "input_layout": LAYOUT}
    with bentoml.models.create(
        MODEL_NAME,
        labels={"aggregator": cfg.aggregator, "task": cfg.task, **(labels or {})},
        metadata=meta,
    ) as entry:
        torch.save(model.state_dict(), os.path.join(entry.path, STATE_DICT_FILE))
        with open(os.path.join(entry.path, CONFIG_FILE), "w") as f:
            json.dump(cfg.to_dict(), f, indent=2)
        target = os.path.join(entry.path, ONNX_FILE)
        if onnx_path:
            with open(onnx_path, "rb") as src, open(target, "wb") as dst:
                dst.write(src.read())
        else:
            export_onnx(to_dense(model), target)
        os.makedirs(os.path.join(entry.path, TENSORRT_DIR), exist_ok=True)
    return str(entry.tag)


def export_and_verify(model: PygGraphSAGE, snapshot: GraphSnapshot, metrics: dict[str, Any],
                      parity_count: int = 256) -> tuple[str, dict[str, Any]]:
    """ONNX export + parity + save; returns (model tag, parity result)."""
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = export_onnx(to_dense(model), os.path.join(tmp, ONNX_FILE))
        parity = check_parity(model, onnx_path, snapshot, count=parity_count)
        tag = save_model(model, snapshot.tag, metrics, parity, onnx_path=onnx_path)
    return tag, parity
