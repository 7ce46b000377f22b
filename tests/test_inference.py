"""The GraphSAGERunner's core (``runners.graphsage.inference``) without a server.

Served parity with PyG per aggregator and backend, batch merging (rebasing, fanout padding),
mixed-version batches, refusal of inputs that do not fit, and hot-load/unload of versions while
requests flow through the same batcher + worker-thread path as ``runners/graphsage/service.py``.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from common import wire
from common.batching import AdaptiveBatcher
from common.feature_tensor import LAYOUT, PREMEAN, FeatureTensor, FeatureTensorError, decode, encode
from runners.feature.sampling import sample_tree
from runners.feature.tree_layout import compact, premean
from runners.graphsage.inference import (
    IncompatibleInput,
    InferenceItem,
    ModelRegistry,
    UnknownVersion,
    check_compatible,
    run_batch,
)
from runners.graphsage.model_config import AGGREGATORS, ModelConfig
from tests.graphs import small_graph
from training_export.export import export_and_verify, parity_targets
from training_export.pyg_model import PygGraphSAGE, mfg_tensors
from training_export.train import TrainSpec, train_graphsage

TOL = 1e-4


@functools.cache
def trained(aggregator: str) -> tuple[PygGraphSAGE, dict]:
    """A tiny trained model per aggregator, trained once per test session."""
    g = small_graph()
    cfg = ModelConfig(in_dim=g.feature_dim, hidden_dim=16, num_classes=g.num_classes, aggregator=aggregator)
    spec = TrainSpec(epochs=1, max_train_nodes=512 if aggregator != "lstm" else 256, eval_nodes=32)
    model, metrics = train_graphsage(g, cfg, spec, progress=False)
    return model.eval(), metrics


def loaded_item(registry, tag, tensor, want_embedding=False):
    """An item as the service queues it: with its version loaded beforehand."""
    return InferenceItem(tag, tensor, want_embedding, registry.load(tag))


def save(aggregator: str) -> str:
    """Export + parity + save into the current (per-test) model store; returns the tag."""
    model, metrics = trained(aggregator)
    tag, parity = export_and_verify(model, small_graph(), metrics, parity_count=32)
    assert parity["passed"], parity
    return tag


def feature_tensor(targets, fanout=(25, 10), seed: int = 0) -> tuple[FeatureTensor, list[np.ndarray]]:
    """Sample + compact + gather, as the FeatureRunner does; also returns the sampled tree."""
    g = small_graph()
    tree = sample_tree(g.indptr, g.indices, np.asarray(targets, dtype=np.int64), fanout, seed=seed)
    unique, index = compact(tree)
    features = np.ascontiguousarray(g.features[unique], dtype=np.float32)
    return FeatureTensor(features=features, index=index, snapshot=g.tag), tree


def pyg_forward(aggregator: str, tree) -> tuple[np.ndarray, np.ndarray]:
    model, _ = trained(aggregator)
    with torch.no_grad():
        logits, embedding = model(*mfg_tensors(tree, small_graph().features))
    return logits.numpy(), embedding.numpy()


def assert_close_same_argmax(got: np.ndarray, want: np.ndarray, tol: float = TOL) -> None:
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= tol, float(np.abs(got - want).max())
    np.testing.assert_array_equal(got.argmax(1), want.argmax(1))


# --- served parity ----------------------------------------------------------------------------


@pytest.mark.parametrize("aggregator", AGGREGATORS)
def test_served_outputs_equal_pyg_per_aggregator_and_backend(model_store, aggregator):
    g = small_graph()
    tag = save(aggregator)
    # hubs (full fanout everywhere), random nodes, and an isolated node if the graph has one
    targets = parity_targets(g, 48, seed=3)
    isolated = np.flatnonzero(g.degrees() == 0)
    if isolated.size:
        targets = np.concatenate([targets, isolated[:2]])
    ft, tree = feature_tensor(targets, seed=11)
    want_logits, want_embedding = pyg_forward(aggregator, tree)
    want_probs = torch.softmax(torch.from_numpy(want_logits), -1).numpy()
    for backend in ("onnx", "torch"):
        registry = ModelRegistry(backend)
        (out,) = run_batch(registry, [loaded_item(registry, tag, ft, want_embedding=True)])
        assert out["model"] == tag and out["task"] == "multiclass"
        assert out["backend"].startswith(backend)
        assert_close_same_argmax(out["logits"], want_logits)
        np.testing.assert_allclose(out["probs"], want_probs, atol=TOL)
        np.testing.assert_allclose(out["probs"].sum(1), 1.0, atol=1e-5)
        np.testing.assert_allclose(out["embedding"], want_embedding, atol=TOL)


def test_float16_transport_keeps_predictions(model_store):
    """The gateway's default transport (GSAGE_FEATURE_TRANSPORT_DTYPE=float16) halves the bytes;
    the answers may move by rounding only, and the class only where float32 itself is a near tie."""
    g = small_graph()
    tag = save("mean")
    ft32, _ = feature_tensor(parity_targets(g, 200, seed=5), seed=4)
    ft16 = decode(encode(FeatureTensor(ft32.features.astype(np.float16), ft32.index, ft32.snapshot)))
    assert ft16.features.dtype == np.float16 and ft16.features.nbytes * 2 == ft32.features.nbytes
    registry = ModelRegistry("onnx")
    (p32,) = run_batch(registry, [loaded_item(registry, tag, ft32)])
    (p16,) = run_batch(registry, [loaded_item(registry, tag, ft16)])
    diff = np.abs(p32["probs"] - p16["probs"]).max()
    assert 0 < diff <= 5e-3, diff  # > 0: the float16 rows really were rounded
    top2 = np.sort(p32["probs"], axis=1)[:, -2:]
    flipped = p32["probs"].argmax(1) != p16["probs"].argmax(1)
    assert np.all(top2[flipped, 1] - top2[flipped, 0] <= 2 * diff)
    # float16 rows are widened inside ONNX Runtime (a Cast before the graph): exactly what
    # widening them first in numpy and running the float32 graph gives.
    widened = FeatureTensor(ft16.features.astype(np.float32), ft16.index, ft16.snapshot)
    (p16_numpy,) = run_batch(registry, [loaded_item(registry, tag, widened)])
    np.testing.assert_array_equal(p16["logits"], p16_numpy["logits"])
    np.testing.assert_array_equal(p16["probs"], p16_numpy["probs"])
    # A batch mixing float16 and float32 tensors runs as float32, each item as it would alone.
    (mixed16, mixed32) = run_batch(registry, [loaded_item(registry, tag, ft16), loaded_item(registry, tag, ft32)])
    np.testing.assert_array_equal(mixed16["probs"], p16["probs"])
    np.testing.assert_array_equal(mixed32["probs"], p32["probs"])


@pytest.mark.parametrize("aggregator", ["mean", "lstm"])
def test_a_merged_batch_equals_each_item_alone_and_pyg(model_store, aggregator):
    """Different sizes, an item sampled with a smaller fanout (padded up to the model's), and
    overlapping nodes across items (rows are rebased per item, never shared)."""
    g = small_graph()
    tag = save(aggregator)
    hubs = np.argsort(-g.degrees(), kind="stable")
    specs = [
        (hubs[:1], (25, 10), 1),
        (hubs[:17], (25, 10), 2),  # overlaps the first item
        (hubs[5:12], (10, 5), 3),  # smaller fanout: padded to (25, 10)
        (np.arange(100, 140), (25, 10), 4),
        (hubs[:3], (25, 3), 5),
    ]
    items, trees = [], []
    registry = ModelRegistry("onnx")
    for targets, fanout, seed in specs:
        ft, tree = feature_tensor(targets, fanout, seed)
        items.append(loaded_item(registry, tag, ft, want_embedding=True))
        trees.append(tree)
    batched = run_batch(registry, items)
    assert len(batched) == len(items)
    for item, tree, out in zip(items, trees, batched):
        (alone,) = run_batch(registry, [item])
        assert out["logits"].shape == (item.tensor.num_targets, g.num_classes)
        np.testing.assert_allclose(out["logits"], alone["logits"], atol=1e-5)
        np.testing.assert_allclose(out["embedding"], alone["embedding"], atol=1e-5)
        want_logits, _ = pyg_forward(aggregator, tree)  # PyG on the unpadded tree
        assert_close_same_argmax(out["logits"], want_logits)


def as_premean(ft: FeatureTensor, dtype=np.float32, seed: int = 0) -> FeatureTensor:
    """What the FeatureRunner sends for a tensor sampled with one seed (repeated hop-1 nodes
    become one entry)."""
    rows, inner, last_rows, last_mean = premean(ft.features, ft.index, seed)
    return FeatureTensor(rows.astype(dtype), inner, ft.snapshot, last_rows, last_mean.astype(dtype), ft.fanout[-1])


def test_premean_input_gives_the_full_rows_answer(model_store):
    """A mean model takes the last hop as its means (ONNX and torch): the same answers as the
    full rows, alone and merged with full-row and premean items, smaller fanouts padded up;
    float16 premean moves probabilities by rounding only."""
    g = small_graph()
    tag = save("mean")
    hubs = np.argsort(-g.degrees(), kind="stable")
    full = [
        feature_tensor(t, f, s)[0]
        for t, f, s in [
            (parity_targets(g, 40, seed=2), (25, 10), 1),
            (hubs[:9], (10, 4), 2),
            (np.arange(50, 60), (25, 10), 3),
        ]
    ]
    assert as_premean(full[0]).last_rows.size < (full[0].index[1] >= 0).sum()  # repeated hop-1 nodes merged
    for backend in ("onnx", "torch"):
        registry = ModelRegistry(backend)
        assert registry.load(tag).input_layouts == [LAYOUT, PREMEAN]
        want = run_batch(registry, [loaded_item(registry, tag, ft, want_embedding=True) for ft in full])
        mixed = [
            loaded_item(registry, tag, as_premean(ft) if i != 1 else ft, want_embedding=True)
            for i, ft in enumerate(full)
        ]
        for items in ([loaded_item(registry, tag, as_premean(ft), want_embedding=True) for ft in full], mixed):
            for got, w in zip(run_batch(registry, items), want):
                np.testing.assert_allclose(got["logits"], w["logits"], atol=1e-5)
                np.testing.assert_allclose(got["embedding"], w["embedding"], atol=1e-5)
        (half,) = run_batch(registry, [loaded_item(registry, tag, decode(encode(as_premean(full[0], np.float16))))])
        assert 0 < np.abs(half["probs"] - want[0]["probs"]).max() <= 5e-3


def test_a_premean_tensor_is_refused_by_a_model_without_that_input(model_store):
    tag = save("pool")
    loaded = ModelRegistry("onnx").load(tag)
    assert loaded.input_layouts == [LAYOUT] and loaded.describe()["input_layouts"] == [LAYOUT]
    ft, _ = feature_tensor([1, 2, 3])
    with pytest.raises(IncompatibleInput, match="premean"):
        check_compatible(loaded, as_premean(ft))


def test_mixed_version_batch_is_split_by_version(model_store):
    v_mean, v_pool = save("mean"), save("pool")
    registry = ModelRegistry("onnx")
    items, trees, versions = [], [], []
    for n, (version, aggregator) in enumerate(
        [(v_mean, "mean"), (v_pool, "pool"), (v_pool, "pool"), (v_mean, "mean"), (v_pool, "pool")]
    ):
        ft, tree = feature_tensor(np.arange(n * 7, n * 7 + n + 1), seed=n)
        items.append(loaded_item(registry, version, ft))
        trees.append(tree)
        versions.append((version, aggregator))
    results = run_batch(registry, items)
    assert registry.tags() == {v_mean, v_pool}  # both hot-loaded on demand from the store
    for (version, aggregator), tree, out in zip(versions, trees, results):
        assert out["model"] == version
        assert "embedding" not in out
        assert_close_same_argmax(out["logits"], pyg_forward(aggregator, tree)[0])
    # the same item under the other version gets that version's answer
    same = [loaded_item(registry, v_mean, items[0].tensor), loaded_item(registry, v_pool, items[0].tensor)]
    a, b = run_batch(registry, same)
    assert (a["model"], b["model"]) == (v_mean, v_pool)
    assert float(np.abs(a["logits"] - b["logits"]).max()) > 1e-3
    assert_close_same_argmax(b["logits"], pyg_forward("pool", trees[0])[0])


# --- refusal ----------------------------------------------------------------------------------


def test_mismatched_inputs_are_refused_with_a_clear_message(model_store):
    tag = save("mean")
    loaded = ModelRegistry("onnx").load(tag)
    good, _ = feature_tensor([1, 2, 3])
    check_compatible(loaded, good)
    smaller, _ = feature_tensor([1, 2, 3], fanout=(10, 5))
    check_compatible(loaded, smaller)  # smaller fanouts are padded up, never refused

    narrow = FeatureTensor(features=good.features[:, :64].copy(), index=good.index)
    with pytest.raises(IncompatibleInput, match=r"expects 128-dim features, got 64"):
        check_compatible(loaded, narrow)
    one_hop, _ = feature_tensor([1, 2, 3], fanout=(25,))
    with pytest.raises(IncompatibleInput, match=r"has 2 hops, the request sampled 1"):
        check_compatible(loaded, one_hop)
    three_hops, _ = feature_tensor([1, 2, 3], fanout=(25, 10, 5))
    with pytest.raises(IncompatibleInput, match=r"has 2 hops, the request sampled 3"):
        check_compatible(loaded, three_hops)
    too_wide, _ = feature_tensor([1, 2, 3], fanout=(30, 10))
    with pytest.raises(IncompatibleInput, match=r"fanout \[25, 10\], the request sampled \[30, 10\]"):
        check_compatible(loaded, too_wide)
    assert IncompatibleInput("x").status == 422 and UnknownVersion("x").status == 404  # what the wire answers


def test_unknown_versions_are_refused(model_store):
    tag = save("mean")
    registry = ModelRegistry("onnx")
    with pytest.raises(UnknownVersion, match="graphsage:nosuchversion"):
        registry.load("graphsage:nosuchversion")
    with pytest.raises(UnknownVersion):
        registry.load("other-model:latest")
    ft, _ = feature_tensor([1])
    with pytest.raises(UnknownVersion):
        run_batch(registry, [InferenceItem("graphsage:nosuchversion", ft)])
    assert registry.tags() == set()
    assert registry.load("graphsage:latest").artifacts.tag == tag
    assert registry.tags() == {tag}
    with pytest.raises(ValueError, match="unknown backend"):
        ModelRegistry("nonsense").load(tag)


def _packed(features: np.ndarray, *index: np.ndarray, **extra: np.ndarray) -> bytes:
    return wire.pack({"features": features, **{f"idx{d}": i for d, i in enumerate(index)}, **extra})


def test_decode_rejects_bad_dtypes_and_shapes():
    ft, _ = feature_tensor([1, 2])
    f, (i0, i1, i2) = ft.features, ft.index
    assert decode(encode(ft)).fanout == (25, 10)
    assert decode(_packed(f.astype(np.float16), i0, i1, i2)).features.dtype == np.float16
    cases = {
        "int index as int64": (_packed(f, i0.astype(np.int64), i1, i2), "int32"),
        "integer features": (_packed(f.astype(np.int32), i0, i1, i2), "float"),
        "1-D features": (_packed(f[:, 0].copy(), i0, i1, i2), "2-D"),
        "hop-1 index 1-D": (_packed(f, i0, i1.reshape(-1).copy(), i2), r"index\[1\]"),
        "hop-2 rows not matching hop-1's real nodes": (_packed(f, i0, i1, i2[:-1].copy()), r"index\[2\]"),
        "batch mismatch": (_packed(f, i0[:1].copy(), i1, i2), r"index\[1\]"),
        "index out of range": (_packed(f, i0, i1 + np.int32(f.shape[0]), i2), "outside features"),
        "padding target": (_packed(f, np.full_like(i0, -1), i1, i2), "padding"),
        "below -1": (_packed(f, i0, np.full_like(i1, -2), i2), "outside features"),
        "no features": (wire.pack({"idx0": i0}), "expected arrays"),
        "extra array": (_packed(f, i0, i1, i2, junk=i0), "expected arrays"),
        "gap in hops": (wire.pack({"features": f, "idx0": i0, "idx2": i2}), "expected arrays"),
        "not a container": (b"\x00" * 32, "bad magic"),
        "truncated": (encode(ft)[:-8], "past the end"),
        "float64 features": (_packed(f.astype(np.float64), i0, i1, i2), "dtype in"),
        "empty header": (b"GSW1" + b"\0" * 4, "bad header"),
    }
    for name, (blob, message) in cases.items():
        with pytest.raises(FeatureTensorError, match=message) as info:
            decode(blob)
        assert str(info.value), name


# --- hot-load / unload under traffic ----------------------------------------------------------


def test_hot_load_and_unload_while_requests_flow(model_store):
    """16 concurrent callers through AdaptiveBatcher + run_batch in a 1-thread executor (as the
    service does). Phases: all traffic on v1; v2 hot-loaded; half the traffic on v2; all on v2;
    v1 unloaded once its traffic drained; finally v2 unloaded under live traffic (the next batch
    reloads it on demand from the store). Every request must succeed with its version's answer.
    Each phase lasts until the traffic did what the phase is for (counted answers, a mixed batch,
    v1 drained), not for a length of time."""
    v1, v2 = save("mean"), save("pool")
    requests = [feature_tensor(np.arange(n * 13, n * 13 + 1 + n % 4), seed=n)[0] for n in range(12)]
    registry = ModelRegistry("onnx")
    registry.load(v1)
    assert registry.tags() == {v1}

    answers: list[tuple[int, str, dict]] = []
    errors: list[BaseException] = []
    batch_versions: list[set[str]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        compute = ThreadPoolExecutor(1, thread_name_prefix="forward")
        loader = ThreadPoolExecutor(1, thread_name_prefix="loader")

        changed = asyncio.Event()  # a batch, an answer or an error: the operator looks again

        async def forward(items: list[InferenceItem]) -> list[dict]:
            batch_versions.append({i.model for i in items})
            changed.set()
            return await loop.run_in_executor(compute, run_batch, registry, items)

        batcher = AdaptiveBatcher(
            forward, max_batch_size=64, max_delay_s=0.001, size_of=lambda item: item.tensor.num_targets
        )
        state = {"v2_share": 0.0}
        inflight: Counter[str] = Counter()
        stop = asyncio.Event()

        async def caller(cid: int) -> None:
            rng = random.Random(cid)
            while not stop.is_set():
                n = rng.randrange(len(requests))
                tag = v2 if rng.random() < state["v2_share"] else v1
                inflight[tag] += 1
                try:
                    loaded = await loop.run_in_executor(loader, registry.load, tag)
                    check_compatible(loaded, requests[n])
                    result = await batcher.submit(InferenceItem(loaded.artifacts.tag, requests[n], loaded=loaded))
                    answers.append((n, tag, result))
                except BaseException as exc:
                    errors.append(exc)
                finally:
                    inflight[tag] -= 1
                    changed.set()
                await asyncio.sleep(0)

        def answered(tag: str | None = None) -> int:
            return sum(1 for _, t, _ in answers if tag in (None, t))

        async def until(done) -> None:
            """Until the traffic makes ``done()`` true; a failed request ends the test at once."""

            async def wait() -> None:
                while not (done() or errors):
                    changed.clear()
                    await changed.wait()

            await asyncio.wait_for(wait(), 60)  # a backstop against a hang, never reached when it works
            if errors:
                stop.set()
                raise AssertionError(f"{len(errors)} failed requests, first: {errors[0]!r}")

        async def operator() -> None:
            await until(lambda: answered(v1) > 20)  # all traffic on v1
            await loop.run_in_executor(loader, registry.load, v2)  # hot-load under traffic
            state["v2_share"] = 0.5
            await until(lambda: answered(v2) > 20 and any(len(vs) == 2 for vs in batch_versions))
            state["v2_share"] = 1.0
            await until(lambda: not inflight[v1])  # v1's traffic drained
            assert registry.unload(v1)
            after = answered()
            await until(lambda: answered() >= after + 40)
            assert registry.tags() == {v2}, "v1 came back: traffic had not moved"
            assert registry.unload(v2)  # under live traffic: reloaded on demand
            after = answered()
            await until(lambda: answered() >= after + 40)
            stop.set()

        try:
            await asyncio.gather(operator(), *(caller(c) for c in range(16)))
        finally:
            compute.shutdown()
            loader.shutdown()

    asyncio.run(main())

    assert not errors, f"{len(errors)} failed requests, first: {errors[0]!r}"
    assert registry.tags() == {v2}
    by_version = Counter(tag for _, tag, _ in answers)
    assert by_version[v1] > 20 and by_version[v2] > 20, by_version
    assert any(len(vs) == 2 for vs in batch_versions), "no batch ever mixed the two versions"
    # every answer is its own version's answer (checked against a fresh registry, item alone)
    reference = ModelRegistry("onnx")
    expected = {
        (n, tag): run_batch(reference, [loaded_item(reference, tag, requests[n])])[0]["logits"]
        for n in range(len(requests))
        for tag in (v1, v2)
    }
    for n, tag, result in answers:
        assert result["model"] == tag
        np.testing.assert_allclose(result["logits"], expected[(n, tag)], atol=1e-5)


def test_a_model_exported_for_another_input_layout_is_refused(model_store, monkeypatch):
    import dataclasses

    import runners.graphsage.inference as inference
    from runners.graphsage.model_artifacts import load_artifacts

    tag = save("mean")
    assert ModelRegistry("onnx").load(tag).artifacts.metadata["input_layout"] == "levels-v1"
    old = dataclasses.replace(load_artifacts(tag), metadata={"aggregator": "mean"})  # before the layout existed
    monkeypatch.setattr(inference, "load_artifacts", lambda _: old)
    with pytest.raises(UnknownVersion, match="re-export"):
        ModelRegistry("onnx").load(tag)
