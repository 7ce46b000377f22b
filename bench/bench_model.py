"""GraphSAGERunner compute: every backend and precision side by side, the batcher under load, and
(``--e2e``) each backend serving end to end.

    python bench/bench_model.py [--quick] [--aggregators mean,pool,lstm] [--nodes 100000]
                                [--budget 1.5] [--duration 5] [--e2e] [--e2e-only]

Prints numbers, never asserts; about 6 minutes on 2 cores (``--quick``: ~1.5 min; ``--e2e`` adds
about 10).

1. Generates the demo graph in-process (``training_export.synthetic``, 100k nodes / 1M edges by
   default) and, per aggregator, trains a model briefly (1 epoch, <= 20k train nodes for mean,
   fewer for pool and LSTM), exports its ONNX graphs to a temporary directory (no model store) and
   quantises them as the export does (``training_export.quantize``: calibrated on the training
   split, the guard's figures on 2000 validation nodes).
2. Forward only (features already gathered), 1 thread each, on the same sampled batches of
   1, 16, 256, 1024 targets, fanout [25, 10]:
      onnx / onnx-int8          runners.graphsage.backends.OnnxBackend, FP32 and the INT8 QDQ graph
      openvino / openvino-int8  runners.graphsage.backends.OpenVinoBackend, the same two graphs
      torch                     runners.graphsage.backends.TorchBackend (the dense model)
      pyg                       training_export.pyg_model.PygGraphSAGE on the message-flow graph
   The backends take turns call by call (the same background load for each). Per call: p50,
   p99, targets/s; max |logit diff| vs PyG (FP32) or max |prob diff| and label agreement vs ONNX
   Runtime FP32 (INT8). Separately: sample+compact and feature gather per batch.
3. The runner under 32 concurrent callers (mean model, ONNX Runtime FP32), emulated in-process
   exactly as runners/graphsage/service.py runs it: decode -> check_compatible ->
   AdaptiveBatcher.submit -> run_batch in a 1-thread executor -> wire.pack; each caller sends
   single-target FeatureTensors back to back for ``--duration`` seconds, batching on
   (max_batch_size 256) vs off (max_batch_size 1).
4. ``--e2e``: the real services (gateway -> FeatureRunner -> GraphSAGERunner, separate
   processes, the bench suite's store in /tmp/gsage-bench-home, a version exported with INT8
   added there when it has none), one app per backend and precision, taking turns in short
   windows (bench.suite's interleaved rounds, as ``python -m bench.suite.ab``): single-node
   P99 at concurrency 1, then 256-node requests at concurrency 16 (nodes/s), each against the
   same run's ONNX Runtime FP32 app.

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

import torch

from common import wire
from common.batching import AdaptiveBatcher
from common.feature_tensor import FeatureTensor, decode, encode
from common.settings import Settings
from runners.feature.sampling import sample_tree
from runners.feature.tree_layout import compact
from runners.graphsage.backends import OnnxBackend, OpenVinoBackend, TorchBackend
from runners.graphsage.inference import InferenceItem, LoadedModel, check_compatible, run_batch
from runners.graphsage.model_artifacts import CONFIG_FILE, STATE_DICT_FILE, ModelArtifacts
from runners.graphsage.model_config import AGGREGATORS, ModelConfig
from training_export.export import export_all, to_dense
from training_export.pyg_model import mfg_tensors
from training_export.quantize import QuantizationRefused, describe, quantize_and_guard
from training_export.synthetic import SyntheticGraphSpec, generate
from training_export.train import TrainSpec, train_graphsage

BATCH_SIZES = (1, 16, 256, 1024)
BACKENDS = ("onnx", "onnx-int8", "openvino", "openvino-int8", "torch", "pyg")
# Training nodes per aggregator (1 epoch): the LSTM trains ~10x slower per node than mean.
TRAIN_NODES = {"mean": 20_000, "pool": 8_000, "lstm": 3_000}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "model_bench.json")
# The e2e sides: (name, GSAGE_* environment of its model runner); the first is the baseline.
E2E_SIDES = (
    ("onnx", {}),
    ("onnx-int8", {"GSAGE_PRECISION": "int8"}),
    ("openvino", {"GSAGE_BACKEND": "openvino"}),
    ("openvino-int8", {"GSAGE_BACKEND": "openvino", "GSAGE_PRECISION": "int8"}),
    ("torch", {"GSAGE_BACKEND": "torch"}),
)


def pct(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds), q) * 1e3)


class FixedRegistry:
    """``run_batch`` only asks its registry to load a tag; the bench has one model, no store."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded

    def load(self, tag: str) -> LoadedModel:
        return self.loaded

    def get_loaded(self, tag: str) -> LoadedModel:
        return self.loaded


def build_model(args: argparse.Namespace, g, aggregator: str, tmp: str):
    cfg = ModelConfig(
        in_dim=g.feature_dim, hidden_dim=args.hidden, num_classes=g.num_classes, fanout=(25, 10), aggregator=aggregator
    )
    t = time.perf_counter()
    train_nodes = min(args.train_nodes, TRAIN_NODES[aggregator] // (4 if args.quick else 1))
    model, metrics = train_graphsage(
        g, cfg, TrainSpec(epochs=1, max_train_nodes=train_nodes, eval_nodes=2000), progress=False
    )
    train_s = time.perf_counter() - t
    directory = os.path.join(tmp, aggregator)
    os.makedirs(directory)
    export_all(to_dense(model), directory)
    torch.save(model.state_dict(), os.path.join(directory, STATE_DICT_FILE))
    with open(os.path.join(directory, CONFIG_FILE), "w") as f:
        json.dump(cfg.to_dict(), f)
    t = time.perf_counter()
    try:
        int8 = quantize_and_guard(g, cfg, directory)
    except QuantizationRefused as exc:
        int8 = exc.figures
    quantize_s = time.perf_counter() - t
    artifacts = ModelArtifacts(tag=f"graphsage:bench-{aggregator}", path=directory, config=cfg, metadata={"int8": int8})
    info = {
        "aggregator": aggregator,
        "train_nodes": train_nodes,
        "train_s": round(train_s, 1),
        "quantize_and_guard_s": round(quantize_s, 1),
        "hidden_dim": cfg.hidden_dim,
        "fanout": list(cfg.fanout),
        **metrics,
        "int8": int8,
    }
    return model, artifacts, info


def backends_for(artifacts: ModelArtifacts, model) -> dict[str, Any]:
    out: dict[str, Any] = {"onnx": OnnxBackend(artifacts, threads=1)}
    stored = artifacts.metadata["int8"].get("stored")
    if stored:
        out["onnx-int8"] = OnnxBackend(artifacts, threads=1, precision="int8")
    out["openvino"] = OpenVinoBackend(artifacts, threads=1)
    if stored:
        out["openvino-int8"] = OpenVinoBackend(artifacts, threads=1, precision="int8")
    out["torch"] = TorchBackend(artifacts, threads=1)
    return out


def bench_forward(args, g, model, artifacts) -> dict[str, Any]:
    torch.set_num_threads(1)
    backends = backends_for(artifacts, model)
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
        row: dict[str, Any] = {
            "unique_rows_mean": float(np.mean([p[0].shape[0] for p in prepared])),
            "sample_compact_ms_p50": pct(sample_s, 50),
            "gather_ms_p50": pct(gather_s, 50),
            "pyg_mfg_build_ms_p50": pct(mfg_s, 50),
        }
        fns = {"pyg": lambda p: model(*p[2])}
        with torch.inference_mode():
            ref = model(*prepared[0][2])[0].numpy()  # accuracy of each backend on the bench's own batch
            ref_probs = backends["onnx"].run(prepared[0][0], prepared[0][1])[1]
            for name, be in backends.items():
                logits, probs, _ = be.run(prepared[0][0], prepared[0][1])
                if be.precision == "fp32":
                    row[name] = {"max_abs_diff_vs_pyg": float(np.abs(logits - ref).max())}
                else:
                    row[name] = {
                        "max_prob_diff_vs_fp32": float(np.abs(probs - ref_probs).max()),
                        "same_label_share": float((probs.argmax(1) == ref_probs.argmax(1)).mean()),
                    }
                fns[name] = lambda p, be=be: be.run(p[0], p[1])
            row["pyg"] = {}
            fns = {name: fns[name] for name in BACKENDS if name in fns}
            timed = time_interleaved(fns, prepared, args.budget * len(fns), 3 if b >= 256 else 10)
        for name, secs in timed.items():
            row[name].update(
                calls=len(secs), p50_ms=pct(secs, 50), p99_ms=pct(secs, 99), targets_per_s=b / float(np.mean(secs))
            )
        out[str(b)] = row
        print(
            f"  batch {b:>4}: " + "  ".join(f"{n} {row[n]['p50_ms']:.2f}" for n in BACKENDS if n in row) + " ms p50",
            flush=True,
        )
    return out


def time_interleaved(
    fns: dict[str, Any], inputs: list, budget_s: float, min_calls: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Seconds per call of each function, the functions taking turns call by call (each on the
    same input in a turn, inputs round-robin): every backend meets the same background load of
    this shared machine, as bench.suite's interleaved windows do for the services."""
    for x in inputs[:warmup]:
        for fn in fns.values():
            fn(x)
    out: dict[str, list[float]] = {name: [] for name in fns}
    deadline = time.perf_counter() + budget_s
    n = 0
    while n < min_calls or (time.perf_counter() < deadline and n < 5000):
        x = inputs[n % len(inputs)]
        for name, fn in fns.items():
            t = time.perf_counter()
            fn(x)
            out[name].append(time.perf_counter() - t)
        n += 1
    return out


async def _service(
    loaded: LoadedModel, blobs: list[bytes], max_batch: int, delay_s: float, callers: int, duration_s: float
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    registry = FixedRegistry(loaded)
    compute = ThreadPoolExecutor(1, thread_name_prefix="forward")
    sizes: list[int] = []

    async def forward(items: list[InferenceItem]) -> list[dict]:
        sizes.append(len(items))
        return await loop.run_in_executor(compute, run_batch, registry, items)

    batcher = AdaptiveBatcher(
        forward, max_batch_size=max_batch, max_delay_s=delay_s, size_of=lambda item: item.tensor.num_targets
    )
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
                wire.pack(
                    {k: result[k] for k in ("logits", "probs")},
                    {k: result[k] for k in ("model", "backend", "precision", "task")},
                )
            except Exception:
                errors += 1
                continue
            latencies.append(time.perf_counter() - t)

    started = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    elapsed = time.perf_counter() - started
    compute.shutdown()
    s = batcher.stats
    return {
        "max_batch_size": max_batch,
        "max_delay_ms": delay_s * 1e3,
        "requests": len(latencies),
        "errors": errors,
        "req_per_s": len(latencies) / elapsed,
        "p50_ms": pct(latencies, 50),
        "p99_ms": pct(latencies, 99),
        "mean_batch": float(np.mean(sizes)) if sizes else 0.0,
        "batches": s.batches,
        "mean_queue_ms": s.queue_seconds / max(s.batches, 1) * 1e3,
        "mean_compute_ms": s.compute_seconds / max(s.batches, 1) * 1e3,
    }


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
        print(
            f"  {label:<13} {r['req_per_s']:8.0f} req/s  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms"
            f"  mean batch {r['mean_batch']:6.1f}",
            flush=True,
        )
    out["throughput_ratio_on_off"] = out["batching_on"]["req_per_s"] / max(out["batching_off"]["req_per_s"], 1e-9)
    return out


# --- end to end --------------------------------------------------------------------------------


def e2e_store(log) -> tuple[str, dict]:
    """The suite's 100k store with a version carrying INT8 graphs (exported once, then reused):
    (its tag, its int8 metadata)."""
    from bench.suite.runner import HOME_100K, ensure_store, run_cmd

    info = ensure_store(HOME_100K, [], log)
    probe = (
        "import bentoml,json;m=bentoml.models.get('graphsage:latest');"
        "print(json.dumps([str(m.tag), m.info.metadata.get('int8') or {}]))"
    )
    env = {"BENTOML_HOME": HOME_100K, "BENTOML_DO_NOT_TRACK": "true"}
    tag, int8 = json.loads(run_cmd([sys.executable, "-c", probe], env, timeout=120).stdout)
    if not int8.get("stored"):
        log(f"{tag} has no INT8 graphs: python -m training_export train --int8 on {info['graph_snapshot']} ...")
        out = run_cmd(
            [sys.executable, "-m", "training_export", "train", "--snapshot", info["graph_snapshot"], "--int8"],
            env,
            timeout=1800,
        )
        if out.returncode != 0:
            raise RuntimeError(f"training_export train --int8 failed:\n{out.stderr[-3000:]}")
        tag, int8 = json.loads(run_cmd([sys.executable, "-c", probe], env, timeout=120).stdout)
    return tag, int8


def served_precision(topo) -> dict:
    """What the side's model runner says it serves (its ``models`` API)."""
    import httpx

    from harness.app import service_headers

    svc = topo.services["model"]
    try:
        loaded = httpx.post(svc.url + "/models", json={}, headers=service_headers(svc.env), timeout=10).json()["loaded"]
        return {m["tag"]: f"{m['backend']} {m['precision']}" for m in loaded}
    except Exception as exc:
        return {"error": repr(exc)}


def bench_e2e(args) -> dict[str, Any]:
    from bench.suite import procs
    from bench.suite.runner import HOME_100K, Suite, snapshot_counts
    from harness.redis_servers import RedisServer, redis_available

    if not redis_available():
        raise SystemExit("--e2e: redis-server is not installed (the app sides use it for L2, as the suite's)")
    suite = Suite(
        argparse.Namespace(
            quick=False, scale=1.0, out=os.path.join(tempfile.gettempdir(), "gsage-bench-model"), code="worktree"
        )
    )
    tag, int8 = e2e_store(suite.log)
    suite.log(f"e2e model {tag}: INT8 {describe(int8) if int8.get('runtimes') else int8}")
    procs.snapshot_code(tempfile.mkdtemp(prefix="gsage-bench-model-code-"), "worktree")
    num_nodes, _ = snapshot_counts(HOME_100K)
    redis = RedisServer(os.path.join(suite.logs, "redis")).start()
    topologies: dict[str, procs.Topology] = {}
    out: dict[str, Any] = {"model": tag, "int8": int8, "rounds": args.e2e_rounds, "window_s": args.e2e_window}
    try:
        env = {**suite.app_env(redis.url, num_nodes), "GSAGE_MODEL_TAGS": tag}
        for name, extra in E2E_SIDES:
            topologies[name] = procs.real_app(f"bm-{name}", HOME_100K, {**env, **extra}, suite.logs)
        suite.start(*topologies.values())
        out["served"] = {name: served_precision(topo) for name, topo in topologies.items()}
        suite.log(f"serving: {out['served']}")
        for name, topo in topologies.items():  # as bench.suite.ab warms its sides: fills L1 and Redis
            suite.load(f"warm-up 32-node {name}", topo, nodes=32, concurrency=2, duration=6, record=False, seed=22)
            suite.load(f"warm-up single {name}", topo, concurrency=8, duration=5, record=False, seed=21)
        for label, concurrency, nodes in (("single_c1", 1, 1), ("bulk256_c16", 16, 256)):
            rows = suite.paired(
                topologies,
                concurrency=concurrency,
                rounds=args.e2e_rounds,
                window=args.e2e_window,
                tags={},
                nodes=nodes,
            )
            out[label] = {
                name: {
                    "p50_ms": r.get("p50_ms"),
                    "p99_ms": r.get("p99_ms"),
                    "req_per_s": r["req_per_s"],
                    "nodes_per_s": r["req_per_s"] * nodes,
                    "errors": r.get("error_count", 0),
                    "window_p99_ms": [w["p99_ms"] for w in r["windows"]],
                }
                for name, r in rows.items()
            }
    finally:
        for topo in topologies.values():
            topo.stop()
        redis.stop()
    return out


# --- report ------------------------------------------------------------------------------------


def print_forward(info: dict, forward: dict) -> None:
    int8 = info["int8"]
    print(
        f"\n{info['aggregator']}: hidden {info['hidden_dim']}, fanout {info['fanout']}, trained 1 epoch on "
        f"{info['train_nodes']:,} nodes (val {info.get('val_score')}); INT8 guard: "
        + (describe(int8) if int8.get("runtimes") else str(int8))
    )
    head = f"{'backend':<14}" + "".join(f" | {'batch ' + b:^26}" for b in forward)
    print(head)
    print(
        f"{'':<14}" + "".join(f" | {'p50':>7} {'p99':>7} {'tgt/s':>10}" for _ in forward) + " | accuracy (batch 1024)"
    )
    for name in BACKENDS:
        cells = []
        for r in forward.values():
            x = r.get(name)
            cells.append(
                f" | {x['p50_ms']:7.2f} {x['p99_ms']:7.2f} {x['targets_per_s']:10,.0f}" if x else f" | {'-':>26}"
            )
        if not any(name in r for r in forward.values()):
            continue
        last = forward[str(BATCH_SIZES[-1])].get(name, {})
        acc = (
            f"max|logit diff| vs pyg {last['max_abs_diff_vs_pyg']:.1e}"
            if "max_abs_diff_vs_pyg" in last
            else f"max|prob diff| vs fp32 {last['max_prob_diff_vs_fp32']:.3f}, same label {last['same_label_share']:.3f}"
            if "max_prob_diff_vs_fp32" in last
            else "reference"
        )
        print(f"{name:<14}" + "".join(cells) + f" | {acc}")
    rows = " ".join(f"{b}:{r['unique_rows_mean']:.0f}" for b, r in forward.items())
    print(f"(ms per call, 1 thread, forward only on prepared inputs; unique rows per batch {rows})")


def print_service(service: dict) -> None:
    print(
        f"\nservice emulation (mean, onnx fp32), {service['callers']} callers, single-target requests, "
        f"{service['duration_s']} s each:"
    )
    print(
        f"{'mode':<13} | {'req/s':>7} | {'p50 ms':>7} | {'p99 ms':>7} | {'mean batch':>10} | {'queue ms':>8} |"
        f" {'compute ms':>10} | errors"
    )
    for label in ("batching_on", "batching_off"):
        r = service[label]
        print(
            f"{label:<13} | {r['req_per_s']:7.0f} | {r['p50_ms']:7.2f} | {r['p99_ms']:7.2f} | {r['mean_batch']:10.1f} |"
            f" {r['mean_queue_ms']:8.2f} | {r['mean_compute_ms']:10.2f} | {r['errors']}"
        )
    print(f"throughput on/off: {service['throughput_ratio_on_off']:.2f}x")


def print_e2e(e2e: dict) -> None:
    print(
        f"\nend to end ({e2e['model']}, {e2e['rounds']} interleaved windows of {e2e['window_s']:g} s per side; "
        f"ratios against this run's onnx fp32):"
    )
    print(
        f"{'backend':<14} | {'served':<22} | {'single c=1 P50':>14} {'P99':>7} {'P99 ratio':>9} |"
        f" {'256-node c=16 nodes/s':>21} {'ratio':>6} {'P99 ms':>8} | errors"
    )
    s0, b0 = e2e["single_c1"]["onnx"], e2e["bulk256_c16"]["onnx"]
    for name in e2e["single_c1"]:
        s, b = e2e["single_c1"][name], e2e["bulk256_c16"][name]
        served = ", ".join(e2e["served"].get(name, {}).values())
        print(
            f"{name:<14} | {served:<22} | {s['p50_ms']:14.2f} {s['p99_ms']:7.2f} {s['p99_ms'] / s0['p99_ms']:8.2f}x |"
            f" {b['nodes_per_s']:21,.0f} {b['nodes_per_s'] / b0['nodes_per_s']:5.2f}x {b['p99_ms']:8.1f} |"
            f" {s['errors'] + b['errors']}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20k-node graph, short budgets (~1.5 min)")
    p.add_argument("--aggregators", default=",".join(AGGREGATORS), help="comma-separated (default: all three)")
    p.add_argument("--nodes", type=int, default=None, help="graph size (default 100000; --quick 20000)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--train-nodes", type=int, default=20_000, help="cap on each aggregator's training nodes")
    p.add_argument("--budget", type=float, default=None, help="seconds per (backend, batch size)")
    p.add_argument("--duration", type=float, default=None, help="seconds per service mode")
    p.add_argument("--callers", type=int, default=32)
    p.add_argument("--pool", type=int, default=2000, help="distinct single-target requests")
    p.add_argument("--e2e", action="store_true", help="then each backend serving end to end (about 10 more minutes)")
    p.add_argument("--e2e-only", action="store_true", help="only the end-to-end part")
    p.add_argument("--e2e-rounds", type=int, default=6)
    p.add_argument("--e2e-window", type=float, default=4.0, help="seconds per side per round")
    args = p.parse_args()
    args.nodes = args.nodes or (20_000 if args.quick else 100_000)
    args.budget = args.budget or (0.3 if args.quick else 1.5)
    args.duration = args.duration or (1.5 if args.quick else 5.0)
    if args.quick:
        args.pool = min(args.pool, 500)
    aggregators = [a for a in args.aggregators.split(",") if a]
    started = time.perf_counter()
    results: dict[str, Any] = {
        "args": vars(args),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "torch": torch.__version__},
    }
    if not args.e2e_only:
        print(f"building: {args.nodes:,}-node graph ...", flush=True)
        t = time.perf_counter()
        g = generate(SyntheticGraphSpec(num_nodes=args.nodes, num_edges=args.nodes * 10), progress=False)
        results["graph"] = {"nodes": g.num_nodes, "edges": g.num_edges, "generate_s": round(time.perf_counter() - t, 1)}
        results["aggregators"] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for aggregator in aggregators:
                print(f"{aggregator}: training, exporting, quantising ...", flush=True)
                model, artifacts, info = build_model(args, g, aggregator, tmp)
                print(
                    f"  trained in {info['train_s']} s (val {info.get('val_score')}), INT8 + guard in "
                    f"{info['quantize_and_guard_s']} s",
                    flush=True,
                )
                forward = bench_forward(args, g, model, artifacts)
                entry = {"model": info, "forward": forward}
                if aggregator == "mean":
                    print(f"service emulation ({args.callers} callers, {args.duration} s per mode):", flush=True)
                    entry["service"] = bench_service(args, g, model, artifacts)
                    entry["service"].update(callers=args.callers, duration_s=args.duration)
                results["aggregators"][aggregator] = entry
        print(f"\ngraph {g.num_nodes:,} nodes / {g.num_edges:,} edges; 1 thread per backend")
        for entry in results["aggregators"].values():
            print_forward(entry["model"], entry["forward"])
        if "service" in results["aggregators"].get("mean", {}):
            print_service(results["aggregators"]["mean"]["service"])
    if args.e2e or args.e2e_only:
        results["e2e"] = bench_e2e(args)
        print_e2e(results["e2e"])
    total = time.perf_counter() - started
    results["total_s"] = round(total, 1)
    print(f"\ntotal {total:.0f} s")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
