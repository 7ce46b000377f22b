"""The CPU backends (ONNX Runtime, OpenVINO, torch) and precisions (FP32, INT8).

Per-backend parity with PyG for every aggregator (FP32: <= 1e-4, identical labels; both input
layouts and float16 rows), the load check on the stored probe, INT8: the stored graphs and the
guard's figures, serving INT8 only where the guard passed (the answer says which precision), the
guard's refusal, and a clear error for a backend whose package is missing.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

from common import wire
from common.feature_tensor import FeatureTensor, decode, encode
from runners.graphsage.backends import BackendUnavailable, LoadCheckError, load_backend
from runners.graphsage.inference import ModelRegistry, run_batch
from runners.graphsage.model_artifacts import INT8_ONNX_FILE, INT8_ONNX_PREMEAN_FILE, PROBE_FILE, load_artifacts
from runners.graphsage.model_config import AGGREGATORS, ModelConfig
from services.answer import from_wire
from tests.graphs import small_graph
from tests.test_inference import (
    TOL,
    as_premean,
    assert_close_same_argmax,
    feature_tensor,
    loaded_item,
    pyg_forward,
    trained,
)
from training_export import quantize
from training_export.export import export_all, export_and_verify, parity_targets, to_dense
from training_export.train import TrainSpec, train_graphsage

pytest.importorskip("openvino")  # the dev extra installs it; the serving image may not
FP32_BACKENDS = ("onnx", "openvino", "torch")


@functools.cache
def learned_mean() -> tuple:
    """A mean model that learned the labels, unlike ``trained``'s one-epoch model (whose classes
    score near chance): INT8 and FP32 agreeing on the top class means something only where the
    top class stands out; on near-equal probabilities it depends on the CPU's INT8 kernels."""
    g = small_graph()
    cfg = ModelConfig(in_dim=g.feature_dim, hidden_dim=16, num_classes=g.num_classes, aggregator="mean")
    model, metrics = train_graphsage(g, cfg, TrainSpec(epochs=4, lr=0.01, eval_nodes=300), progress=False)
    assert metrics["val_score"] > 3 / g.num_classes, metrics  # well above chance
    return model.eval(), metrics


def save(aggregator: str, int8: bool = False, learned: bool = False, **int8_options) -> str:
    model, metrics = learned_mean() if learned else trained(aggregator)
    tag, parity = export_and_verify(
        model, small_graph(), metrics, parity_count=32, int8=int8, int8_options=int8_options or None
    )
    assert parity["passed"], parity
    return tag


@pytest.mark.parametrize("aggregator", AGGREGATORS)
def test_every_cpu_backend_reproduces_pyg_at_fp32(model_store, aggregator):
    g = small_graph()
    tag = save(aggregator)
    targets = parity_targets(g, 40, seed=5)
    ft, tree = feature_tensor(targets, seed=13)
    want_logits, want_embedding = pyg_forward(aggregator, tree)
    for kind in FP32_BACKENDS:
        registry = ModelRegistry(kind, 1, "fp32")
        loaded = registry.load(tag)
        check = loaded.describe()["load_check"]
        assert check["checked"] and check["levels_max_abs_diff_vs_pyg"] <= TOL, (kind, check)
        (out,) = run_batch(registry, [loaded_item(registry, tag, ft, want_embedding=True)])
        assert out["backend"].startswith(kind) and out["precision"] == "fp32"
        assert_close_same_argmax(out["logits"], want_logits)
        np.testing.assert_allclose(out["embedding"], want_embedding, atol=TOL)
        np.testing.assert_allclose(out["probs"].sum(1), 1.0, atol=1e-5)
        if aggregator == "mean":  # the premean layout: the same answers
            assert check["premean_max_abs_diff_vs_pyg"] <= TOL
            (pm,) = run_batch(registry, [loaded_item(registry, tag, as_premean(ft, seed=13))])
            assert_close_same_argmax(pm["logits"], want_logits)
        # float16 rows (the default transport) widened inside the runtime: what widening first gives
        half = FeatureTensor(ft.features.astype(np.float16), ft.index, ft.snapshot)
        widened = FeatureTensor(half.features.astype(np.float32), ft.index, ft.snapshot)
        (h,) = run_batch(registry, [loaded_item(registry, tag, decode(encode(half)))])
        (w,) = run_batch(registry, [loaded_item(registry, tag, widened)])
        np.testing.assert_allclose(h["logits"], w["logits"], atol=1e-5)


def test_int8_export_stores_the_graphs_and_the_guard_figures_and_serves_int8(model_store):
    g = small_graph()
    tag = save("mean", int8=True, learned=True)
    art = load_artifacts(tag)
    meta = art.metadata["int8"]
    assert meta["stored"] and meta["guard_points"] == quantize.GUARD_POINTS and meta["metric"] == "accuracy"
    assert meta["calibration"]["split"] == "train" and meta["calibration"]["targets"] > 0
    assert meta["validation_nodes"] == min(g.val.size, quantize.GUARD_NODES)
    for name in (INT8_ONNX_FILE, INT8_ONNX_PREMEAN_FILE, PROBE_FILE):
        assert os.path.exists(os.path.join(art.path, name)), name
    assert set(meta["runtimes"]) == {"onnx", "openvino"}
    # Whether a runtime's INT8 kernels keep the accuracy depends on the CPU (its INT8 instructions):
    # the guard decides per runtime; the one that failed serves FP32. ONNX Runtime's passed on
    # every CPU tried; the test needs one INT8 path to serve.
    passed = {runtime for runtime, fig in meta["runtimes"].items() if fig["passed"]}
    assert "onnx" in passed, meta["runtimes"]
    for runtime, fig in meta["runtimes"].items():
        for prefix in ("", "premean_"):  # both graphs measured
            assert (fig[f"{prefix}points_lost"] <= quantize.GUARD_POINTS) == fig["passed"], (runtime, fig)
            assert (
                abs(
                    100 * (fig[f"{prefix}fp32_val_score"] - fig[f"{prefix}int8_val_score"])
                    - fig[f"{prefix}points_lost"]
                )
                < 1e-2
            )
            assert fig[f"{prefix}max_prob_diff"] > 0  # really quantised
    assert meta["bytes"]["levels"]["int8"] < meta["bytes"]["levels"]["fp32"]

    ft, _ = feature_tensor(parity_targets(g, 64, seed=9), seed=3)
    fp32 = ModelRegistry("onnx", 1, "fp32")
    (want,) = run_batch(fp32, [loaded_item(fp32, tag, ft)])
    for kind in ("onnx", "openvino"):
        registry = ModelRegistry(kind, 1, "int8")
        loaded = registry.load(tag)
        precision = "int8" if kind in passed else "fp32"
        assert loaded.describe()["precision"] == precision
        if kind in passed:
            assert loaded.describe()["load_check"]["levels_max_prob_diff_vs_export"] <= 1e-3
        for tensor in (ft, as_premean(ft, seed=3)):
            (out,) = run_batch(registry, [loaded_item(registry, tag, tensor)])
            assert out["precision"] == precision and out["backend"].startswith(kind)
            # and the gateway's answer says it, from the reply's meta as GraphSAGERunner.infer packs it
            meta, arrays = wire.unpack(
                wire.pack({"probs": out["probs"]}, {k: out[k] for k in ("model", "backend", "precision", "task")})
            )
            assert from_wire(list(range(len(arrays["probs"]))), meta, arrays).to_dict()["precision"] == precision
            if kind in passed:
                diff = np.abs(out["probs"] - want["probs"]).max()
                assert 0 < diff < 0.2, diff
                assert (out["probs"].argmax(1) == want["probs"].argmax(1)).mean() >= 0.9
            else:
                np.testing.assert_allclose(out["probs"], want["probs"], atol=1e-4)
    # torch serves FP32 only: asked for INT8, it serves FP32 and says so
    registry = ModelRegistry("torch", 1, "int8")
    (out,) = run_batch(registry, [loaded_item(registry, tag, ft)])
    assert out["precision"] == "fp32"


def _sabotaged_calibration(monkeypatch) -> None:
    """Calibrate on rows scaled down 1000x: activation ranges far too narrow, so INT8 clips."""
    real = quantize.quantize_graph

    def quantize_graph(src, dst, calibration):
        real(src, dst, [(t[0] * 1e-3, t[1], None if t[2] is None else (t[2][0], t[2][1] * 1e-3)) for t in calibration])

    monkeypatch.setattr(quantize, "quantize_graph", quantize_graph)


def test_the_guard_refuses_int8_that_loses_accuracy(model_store, monkeypatch, capsys):
    _sabotaged_calibration(monkeypatch)
    model, _ = trained("mean")
    g = small_graph()
    with tempfile.TemporaryDirectory() as tmp:
        export_all(to_dense(model), tmp)
        with pytest.raises(
            quantize.QuantizationRefused, match=r"INT8 refused: accuracy on \d+ validation nodes"
        ) as info:
            quantize.quantize_and_guard(g, model.cfg, tmp)
        assert not os.path.exists(os.path.join(tmp, INT8_ONNX_FILE))  # nothing left behind
    figures = info.value.figures
    assert not figures["stored"] and "refused" in figures
    for fig in figures["runtimes"].values():
        assert not fig["passed"] and fig["points_lost"] > quantize.GUARD_POINTS
        assert f"{fig['points_lost']} points lost" in str(info.value)  # the figures are in the message

    # Through the export: the version is saved at FP32 only, the refusal and its figures recorded
    # and printed; asked for INT8, the runner serves FP32 and says so.
    tag = save("mean", int8=True)
    assert "INT8 refused" in capsys.readouterr().err
    art = load_artifacts(tag)
    assert not art.metadata["int8"]["stored"] and art.metadata["int8"]["runtimes"]["onnx"]["points_lost"] > 0.5
    assert not os.path.exists(os.path.join(art.path, INT8_ONNX_FILE))
    ft, _ = feature_tensor([1, 2, 3])
    for kind in ("onnx", "openvino"):
        registry = ModelRegistry(kind, 1, "int8")
        (out,) = run_batch(registry, [loaded_item(registry, tag, ft)])
        assert out["precision"] == "fp32"


def test_a_runtime_that_failed_the_guard_serves_fp32_while_another_serves_int8(model_store):
    tag = save("mean", int8=True)
    art = load_artifacts(tag)
    meta = dict(art.metadata["int8"])
    meta["runtimes"] = {**meta["runtimes"], "openvino": {**meta["runtimes"]["openvino"], "passed": False}}
    failed = dataclasses.replace(art, metadata={**art.metadata, "int8": meta})
    assert load_backend(failed, "onnx", precision="int8").precision == "int8"
    assert load_backend(failed, "openvino", precision="int8").precision == "fp32"
    only_onnx = {**meta, "runtimes": {"onnx": meta["runtimes"]["onnx"]}}  # exported without openvino installed
    unmeasured = dataclasses.replace(art, metadata={**art.metadata, "int8": only_onnx})
    assert load_backend(unmeasured, "openvino", precision="int8").precision == "fp32"
    plain = load_artifacts(save("mean"))  # exported without --int8
    assert not plain.metadata["int8"]["stored"]
    assert load_backend(plain, "onnx", precision="int8").precision == "fp32"


def test_the_load_check_refuses_a_backend_that_does_not_reproduce_pyg(model_store, tmp_path):
    art = load_artifacts(save("mean", int8=True))
    copy = str(tmp_path / "copy")
    shutil.copytree(art.path, copy)
    with np.load(os.path.join(copy, PROBE_FILE)) as z:
        probe = {k: z[k] for k in z.files}
    probe["ref_logits"] = probe["ref_logits"] + 1e-3  # PyG said otherwise
    probe["int8_probs_onnx"] = probe["int8_probs_onnx"] + 0.1  # the exporter's INT8 said otherwise
    np.savez(os.path.join(copy, PROBE_FILE), **probe)
    bad = dataclasses.replace(art, path=copy)
    for kind in FP32_BACKENDS:
        with pytest.raises(LoadCheckError, match="does not reproduce PyG"):
            load_backend(bad, kind)
    # INT8 that does not reproduce the exporter's answers is not served; FP32 is checked in turn
    with pytest.raises(LoadCheckError, match="does not reproduce PyG"):
        load_backend(bad, "onnx", precision="int8")
    probe["ref_logits"] -= 1e-3
    np.savez(os.path.join(copy, PROBE_FILE), **probe)
    assert load_backend(bad, "onnx", precision="int8").precision == "fp32"
    assert load_backend(bad, "openvino", precision="int8").precision == "int8"  # its own answers still match
    os.remove(os.path.join(copy, PROBE_FILE))  # exported before probes: loads unchecked
    assert load_backend(bad, "onnx").load_check == {
        "checked": False,
        "reason": "no probe stored (exported before load checks)",
    }


@pytest.mark.parametrize(
    "kind,module,hint",
    [("openvino", "openvino", r"graphsage-serving\[openvino\]"), ("torch", "torch", "GSAGE_BACKEND=onnx")],
)
def test_a_backend_whose_package_is_missing_is_refused_clearly(model_store, monkeypatch, kind, module, hint):
    tag = save("pool")
    monkeypatch.setitem(sys.modules, module, None)  # `import <module>` raises ImportError
    with pytest.raises(BackendUnavailable, match=rf"the {kind} backend needs the '{module}' package.*{hint}"):
        ModelRegistry(kind, 1, "fp32").load(tag)
    assert ModelRegistry("onnx", 1, "fp32").load(tag).backend.name == "onnx-cpu"  # the others are unaffected


def test_unknown_precision_is_refused(model_store):
    art = load_artifacts(save("pool"))
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        load_backend(art, "onnx", precision="int4")
