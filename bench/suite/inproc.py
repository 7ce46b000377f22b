"""Baselines B3 and B4: the whole job in one Python process, no HTTP, no serialisation.

B3 (project monolith): ``runners.feature.neighbourhood.NeighbourhoodBuilder`` (validate + sample_tree +
    tiered feature fetch, L1 holding every row after the first pass, no Redis; the premean
    tensor when the model takes it, as the served FeatureRunner sends) ->
    ``runners.graphsage.inference.run_batch`` (merge + ONNX Runtime, 1 intra-op thread, as served).
    Also without L1 (``b3_no_l1``: every batch a scan, as the served FeatureRunner runs bulk
    requests: rows gathered from the memory-mapped snapshot). B3's figure is the better of the two.
B4 (PyG monolith): ``runners.feature.sampling.sample_tree`` -> ``training_export.pyg_model.mfg_tensors``
    (gather per slot + edge lists) -> ``PygGraphSAGE`` with the stored ``state_dict.pt`` ->
    softmax; torch with 1 thread (as B3) and with all cores.
B3 at 1 node also after an idle gap before each call (``b3_idle``, ``--idle-ms``): a service at
concurrency 1 runs its share of a request and then waits ~10 ms for the next, and on a shared VM
the same code then runs several times slower than back to back (caches gone meanwhile, whether
the process sleeps or spins; the findings in docs/performance.md).
Both also as a monolith serving concurrent callers (``*_callers``): one caller thread per core,
each with 1 compute thread, calls counted over the same wall time. The served app's best
bulk figure comes from concurrent requests; this is the monolith's way to use the same cores
(torch and ONNX Runtime release the GIL while they compute).

Same Zipf(1.0) targets for both. The keys of the output are the variants' in
``bench/suite/targets.py`` (which the report reads them by). Run as a subprocess so that torch
never loads into the driver:

    BENTOML_HOME=/tmp/gsage-bench-home python -m bench.suite.inproc --budget 3 > b34.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time

import numpy as np

from bench.suite.targets import (
    B3_CALLERS,
    B3_IDLE,
    B3_NO_L1,
    B3_WITH_L1,
    B4_ALL_THREADS,
    B4_CALLERS,
    B4_ONE_THREAD,
    INPROC_VARIANTS,
)
from harness.workload import time_calls


def _timed(fn, inputs: list, budget_s: float, min_calls: int, idle_s: float = 0.0) -> np.ndarray:
    return np.asarray(time_calls(fn, inputs, budget_s, min_calls, max_calls=20_000, idle_s=idle_s))


def _stats(secs: np.ndarray, nodes: int) -> dict:
    ms = secs * 1e3
    return {
        "calls": int(ms.size),
        "nodes_per_request": nodes,
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "nodes_per_s": nodes / float(secs.mean()),
    }


def _concurrent(make_fn, inputs: list, budget_s: float, callers: int, nodes: int) -> dict:
    """``callers`` threads, each calling its own ``make_fn(k)`` round-robin over ``inputs`` until
    the budget is spent (after one untimed call each); nodes/s over the wall time of all."""
    fns = [make_fn(k) for k in range(callers)]
    for k, fn in enumerate(fns):
        fn(inputs[k % len(inputs)])
    times: list[list[float]] = [[] for _ in fns]
    start = threading.Barrier(callers + 1)

    def loop(k: int) -> None:
        start.wait()
        deadline = time.perf_counter() + budget_s
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            fns[k](inputs[(k + len(times[k]) * callers) % len(inputs)])
            times[k].append(time.perf_counter() - t)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(callers)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    secs = np.asarray([x for per in times for x in per])
    out = _stats(secs, nodes)
    out.update(nodes_per_s=secs.size * nodes / wall, callers=callers)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=3.0, help="seconds per measurement")
    p.add_argument("--sizes", default="1,256")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--idle-ms",
        type=float,
        default=10.0,
        help="the idle gap before each call of B3's 1-node idle variant (0: skip it)",
    )
    a = p.parse_args()

    import torch

    from common.feature_tensor import PREMEAN
    from common.settings import Settings
    from harness.workload import Zipf
    from runners.feature.cache.tiered import build_feature_store
    from runners.feature.neighbourhood import NeighbourhoodBuilder
    from runners.feature.sampling import sample_tree
    from runners.feature.snapshot import load_snapshot
    from runners.graphsage.inference import InferenceItem, ModelRegistry, run_batch
    from training_export.pyg_model import PygGraphSAGE, mfg_tensors

    t0 = time.perf_counter()
    snap = load_snapshot("graph-snapshot:latest")
    registry = ModelRegistry("onnx", 1)
    loaded = registry.load("graphsage:latest")
    cfg = loaded.artifacts.config
    fanout = tuple(cfg.fanout)
    settings = Settings(l1_bytes=snap.num_nodes * (snap.feature_dim * 4 + 256), redis_url="")
    store = build_feature_store(settings.feature_cache, settings.redis, snap.features, snap.tag)
    builder = NeighbourhoodBuilder(snap, store, fanout, 4096)
    # B3 without L1: every row gathered straight from the memory-mapped snapshot (page cache)
    no_l1 = Settings(l1_bytes=0, redis_url="")
    bare = NeighbourhoodBuilder(
        snap,
        build_feature_store(no_l1.feature_cache, no_l1.redis, snap.features, snap.tag),
        fanout,
        4096,
        scan_min_targets=1,
    )
    pyg = PygGraphSAGE(cfg)
    pyg.load_state_dict(torch.load(loaded.artifacts.state_dict_path, weights_only=True), strict=True)
    pyg.eval()
    zipf = Zipf(snap.num_nodes, a.seed)
    loop = asyncio.new_event_loop()
    rng = np.random.default_rng(a.seed)
    premean = PREMEAN in loaded.input_layouts and settings.premean
    out: dict = {
        "graph_snapshot": snap.tag,
        "model": loaded.artifacts.tag,
        "b3_premean": premean,
        "num_nodes": snap.num_nodes,
        "num_edges": snap.num_edges,
        "fanout": list(fanout),
        "setup_s": 0.0,
        **{v.key: {} for v in INPROC_VARIANTS},
        "idle_ms": a.idle_ms,
    }
    b3k, b3_bare_k, b3_idle_k, b3_callers_k = B3_WITH_L1.key, B3_NO_L1.key, B3_IDLE.key, B3_CALLERS.key
    b4k, b4_all_k, b4_callers_k = B4_ONE_THREAD.key, B4_ALL_THREADS.key, B4_CALLERS.key
    callers = os.cpu_count() or 1

    def make_b3(nb: NeighbourhoodBuilder, own_loop: asyncio.AbstractEventLoop, own_rng: np.random.Generator):
        def call(ids: np.ndarray) -> np.ndarray:
            req = nb.validate(
                ids.tolist(),
                None,
                int(own_rng.integers(2**62)),
                premean=premean and ids.size >= settings.premean_min_targets,
            )
            (ft,) = own_loop.run_until_complete(nb.build([req]))
            (res,) = run_batch(registry, [InferenceItem(loaded.artifacts.tag, ft, loaded=loaded)])
            return res["probs"]

        return call

    def make_b4(own_rng: np.random.Generator):
        def call(ids: np.ndarray) -> np.ndarray:
            tree = sample_tree(snap.indptr, snap.indices, ids, fanout, seed=int(own_rng.integers(2**62)))
            xs, edges = mfg_tensors(tree, snap.features)
            with torch.inference_mode():
                logits, _ = pyg(xs, edges)
                return torch.softmax(logits, -1).numpy()

        return call

    b3, b3_bare, b4 = make_b3(builder, loop, rng), make_b3(bare, loop, rng), make_b4(rng)

    def b3_bare_caller(k: int):
        """B3 without L1 for one caller thread: its own event loop and seeds (the scan path
        shares no mutable state; the numba kernels hold the GIL while they run)."""
        return make_b3(bare, asyncio.new_event_loop(), np.random.default_rng(a.seed + 1 + k))

    def b4_caller(k: int):
        return make_b4(np.random.default_rng(a.seed + 1 + k))

    # Warm L1 with every row (the monolith's best case; the served app's L1 is smaller).
    loop.run_until_complete(store.warm(np.arange(snap.num_nodes)))
    out["setup_s"] = round(time.perf_counter() - t0, 1)
    for n in (int(x) for x in a.sizes.split(",")):
        inputs = [zipf.draw(n) for _ in range(64 if n <= 64 else 8)]
        min_calls = 20 if n <= 64 else 5
        torch.set_num_threads(1)
        out[b3k][str(n)] = _stats(_timed(b3, inputs, a.budget, min_calls), n)
        out[b3_bare_k][str(n)] = _stats(_timed(b3_bare, inputs, a.budget / 2, min_calls), n)
        if n == 1 and a.idle_ms > 0:
            out[b3_idle_k][str(n)] = _stats(_timed(b3, inputs, a.budget, min_calls, idle_s=a.idle_ms / 1e3), n)
        out[b4k][str(n)] = _stats(_timed(b4, inputs, a.budget, min_calls), n)
        torch.set_num_threads(os.cpu_count() or 1)
        out[b4_all_k][str(n)] = _stats(_timed(b4, inputs, a.budget / 2, min_calls), n)
        if n >= 64 and callers > 1:  # bulk: the throughput figure of T3
            torch.set_num_threads(1)
            out[b3_callers_k][str(n)] = _concurrent(b3_bare_caller, inputs, a.budget / 2, callers, n)
            out[b4_callers_k][str(n)] = _concurrent(b4_caller, inputs, a.budget / 2, callers, n)
        k = str(n)
        line = (
            f"  in-process {n:>4} nodes: B3 {out[b3k][k]['nodes_per_s']:,.0f} nodes/s p99 "
            f"{out[b3k][k]['p99_ms']:.2f} ms (no L1: {out[b3_bare_k][k]['nodes_per_s']:,.0f})"
        )
        if k in out[b3_idle_k]:
            line += (
                f" | B3 after {a.idle_ms:g} ms idle: mean {out[b3_idle_k][k]['mean_ms']:.2f} ms vs "
                f"{out[b3k][k]['mean_ms']:.2f} back to back"
            )
        line += f" | B4 {out[b4k][k]['nodes_per_s']:,.0f} nodes/s"
        if k in out[b4_callers_k]:
            line += (
                f" | {callers} callers: B3 {out[b3_callers_k][k]['nodes_per_s']:,.0f}, "
                f"B4 {out[b4_callers_k][k]['nodes_per_s']:,.0f} nodes/s"
            )
        print(line, file=sys.stderr, flush=True)
    out["torch_threads_all"] = os.cpu_count()
    loop.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
