"""Inference backends behind one interface: ONNX Runtime (CPU or CUDA), torch (reference).

Each backend runs the dense GraphSAGE on ``features [U, F]`` and one int32 index per hop and
returns ``(logits, probs, embedding)`` as numpy arrays. TensorRT has its slot here (``kind =
"tensorrt"``); it is built by the GPU issue and refused with a clear error until then.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

from runners.model_artifacts import ModelArtifacts

log = logging.getLogger(__name__)
KINDS = ("onnx", "torch", "tensorrt")
Outputs = tuple[np.ndarray, np.ndarray, np.ndarray]


class Backend(Protocol):
    name: str

    def run(self, features: np.ndarray, index: list[np.ndarray]) -> Outputs: ...


class OnnxBackend:
    def __init__(self, artifacts: ModelArtifacts, threads: int = 1, device: str = "cpu") -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # 1 intra-op thread per worker: 2 threads gave 12-32 ms P99 stalls beside other load.
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        providers = ["CPUExecutionProvider"]
        if device == "cuda":
            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers.insert(0, "CUDAExecutionProvider")
            else:
                log.warning("ONNX Runtime CUDA requested but not available; running on CPU")
        self.session = ort.InferenceSession(artifacts.onnx_path, sess_options=opts, providers=providers)
        # The same graph behind a Cast for float16 rows (the default transport): numpy's float16 ->
        # float32 conversion cost ~3 ms per 256-target batch; ONNX Runtime's is vectorised. Exact.
        self.session_f16 = ort.InferenceSession(
            _with_float16_features(artifacts.onnx_path), sess_options=opts, providers=providers)
        self.name = "onnx-" + ("cuda" if providers[0].startswith("CUDA") else "cpu")
        self._index_names = [i.name for i in self.session.get_inputs()[1:]]

    def run(self, features: np.ndarray, index: list[np.ndarray]) -> Outputs:
        if features.dtype == np.float16:
            session, feed = self.session_f16, {F16_INPUT: features}
        else:
            session, feed = self.session, {"features": features.astype(np.float32, copy=False)}
        feed.update(zip(self._index_names, index))
        logits, probs, embedding = session.run(None, feed)
        return logits, probs, embedding


F16_INPUT = "features_f16"


def _with_float16_features(onnx_path: str) -> bytes:
    """The model with a float16 ``features_f16`` input cast to the float32 ``features`` it had."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(onnx_path)
    (inp,) = [i for i in model.graph.input if i.name == "features"]
    inp.name = F16_INPUT
    inp.type.tensor_type.elem_type = TensorProto.FLOAT16
    model.graph.node.insert(0, helper.make_node("Cast", [F16_INPUT], ["features"], to=TensorProto.FLOAT))
    return model.SerializeToString()


class TorchBackend:
    """The reference: the dense torch model with the PyG state dict."""

    def __init__(self, artifacts: ModelArtifacts, threads: int = 1) -> None:
        import torch

        from runners.dense_model import DenseGraphSAGE

        torch.set_num_threads(threads)
        self._torch = torch
        self.model = DenseGraphSAGE(artifacts.config)
        self.model.load_state_dict(torch.load(artifacts.state_dict_path, weights_only=True), strict=True)
        self.model.eval()
        self.name = "torch-cpu"

    def run(self, features: np.ndarray, index: list[np.ndarray]) -> Outputs:
        torch = self._torch
        with torch.inference_mode():
            out = self.model(torch.from_numpy(features.astype(np.float32, copy=False)), *[torch.from_numpy(i) for i in index])
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
