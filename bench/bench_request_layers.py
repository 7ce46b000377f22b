"""Where the co-located app's time at c=1 goes beside B5's, with no socket: both ASGI apps called
in this process (prints numbers, never asserts).

    python bench/bench_request_layers.py [--calls 3000] [--rounds 4] [--redis] [--layers [--nonblocking]] [--targets 1] [--sweep-mb 0]
    python bench/bench_request_layers.py --stubbed [--targets 1]
    python bench/bench_request_layers.py --knockout [--targets 1]

``bench.suite.ab --colocated --baseline B5`` measures both over HTTP, from a client; this calls the
same two ASGI apps directly, one request at a time on one uvloop loop, in interleaved rounds: the
co-located gateway (``Gateway.to_asgi()``, the runners in this process as the gateway started
alone runs them: BentoML's middleware, the guards, the three cores and their batchers, the answer)
and B5 (``bench.suite.one_process``: the same sampler, tiered store and forward behind one route).
Their difference is the cost of the app's own layers; what the HTTP run adds beyond it (its
difference minus this one) is the server and the socket path. Store: the suite's (``HOME_100K``,
built by ``bench.suite.runner.ensure_store`` when missing), L1 at 10% of the features as the
suite's app; ``--redis`` adds the suite's L2 (a Redis started here on a free loopback port).

``--layers`` (py-spy, the ``bench`` extra): one more window of the co-located app, sampled by py-spy
(1 kHz), each sample charged to the innermost layer its stack is in (``bench.suite.layers.LAYERS``, outermost first:
BentoML's middleware, the gateway's guard, router and core, the hop to the FeatureRunner, its
pipeline, the sampling and fetch B5 does too, the model runner's core, the forward B5 does too),
the shares scaled to the unprofiled mean: which layers hold the difference. A sample in none of
them is the event loop's own work (task steps, callbacks) or a background task.

``--stubbed`` (no py-spy, no B5): each layer's own cost, timed rather than sampled. The gateway
core answers a kept answer, and the request enters at each ASGI layer in turn (BentoML's
middlewares, the guard, the router): the difference between two entries is the outer layer's own
cost. Then the gateway core's own cost (the FeatureRunner answering a kept answer), and the
FeatureRunner's ``predict`` timed alone, back to back, against the same call timed inside whole
requests: the same work costs more between the layers than in a tight loop (caches and branch
predictors shared with the rest of the request), which a sum of layer costs measured alone misses.
It also times whole requests with the FeatureRunner answering a kept answer: the whole request
minus that and minus the FeatureRunner alone is what the composition costs beyond its parts.

``--knockout`` (no B5): the co-located app whole, and with one layer left out (each of BentoML's
middlewares but the error handler, the gateway's guard, the metric tally's updates), in
interleaved windows: what each layer costs in place, cache effects included. A layer left out
does its work for no request of that window (no metrics, no trace, no access log, no guard), so
this is a measurement, never a deployment.

``--sweep-mb N``: before each request of both sides, outside its figures, a read of N MB: each
request then starts on caches that other work has used, as between two requests over HTTP,
where the client, the kernel and other tenants run in the gap. Which side's own code suffers
more from cold caches.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.suite.layers import layer_of  # noqa: E402
from bench.suite.runner import HOME_100K, ROW_BYTES, ensure_store, snapshot_counts  # noqa: E402
from harness.redis_servers import RedisServer  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "request_layers.json"
App = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


def _scope(body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/predict",
        "raw_path": b"/predict",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:3000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 3000),
    }


async def _call(app: App, body: bytes, state: dict[str, Any]) -> int:
    """One request through ``app``; its status."""
    delivered = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never disconnects
        raise AssertionError("unreachable")

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    await app({**_scope(body), "state": dict(state)}, receive, send)
    return status


async def _started(app: App) -> dict[str, Any]:
    """Run the app's lifespan startup; the state it set (Starlette hands it to each request)."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    state: dict[str, Any] = {}
    await inbox.put({"type": "lifespan.startup"})
    asyncio.get_running_loop().create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": state}, inbox.get, outbox.put)
    )
    message = await outbox.get()
    if message["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {message}")
    return state


async def _window(
    app: App, state: dict[str, Any], bodies: list[bytes], sweep: np.ndarray | None = None
) -> dict[str, float]:
    """One request after another. ``sweep``: an array read before each request, outside its
    figures, so that each starts on caches another workload has used (as between two requests at
    c=1 over HTTP, where the client, the kernel and other tenants run in the gap)."""
    latencies = []
    cpu_swept = wall_swept = 0.0
    cpu, wall = time.process_time(), time.perf_counter()
    for body in bodies:
        if sweep is not None:
            cpu_before, wall_before = time.process_time(), time.perf_counter()
            sweep.sum()
            cpu_swept += time.process_time() - cpu_before
            wall_swept += time.perf_counter() - wall_before
        started = time.perf_counter()
        if await _call(app, body, state) != 200:
            raise RuntimeError("a request failed")
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    n = len(latencies)
    return {
        "mean_ms": (time.perf_counter() - wall - wall_swept) / n * 1e3,
        "p50_ms": latencies[n // 2] * 1e3,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1e3,
        "cpu_ms": (time.process_time() - cpu - cpu_swept) / n * 1e3,
    }


async def _layers(
    app: App, state: dict[str, Any], bodies: list[bytes], mean_ms: float, nonblocking: bool
) -> dict[str, float]:
    """One window of ``app`` under py-spy; each layer's share of the main thread's samples, in ms
    of the unprofiled ``mean_ms``. ``nonblocking``: py-spy does not pause the process per sample
    (a paused thread stops at its next return to user space, so blocking samples favour the
    frames right after a system call)."""
    raw = Path(tempfile.mkdtemp(prefix="gsage-layers-")) / "stacks.txt"
    spy = await asyncio.create_subprocess_exec(
        *["py-spy", "record", "-r", "1000", "-f", "raw", "-o", str(raw), "-p", str(os.getpid())],
        *(["--nonblocking"] if nonblocking else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await asyncio.sleep(1.0)  # py-spy attaches
    await _window(app, state, bodies)
    spy.send_signal(signal.SIGINT)  # py-spy writes its stacks on SIGINT
    await asyncio.wait_for(spy.wait(), 60)
    charged: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if frames and frames[0].startswith("Thread._bootstrap"):
            continue  # another thread (an executor's): the loop's thread is what a request waits on
        layer = layer_of(frames)
        charged[layer] = charged.get(layer, 0) + int(count)
    total = sum(charged.values()) or 1
    return {name: round(n / total * mean_ms, 4) for name, n in sorted(charged.items(), key=lambda kv: -kv[1])}


async def _per_call_us(fn: Callable[[Any], Awaitable[Any]], inputs: list[Any]) -> float:
    started = time.perf_counter()
    for value in inputs:
        await fn(value)
    return (time.perf_counter() - started) / len(inputs) * 1e6


def _asgi_chain(app: Any) -> list[Any]:
    """The co-located app's ASGI layers, outermost first, down to the gateway's router (what
    answers ``/predict``; BentoML's own routing sits past it)."""
    chain = []
    while app is not None and type(app).__name__ != "ContextMiddleware":
        chain.append(app)
        app = getattr(app, "middleware_stack" if type(app).__name__ == "Starlette" else "app", None)
    return chain


async def stubbed(args: argparse.Namespace, num_nodes: int) -> dict[str, Any]:
    """``--stubbed``: each layer's own cost, timed with what is inside it answering a kept answer."""
    from common.feature_runner_api import PredictBatch
    from services.gateway import Gateway
    from services.gateway import _core as gateway_core
    from services.protocol import PredictRequest

    app = Gateway.to_asgi()
    state = await _started(app)
    n = args.targets
    ids = [[(i * n + j) * 7919 % num_nodes for j in range(n)] for i in range(args.calls)]
    bodies = [json.dumps({"node_ids": g, "seed": 5}).encode() for g in ids]
    await _window(app, state, bodies[: args.calls // 4])
    core = gateway_core.get()
    pipeline = core.admin.feature.transport.core  # the FeatureRunner's core this gateway calls (LocalTransport)
    requests = [PredictRequest(node_ids=g, seed=5) for g in ids]
    batches = [PredictBatch.of(g, 5, "graphsage", dtype=core.prediction.transport_dtype) for g in ids]
    kept_answer, kept_packed = await core.predict(requests[0]), await pipeline.predict(batches[0])
    real_core, real_pipeline = core.predict, pipeline.predict

    async def answer_kept(_: Any) -> Any:
        return kept_answer

    async def packed_kept(_: Any) -> Any:
        return kept_packed

    inside = [0.0]

    async def pipeline_timed(batch: Any) -> Any:
        started = time.perf_counter()
        try:
            return await real_pipeline(batch)
        finally:
            inside[0] += time.perf_counter() - started

    chain = _asgi_chain(app)
    rounds: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        core.predict = answer_kept  # type: ignore[method-assign]
        for i, layer in enumerate(chain):
            entry = f"{i} {type(layer).__name__}"
            rounds.setdefault(entry, []).append(
                await _per_call_us(lambda body, layer=layer: _call(layer, body, state), bodies)
            )
        core.predict = real_core  # type: ignore[method-assign]
        pipeline.predict = packed_kept  # type: ignore[method-assign]
        rounds.setdefault("gateway core", []).append(await _per_call_us(core.predict, requests))
        rounds.setdefault("whole request, FeatureRunner kept", []).append(
            await _per_call_us(lambda body: _call(app, body, state), bodies)
        )
        pipeline.predict = real_pipeline  # type: ignore[method-assign]
        rounds.setdefault("FeatureRunner predict, alone", []).append(await _per_call_us(pipeline.predict, batches))
        inside[0] = 0.0
        pipeline.predict = pipeline_timed  # type: ignore[method-assign]
        whole = await _per_call_us(lambda body: _call(app, body, state), bodies)
        pipeline.predict = real_pipeline  # type: ignore[method-assign]
        rounds.setdefault("whole request", []).append(whole)
        rounds.setdefault("FeatureRunner predict, in the request", []).append(inside[0] / len(bodies) * 1e6)
    med = {k: statistics.median(v) for k, v in rounds.items()}
    entries = [f"{i} {type(layer).__name__}" for i, layer in enumerate(chain)]
    own = {e: med[e] - (med[entries[i + 1]] if i + 1 < len(entries) else 0.0) for i, e in enumerate(entries)}
    return {
        "layers_own_us": {e.split(" ", 1)[1]: round(v, 2) for e, v in own.items()},
        "layers_total_us": round(med[entries[0]], 2),
        "gateway_core_own_us": round(med["gateway core"], 2),
        "feature_predict_alone_us": round(med["FeatureRunner predict, alone"], 2),
        "feature_predict_in_request_us": round(med["FeatureRunner predict, in the request"], 2),
        "whole_request_us": round(med["whole request"], 2),
        "whole_request_feature_kept_us": round(med["whole request, FeatureRunner kept"], 2),
    }


KNOCKED_OUT = (
    "RunnerTrafficMetricsMiddleware",
    "OpenTelemetryMiddleware",
    "AccessLogMiddleware",
    "TimeoutMiddleware",
    "MaxConcurrencyMiddleware",
    "HttpGuard",
)


async def knockout(args: argparse.Namespace, num_nodes: int) -> dict[str, Any]:
    """``--knockout``: the co-located app whole, and with one layer left out per side, in
    interleaved windows: what each layer costs in place, with the caches as the rest of the
    request leaves them (``--stubbed`` times each alone, warm)."""
    from common.metric_tally import TALLY
    from services.gateway import Gateway

    app = Gateway.to_asgi()
    state = await _started(app)
    n = args.targets
    bodies = [
        json.dumps({"node_ids": [(i * n + j) * 7919 % num_nodes for j in range(n)], "seed": 5}).encode()
        for i in range(args.calls)
    ]
    await _window(app, state, bodies[: args.calls // 4])
    chain = _asgi_chain(app)
    sides: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {"whole": (lambda: None, lambda: None)}
    for outer, layer in itertools.pairwise(chain):
        if type(layer).__name__ in KNOCKED_OUT:
            attr = "middleware_stack" if type(outer).__name__ == "Starlette" else "app"
            sides[f"without {type(layer).__name__}"] = (
                lambda o=outer, a=attr, inner=layer.app: setattr(o, a, inner),
                lambda o=outer, a=attr, kept=layer: setattr(o, a, kept),
            )
    kept_updates = TALLY.observe, TALLY.inc

    def no_updates() -> None:
        TALLY.observe = TALLY.inc = lambda *_a, **_k: None  # type: ignore[method-assign,assignment]

    def updates_back() -> None:
        TALLY.observe, TALLY.inc = kept_updates  # type: ignore[method-assign]

    sides["without the metric tally's updates"] = (no_updates, updates_back)
    windows: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    order = list(sides)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            leave_out, put_back = sides[name]
            leave_out()
            try:
                windows[name].append(await _window(app, state, bodies))
            finally:
                put_back()
    med = {name: {k: statistics.median(w[k] for w in ws) for k in ("p50_ms", "cpu_ms")} for name, ws in windows.items()}
    whole = med["whole"]
    return {
        "whole": {k: round(v, 4) for k, v in whole.items()},
        "saved_us": {
            name: {k: round((whole[k] - m[k]) * 1e3, 1) for k in ("p50_ms", "cpu_ms")}
            for name, m in med.items()
            if name != "whole"
        },
    }


def _print_knockout(out: dict[str, Any]) -> None:
    w = out["whole"]
    print(f"the co-located app whole: P50 {w['p50_ms'] * 1e3:.1f} us, CPU {w['cpu_ms'] * 1e3:.1f} us per request")
    for name, saved in out["saved_us"].items():
        print(f"  {saved['cpu_ms']:6.1f} us CPU, {saved['p50_ms']:6.1f} us P50 less  {name}")


def _print_stubbed(out: dict[str, Any]) -> None:
    print("each layer's own cost (the gateway core answering a kept answer), outermost first:")
    for name, us in out["layers_own_us"].items():
        print(f"  {us:7.1f} us  {name}")
    print(f"  {out['layers_total_us']:7.1f} us  all ASGI layers")
    print(f"  {out['gateway_core_own_us']:7.1f} us  gateway core (the FeatureRunner answering a kept answer)")
    print(
        f"FeatureRunner predict (sampling, fetch, the model runner): {out['feature_predict_alone_us']:.1f} us alone, "
        f"{out['feature_predict_in_request_us']:.1f} us inside whole requests of {out['whole_request_us']:.1f} us"
    )
    kept, alone = out["whole_request_feature_kept_us"], out["feature_predict_alone_us"]
    print(
        f"whole request with the FeatureRunner answering a kept answer: {kept:.1f} us; with that and the "
        f"FeatureRunner alone ({kept + alone:.1f} us), a whole request costs {out['whole_request_us'] - kept - alone:+.1f} us more"
    )


async def measure(args: argparse.Namespace, num_nodes: int) -> dict[str, Any]:
    apps: dict[str, App] = {}
    if args.only in (None, "B5"):
        from bench.suite.one_process import app as b5

        apps["B5"] = b5
    if args.only in (None, "gateway"):
        from services.gateway import Gateway

        apps["colocated"] = Gateway.to_asgi()
    states = {name: await _started(app) for name, app in apps.items()}
    n = args.targets
    bodies = [
        json.dumps({"node_ids": [(i * n + j) * 7919 % num_nodes for j in range(n)], "seed": 5}).encode()
        for i in range(args.calls)
    ]
    for name, app in apps.items():  # warm: L1, the compiled kernels, the connection pools
        await _window(app, states[name], bodies[: args.calls // 4])
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in apps}
    order = list(apps)
    sweep = np.ones(args.sweep_mb * 2**20 // 4, np.float32) if args.sweep_mb else None
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            rounds[name].append(await _window(apps[name], states[name], bodies, sweep))
    out: dict[str, Any] = {}
    for name, windows in rounds.items():
        out[name] = {k: round(statistics.median(w[k] for w in windows), 4) for k in windows[0]}
        out[name]["windows_p50_ms"] = [round(w["p50_ms"], 4) for w in windows]
    if args.layers and "colocated" in apps:
        out["layers_ms"] = await _layers(
            apps["colocated"], states["colocated"], bodies, out["colocated"]["mean_ms"], args.nonblocking
        )
    if len(out) >= 2 and "B5" in out:
        a, b = out["colocated"], out["B5"]
        out["colocated_minus_B5_ms"] = {k: round(a[k] - b[k], 4) for k in ("mean_ms", "p50_ms", "p99_ms", "cpu_ms")}
        out["colocated_over_B5"] = {k: round(a[k] / b[k], 3) for k in ("mean_ms", "p50_ms", "p99_ms")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=3000, help="requests per side per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--redis", action="store_true", help="L2 in a Redis started here, as the suite's app")
    ap.add_argument("--only", choices=("gateway", "B5"), default=None, help="one side (to profile it)")
    ap.add_argument("--layers", action="store_true", help="the co-located app's time per layer (py-spy)")
    ap.add_argument("--nonblocking", action="store_true", help="--layers with py-spy's --nonblocking")
    ap.add_argument("--targets", type=int, default=1, help="node ids per request (256: T3's bulk request)")
    ap.add_argument("--stubbed", action="store_true", help="each layer's own cost, timed (see above)")
    ap.add_argument("--knockout", action="store_true", help="each layer's cost in place (see above)")
    ap.add_argument("--sweep-mb", type=int, default=0, help="read this many MB before each request (see above)")
    args = ap.parse_args()
    if args.layers and shutil.which("py-spy") is None:
        raise SystemExit("--layers needs py-spy: pip install -e '.[bench]'")
    ensure_store(HOME_100K, [], print)
    num_nodes, _ = snapshot_counts(HOME_100K)
    with tempfile.TemporaryDirectory() as redis_dir:
        redis = RedisServer(redis_dir).start() if args.redis else None
        try:
            os.environ.update(
                BENTOML_HOME=HOME_100K,
                BENTOML_DO_NOT_TRACK="true",
                GSAGE_REDIS_URL=redis.url if redis else "",
                GSAGE_L1_BYTES=str(num_nodes * ROW_BYTES // 10),
                GSAGE_GRPC_PORT="0",
                GSAGE_AUTH_ENABLED="0",
                GSAGE_RATE_LIMIT_PER_S="0",
            )
            import uvloop

            mode = stubbed if args.stubbed else knockout if args.knockout else measure
            out = uvloop.run(mode(args, num_nodes))
        finally:
            if redis is not None:
                redis.stop()
    out["config"] = {
        "calls": args.calls,
        "rounds": args.rounds,
        "redis": args.redis,
        "nodes": num_nodes,
        "targets": args.targets,
        "nonblocking": args.nonblocking,
        "sweep_mb": args.sweep_mb,
    }
    if args.stubbed:
        _print_stubbed(out)
    if args.knockout:
        _print_knockout(out)
    for name in ("colocated", "B5"):
        if name in out:
            s = out[name]
            print(
                f"{name:10s} mean {s['mean_ms']:.3f} ms  P50 {s['p50_ms']:.3f}  P99 {s['p99_ms']:.3f}  "
                f"CPU {s['cpu_ms']:.3f} ms/request"
            )
    if "colocated_over_B5" in out:
        d, r = out["colocated_minus_B5_ms"], out["colocated_over_B5"]
        print(
            f"co-located - B5: P50 +{d['p50_ms']:.3f} ms ({r['p50_ms']}x), CPU +{d['cpu_ms']:.3f} ms/request: "
            "the app's own layers, with no socket"
        )
    for name, ms in out.get("layers_ms", {}).items():
        print(f"  {ms * 1e3:7.1f} us  {name}")
    if args.only is None:
        stem = "request_layers" + ("_stubbed" if args.stubbed else "_knockout" if args.knockout else "")
        suffix = (f"_{args.targets}" if args.targets != 1 else "") + (f"_sweep{args.sweep_mb}" if args.sweep_mb else "")
        results = RESULTS.with_name(f"{stem}{suffix}.json")
        results.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {results.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
