"""INT8: static quantisation of the exported graphs, calibrated on the training split, behind an
accuracy guard.

- Calibration: FeatureTensors of nodes sampled from the snapshot's *training* split, built the
  way the FeatureRunner builds them (``runners.feature.sampling.sample_tree`` +
  ``runners.feature.tree_layout.compact``, and ``premean`` for the premean graph), one seed per batch.
- Quantisation: ONNX Runtime's ``quantize_static`` in QDQ form: int8 weights per output channel,
  int8 activations (symmetric, MinMax ranges), MatMul and Gemm only (the row gathers, the
  reductions and an LSTM stay float32). One graph per served graph (levels, premean), read by
  ONNX Runtime and by OpenVINO alike. OpenVINO's NNCF was measured instead (``nncf.quantize`` on
  the OpenVINO model): as accurate, but OpenVINO ran its graph slower than this QDQ graph
  (docs/performance.md, "Model runner on CPU: backends and precision") and it needs scipy + scikit-learn at export; it is
  not used.
- Guard: on up to ``GUARD_NODES`` validation nodes, sampled once, every runtime installed here
  (ONNX Runtime; OpenVINO when installed) scores the FP32 and the INT8 graphs on the same
  tensors. A runtime passes when INT8 loses at most ``GUARD_POINTS`` points of the validation
  score (accuracy, micro-F1 for multilabel) on every graph; the figures (scores, points lost,
  largest probability difference from FP32) are stored per runtime in the version's metadata
  (``int8``) and a backend serves INT8 only where its runtime passed. When no runtime passes the
  export refuses the INT8 graphs (``QuantizationRefused``, with the figures); the FP32 version
  is still saved.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
import time
from typing import Any

import numpy as np

from runners.feature.sampling import sample_tree
from runners.feature.snapshot import GraphSnapshot
from runners.feature.tree_layout import compact, premean
from runners.graphsage.model_artifacts import INT8_ONNX_FILE, INT8_ONNX_PREMEAN_FILE, ONNX_FILE, ONNX_PREMEAN_FILE
from runners.graphsage.model_config import ModelConfig

GUARD_POINTS = 0.5  # validation score points (of 100) INT8 may lose against FP32
GUARD_NODES = 2000  # validation nodes the guard scores (all of a smaller split)
CALIBRATION_BATCHES = 8
CALIBRATION_TARGETS = 64  # training nodes per calibration batch
QUANTIZED_OPS = ("MatMul", "Gemm")
GRAPHS = {"levels": (ONNX_FILE, INT8_ONNX_FILE), "premean": (ONNX_PREMEAN_FILE, INT8_ONNX_PREMEAN_FILE)}


class QuantizationRefused(RuntimeError):
    """The INT8 graphs lost more than the guard allows on every runtime; ``figures`` says how much."""

    def __init__(self, figures: dict[str, Any]) -> None:
        self.figures = figures
        super().__init__(f"INT8 refused: {describe(figures)}")


Tensors = tuple[np.ndarray, list[np.ndarray], tuple[np.ndarray, np.ndarray] | None]


def feature_tensors(
    snapshot: GraphSnapshot, cfg: ModelConfig, nodes: np.ndarray, batch: int, seed: int, layout: str
) -> list[Tensors]:
    """``nodes`` in batches as the FeatureRunner sends them: (rows, index, premean inputs or None)."""
    out: list[Tensors] = []
    for n, lo in enumerate(range(0, nodes.size, batch)):
        targets = nodes[lo : lo + batch]
        tree = sample_tree(snapshot.indptr, snapshot.indices, targets, cfg.fanout, seed=seed + n)
        unique, index = compact(tree)
        rows = np.ascontiguousarray(snapshot.features[unique], dtype=np.float32)
        if layout == "premean":
            rows, inner, last_rows, last_mean = premean(rows, index, np.full(targets.size, seed + n))
            out.append((np.ascontiguousarray(rows), inner, (last_rows, last_mean)))
        else:
            out.append((rows, index, None))
    return out


def _feed(names: list[str], t: Tensors) -> dict[str, np.ndarray]:
    return dict(zip(names, [t[0], *t[1], *(t[2] or ())]))


def quantize_graph(src: str, dst: str, calibration: list[Tensors]) -> None:
    """``src`` (FP32 ONNX) -> ``dst`` (INT8 QDQ), ranges from ``calibration``."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    names = [i.name for i in onnx.load(src, load_external_data=False).graph.input]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            t = next(self._it, None)
            return None if t is None else _feed(names, t)

    # No quant_pre_process (the pre-processing ONNX Runtime advises, and warns about, once per
    # graph): it fused lin_l + lin_r into a Gemm with a non-constant bias and, measured once with
    # bench/bench_model.py, was not faster at the same accuracy.
    quiet = _DropRecords("pre-process")
    logging.getLogger().addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory() as tmp:  # the calibrator's augmented model goes here
            quantize_static(
                src,
                dst,
                Reader(),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=list(QUANTIZED_OPS),
                per_channel=True,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                extra_options={
                    "ActivationSymmetric": True,
                    "CalibTensorRangeSymmetric": True,
                    "CalibIntermediateOutputPath": os.path.join(tmp, "augmented.onnx"),
                },
            )
    finally:
        logging.getLogger().removeFilter(quiet)


class _DropRecords(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def runtimes_here() -> list[str]:
    """The runtimes the guard measures: ONNX Runtime, and OpenVINO when it is installed."""
    return ["onnx"] + (["openvino"] if importlib.util.find_spec("openvino") is not None else [])


class _Runner:
    """One graph on one runtime, 1 thread: ``(features, index, premean) -> (logits, probs)``."""

    def __init__(self, runtime: str, path: str) -> None:
        import onnx

        self.names = [i.name for i in onnx.load(path, load_external_data=False).graph.input]
        if runtime == "onnx":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = opts.inter_op_num_threads = 1
            session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
            self._run = lambda feed: session.run(["logits", "probs"], feed)
        else:
            import openvino as ov

            from runners.graphsage.backends import OPENVINO_CONFIG

            core = ov.Core()
            request = core.compile_model(
                core.read_model(path), "CPU", {**OPENVINO_CONFIG, "INFERENCE_NUM_THREADS": 1}
            ).create_infer_request()
            self._run = lambda feed: (lambda out: (out[0], out[1]))(request.infer(feed, share_outputs=False))

    def __call__(self, t: Tensors) -> tuple[np.ndarray, np.ndarray]:
        return self._run(_feed(self.names, t))


def _scores(task: str, runner: _Runner, tensors: list[Tensors], labels: np.ndarray) -> tuple[float, np.ndarray]:
    from training_export.train import score

    logits, probs = zip(*(runner(t) for t in tensors))
    return score(task, np.concatenate(logits), labels), np.concatenate(probs)


def quantize_and_guard(
    snapshot: GraphSnapshot,
    cfg: ModelConfig,
    directory: str,
    probe: dict[str, np.ndarray] | None = None,
    guard_points: float = GUARD_POINTS,
    guard_nodes: int = GUARD_NODES,
    calibration_batches: int = CALIBRATION_BATCHES,
    calibration_targets: int = CALIBRATION_TARGETS,
    seed: int = 0,
    runtimes: list[str] | None = None,
) -> dict[str, Any]:
    """Quantise every FP32 graph in ``directory`` (``export.export_all``'s) next to it and guard
    it; returns the figures (metadata ``int8``). ``probe``: the load probe, to which each
    runtime's INT8 probabilities are added. Raises ``QuantizationRefused`` (INT8 files removed)
    when no runtime passes."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    train = np.asarray(snapshot.train)
    calib_nodes = rng.choice(train, size=min(train.size, calibration_batches * calibration_targets), replace=False)
    val = np.asarray(snapshot.val)
    val = np.sort(rng.choice(val, size=guard_nodes, replace=False)) if val.size > guard_nodes else val
    labels = np.asarray(snapshot.labels[val])
    runtimes = runtimes or runtimes_here()
    figures: dict[str, Any] = {
        "stored": False,
        "guard_points": guard_points,
        "metric": "accuracy" if cfg.task == "multiclass" else "micro_f1",
        "validation_nodes": int(val.size),
        "calibration": {
            "split": "train",
            "targets": int(calib_nodes.size),
            "batches": calibration_batches,
            "method": "MinMax",
            "format": "QDQ",
            "weights": "int8 per channel",
            "activations": "int8",
            "ops": list(QUANTIZED_OPS),
        },
        "runtimes": {rt: {"passed": True} for rt in runtimes},
        "bytes": {},
    }
    written = []
    for layout, (fp32_file, int8_file) in GRAPHS.items():
        src = os.path.join(directory, fp32_file)
        if not os.path.exists(src):
            continue
        dst = os.path.join(directory, int8_file)
        quantize_graph(src, dst, feature_tensors(snapshot, cfg, calib_nodes, calibration_targets, seed + 1, layout))
        written.append(dst)
        figures["bytes"][layout] = {"fp32": os.path.getsize(src), "int8": os.path.getsize(dst)}
        tensors = feature_tensors(snapshot, cfg, val, 256, seed + 2, layout)
        probe_t = _probe_tensors(probe, layout, cfg) if probe is not None else None
        for rt in runtimes:
            fp32_score, fp32_probs = _scores(cfg.task, _Runner(rt, src), tensors, labels)
            int8_runner = _Runner(rt, dst)
            int8_score, int8_probs = _scores(cfg.task, int8_runner, tensors, labels)
            points = 100.0 * (fp32_score - int8_score)
            fig = figures["runtimes"][rt]
            prefix = "" if layout == "levels" else "premean_"
            fig.update(
                {
                    f"{prefix}fp32_val_score": round(fp32_score, 4),
                    f"{prefix}int8_val_score": round(int8_score, 4),
                    f"{prefix}points_lost": round(points, 3),
                    f"{prefix}max_prob_diff": float(np.abs(int8_probs - fp32_probs).max()),
                }
            )
            fig["passed"] = bool(fig["passed"] and points <= guard_points)
            if probe is not None and probe_t is not None:
                probe[f"int8_probs_{prefix}{rt}"] = int8_runner(probe_t)[1]
    figures["seconds"] = round(time.perf_counter() - started, 1)
    if not any(f["passed"] for f in figures["runtimes"].values()):
        for path in written:
            os.remove(path)
        if probe is not None:
            for key in [k for k in probe if k.startswith("int8_")]:
                del probe[key]
        figures["refused"] = f"INT8 lost more than {guard_points:g} points on every runtime"
        raise QuantizationRefused(figures)
    figures["stored"] = True
    return figures


def _probe_tensors(probe: dict[str, np.ndarray], layout: str, cfg: ModelConfig) -> Tensors | None:
    levels = cfg.num_layers + 1
    if layout == "levels":
        return probe["features"], [probe[f"idx{d}"] for d in range(levels)], None
    if "pm_features" not in probe:
        return None
    return (
        probe["pm_features"],
        [probe[f"pm_idx{d}"] for d in range(levels - 1)],
        (probe["pm_last_rows"], probe["pm_last_mean"]),
    )


def describe(figures: dict[str, Any]) -> str:
    """One line per runtime: the guard's figures."""
    parts = []
    for rt, f in figures.get("runtimes", {}).items():
        graphs = [
            f"{'premean' if p else 'levels'} {f.get(p + 'fp32_val_score')} -> {f.get(p + 'int8_val_score')} "
            f"({_points(f[p + 'points_lost'])}), max |prob diff| {f.get(p + 'max_prob_diff', float('nan')):.3g}"
            for p in ("", "premean_")
            if p + "int8_val_score" in f
        ]
        parts.append(f"{rt}: {'passed' if f.get('passed') else 'FAILED'} ({'; '.join(graphs)})")
    return (
        f"{figures.get('metric')} on {figures.get('validation_nodes')} validation nodes, guard "
        f"{figures.get('guard_points')} points: " + " | ".join(parts)
    )


def _points(lost: float) -> str:
    return f"{lost} points lost" if lost >= 0 else f"{-lost} points gained"
