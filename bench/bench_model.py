"""GraphSAGERunner compute: ONNX Runtime vs dense torch vs PyG, and the batcher under load.

    python bench/bench_model.py [--quick] [--nodes 100000] [--duration 5] [--budget 1.5]

Prints numbers, never asserts; about 1.5-2 minutes on 2 cores (``--quick``: ~30 s).

1. Generates the demo graph in-process (``training_export.synthetic``, 100k nodes / 1M edges by
   default), trains a mean-aggregator model briefly (1 epoch, <= 20k train nodes) and exports
   ONNX to a temporary directory (no model store).
2. Forward only (features already gathered), 1 thread each, on the same sampled batches of
   1, 16, 64, 256, 1024 targets, fanout [25, 10]:
      onnx   runners.graphsage.backends.OnnxBackend (1 intra-op thread) on the deduplicated FeatureTensor
      torch  runners.graphsage.backends.TorchBackend (the dense model) on the same tensors
      pyg    training_export.pyg_model.PygGraphSAGE on the message-flow graph of the same tree
   Per call: targets/s, p50, p99. Separately: sample+compact and feature gather per batch.
3. The runner under 32 concurrent callers, emulated in-process exactly as runners/graphsage/service.py
   runs it: decode -> check_compatible -> AdaptiveBatcher.submit -> run_batch in a 1-thread
   executor -> wire.pack; each caller sends single-target FeatureTensors back to back for
   ``--duration`` seconds, batching on (max_batch_size 256) vs off (max_batch_size 1).

Results also go to bench/results/model_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.workload import time_calls  # noqa: E402

import torch  # noqa: E402

from runners import wire  # noqa: E402
from runners.graphsage.backends import OnnxBackend, TorchBackend  # noqa: E402
from common.batching import AdaptiveBatcher  # noqa: E402
from common.settings import Settings  # noqa: E402
from common.feature_tensor import FeatureTensor, compact, decode, encode  # noqa: E402
from runners.graphsage.inference import InferenceItem, LoadedModel, check_compatible, run_batch  # noqa: E402
from runners.graphsage.model_artifacts import CONFIG_FILE, ONNX_FILE, STATE_DICT_FILE, ModelArtifacts  # noqa: E402
from runners.graphsage.model_config import ModelConfig  # noqa: E402
from runners.feature.sampling import sample_tree  # noqa: E402
from training_export.export import export_onnx, to_dense  # noqa: E402
from training_export.pyg_model import mfg_tensors  # noqa: E402
from training_export.synthetic import SyntheticGraphSpec, generate  # noqa: E402
from training_export.train import TrainSpec, train_graphsage  # noqa: E402

BATCH_SIZES = (1, 16, 64, 256, 1024)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "model_bench.json")


def pct(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds), q) * 1e3)


class FixedRegistry:
    """``run_batch`` only asks its registry to load a tag; the bench has one model, no store."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded

    def load(self, tag: str) -> LoadedModel:
        return self.loaded


def build_model(args: argparse.Namespace, tmp: str):
    t = time.perf_counter()
    g = generate(SyntheticGraphSpec(num_nodes=args.nodes, num_edges=args.nodes * 10), progress=False)
    gen_s = time.perf_counter() - t
    cfg = ModelConfig(in_dim=g.feature_dim, hidden_dim=args.hidden, num_classes=g.num_classes,
                      fanout=(25, 10), aggregator="mean")
    t = time.perf_counter()
    model, metrics = train_graphsage(g, cfg, TrainSpec(epochs=1, max_train_nodes=args.train_nodes, eval_nodes=2000),
                                     progress=False)
    train_s = time.perf_counter() - t
    export_onnx(to_dense(model), os.path.join(tmp, ONNX_FILE))
    torch.save(model.state_dict(), os.path.join(tmp, STATE_DICT_FILE))
    with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
        json.dump(cfg.to_dict(), f)
    artifacts = ModelArtifacts(tag="graphsage:bench", path=tmp, config=cfg, metadata={})
    info = {"nodes": g.num_nodes, "edges": g.num_edges, "generate_s": round(gen_s, 1), "train_s": round(train_s, 1),
            "hidden_dim": cfg.hidden_dim, "fanout": list(cfg.fanout), "aggregator": cfg.aggregator, **metrics}
    return g, model, artifacts, info


def bench_forward(args, g, model, artifacts) -> dict[str, Any]:
    torch.set_num_threads(1)
    onnx, dense = OnnxBackend(artifacts, threads=1), TorchBackend(artifacts, threads=1)
    model.eval()
    rng = np.random.default_rng(7)
    out: dict[str, Any] = {}
    for b in BATCH_SIZES:
        n_batches = 4 if b <= 256 else 2
        prepared, sample_s, gather_s, mfg_s = [], [], [], []
        for i in range(n_batches):
            targets = rng.choice(g.num_nodes, size=b, replace=False)
            t0 = time.perf_counter()
            tree = sample_tree(g.indptr, g.indices, targets, model.cfg.fanout, seed=1000 + i)
            unique, index = compact(tree)
            t1 = time.perf_counter()
            feats = np.ascontiguousarray(g.features[unique], dtype=np.float32)
            t2 = time.perf_counter()
            mfg = mfg_tensors(tree, g.features)
            t3 = time.perf_counter()
            sample_s.append(t1 - t0)
            gather_s.append(t2 - t1)
            mfg_s.append(t3 - t2)
            prepared.append((feats, index, mfg))
        with torch.inference_mode():
            # parity on the bench's own batches (sanity, not a check)
            ref = model(*prepared[0][2])[0].numpy()
            diff = max(float(np.abs(onnx.run(prepared[0][0], prepared[0][1])[0] - ref).max()),
                       float(np.abs(dense.run(prepared[0][0], prepared[0][1])[0] - ref).max()))
            budget, min_calls = args.budget, 3 if b >= 256 else 10
            runs = {
                "onnx": time_calls(lambda p: onnx.run(p[0], p[1]), prepared, budget, min_calls, warmup=2),
                "torch": time_calls(lambda p: dense.run(p[0], p[1]), prepared, budget, min_calls, warmup=2),
                "pyg": time_calls(lambda p: model(*p[2]), prepared, budget, min_calls, warmup=2),
            }
        row: dict[str, Any] = {
            "unique_rows_mean": float(np.mean([p[0].shape[0] for p in prepared])),
            "sample_compact_ms_p50": pct(sample_s, 50), "gather_ms_p50": pct(gather_s, 50),
            "pyg_mfg_build_ms_p50": pct(mfg_s, 50), "max_abs_diff_vs_pyg": diff,
        }
        for name, secs in runs.items():
            row[name] = {"calls": len(secs), "p50_ms": pct(secs, 50), "p99_ms": pct(secs, 99),
                         "targets_per_s": b / float(np.mean(secs))}
        out[str(b)] = row
        print(f"  batch {b:>4}: onnx p50 {row['onnx']['p50_ms']:8.2f} ms  torch {row['torch']['p50_ms']:8.2f} ms"
              f"  pyg {row['pyg']['p50_ms']:8.2f} ms", flush=True)
    return out


async def _service(loaded: LoadedModel, blobs: list[bytes], max_batch: int, delay_s: float, callers: int,
                   duration_s: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    registry = FixedRegistry(loaded)
    compute = ThreadPoolExecutor(1, thread_name_prefix="forward")
    sizes: list[int] = []

    async def forward(items: list[InferenceItem]) -> list[dict]:
        sizes.append(len(items))
        return await loop.run_in_executor(compute, run_batch, registry, items)

    batcher = AdaptiveBatcher(forward, max_batch_size=max_batch, max_delay_s=delay_s,
                              size_of=lambda item: item.tensor.num_targets)
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + duration_s

    async def caller(cid: int) -> None:
        nonlocal errors
        n = cid
        while time.perf_counter() < stop_at:
            blob = blobs[n % len(blobs)]
            n += callers
            t = time.perf_counter()
            try:
                ft = decode(blob)  # what GraphSAGERunner.infer does per request
                check_compatible(loaded, ft)
                result = await batcher.submit(InferenceItem(loaded.artifacts.tag, ft, loaded=loaded))
                wire.pack({k: result[k] for k in ("logits", "probs")},
                          {k: result[k] for k in ("model", "backend", "task")})
            except Exception:  # noqa: BLE001 - counted, never raised
                errors += 1
                continue
            latencies.append(time.perf_counter() - t)

    started = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    elapsed = time.perf_counter() - started
    compute.shutdown()
    s = batcher.stats
    return {"max_batch_size": max_batch, "max_delay_ms": delay_s * 1e3, "requests": len(latencies), "errors": errors,
            "req_per_s": len(latencies) / elapsed, "p50_ms": pct(latencies, 50), "p99_ms": pct(latencies, 99),
            "mean_batch": float(np.mean(sizes)) if sizes else 0.0, "batches": s.batches,
            "mean_queue_ms": s.queue_seconds / max(s.batches, 1) * 1e3,
            "mean_compute_ms": s.compute_seconds / max(s.batches, 1) * 1e3}


def bench_service(args, g, model, artifacts) -> dict[str, Any]:
    loaded = LoadedModel(artifacts, OnnxBackend(artifacts, threads=1), time.time())
    rng = np.random.default_rng(11)
    blobs = []
    for i, node in enumerate(rng.choice(g.num_nodes, size=args.pool, replace=False)):
        tree = sample_tree(g.indptr, g.indices, np.array([node]), model.cfg.fanout, seed=i)
        unique, index = compact(tree)
        blobs.append(encode(FeatureTensor(np.ascontiguousarray(g.features[unique], dtype=np.float32), index)))
    delay_s = Settings().max_batch_delay_ms / 1e3
    out = {}
    for label, max_batch in (("batching_on", 256), ("batching_off", 1)):
        out[label] = asyncio.run(_service(loaded, blobs, max_batch, delay_s, args.callers, args.duration))
        r = out[label]
        print(f"  {label:<13} {r['req_per_s']:8.0f} req/s  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms"
              f"  mean batch {r['mean_batch']:6.1f}", flush=True)
    out["throughput_ratio_on_off"] = out["batching_on"]["req_per_s"] / max(out["batching_off"]["req_per_s"], 1e-9)
    return out


def print_table(info: dict, forward: dict, service: dict) -> None:
    print()
    print(f"graph {info['nodes']:,} nodes / {info['edges']:,} edges; mean aggregator, hidden {info['hidden_dim']},"
          f" fanout {info['fanout']}; val {info.get('val_score')}; 1 thread per backend")
    print(f"{'batch':>5} | {'uniq rows':>9} | {'sample+compact':>14} | {'gather':>7} |"
          f" {'onnx tgt/s':>10} {'p50':>7} {'p99':>7} | {'torch tgt/s':>11} {'p50':>7} {'p99':>7} |"
          f" {'pyg tgt/s':>9} {'p50':>7} {'p99':>7} | {'pyg mfg':>7} | {'onnx/pyg':>8}")
    for b, r in forward.items():
        cells = []
        for name in ("onnx", "torch", "pyg"):
            x = r[name]
            cells.append(f"{x['targets_per_s']:>{11 if name == 'torch' else 10 if name == 'onnx' else 9},.0f}"
                         f" {x['p50_ms']:7.2f} {x['p99_ms']:7.2f}")
        ratio = r["pyg"]["p50_ms"] / r["onnx"]["p50_ms"]
        print(f"{b:>5} | {r['unique_rows_mean']:9.0f} | {r['sample_compact_ms_p50']:11.2f} ms | {r['gather_ms_p50']:4.2f} ms |"
              f" {cells[0]} | {cells[1]} | {cells[2]} | {r['pyg_mfg_build_ms_p50']:7.2f} | {ratio:7.2f}x")
    print("(ms per call, 1 thread. Forward only, inputs prepared: onnx/torch get the deduplicated rows + index, pyg\n"
          " gets per-slot rows + edges. Not timed, p50 per batch: sample+compact and the unique-row gather (onnx/torch),\n"
          " 'pyg mfg' = tree -> per-slot feature gather + edge lists. onnx/pyg = pyg p50 / onnx p50, >1 = onnx faster)")
    print(f"ONNX / PyG at batch 64 (p50): {forward['64']['onnx_over_pyg']:.2f}x (issue expects >= 2.5x)")
    print()
    print(f"service emulation, {service['callers']} callers, single-target requests, {service['duration_s']} s each:")
    print(f"{'mode':<13} | {'req/s':>7} | {'p50 ms':>7} | {'p99 ms':>7} | {'mean batch':>10} | {'queue ms':>8} |"
          f" {'compute ms':>10} | errors")
    for label in ("batching_on", "batching_off"):
        r = service[label]
        print(f"{label:<13} | {r['req_per_s']:7.0f} | {r['p50_ms']:7.2f} | {r['p99_ms']:7.2f} | {r['mean_batch']:10.1f} |"
              f" {r['mean_queue_ms']:8.2f} | {r['mean_compute_ms']:10.2f} | {r['errors']}")
    print(f"throughput on/off: {service['throughput_ratio_on_off']:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20k-node graph, short budgets (~30 s)")
    p.add_argument("--nodes", type=int, default=None, help="graph size (default 100000; --quick 20000)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--train-nodes", type=int, default=20_000)
    p.add_argument("--budget", type=float, default=None, help="seconds per (backend, batch size)")
    p.add_argument("--duration", type=float, default=None, help="seconds per service mode")
    p.add_argument("--callers", type=int, default=32)
    p.add_argument("--pool", type=int, default=2000, help="distinct single-target requests")
    args = p.parse_args()
    args.nodes = args.nodes or (20_000 if args.quick else 100_000)
    args.budget = args.budget or (0.3 if args.quick else 1.5)
    args.duration = args.duration or (1.5 if args.quick else 5.0)
    if args.quick:
        args.train_nodes = min(args.train_nodes, 4000)
        args.pool = min(args.pool, 500)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"building: {args.nodes:,}-node graph, training 1 epoch on <= {args.train_nodes:,} nodes ...", flush=True)
        g, model, artifacts, info = build_model(args, tmp)
        print(f"  generated in {info['generate_s']} s, trained in {info['train_s']} s (val {info.get('val_score')})")
        print("forward passes:", flush=True)
        forward = bench_forward(args, g, model, artifacts)
        for r in forward.values():
            r["onnx_over_pyg"] = r["pyg"]["p50_ms"] / r["onnx"]["p50_ms"]
        print(f"service emulation ({args.callers} callers, {args.duration} s per mode):", flush=True)
        service = bench_service(args, g, model, artifacts)
        service.update(callers=args.callers, duration_s=args.duration)
    print_table(info, forward, service)
    total = time.perf_counter() - started
    print(f"\ntotal {total:.0f} s")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"args": vars(args), "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                                  "torch": torch.__version__},
                   "model": info, "forward": forward, "service": service, "total_s": round(total, 1)}, f, indent=2)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
