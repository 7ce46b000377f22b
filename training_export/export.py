"""Export: PyG model -> dense served model -> ONNX (and, for the mean aggregator, the graph with
the premean input), parity check, optionally INT8 (``training_export.quantize``: quantised,
calibrated on the training split, behind an accuracy guard), save ``graphsage:<version>``.

Parity runs the PyG model, the dense torch model and ONNX Runtime on the same sampled
neighbourhoods and requires max |logit difference| <= 1e-4 and identical argmax. A small probe
(a sampled FeatureTensor, both layouts, and PyG's logits on it) is stored with the version: every
backend runs it when it loads the version (``runners.graphsage.backends.check_probe``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from typing import Any

import numpy as np
import torch

from common.feature_tensor import LAYOUT, PREMEAN
from runners.feature.sampling import sample_tree
from runners.feature.snapshot import GraphSnapshot
from runners.feature.tree_layout import compact, premean
from runners.graphsage.dense_model import DenseGraphSAGE, PremeanInputs, supports_premean
from runners.graphsage.model_artifacts import (
    CONFIG_FILE,
    INT8_ONNX_FILE,
    INT8_ONNX_PREMEAN_FILE,
    MODEL_NAME,
    ONNX_FILE,
    ONNX_PREMEAN_FILE,
    PROBE_FILE,
    STATE_DICT_FILE,
    TENSORRT_DIR,
)
from runners.graphsage.model_config import ModelConfig
from training_export.pyg_model import PygGraphSAGE, mfg_tensors

PARITY_TOLERANCE = 1e-4
OPSET = 17
PROBE_TARGETS = 16  # the load probe's targets: enough hops and rows to exercise every layer, small enough to store


class ParityError(RuntimeError):
    """The served form does not reproduce the trained model."""


def to_dense(model: PygGraphSAGE) -> DenseGraphSAGE:
    dense = DenseGraphSAGE(model.cfg)
    dense.load_state_dict(model.state_dict(), strict=True)
    return dense.eval()


def export_onnx(dense: DenseGraphSAGE, path: str, premean: bool = False) -> str:
    """The served graph; ``premean``: with the premean input (``PremeanInputs``, mean only)."""
    cfg = dense.cfg
    levels = cfg.num_layers if premean else cfg.num_layers + 1
    index_names = [f"idx{d}" for d in range(levels)]
    # All-real example levels: level d has one row per slot of level d-1.
    example, rows = [torch.zeros(2, dtype=torch.int32)], 2
    for k in cfg.fanout[: levels - 1]:
        example.append(torch.zeros(rows, k, dtype=torch.int32))
        rows *= k
    names = ["features", *index_names]
    dynamic = {
        "features": {0: "num_rows"},
        **{n: {0: f"rows_{n}"} for n in index_names},
        "logits": {0: "batch"},
        "probs": {0: "batch"},
        "embedding": {0: "batch"},
    }
    module: torch.nn.Module = dense
    if premean:
        module = PremeanInputs(dense)
        example += [torch.zeros(rows, dtype=torch.int32), torch.zeros(rows, cfg.in_dim)]
        names += ["last_rows", "last_mean"]
        dynamic.update(last_rows={0: "entries"}, last_mean={0: "entries"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LSTM batch-size warnings of the TorchScript exporter
        torch.onnx.export(
            module,
            (torch.zeros(4, cfg.in_dim), *example),
            path,
            dynamo=False,
            opset_version=OPSET,
            input_names=names,
            output_names=["logits", "probs", "embedding"],
            dynamic_axes=dynamic,
        )
    return path


def export_all(dense: DenseGraphSAGE, directory: str) -> list[str]:
    """Every served graph of the model into ``directory``: ``model.onnx`` and, for the mean
    aggregator with 2+ layers, ``model_premean.onnx``."""
    paths = [export_onnx(dense, os.path.join(directory, ONNX_FILE))]
    if supports_premean(dense.cfg):
        paths.append(export_onnx(dense, os.path.join(directory, ONNX_PREMEAN_FILE), premean=True))
    return paths


def parity_targets(snapshot: GraphSnapshot, count: int, seed: int) -> np.ndarray:
    """Hubs (full fanout at every hop) plus random nodes (low degree, isolated nodes)."""
    deg = snapshot.degrees()
    hubs = np.argsort(-deg, kind="stable")[: max(count // 8, 1)]
    rest = np.random.default_rng(seed).choice(snapshot.num_nodes, size=max(count - hubs.size, 0), replace=False)
    return np.concatenate([hubs, rest]).astype(np.int64)


def _sampled_reference(
    model: PygGraphSAGE, snapshot: GraphSnapshot, count: int, seed: int
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], torch.Tensor]:
    """Targets sampled as ``parity_targets``, their FeatureTensor (float32 rows, one index per hop)
    as the FeatureRunner builds it, and PyG's logits on the same trees. Leaves ``model`` in eval."""
    model.eval()
    targets = parity_targets(snapshot, count, seed)
    tree = sample_tree(snapshot.indptr, snapshot.indices, targets, model.cfg.fanout, seed=seed)
    unique, index = compact(tree)
    feats = np.ascontiguousarray(snapshot.features[unique], dtype=np.float32)
    with torch.no_grad():
        ref, _ = model(*mfg_tensors(tree, snapshot.feature_rows()))
    return targets, feats, index, ref


def check_parity(
    model: PygGraphSAGE,
    onnx_path: str,
    snapshot: GraphSnapshot,
    count: int = 256,
    seed: int = 0,
    premean_path: str | None = None,
) -> dict[str, Any]:
    """PyG vs dense torch vs ONNX Runtime on the same sampled trees; ``premean_path``: also the
    graph with the premean input, fed as the FeatureRunner feeds it (``tree_layout.premean``)."""
    import onnxruntime as ort

    targets, feats, index, ref = _sampled_reference(model, snapshot, count, seed)
    with torch.no_grad():
        dense_logits, _, _ = to_dense(model)(torch.from_numpy(feats), *[torch.from_numpy(i) for i in index])
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    feed = {"features": feats, **{f"idx{d}": idx for d, idx in enumerate(index)}}
    onnx_logits = session.run(["logits"], feed)[0]
    ref_np = ref.numpy()
    result = {
        "targets": int(targets.size),
        "max_abs_diff_torch": float(np.abs(ref_np - dense_logits.numpy()).max()),
        "max_abs_diff_onnx": float(np.abs(ref_np - onnx_logits).max()),
        "argmax_equal": bool(
            (ref_np.argmax(1) == onnx_logits.argmax(1)).all()
            and (ref_np.argmax(1) == dense_logits.numpy().argmax(1)).all()
        ),
        "tolerance": PARITY_TOLERANCE,
    }
    diffs = [result["max_abs_diff_torch"], result["max_abs_diff_onnx"]]
    if premean_path is not None:
        rows, inner, last_rows, last_mean = premean(feats, index, np.full(targets.size, seed))
        session = ort.InferenceSession(premean_path, providers=["CPUExecutionProvider"])
        feed = {
            "features": rows,
            **{f"idx{d}": idx for d, idx in enumerate(inner)},
            "last_rows": last_rows,
            "last_mean": last_mean,
        }
        premean_logits = session.run(["logits"], feed)[0]
        result["max_abs_diff_onnx_premean"] = float(np.abs(ref_np - premean_logits).max())
        result["argmax_equal"] = bool(result["argmax_equal"] and (ref_np.argmax(1) == premean_logits.argmax(1)).all())
        diffs.append(result["max_abs_diff_onnx_premean"])
    result["passed"] = bool(result["argmax_equal"] and max(diffs) <= PARITY_TOLERANCE)
    return result


def make_probe(
    model: PygGraphSAGE, snapshot: GraphSnapshot, count: int = PROBE_TARGETS, seed: int = 1
) -> dict[str, np.ndarray]:
    """The load probe: a sampled FeatureTensor (hubs and random nodes), its premean form where the
    model takes it (``pm_*``), and PyG's logits on it (``ref_logits``)."""
    targets, feats, index, ref = _sampled_reference(model, snapshot, count, seed)
    probe = {"features": feats, **{f"idx{d}": idx for d, idx in enumerate(index)}, "ref_logits": ref.numpy()}
    if supports_premean(model.cfg):
        rows, inner, last_rows, last_mean = premean(feats, index, np.full(targets.size, seed))
        probe.update(
            pm_features=np.ascontiguousarray(rows),
            pm_last_rows=last_rows,
            pm_last_mean=last_mean,
            **{f"pm_idx{d}": idx for d, idx in enumerate(inner)},
        )
    return probe


def save_model(
    model: PygGraphSAGE,
    snapshot_tag: str,
    metrics: dict[str, Any],
    parity: dict[str, Any],
    onnx_dir: str | None = None,
    labels: dict[str, str] | None = None,
    int8: dict[str, Any] | None = None,
) -> str:
    """Write ``graphsage:<version>`` (ONNX graphs, state dict, config, metadata); refuses failed
    parity. ``onnx_dir``: the checked graphs (``export_all``'s, and the INT8 graphs and the probe
    when made), exported afresh when None. ``int8``: the INT8 guard's figures (metadata ``int8``)."""
    import bentoml

    if not parity.get("passed"):
        raise ParityError(f"refusing to save a model that failed parity: {parity}")
    cfg: ModelConfig = model.cfg
    meta = {
        "config": cfg.to_dict(),
        "aggregator": cfg.aggregator,
        "fanout": list(cfg.fanout),
        "feature_dim": cfg.in_dim,
        "num_classes": cfg.num_classes,
        "task": cfg.task,
        "graph_snapshot": snapshot_tag,
        "metrics": metrics,
        "parity": parity,
        "tensorrt_engines": {},
        "input_layout": LAYOUT,
        "input_layouts": [LAYOUT, PREMEAN] if supports_premean(cfg) else [LAYOUT],
        "int8": int8 or {"stored": False},
    }
    with bentoml.models.create(
        MODEL_NAME,
        labels={"aggregator": cfg.aggregator, "task": cfg.task, **(labels or {})},
        metadata=meta,
    ) as entry:
        torch.save(model.state_dict(), os.path.join(entry.path, STATE_DICT_FILE))
        with open(os.path.join(entry.path, CONFIG_FILE), "w") as f:
            json.dump(cfg.to_dict(), f, indent=2)
        if onnx_dir:
            stored = [ONNX_FILE, ONNX_PREMEAN_FILE, PROBE_FILE]
            if int8 and int8.get("stored"):
                stored += [INT8_ONNX_FILE, INT8_ONNX_PREMEAN_FILE]
            for name in stored:
                if os.path.exists(os.path.join(onnx_dir, name)):
                    shutil.copyfile(os.path.join(onnx_dir, name), os.path.join(entry.path, name))
        else:
            export_all(to_dense(model), entry.path)
        os.makedirs(os.path.join(entry.path, TENSORRT_DIR), exist_ok=True)
    return str(entry.tag)


def export_and_verify(
    model: PygGraphSAGE,
    snapshot: GraphSnapshot,
    metrics: dict[str, Any],
    parity_count: int = 256,
    int8: bool = False,
    int8_options: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """ONNX export + parity + load probe (+ INT8 and its guard) + save; returns (model tag,
    parity result). ``int8``: quantise and guard (``quantize.quantize_and_guard``, with
    ``int8_options``); a refusal is logged with its figures, recorded in the metadata, and the
    version saved at FP32 only."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = export_all(to_dense(model), tmp)
        parity = check_parity(
            model, paths[0], snapshot, count=parity_count, premean_path=paths[1] if len(paths) > 1 else None
        )
        probe = make_probe(model, snapshot)
        figures = None
        if int8 and parity["passed"]:
            from training_export.quantize import QuantizationRefused, describe, quantize_and_guard

            try:
                figures = quantize_and_guard(snapshot, model.cfg, tmp, probe, **(int8_options or {}))
                _log(f"INT8 stored: {describe(figures)}")
            except QuantizationRefused as exc:
                figures = exc.figures
                _log(f"{exc}\nthe version is saved at FP32 only")
        np.savez(os.path.join(tmp, PROBE_FILE), **probe)  # type: ignore[arg-type]  # numpy's stub: allow_pickle
        tag = save_model(model, snapshot.tag, metrics, parity, onnx_dir=tmp, int8=figures)
    return tag, parity


def _log(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)
