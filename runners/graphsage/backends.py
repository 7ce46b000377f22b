"""Inference backends behind one interface: ONNX Runtime (CPU or CUDA), OpenVINO (CPU), torch
(reference).

Each backend runs the dense GraphSAGE on ``features [U, F]`` and one int32 index per hop and
returns ``(logits, probs, embedding)`` as numpy arrays. TensorRT has its slot here (``kind =
"tensorrt"``); it is built by the GPU issue and refused with a clear error until then.

Precision: ``fp32`` (the exported graphs) or ``int8`` (the statically quantised QDQ graphs that
``training_export.quantize`` stores with a version, ONNX Runtime and OpenVINO on CPU only). A
version is served at INT8 only where its export measured the INT8 graph *on that runtime* and it
passed the accuracy guard (metadata ``int8.runtimes.<runtime>.passed``); otherwise it is served
at FP32 and the log says why. Every backend reports the precision it serves (``precision``; the
answers carry it).

Load check: ``load_backend`` runs the version's stored probe (``probe.npz``: a sampled
FeatureTensor and PyG's logits on it) through the new backend: FP32 must reproduce PyG within
``PARITY_TOLERANCE`` with identical labels (else the version is refused), INT8 must reproduce
the exporter's INT8 probabilities of the same runtime within ``INT8_LOAD_TOLERANCE`` (else FP32).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Protocol

import numpy as np

from common.settings import BACKENDS, PRECISIONS
from runners.graphsage.model_artifacts import ModelArtifacts

log = logging.getLogger(__name__)
# The backends that can serve the INT8 graph, by the runtime the export measured it on.
INT8_RUNTIMES = {"onnx": "onnx", "openvino": "openvino"}
Outputs = tuple[np.ndarray, np.ndarray, np.ndarray]
PARITY_TOLERANCE = 1e-4  # = training_export.export.PARITY_TOLERANCE (max |logit difference| vs PyG)
# The same INT8 graph on the same runtime gives the exporter's probabilities bit for bit on the
# same CPU; a CPU with other integer instructions (no VNNI) may round a few activations apart.
INT8_LOAD_TOLERANCE = 5e-3


class BackendUnavailable(RuntimeError):
    """The package a backend needs is not installed here."""


class LoadCheckError(RuntimeError):
    """A backend does not reproduce the version's stored probe (PyG's answers) at FP32."""


class Backend(Protocol):
    name: str
    precision: str  # "fp32" or "int8": what this backend serves
    supports_premean: bool  # takes the premean input (common.feature_tensor.PREMEAN)

    def run(
        self, features: np.ndarray, index: list[np.ndarray], premean: tuple[np.ndarray, np.ndarray] | None = None
    ) -> Outputs: ...


def _require(module: str, kind: str, hint: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailable(
            f"the {kind} backend needs the {module!r} package, which is not installed here ({exc}): {hint}"
        ) from exc


def _premean_signature(names: list[str]) -> bool:
    """The premean graph's signature ends with (last_rows, last_mean); any other is not served."""
    return names[-2:] == ["last_rows", "last_mean"]


class OnnxBackend:
    runtime = "onnx"

    def __init__(
        self, artifacts: ModelArtifacts, threads: int = 1, device: str = "cpu", precision: str = "fp32"
    ) -> None:
        ort = _require("onnxruntime", "onnx", "pip install onnxruntime")

        opts = ort.SessionOptions()
        # 1 intra-op thread per worker: 2 threads gave P99 stalls beside other load (measure with
        # python -m bench.suite.ab --variant GSAGE_INTRA_OP_THREADS=2 --variant-model-runner).
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        providers = ["CPUExecutionProvider"]
        if device == "cuda":
            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers.insert(0, "CUDAExecutionProvider")
            else:
                log.warning("ONNX Runtime CUDA requested but not available; running on CPU")
        # Per input layout: the graph as exported (float32 rows) and the same graph behind a Cast
        # for float16 rows (the default transport): numpy's float16 -> float32 conversion was a
        # visible cost on bulk batches; ONNX Runtime's is vectorised. Exact. No benchmark compares
        # the two (bench/bench_premean.py times decode + run_batch on float16 rows, Cast included).
        self._sessions: dict[tuple[str, type[np.floating[Any]]], Any] = {}
        for layout, path in artifacts.onnx_graphs(precision).items():
            self._sessions[layout, np.float32] = ort.InferenceSession(path, sess_options=opts, providers=providers)
            self._sessions[layout, np.float16] = ort.InferenceSession(
                _with_float16_inputs(path), sess_options=opts, providers=providers
            )
        premean = self._sessions.get(("premean", np.float32))
        self.supports_premean = premean is not None and _premean_signature([i.name for i in premean.get_inputs()])
        self.session = self._sessions["levels", np.float32]
        self.precision = precision
        self.name = "onnx-" + ("cuda" if providers[0].startswith("CUDA") else "cpu")

    def run(
        self, features: np.ndarray, index: list[np.ndarray], premean: tuple[np.ndarray, np.ndarray] | None = None
    ) -> Outputs:
        """``premean``: (last_rows, last_mean) of the premean layout."""
        half = features.dtype == np.float16
        session = self._sessions["levels" if premean is None else "premean", np.float16 if half else np.float32]
        inputs = [features, *index, *(premean or ())]
        if not half:
            inputs = [a.astype(np.float32, copy=False) if a.dtype.kind == "f" else a for a in inputs]
        feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
        logits, probs, embedding = session.run(None, feed)
        return logits, probs, embedding


F16_SUFFIX = "_f16"
FLOAT_INPUTS = ("features", "last_mean")


def _with_float16_inputs(onnx_path: str) -> bytes:
    """The model with each float32 row input (``features``, ``last_mean``) taken as float16
    (``<name>_f16``) and cast to the float32 input it had."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(onnx_path)
    for inp in [i for i in model.graph.input if i.name in FLOAT_INPUTS]:
        name = inp.name
        inp.name = name + F16_SUFFIX
        inp.type.tensor_type.elem_type = TensorProto.FLOAT16
        model.graph.node.insert(0, helper.make_node("Cast", [inp.name], [name], to=TensorProto.FLOAT))
    return model.SerializeToString()


# OpenVINO's CPU plugin, one inference thread on the calling process's cores. f32 inference
# precision explicitly: on a CPU with bf16 (AVX512-BF16, AMX) its default is bf16, which moves
# logits far past the parity tolerance (the load probe, ``check_probe``, would refuse it). No core pinning: the model runner shares its cores with
# the gateway and the FeatureRunner (ONNX Runtime does not pin either).
OPENVINO_CONFIG = {
    "PERFORMANCE_HINT": "LATENCY",
    "NUM_STREAMS": 1,
    "INFERENCE_PRECISION_HINT": "f32",
    "ENABLE_CPU_PINNING": False,
}


class OpenVinoBackend:
    """OpenVINO on CPU, reading the stored ONNX graphs (levels and premean; FP32 or INT8 QDQ)."""

    runtime = "openvino"

    def __init__(self, artifacts: ModelArtifacts, threads: int = 1, precision: str = "fp32") -> None:
        ov = _require(
            "openvino",
            "openvino",
            "pip install 'graphsage-serving[openvino]' (or pip install openvino), or use GSAGE_BACKEND=onnx",
        )
        core = ov.Core()
        config = {**OPENVINO_CONFIG, "INFERENCE_NUM_THREADS": threads}
        self._requests: dict[tuple[str, bool], Any] = {}
        names: dict[str, list[str]] = {}
        for layout, path in artifacts.onnx_graphs(precision).items():
            for half in (False, True):
                model = core.read_model(path)
                names[layout] = [p.get_any_name() for p in model.inputs]
                if half:  # float16 rows (the default transport) widened inside OpenVINO, as ONNX Runtime's Cast
                    ppp = ov.preprocess.PrePostProcessor(model)
                    for name in FLOAT_INPUTS:
                        if name in names[layout]:
                            ppp.input(name).tensor().set_element_type(ov.Type.f16)
                            ppp.input(name).preprocess().convert_element_type(ov.Type.f32)
                    model = ppp.build()
                self._requests[layout, half] = core.compile_model(model, "CPU", config).create_infer_request()
        self.supports_premean = "premean" in names and _premean_signature(names["premean"])
        # An infer request runs one call at a time; the runner runs one batch at a time per worker,
        # the lock only keeps a stray second caller (a test, an admin load's check) correct.
        self._lock = threading.Lock()
        self.precision = precision
        self.name = "openvino-cpu"

    def run(
        self, features: np.ndarray, index: list[np.ndarray], premean: tuple[np.ndarray, np.ndarray] | None = None
    ) -> Outputs:
        half = features.dtype == np.float16
        inputs = [features, *index, *(premean or ())]
        if not half:
            inputs = [a.astype(np.float32, copy=False) if a.dtype.kind == "f" else a for a in inputs]
        # share_inputs: OpenVINO reads the arrays in place instead of copying them on every call.
        inputs = [np.ascontiguousarray(a) for a in inputs]
        request = self._requests["levels" if premean is None else "premean", half]
        with self._lock:
            out = request.infer(inputs, share_inputs=True, share_outputs=False)
            return out[0], out[1], out[2]


class TorchBackend:
    """The reference: the dense torch model with the PyG state dict."""

    runtime = "torch"

    def __init__(self, artifacts: ModelArtifacts, threads: int = 1) -> None:
        torch = _require(
            "torch",
            "torch",
            "the serving image does not ship torch (it is the reference backend "
            "for development: pip install torch); serve with GSAGE_BACKEND=onnx",
        )

        from runners.graphsage.dense_model import DenseGraphSAGE, supports_premean

        torch.set_num_threads(threads)
        self._torch = torch
        self.model = DenseGraphSAGE(artifacts.config)
        self.model.load_state_dict(torch.load(artifacts.state_dict_path, weights_only=True), strict=True)
        self.model.eval()
        self.supports_premean = supports_premean(artifacts.config)
        self.precision = "fp32"
        self.name = "torch-cpu"

    def run(
        self, features: np.ndarray, index: list[np.ndarray], premean: tuple[np.ndarray, np.ndarray] | None = None
    ) -> Outputs:
        torch = self._torch
        as_tensor = lambda a: torch.from_numpy(a.astype(np.float32, copy=False))  # noqa: E731
        with torch.inference_mode():
            out = self.model.run(
                as_tensor(features),
                [torch.from_numpy(i) for i in index],
                None if premean is None else (torch.from_numpy(premean[0]), as_tensor(premean[1])),
            )
        return tuple(t.numpy() for t in out)  # type: ignore[return-value]


def _construct(artifacts: ModelArtifacts, kind: str, threads: int, precision: str) -> Backend:
    if kind == "onnx":
        return OnnxBackend(artifacts, threads, precision=precision)
    if kind == "onnx-cuda":
        return OnnxBackend(artifacts, threads, device="cuda")
    if kind == "openvino":
        return OpenVinoBackend(artifacts, threads, precision=precision)
    if kind == "torch":
        return TorchBackend(artifacts, threads)
    if kind == "tensorrt":
        raise NotImplementedError("the TensorRT backend needs engines built on a GPU machine (GPU issue); use onnx")
    raise ValueError(f"unknown backend {kind!r}; expected one of {BACKENDS}")


def int8_refusal(artifacts: ModelArtifacts, kind: str) -> str | None:
    """Why ``kind`` cannot serve this version at INT8 (None: it can)."""
    runtime = INT8_RUNTIMES.get(kind)
    if runtime is None:
        return f"the {kind} backend serves FP32 only (INT8: {', '.join(INT8_RUNTIMES)})"
    int8 = artifacts.metadata.get("int8") or {}
    if not int8.get("stored"):
        return "its export stored no INT8 graph" + (
            f" ({int8['refused']})" if int8.get("refused") else " (export with --int8)"
        )
    guard = artifacts.int8_guard(runtime)
    if guard is None:
        return f"its INT8 graph was not measured on {runtime} at export (re-export with {runtime} installed)"
    if not guard.get("passed"):
        return f"its INT8 graph failed the accuracy guard on {runtime}: {guard}"
    return None


def load_backend(
    artifacts: ModelArtifacts, kind: str = "onnx", threads: int = 1, precision: str = "fp32", check: bool = True
) -> Backend:
    """The backend ``kind`` for a version at ``precision`` (INT8 where the version allows it on
    this runtime, else FP32: see the module), checked on the version's probe unless ``check`` is
    False. Raises ``BackendUnavailable`` when the backend's package is missing, ``LoadCheckError``
    when the FP32 answers do not reproduce PyG's."""
    if kind not in BACKENDS:
        raise ValueError(f"unknown backend {kind!r}; expected one of {BACKENDS}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    if precision == "int8":
        reason = int8_refusal(artifacts, kind)
        if reason is not None:
            log.warning("%s: serving FP32 on %s, not INT8: %s", artifacts.tag, kind, reason)
            precision = "fp32"
    backend = _construct(artifacts, kind, threads, precision)
    if check:
        try:
            backend.load_check = check_probe(backend, artifacts)  # type: ignore[attr-defined]
        except LoadCheckError as exc:
            if precision == "fp32":
                raise
            log.warning("%s: serving FP32 on %s, not INT8: %s", artifacts.tag, kind, exc)
            backend = _construct(artifacts, kind, threads, "fp32")
            backend.load_check = check_probe(backend, artifacts)  # type: ignore[attr-defined]
    return backend


def check_probe(backend: Backend, artifacts: ModelArtifacts) -> dict[str, Any]:
    """Run the stored probe through ``backend`` (both layouts it serves) and compare: FP32 with
    PyG's logits, INT8 with the exporter's INT8 probabilities of the same runtime. Returns the
    figures; raises ``LoadCheckError``. A version exported before probes existed is not checked."""
    if not os.path.exists(artifacts.probe_path):
        return {"checked": False, "reason": "no probe stored (exported before load checks)"}
    with np.load(artifacts.probe_path) as z:
        probe = {k: z[k] for k in z.files}
    levels = artifacts.config.num_layers + 1
    cases: list[tuple[str, Any, list[Any], tuple[Any, Any] | None]] = [
        ("levels", probe["features"], [probe[f"idx{d}"] for d in range(levels)], None)
    ]
    if backend.supports_premean and "pm_features" in probe:
        cases.append(
            (
                "premean",
                probe["pm_features"],
                [probe[f"pm_idx{d}"] for d in range(levels - 1)],
                (probe["pm_last_rows"], probe["pm_last_mean"]),
            )
        )
    runtime = getattr(backend, "runtime", backend.name)
    figures: dict[str, Any] = {"checked": True, "precision": backend.precision}
    for layout, features, index, premean in cases:
        logits, probs, _ = backend.run(features, index, premean)
        if backend.precision == "fp32":
            ref = probe["ref_logits"]
            diff = float(np.abs(logits - ref).max()) if ref.size else 0.0
            same = bool((logits.argmax(1) == ref.argmax(1)).all())
            figures[f"{layout}_max_abs_diff_vs_pyg"] = diff
            if not (diff <= PARITY_TOLERANCE and same):
                raise LoadCheckError(
                    f"{artifacts.tag} on {backend.name}: the {layout} graph does not reproduce PyG on "
                    f"the stored probe (max |logit diff| {diff:.2e} > {PARITY_TOLERANCE:g} or labels "
                    f"differ: {not same})"
                )
        else:
            key = f"int8_probs_{'premean_' if layout == 'premean' else ''}{runtime}"
            if key not in probe:
                raise LoadCheckError(f"the probe holds no INT8 answers of {runtime} ({key})")
            diff = float(np.abs(probs - probe[key]).max()) if probs.size else 0.0
            figures[f"{layout}_max_prob_diff_vs_export"] = diff
            if diff > INT8_LOAD_TOLERANCE:
                raise LoadCheckError(
                    f"{artifacts.tag} on {backend.name}: the INT8 {layout} graph gives probabilities "
                    f"{diff:.2e} from the exporter's (> {INT8_LOAD_TOLERANCE:g}; another CPU's integer "
                    f"kernels?)"
                )
    return figures
