import numpy as np
import pytest

from runners.feature.snapshot import load_snapshot, save_snapshot
from runners.graphsage.model_artifacts import load_artifacts
from runners.graphsage.model_config import ModelConfig
from tests.graphs import small_graph
from training_export.export import ParityError, export_and_verify, save_model
from training_export.train import TrainSpec, train_graphsage


def test_snapshot_round_trip_by_tag_and_latest(model_store):
    g = small_graph()
    tag = save_snapshot(g)
    for ref in (tag, "graph-snapshot:latest"):
        loaded = load_snapshot(ref)
        assert loaded.tag == tag
        assert isinstance(loaded.features.base, np.memmap) and isinstance(
            loaded.indices.base, np.memmap
        )  # mapped, as ndarray views
        np.testing.assert_array_equal(loaded.features, g.features)
        np.testing.assert_array_equal(loaded.indptr, g.indptr)
        assert loaded.metadata()["num_edges"] == g.num_edges


def test_two_model_versions_coexist(model_store):
    g = small_graph()
    save_snapshot(g)
    tags = []
    for aggregator in ("mean", "pool"):
        cfg = ModelConfig(in_dim=128, hidden_dim=16, num_classes=g.num_classes, aggregator=aggregator)
        model, metrics = train_graphsage(
            g, cfg, TrainSpec(epochs=1, max_train_nodes=512, eval_nodes=128), progress=False
        )
        tag, parity = export_and_verify(model, g, metrics, parity_count=64)
        assert parity["passed"]
        tags.append(tag)
    assert tags[0] != tags[1]
    first, latest = load_artifacts(tags[0]), load_artifacts("graphsage:latest")
    assert first.config.aggregator == "mean" and latest.tag == tags[1] and latest.config.aggregator == "pool"
    assert latest.metadata["graph_snapshot"] == g.tag and latest.metadata["parity"]["passed"]
    with open(first.onnx_path, "rb") as f:
        assert len(f.read()) > 1000


def test_refuses_to_save_a_model_that_failed_parity(model_store):
    g = small_graph()
    cfg = ModelConfig(in_dim=128, hidden_dim=16, num_classes=g.num_classes)
    model, _ = train_graphsage(g, cfg, TrainSpec(epochs=1, max_train_nodes=256, eval_nodes=64), progress=False)
    with pytest.raises(ParityError):
        save_model(model, "graph-snapshot:x", {}, {"passed": False, "max_abs_diff_onnx": 1.0})
