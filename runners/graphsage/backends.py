"""Inference backends behind one interface: ONNX Runtime (CPU or CUDA), torch (reference).

Each backend runs the dense GraphSAGE on ``features [U, F]`` and one int32 index per hop and
returns ``(logits, probs, embedding)`` as numpy arrays. TensorRT has its slot here (``kind =
"tensorrt"``); it is built by the GPU issue and refused with a clear error until then.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

import numpy as np

from runners.graphsage.model_artifacts import ModelArtifacts

log = logging.getLogger(__name__)
KINDS = ("onnx", "torch", "tensorrt")
Outputs = tuple[np.ndarray, np.ndarray, np.ndarray]


class Backend(Protocol):
    name: str
    supports_premean: bool  # takes the premean input (common.feature_tensor.PREMEAN)

    def run(self, features: np.ndarray, index: list[np.ndarray],
            premean: tuple[np.ndarray, np.ndarray] | None = None) -> Outputs: ...


class OnnxBackend:
    def __init__(self, artifacts: ModelArtifacts, threads: int = 1, device: str = "cpu") -> None:
        import onnxruntime as ort

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
        graphs = {"levels": artifacts.onnx_path}
        if os.path.exists(artifacts.onnx_premean_path):
            graphs["premean"] = artifacts.onnx_premean_path
        self._sessions = {}
        for layout, path in graphs.items():
            self._sessions[layout, np.float32] = ort.InferenceSession(path, sess_options=opts, providers=providers)
            self._sessions[layout, np.float16] = ort.InferenceSession(
                _with_float16_inputs(path), sess_options=opts, providers=providers)
        # The premean graph's signature ends with (last_rows, last_mean); any other is not served.
        premean = self._sessions.get(("premean", np.float32))
        self.supports_premean = premean is not None and [i.name for i in premean.get_inputs()][-2:] == [
            "last_rows", "last_mean"]
        self.session = self._sessions["levels", np.float32]
        self.name = "onnx-" + ("cuda" if providers[0].startswith("CUDA") else "cpu")

    def run(self, features: np.ndarray, index: list[np.ndarray],
            premean: tuple[np.ndarray, np.ndarray] | None = None) -> Outputs:
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


class TorchBackend:
    """The reference: the dense torch model with the PyG state dict."""

    def __init__(self, artifacts: ModelArtifacts, threads: int = 1) -> None:
        import torch

        from runners.graphsage.dense_model import DenseGraphSAGE, supports_premean

        torch.set_num_threads(threads)
        self._torch = torch
        self.model = DenseGraphSAGE(artifacts.config)
        self.model.load_state_dict(torch.load(artifacts.state_dict_path, weights_only=True), strict=True)
        self.model.eval()
        self.supports_premean = supports_premean(artifacts.config)
        self.name = "torch-cpu"

    def run(self, features: np.ndarray, index: list[np.ndarray],
            premean: tuple[np.ndarray, np.ndarray] | None = None) -> Outputs:
        torch = self._torch
        as_tensor = lambda a: torch.from_numpy(a.astype(np.float32, copy=False))  # noqa: E731
        with torch.inference_mode():
            out = self.model.run(as_tensor(features), [torch.from_numpy(i) for i in index],
                                 None if premean is None else (torch.from_numpy(premean[0]), as_tensor(premean[1])))
        return tuple(t.numpy() for t in out)  # type: ignore[return-value]


def load_backend(artifacts: ModelArtifacts, kind: str = "onnx", threads: int = 1) -> Backend:
    if kind == "onnx":
        return OnnxBackend(artifacts, threads)
    if kind == "onnx-cuda":
        return OnnxBackend(artifacts, threads, device="cuda")
    if kind == "torch":
        return TorchBackend(artifacts, threads)
    if kind == "tensorrt":
        raise NotImplementedError("the TensorRT backend needs engines built on a GPU machine (GPU issue); use onnx")
    raise ValueError(f"unknown backend {kind!r}; expected one of {KINDS + ('onnx-cuda',)}")
