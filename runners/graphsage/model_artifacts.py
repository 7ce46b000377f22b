"""The ``graphsage:<version>`` model-store entry: file layout and a torch-free loader.

Layout inside the entry's directory::

    model.onnx         the dense served network (inputs: features, idx0..idxL; outputs:
                       logits, probs, embedding), dynamic batch and node counts
    model_premean.onnx mean aggregator, 2+ layers: the same network with the premean input
                       (features, idx0..idx{L-1}, last_rows, last_mean; runners.graphsage.dense_model.PremeanInputs)
    state_dict.pt      the PyG model's state dict (the dense torch model loads it unchanged)
    config.json        ModelConfig: everything needed to rebuild either model without code
    model.int8.onnx    INT8 (static, QDQ) forms of the two graphs above, when the export made them
    model_premean.int8.onnx  (``--int8``) and they passed the accuracy guard (metadata ``int8``)
    probe.npz          a small sampled FeatureTensor with PyG's logits on it (and each runtime's
                       INT8 probabilities): every backend runs it when it loads the version
    tensorrt/          TensorRT plans, one per (GPU model, TensorRT version, precision); built by
                       the TensorRT export step, never loaded when the key does not match

Metadata: config, graph snapshot tag, metrics, parity result, feature-only baseline, and
``int8``: the guard's figures (FP32 and INT8 validation score per runtime, largest probability
difference from FP32, passed) and whether the INT8 graphs are stored (``training_export.quantize``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from common.bento.store import get_entry
from runners.graphsage.model_config import ModelConfig

MODEL_NAME = "graphsage"
ONNX_FILE = "model.onnx"
ONNX_PREMEAN_FILE = "model_premean.onnx"
STATE_DICT_FILE = "state_dict.pt"
CONFIG_FILE = "config.json"
TENSORRT_DIR = "tensorrt"
INT8_ONNX_FILE = "model.int8.onnx"
INT8_ONNX_PREMEAN_FILE = "model_premean.int8.onnx"
PROBE_FILE = "probe.npz"


@dataclasses.dataclass(frozen=True)
class ModelArtifacts:
    tag: str
    path: str
    config: ModelConfig
    metadata: dict[str, Any]

    @property
    def onnx_path(self) -> str:
        return os.path.join(self.path, ONNX_FILE)

    @property
    def onnx_premean_path(self) -> str:
        return os.path.join(self.path, ONNX_PREMEAN_FILE)

    @property
    def state_dict_path(self) -> str:
        return os.path.join(self.path, STATE_DICT_FILE)

    @property
    def tensorrt_dir(self) -> str:
        return os.path.join(self.path, TENSORRT_DIR)

    @property
    def probe_path(self) -> str:
        return os.path.join(self.path, PROBE_FILE)

    def onnx_graphs(self, precision: str = "fp32") -> dict[str, str]:
        """The stored ONNX graphs of one precision by input layout (``levels``, ``premean``)."""
        names = {"fp32": (ONNX_FILE, ONNX_PREMEAN_FILE), "int8": (INT8_ONNX_FILE, INT8_ONNX_PREMEAN_FILE)}[precision]
        graphs = {"levels": os.path.join(self.path, names[0])}
        premean = os.path.join(self.path, names[1])
        if os.path.exists(premean):
            graphs["premean"] = premean
        return graphs

    def int8_guard(self, runtime: str) -> dict[str, Any] | None:
        """The accuracy guard's figures for ``runtime`` (``onnx``, ``openvino``) when the INT8
        graphs are stored and that runtime was measured at export; else None."""
        int8 = self.metadata.get("int8") or {}
        if not int8.get("stored") or not os.path.exists(os.path.join(self.path, INT8_ONNX_FILE)):
            return None
        return (int8.get("runtimes") or {}).get(runtime)


def load_artifacts(tag: str = f"{MODEL_NAME}:latest") -> ModelArtifacts:
    """Resolve a tag (``:latest`` included) in the model store; raises ``StoreEntryNotFound``."""
    entry = get_entry(tag)
    with open(os.path.join(entry.path, CONFIG_FILE)) as f:
        config = ModelConfig.from_dict(json.load(f))
    return ModelArtifacts(tag=entry.tag, path=entry.path, config=config, metadata=entry.metadata)
