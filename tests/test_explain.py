"""Explained predictions (``runners.feature.explain``) without a server.

The neighbourhood an explanation names is the sampler's for the same seed; each leave-one-out
variant is the tree the sampler draws on the graph without that edge (where that is exact: a
target whose whole neighbour list fits the fanout); each hop-1 neighbour's influence is PyG's
answer on the tree minus PyG's answer on the tree without that neighbour, per aggregator and for
a multilabel model, from one forward pass of the model runner's core; the gateway renders one
explanation over HTTP (JSON) and gRPC alike, and never merges an explained request with others.
"""

from __future__ import annotations

import asyncio
import functools
import types

import numpy as np
import pytest
import torch

from common import wire
from common.breaker import CircuitBreaker
from common.feature_runner_api import ExplainTooLarge, check_explain_size
from common.feature_tensor import FeatureTensor, to_padded
from common.settings import Settings
from runners.feature.explain import PAD, explain, neighbourhood, with_variants
from runners.feature.neighbourhood import NeighbourhoodBuilder
from runners.feature.sampling import sample_tree
from runners.feature.snapshot import GraphSnapshot
from runners.graphsage.inference import InferenceItem, run_batch
from runners.graphsage.model_config import ModelConfig
from services.answer import Answer, from_wire
from services.prediction import PredictionCore
from services.protocol import PredictRequest, PredictResponse
from tests.graphs import feature_store, small_graph
from tests.virtual_time import run
from training_export.export import export_onnx, to_dense
from training_export.pyg_model import PygGraphSAGE, mfg_tensors
from training_export.train import TrainSpec, train_graphsage

FANOUT = (25, 10)
SEED = 20240607
TOL = 1e-4  # ONNX Runtime against PyG (training_export.export.PARITY_TOLERANCE)


def tensor_of(
    graph: GraphSnapshot, ids: list[int], fanout: tuple[int, ...] = FANOUT, seed: int = SEED
) -> FeatureTensor:
    """The FeatureRunner's tensor for one request (float32 rows: PyG sees the same numbers)."""
    store = feature_store(Settings(), graph.features, "graph-snapshot:test")
    builder = NeighbourhoodBuilder(graph, store, FANOUT, max_nodes=64)
    return asyncio.run(builder.build([builder.validate(ids, list(fanout), seed)]))[0]


def targets(graph: GraphSnapshot) -> list[int]:
    """A hub (every slot full), two nodes under the fanout (empty slots), an isolated node (no
    neighbour at all) and a repeat."""
    deg = graph.degrees()
    hub = int(np.argmax(deg))
    low = [int(v) for v in np.flatnonzero((deg > 2) & (deg < FANOUT[0]))[:2]]
    isolated = [int(v) for v in np.flatnonzero(deg == 0)[:1]]
    return [hub, *low, *isolated, low[0]]


def without_slot(tree: list[np.ndarray], b: int, j: int) -> list[np.ndarray]:
    """Target ``b``'s sampled tree with hop-1 slot ``j`` (and its subtree) removed and the later
    slots moved up: as the sampler writes a node whose list lacks that neighbour."""
    out = [tree[0][b : b + 1]]
    for level in tree[1:]:
        kept = np.delete(level[b], j, axis=0)
        out.append(np.concatenate([kept, np.full_like(level[b][:1], PAD)])[None])
    return out


def ids_of(ft: FeatureTensor, index: list[np.ndarray]) -> list[np.ndarray]:
    return [np.where(level >= 0, ft.node_ids[np.maximum(level, 0)], PAD) for level in to_padded(index)]


@pytest.mark.parametrize("fanout", [FANOUT, (5, 3)], ids=["25,10", "5,3"])
def test_explained_neighbourhood_is_what_the_sampler_drew(fanout):
    g = small_graph()
    ids = targets(g)
    hop1, hop2 = neighbourhood(tensor_of(g, ids, fanout))
    tree = sample_tree(g.indptr, g.indices, np.array(ids), fanout, seed=SEED)
    np.testing.assert_array_equal(hop1, tree[1])
    np.testing.assert_array_equal(hop2, tree[2])
    assert (hop1 == PAD).any() and (hop1 >= 0).any()  # empty slots (degree under the fanout) and real ones
    other = neighbourhood(tensor_of(g, ids, fanout, seed=SEED + 1))[0]
    assert not np.array_equal(other, hop1)  # the seed decides


def test_each_variant_is_the_tree_without_one_neighbour():
    g = small_graph()
    ids = targets(g)
    ft = tensor_of(g, ids)
    tree = sample_tree(g.indptr, g.indices, np.array(ids), FANOUT, seed=SEED)
    v = with_variants(ft)
    v.tensor.validate()
    assert v.tensor.features is ft.features  # the variants add index rows, never feature rows
    assert v.tensor.num_targets == len(ids) + int((tree[1] >= 0).sum())
    got = ids_of(ft, v.tensor.index)
    for level, want in zip(got, tree):  # the originals come first, unchanged
        np.testing.assert_array_equal(level[: len(ids)], want)
    for n, (b, j) in enumerate(zip(v.target.tolist(), v.slot.tolist())):
        for level, want in zip(got, without_slot(tree, b, j)):
            np.testing.assert_array_equal(level[len(ids) + n], want[0])


def test_a_left_out_neighbour_is_the_edge_removed_from_the_graph():
    """For a target whose neighbour list fits the fanout, the sampler takes the whole list, so
    the variant is exactly the sampler's tree on the graph without that (undirected) edge."""
    g = small_graph()
    deg = g.degrees()
    b = int(np.flatnonzero((deg > 3) & (deg < FANOUT[0]))[0])
    ft = tensor_of(g, [b])
    v = with_variants(ft)
    got = ids_of(ft, v.tensor.index)
    nbrs = g.indices[g.indptr[b] : g.indptr[b + 1]]
    assert len(set(nbrs.tolist())) == nbrs.size and b not in nbrs  # no multi-edge, no self-loop
    for n, j in enumerate(v.slot.tolist()):
        indptr, indices = _remove_edge(g, b, int(ft.node_ids[ft.index[1][0, j]]))
        want = sample_tree(indptr, indices, np.array([b]), FANOUT, seed=SEED)
        for level, w in zip(got, want):
            np.testing.assert_array_equal(level[1 + n], w[0])


def _remove_edge(g: GraphSnapshot, u: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """The CSR without the undirected edge u-w (both directions), order otherwise kept."""
    src = np.repeat(np.arange(g.indptr.size - 1), np.diff(g.indptr))
    keep = ~(((src == u) & (g.indices == w)) | ((src == w) & (g.indices == u)))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(src[keep], minlength=g.indptr.size - 1))])
    return indptr.astype(g.indptr.dtype), np.ascontiguousarray(g.indices[keep])


@functools.cache
def trained(aggregator: str, task: str) -> PygGraphSAGE:
    g = small_graph(task=task)
    cfg = ModelConfig(in_dim=g.feature_dim, hidden_dim=16, num_classes=g.num_classes, aggregator=aggregator, task=task)
    model, _ = train_graphsage(g, cfg, TrainSpec(epochs=1, max_train_nodes=256, eval_nodes=32), progress=False)
    return model.eval()


class CountingOnnx:
    """The model runner's backend interface over an ONNX Runtime session, counting forward passes."""

    name, precision, supports_premean = "onnx-cpu", "fp32", False

    def __init__(self, path: str) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.calls = 0

    def run(self, features, index, premean=None):
        self.calls += 1
        feed = {"features": features.astype(np.float32), **{f"idx{d}": i for d, i in enumerate(index)}}
        return tuple(self.session.run(None, feed))


def pyg_probs(model: PygGraphSAGE, tree: list[np.ndarray], features: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        logits, _ = model(*mfg_tensors(tree, features))
    return (torch.softmax(logits, -1) if model.cfg.task == "multiclass" else torch.sigmoid(logits)).numpy()


@pytest.mark.parametrize(
    ("aggregator", "task"),
    [("mean", "multiclass"), ("pool", "multiclass"), ("lstm", "multiclass"), ("mean", "multilabel")],
)
def test_influence_is_pygs_answer_with_the_neighbour_left_out(aggregator, task, tmp_path):
    g = small_graph(task=task)
    model = trained(aggregator, task)
    backend = CountingOnnx(export_onnx(to_dense(model), str(tmp_path / "m.onnx")))
    loaded = types.SimpleNamespace(
        artifacts=types.SimpleNamespace(tag="graphsage:test", config=model.cfg), backend=backend
    )
    ids = targets(g)
    ft = tensor_of(g, ids)
    v = with_variants(ft)
    (out,) = run_batch(None, [InferenceItem("graphsage:test", v.tensor, False, loaded)])
    assert backend.calls == 1  # the originals and every variant: one forward pass
    got = explain(ft, v, out["probs"], task == "multilabel")

    tree = sample_tree(g.indptr, g.indices, np.array(ids), FANOUT, seed=SEED)
    full = pyg_probs(model, tree, g.features)
    np.testing.assert_allclose(out["probs"][: len(ids)], full, atol=TOL)
    if task == "multiclass":
        np.testing.assert_array_equal(got.classes[:, 0], full.argmax(1))
    else:
        np.testing.assert_array_equal(got.classes, np.tile(np.arange(g.num_classes), (len(ids), 1)))
    want = np.full(got.influence.shape, np.nan, np.float32)
    for b, j in zip(*np.nonzero(tree[1] >= 0)):
        left_out = pyg_probs(model, without_slot(tree, b, j), g.features)[0]
        want[b, j] = full[b, got.classes[b]] - left_out[got.classes[b]]
    np.testing.assert_allclose(got.influence, want, atol=TOL)  # NaN exactly at the empty slots
    assert np.abs(np.nan_to_num(want)).max() > 10 * TOL  # some neighbour matters: the check can fail


def test_the_limit_names_itself():
    check_explain_size(16, 16)
    with pytest.raises(ExplainTooLarge) as exc:
        check_explain_size(17, 16)
    assert exc.value.status == 413 and "GSAGE_EXPLAIN_MAX_NODES" in exc.value.message and "16" in exc.value.message


def explained_answer() -> Answer:
    """A two-node explained answer as the gateway gets it from the FeatureRunner."""
    hop1 = np.array([[7, 8, PAD], [9, PAD, PAD]], np.int64)
    hop2 = np.array([[[1, 2], [3, PAD], [PAD, PAD]], [[4, 5], [PAD, PAD], [PAD, PAD]]], np.int64)
    influence = np.array([[[0.25], [-0.125], [np.nan]], [[0.5], [np.nan], [np.nan]]], np.float32)
    arrays = {
        "probs": np.array([[0.2, 0.8], [0.6, 0.4]], np.float32),
        "explain_hop1": hop1,
        "explain_hop2": hop2,
        "explain_classes": np.array([[1], [0]], np.int32),
        "explain_influence": influence,
    }
    return from_wire([10, 11], {"model": "graphsage:v1", "task": "multiclass"}, arrays)


def test_http_and_grpc_render_one_explanation():
    from services.grpc_client import to_dict
    from services.grpc_server import to_proto

    answer = explained_answer()
    http = PredictResponse.model_validate_json(answer.to_json()).model_dump()
    first = http["predictions"][0]["explanation"]
    assert first == {
        "classes": [1],
        "empty_slots": 1,
        "neighbours": [
            {"node_id": 7, "influence": [0.25], "hop2": [1, 2], "hop2_empty": 0},
            {"node_id": 8, "influence": [-0.125], "hop2": [3], "hop2_empty": 1},
        ],
    }
    assert http["predictions"][1]["explanation"]["empty_slots"] == 2
    rpc = to_dict(to_proto(answer))
    assert [p["explanation"] for p in rpc["predictions"]] == [p["explanation"] for p in http["predictions"]]
    plain = Answer("graphsage:v1", [10], np.array([[0.2, 0.8]], np.float32))
    assert "explanation" not in plain.to_dict()["predictions"][0]  # a plain answer is as it was


def test_an_explained_request_is_never_merged():
    calls: list[tuple[int, bool]] = []

    async def predict(batch):
        await asyncio.sleep(0.01)
        calls.append((batch.node_ids.size, batch.explain))
        probs = np.full((batch.node_ids.size, 2), 0.5, np.float32)
        return wire.Packed.of({"probs": probs}, {"model": batch.model, "task": "multiclass"})

    class OneRoute:
        def choose(self, model, version, routing_key):
            return "graphsage:v1"

    async def main():
        clock = asyncio.get_running_loop().time
        core = PredictionCore(
            OneRoute(), predict, CircuitBreaker("f", clock=clock), CircuitBreaker("m", clock=clock), timeout_s=1.0
        )
        reqs = [PredictRequest(node_ids=[i, i + 1], seed=i, explain=i % 3 == 0) for i in range(9)]
        await asyncio.gather(*(core.predict(r) for r in reqs))

    run(main())
    explained = [c for c in calls if c[1]]
    assert explained == [(2, True)] * 3  # one call each, never with another request's nodes
    assert sum(n for n, e in calls if not e) == 12 and len(calls) < 9  # the plain ones still merge
