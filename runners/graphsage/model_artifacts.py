"""The ``graphsage:<version>`` model-store entry: file layout and a torch-free loader.

Layout inside the entry's directory::

    model.onnx         the dense served network (inputs: features, idx0..idxL; outputs:
                       logits, probs, embedding), dynamic batch and node counts
    model_premean.onnx mean aggregator, 2+ layers: the same network with the premean input
                       (features, idx0..idx{L-1}, last_rows, last_mean; runners.graphsage.dense_model.PremeanInputs)
    state_dict.pt      the PyG model's state dict (the dense torch model loads it unchanged)
    config.json        ModelConfig: everything needed to rebuild either model without code
    tensorrt/          TensorRT plans, one per (GPU model, TensorRT version, precision); built by
                       the TensorRT export step, never loaded when the key does not match

Metadata: config, graph snapshot tag, metrics, parity result, feature-only baseline.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from runners.graphsage.model_config import ModelConfig

MODEL_NAME = "graphsage"
ONNX_FILE = "model.onnx"
ONNX_PREMEAN_FILE = "model_premean.onnx"
STATE_DICT_FILE = "state_dict.pt"
CONFIG_FILE = "config.json"
TENSORRT_DIR = "tensorrt"


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


def load_artifacts(tag: str = f"{MODEL_NAME}:latest") -> ModelArtifacts:
    """Resolve a tag (``:latest`` included) in the model store; raises bentoml's NotFound."""
    import bentoml

    model = bentoml.models.get(tag)
    with open(os.path.join(model.path, CONFIG_FILE)) as f:
        config = ModelConfig.from_dict(json.load(f))
    return ModelArtifacts(tag=str(model.tag), path=model.path, config=config, metadata=dict(model.info.metadata))
