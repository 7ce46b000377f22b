"""The premean FeatureTensor against full rows, in-process (prints numbers, never asserts).

    BENTOML_HOME=/tmp/gsage-bench-home python bench/bench_premean.py [--budget 1.5] [--sizes 1,16,64,256]

On the graph snapshot and mean model of the BentoML store (``make demo-model``), fanout [25, 10],
Zipf(1.0) targets, float16 transport, 1 thread. For each batch size, both layouts measured on the
same requests, call by call in alternation (so both meet the same machine):

- bytes of the encoded FeatureTensor;
- FeatureRunner side: ``NeighbourhoodBuilder.build`` + ``encode`` as served (L1 holding every
  row; batches of ``GSAGE_SCAN_MIN_TARGETS`` or more are scans of the snapshot);
- model runner side: ``decode`` + ``run_batch`` (ONNX Runtime, 1 intra-op thread);
- the largest difference of the probabilities between the two layouts.

The model's graphs are exported afresh from its state dict into a temporary directory, so a
model stored before the premean graph existed is measured too.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from common.feature_tensor import decode, encode
from common.settings import Settings
from harness.workload import Zipf
from runners.feature.cache.tiered import build_feature_store
from runners.feature.neighbourhood import NeighbourhoodBuilder
from runners.feature.snapshot import load_snapshot
from runners.graphsage.inference import InferenceItem, ModelRegistry, run_batch
from runners.graphsage.model_artifacts import ONNX_PREMEAN_FILE, load_artifacts
from training_export.export import export_all, to_dense
from training_export.pyg_model import PygGraphSAGE


def _registry_with_fresh_graphs(tmp: str) -> tuple[ModelRegistry, str]:
    """The stored model with both graphs exported now into ``tmp`` (artifacts pointed there)."""
    art = load_artifacts("graphsage:latest")
    if art.config.aggregator != "mean":
        sys.exit(f"{art.tag} uses the {art.config.aggregator} aggregator; the premean input is for mean models")
    pyg = PygGraphSAGE(art.config)
    pyg.load_state_dict(torch.load(art.state_dict_path, weights_only=True), strict=True)
    export_all(to_dense(pyg.eval()), tmp)
    for name in ("state_dict.pt", "config.json"):
        os.symlink(os.path.join(art.path, name), os.path.join(tmp, name))
    assert os.path.exists(os.path.join(tmp, ONNX_PREMEAN_FILE))
    registry = ModelRegistry("onnx", 1)
    registry.register(dataclasses.replace(art, path=tmp))
    return registry, art.tag


def _alternating(fn, inputs: dict[bool, list], budget_s: float, min_calls: int = 20) -> dict[bool, list[float]]:
    """Seconds per call of ``fn`` on each layout's inputs, one call of each in turn."""
    out: dict[bool, list[float]] = {False: [], True: []}
    deadline = time.perf_counter() + 2 * budget_s
    i = 0
    while i < min_calls or (time.perf_counter() < deadline and i < 5000):
        for pm in (False, True):
            x = inputs[pm][i % len(inputs[pm])]
            t = time.perf_counter()
            fn(x)
            out[pm].append(time.perf_counter() - t)
        i += 1
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=1.5, help="seconds per measurement")
    p.add_argument("--sizes", default="1,16,64,256")
    a = p.parse_args()
    torch.set_num_threads(1)
    snap = load_snapshot("graph-snapshot:latest")
    with tempfile.TemporaryDirectory() as tmp:
        registry, tag = _registry_with_fresh_graphs(tmp)
        settings = Settings(l1_bytes=snap.num_nodes * (snap.feature_dim * 4 + 256), redis_url="")
        store = build_feature_store(settings.feature_cache, settings.redis, snap.features, snap.tag)
        builder = NeighbourhoodBuilder(snap, store, (25, 10), 4096, settings.scan_min_targets)
        loop = asyncio.new_event_loop()
        loop.run_until_complete(store.warm(np.arange(snap.num_nodes)))
        zipf = Zipf(snap.num_nodes, 0)
        print(f"{snap.tag}, {tag}, float16 transport, 1 thread; per request, medians (P99) in ms")
        print(
            f"{'targets':>7} | {'layout':>7} | {'bytes':>9} | {'FeatureRunner build+encode':>26} | "
            f"{'model decode+run':>17} | max |prob diff|"
        )
        for n in (int(x) for x in a.sizes.split(",")):
            ids = [zipf.draw(n) for _ in range(16)]
            reqs = {
                pm: [builder.validate(t.tolist(), None, 1000 + i, "float16", premean=pm) for i, t in enumerate(ids)]
                for pm in (False, True)
            }
            build = lambda r: encode(loop.run_until_complete(builder.build([r]))[0])  # noqa: E731
            infer = lambda b: run_batch(registry, [InferenceItem(tag, decode(b))])[0]  # noqa: E731
            blobs = {pm: [build(r) for r in reqs[pm]] for pm in (False, True)}
            probs = {pm: [infer(b)["probs"] for b in blobs[pm]] for pm in (False, True)}
            feat, model = _alternating(build, reqs, a.budget), _alternating(infer, blobs, a.budget)
            for pm in (False, True):
                diff = max(float(np.abs(x - y).max()) for x, y in zip(probs[pm], probs[False]))
                print(
                    f"{n:>7} | {'premean' if pm else 'full':>7} | {np.mean([len(b) for b in blobs[pm]]):>9,.0f} | "
                    f"{np.median(feat[pm]) * 1e3:>13.3f} ({np.percentile(feat[pm], 99) * 1e3:7.3f})    | "
                    f"{np.median(model[pm]) * 1e3:>6.3f} ({np.percentile(model[pm], 99) * 1e3:7.3f}) | {diff:.1e}"
                )
        loop.close()


if __name__ == "__main__":
    main()
