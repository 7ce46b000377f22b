"""The served form (dense torch, ONNX Runtime) equals the PyG model on the same neighbourhoods."""

import os

import pytest

from runners.graphsage.model_config import AGGREGATORS, ModelConfig
from tests.graphs import small_graph
from training_export.export import PARITY_TOLERANCE, check_parity, export_onnx, to_dense
from training_export.train import TrainSpec, train_graphsage


@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
@pytest.mark.parametrize("aggregator", AGGREGATORS)
def test_parity_per_aggregator(aggregator, task, tmp_path):
    g = small_graph(task=task)
    cfg = ModelConfig(in_dim=g.feature_dim, hidden_dim=32, num_classes=g.num_classes, aggregator=aggregator, task=task)
    model, metrics = train_graphsage(g, cfg, TrainSpec(epochs=1, max_train_nodes=1024, eval_nodes=256), progress=False)
    path = export_onnx(to_dense(model), os.path.join(tmp_path, "m.onnx"))
    result = check_parity(model, path, g, count=128)
    assert result["argmax_equal"], result
    assert result["max_abs_diff_onnx"] <= PARITY_TOLERANCE and result["max_abs_diff_torch"] <= PARITY_TOLERANCE, result
    assert result["passed"]
