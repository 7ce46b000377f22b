"""The living graph's costs, measured side by side in one run (prints numbers, never asserts).

    python bench/bench_live_graph.py [--quick] [--skip-1m] [--skip-serving] [--skip-staleness]
                                     [--skip-ingest] [--skip-sampling] [--skip-compaction]

Sections (each can be skipped; ``--quick`` is a smoke run of under two minutes):

1. Serving cost of a concurrent update stream. The app (``harness.app.SplitApp``: gateway,
   FeatureRunner with ``--feature-workers`` workers, GraphSAGERunner, as separate processes) on the
   100k/1M demo store (``bench.suite.runner.ensure_store(HOME_100K)``), the file update log in a
   temporary directory, no Redis, auth off. Single-node ``/predict`` at concurrency 8 (closed loop,
   Zipf ids), in interleaved windows (``--rounds`` rounds of ``--window`` s per side, the order
   alternating each round) WITH and WITHOUT an open-loop writer sending ``--rate`` batches/s of
   ``--batch-size`` ops (default 20 x 50 = 1,000 ops/s): add_edge 80 %, set_features 10 %,
   add_node 5 % (new ids from a reserved range above the snapshot's), remove_edge 5 % (of edges it
   added and saw acknowledged). Windows of one side are pooled: req/s, P50/P99, the ratios
   with/without, the ops/s acknowledged and the acknowledgement latency of the batches.
2. Staleness at the same update rate (with the same /predict load beside it, ``--staleness-c``):
   probes send a one-op ``set_features`` batch for a probe node, then poll ``/predict`` for that node
   (same seed, no ``min_sequence``) every ``--poll-ms`` until the answer differs from the one before
   the update; staleness = that answer's arrival - the acknowledgement's arrival (and, a lower
   bound, that request's send - the acknowledgement). Probe nodes and their whole 2-hop
   neighbourhood are kept out of the writer's ops, so nothing else changes their answers.
3. Ingest ceiling: closed-loop writers (``--ingest writers:batch,...``) for ``--ingest-seconds``
   each, the same op mix, no /predict load: batches/s, ops/s acknowledged, ack P50/P99.
4. Sampling with an overlay, in-process (no services): ``LiveGraph`` over the 100k/1M snapshot,
   ``--overlay-edges`` random add_edge ops applied in batches of 10,000 (validate and apply timed
   apart, printed as set-up); ``sample_tree`` fanout [25, 10] for single targets and 256-target
   batches, on the same targets and seeds, calls alternating (order rotating) between: the
   snapshot CSR with no overlay, an overlay holding every node's unchanged list (the indirection
   alone, same samples), the overlay of the added edges, and the compacted CSR of that same graph
   (``materialize``; its samples must equal the overlay's, and mismatches are counted). P50/P99, ratios
   to the snapshot CSR and overlay/compacted, sampled ids per target (a denser graph samples more)
   and microseconds per sampled id.
5. Compaction, in-process: ``LiveGraph.materialize()`` of the graph of section 4, and the whole
   ``runners.feature.live.compact`` path (load the snapshot, replay the log, materialize, save) over
   a file log holding the same ops; then the same for the 1M/10M graph with ``--overlay-1m``
   mixed updates. The 1M graph comes from ``HOME_1M`` when that store exists, is built there with
   ``--build-1m`` (``ensure_store``, minutes: it also trains), and is otherwise generated in this
   process (``training_export.synthetic``, the demo's spec and seed: the same graph) and saved to a
   private temporary store; ``--skip-1m`` skips it. Compactions save into a private temporary
   BentoML home (links to the stores' snapshots), never into the shared stores.

Also: cores, load average before and after, the commit. Writes bench/results/live_graph.json.
Only loopback addresses; every load is bounded in time.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

# This process's own BentoML home (compactions save snapshots; the shared stores stay as they are),
# set before anything imports bentoml. The services get the store's home from SplitApp. Removed at
# exit (it holds links to the shared snapshots: removed, not followed).
_PRIVATE_HOME = tempfile.mkdtemp(prefix="gsage-live-bench-home-")
atexit.register(shutil.rmtree, _PRIVATE_HOME, True)
os.environ["BENTOML_HOME"] = _PRIVATE_HOME
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any  # noqa: E402

import aiohttp  # noqa: E402
import httpx  # noqa: E402
import numpy as np  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

try:  # the load generator and the id distributions moved to harness/ (older checkouts: bench/suite/)
    from harness import load as loadgen
    from harness.workload import bodies as make_bodies
    from harness.workload import make_dist
except ImportError:  # pragma: no cover
    from bench.suite import loadgen  # type: ignore[no-redef]
    from bench.suite.workload import bodies as make_bodies  # type: ignore[no-redef]
    from bench.suite.workload import make_dist
from bench.suite.runner import HOME_1M, HOME_100K, ensure_store  # noqa: E402
from harness.app import SplitApp  # noqa: E402
from runners.feature.graph import LiveGraph  # noqa: E402
from runners.feature.sampling import AdjacencyOverlay, sample_tree  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "live_graph.json")
RUN: dict[str, Any] = {}  # the results of this run (written after every section)
FANOUT = (25, 10)
ONE_M_ARGS = ["--nodes", "1000000", "--edges", "10000000", "--epochs", "1", "--max-train-nodes", "20000"]
MIX = (("add_edge", 0.80), ("set_features", 0.10), ("add_node", 0.05), ("remove_edge", 0.05))
HTTP_TIMEOUT_S = 15.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(seconds: Any) -> dict[str, float]:
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    if not ms.size:
        return {"n": 0}
    return {
        "n": int(ms.size),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "max_ms": float(ms.max()),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    return out.stdout.strip() if out.returncode == 0 else ""


def machine() -> dict[str, Any]:
    dirty = [ln[3:] for ln in git("status", "--porcelain").splitlines() if ln.strip()]
    return {
        "cores": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted_files": len(dirty),
    }


def store_snapshot_tag(home: str) -> str:
    """``graph-snapshot:<version>`` that ``home``'s store calls latest, linked into this process's
    private home so that it can be loaded by tag (and compactions save next to it, privately)."""
    base = os.path.join(home, "models", "graph-snapshot")
    with open(os.path.join(base, "latest")) as f:
        version = f.read().strip()
    mine = os.path.join(_PRIVATE_HOME, "models", "graph-snapshot")
    os.makedirs(mine, exist_ok=True)
    link = os.path.join(mine, version)
    if not os.path.lexists(link):
        os.symlink(os.path.join(base, version), link)
    return f"graph-snapshot:{version}"


# -- the op stream ---------------------------------------------------------------------------------


class OpStream:
    """Valid update batches for a graph that only this stream changes: add_edge between present
    nodes (base nodes outside ``excluded``, and nodes it added that were acknowledged), add_node
    with fresh ids from ``[first_new_id, capacity)``, set_features, remove_edge of an acknowledged
    edge it added (each once)."""

    def __init__(
        self, num_nodes: int, dim: int, first_new_id: int, capacity: int, seed: int, excluded: np.ndarray | None = None
    ) -> None:
        self.rng = np.random.default_rng(seed)
        pool = np.ones(num_nodes, dtype=bool)
        if excluded is not None and excluded.size:
            pool[excluded] = False
        self.pool = np.flatnonzero(pool)
        self.next_id = first_new_id
        self.capacity = capacity
        self.features = self.rng.normal(0.0, 1.0, (64, dim)).round(3).tolist()
        self.added: list[int] = []
        self.edges: list[tuple[int, int]] = []  # acknowledged added edges not yet removed
        self.edge_keys: set[tuple[int, int]] = set()
        names, weights = zip(*MIX)
        self.kinds, self.cum = names, np.cumsum(weights)
        self.counts: Counter[str] = Counter()

    def _node(self) -> int:
        if self.added and self.rng.random() < 0.2:
            return self.added[int(self.rng.integers(len(self.added)))]
        return int(self.pool[int(self.rng.integers(self.pool.size))])

    def batch(self, size: int) -> tuple[list[dict], tuple[list[int], list[tuple[int, int]]]]:
        ops: list[dict] = []
        new_ids: list[int] = []
        new_edges: list[tuple[int, int]] = []
        kinds = np.searchsorted(self.cum, self.rng.random(size) * self.cum[-1], side="right")
        for k in kinds.tolist():
            kind = self.kinds[min(k, len(self.kinds) - 1)]
            if kind == "remove_edge" and not self.edges:
                kind = "add_edge"
            if kind == "add_node" and self.next_id >= self.capacity:
                kind = "add_edge"
            if kind == "add_edge":
                src = self._node()
                dst = self._node()
                while dst == src:
                    dst = self._node()
                ops.append({"op": "add_edge", "src": src, "dst": dst})
                new_edges.append((src, dst))
            elif kind == "remove_edge":
                i = int(self.rng.integers(len(self.edges)))
                src, dst = self.edges[i]
                self.edges[i] = self.edges[-1]
                self.edges.pop()
                self.edge_keys.discard((min(src, dst), max(src, dst)))
                ops.append({"op": "remove_edge", "src": src, "dst": dst})
            elif kind == "set_features":
                ops.append(
                    {
                        "op": "set_features",
                        "id": self._node(),
                        "features": self.features[int(self.rng.integers(len(self.features)))],
                    }
                )
            else:
                v = self.next_id
                self.next_id += 1
                ops.append(
                    {
                        "op": "add_node",
                        "id": v,
                        "label": int(self.rng.integers(10)),
                        "features": self.features[int(self.rng.integers(len(self.features)))],
                    }
                )
                new_ids.append(v)
            self.counts[kind] += 1
        return ops, (new_ids, new_edges)

    def acknowledged(self, pending: tuple[list[int], list[tuple[int, int]]]) -> None:
        new_ids, new_edges = pending
        self.added.extend(new_ids)
        for src, dst in new_edges:
            key = (min(src, dst), max(src, dst))
            if key not in self.edge_keys:  # a pair added twice is removed once (remove_edge takes every copy)
                self.edge_keys.add(key)
                self.edges.append((src, dst))


class WriterStats:
    def __init__(self) -> None:
        self.batches = 0
        self.ops = 0
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self.first_error: dict[str, str] = {}
        self.dropped = 0
        self.last_sequence = 0
        self.elapsed_s = 0.0

    def merge(self, other: WriterStats) -> None:
        self.batches += other.batches
        self.ops += other.ops
        self.latencies += other.latencies
        self.errors.update(other.errors)
        for k, v in other.first_error.items():
            self.first_error.setdefault(k, v)
        self.dropped += other.dropped
        self.last_sequence = max(self.last_sequence, other.last_sequence)
        self.elapsed_s += other.elapsed_s

    def summary(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "ops": self.ops,
            "elapsed_s": round(self.elapsed_s, 3),
            "batches_per_s": self.batches / self.elapsed_s if self.elapsed_s else 0.0,
            "ops_per_s": self.ops / self.elapsed_s if self.elapsed_s else 0.0,
            "ack": pct(self.latencies),
            "errors": dict(self.errors),
            "first_error": self.first_error,
            "dropped": self.dropped,
            "last_sequence": self.last_sequence,
        }


def session(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, limit_per_host=limit),
        timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S),
        headers={"Content-Type": "application/json"},
    )


async def send_batch(
    s: aiohttp.ClientSession, url: str, stream: OpStream, size: int, stats: WriterStats, started: float
) -> float | None:
    """One batch; on success the stream learns what it added. Returns the ack's arrival time."""
    ops, pending = stream.batch(size)
    try:
        async with s.post(url, data=orjson.dumps({"ops": ops})) as r:
            body = await r.read()
            status = r.status
    except TimeoutError:
        status, body = "exc:Timeout", b""
    except aiohttp.ClientError as exc:
        status, body = f"exc:{type(exc).__name__}", repr(exc).encode()
    now = time.perf_counter()
    if status != 200:
        stats.errors[str(status)] += 1
        stats.first_error.setdefault(str(status), body[:300].decode("utf-8", "replace"))
        return None
    ack = orjson.loads(body)
    stream.acknowledged(pending)
    stats.batches += 1
    stats.ops += int(ack["accepted"])
    stats.last_sequence = max(stats.last_sequence, int(ack["sequence"]))
    stats.latencies.append(now - started)
    return now


async def open_writer(
    url: str, stream: OpStream, rate: float, size: int, duration_s: float, max_in_flight: int = 16
) -> WriterStats:
    """Batches at ``rate``/s, evenly spaced, whatever the server does (latency from the scheduled
    start); an arrival that finds ``max_in_flight`` batches unanswered is dropped (counted)."""
    stats = WriterStats()
    tasks: set[asyncio.Task] = set()
    async with session(max_in_flight) as s:
        start = time.perf_counter()
        for i in range(max(1, int(rate * duration_s))):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) >= max_in_flight:
                stats.dropped += 1
                continue
            task = asyncio.ensure_future(send_batch(s, url, stream, size, stats, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        end_of_schedule = start + duration_s
        if tasks:
            await asyncio.wait(list(tasks), timeout=HTTP_TIMEOUT_S + 1)
        stats.elapsed_s = max(time.perf_counter(), end_of_schedule) - start
    return stats


async def closed_writers(url: str, stream: OpStream, writers: int, size: int, duration_s: float) -> WriterStats:
    stats = WriterStats()
    async with session(writers) as s:
        start = time.perf_counter()
        stop_at = start + duration_s

        async def one() -> None:
            while time.perf_counter() < stop_at:
                await send_batch(s, url, stream, size, stats, time.perf_counter())

        await asyncio.gather(*(one() for _ in range(writers)))
        stats.elapsed_s = time.perf_counter() - start
    return stats


# -- the app sections --------------------------------------------------------------------------------


def probe_nodes(indptr: np.ndarray, indices: np.ndarray, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Low-degree nodes whose neighbours have low degree too, and their 2-hop closure (what the
    writer must not touch, so that only a probe's own update changes its answer)."""
    deg = np.diff(indptr)
    rng = np.random.default_rng(seed)
    candidates = rng.permutation(np.flatnonzero((deg >= 1) & (deg <= 4)))
    probes: list[int] = []
    closure: set[int] = set()
    for v in candidates.tolist():
        nb = np.asarray(indices[indptr[v] : indptr[v + 1]], dtype=np.int64)
        if nb.size == 0 or deg[nb].max() > 30:
            continue
        two = [np.asarray(indices[indptr[u] : indptr[u + 1]], dtype=np.int64) for u in nb.tolist()]
        closure.update([v, *nb.tolist(), *np.concatenate(two).tolist()])
        probes.append(v)
        if len(probes) >= count:
            break
    return np.asarray(probes, dtype=np.int64), np.fromiter(closure, np.int64, len(closure))


async def predict_probs(
    s: aiohttp.ClientSession, url: str, node: int, seed: int, min_sequence: int | None = None
) -> np.ndarray | None:
    body: dict[str, Any] = {"node_ids": [node], "seed": seed}
    if min_sequence is not None:
        body["min_sequence"] = min_sequence
    try:
        async with s.post(url, data=orjson.dumps(body)) as r:
            body = await r.read()
            if r.status != 200:
                return None
    except (TimeoutError, aiohttp.ClientError):
        return None
    doc = orjson.loads(body)
    if doc.get("degraded"):
        return None
    return np.asarray(doc["predictions"][0]["probabilities"], dtype=np.float64)


async def prober(
    base: str,
    probes: np.ndarray,
    dim: int,
    stop_at: float,
    poll_s: float,
    threshold: float,
    rng: np.random.Generator,
    out: dict[str, list],
) -> None:
    """Until ``stop_at``: for the next probe node, the answer before, a set_features batch, then
    polls until the answer differs (at most 5 s); afterwards a few polls that must still differ."""
    predict, update = base + "/predict", base + "/graph/updates"
    async with session(2) as s:
        i = int(rng.integers(probes.size))
        while time.perf_counter() < stop_at:
            node = int(probes[i % probes.size])
            i += 1
            seed = 1_000_003 * node % (2**31)
            before = await predict_probs(s, predict, node, seed)
            again = await predict_probs(s, predict, node, seed)
            if before is None or again is None:
                out["errors"].append("predict before")
                continue
            out["noise"].append(float(np.abs(before - again).max()))
            features = rng.normal(0.0, 3.0, dim).round(3).tolist()
            try:
                async with s.post(
                    update, data=orjson.dumps({"ops": [{"op": "set_features", "id": node, "features": features}]})
                ) as r:
                    ack = await r.read()
                    status = r.status
            except (TimeoutError, aiohttp.ClientError) as exc:
                status = type(exc).__name__
            acked = time.perf_counter()
            if status != 200:
                out["errors"].append(f"update {status}")
                continue
            sequence = int(orjson.loads(ack)["sequence"])
            seen = False
            deadline = acked + 5.0
            polls = 0
            largest = 0.0
            while time.perf_counter() < deadline:
                sent = time.perf_counter()
                probs = await predict_probs(s, predict, node, seed)
                polls += 1
                if probs is not None:
                    largest = max(largest, float(np.abs(probs - before).max()))
                if probs is not None and float(np.abs(probs - before).max()) > threshold:
                    got = time.perf_counter()
                    out["arrival_s"].append(got - acked)
                    out["send_s"].append(sent - acked)
                    out["rtt_s"].append(got - sent)
                    out["polls"].append(polls)
                    out["change"].append(float(np.abs(probs - before).max()))
                    seen = True
                    break
                pause = sent + poll_s - time.perf_counter()
                if pause > 0:
                    await asyncio.sleep(pause)
            if not seen:
                # Not stale, or an update that does not move this answer? Read it with min_sequence.
                ryw = await predict_probs(s, predict, node, seed, min_sequence=sequence)
                out["missed"].append(
                    {
                        "node": node,
                        "sequence": sequence,
                        "polls": polls,
                        "largest_change": largest,
                        "change_with_min_sequence": None if ryw is None else float(np.abs(ryw - before).max()),
                    }
                )
                continue
            for _ in range(3):  # once reflected, every later answer must reflect it (any worker)
                probs = await predict_probs(s, predict, node, seed)
                if probs is not None and float(np.abs(probs - before).max()) <= threshold:
                    out["flip_back"].append(node)


def tree_cpu_s(pid: int | None) -> float:
    """user + system CPU seconds of a process and its descendants (a BentoML arbiter and workers)."""
    if pid is None:
        return 0.0
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def cpu_snapshot(app: SplitApp) -> dict[str, float]:
    out = {
        name: tree_cpu_s(getattr(svc.proc, "pid", None))
        for name, svc in (("gateway", app.gateway), ("feature", app.feature), ("model", app.model))
    }
    t = os.times()
    out["bench"] = t.user + t.system
    m = psutil.cpu_times()
    out["machine_busy"] = sum(m) - m.idle - getattr(m, "iowait", 0.0)
    out["wall"] = time.perf_counter()
    return out


def cpu_diff(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


async def serving_section(
    a: argparse.Namespace, base: str, stream: OpStream, num_nodes: int, app: SplitApp
) -> dict[str, Any]:
    url = base + "/predict"
    updates = base + "/graph/updates"
    pool = make_bodies(make_dist(a.dist, num_nodes, a.seed), 1, 4000)
    log(f"warm-up: {a.warmup:.0f} s of /predict c={a.concurrency} with the update stream")
    await asyncio.gather(
        loadgen.closed_loop(url, pool, a.concurrency, a.warmup, warmup_requests=2 * a.concurrency),
        open_writer(updates, stream, a.rate, a.batch_size, a.warmup),
    )
    parts: dict[bool, list] = {True: [], False: []}
    cpu: dict[bool, Counter] = {True: Counter(), False: Counter()}
    writers: list[WriterStats] = []
    for r in range(a.rounds):
        for with_stream in (True, False) if r % 2 == 0 else (False, True):
            before = cpu_snapshot(app)
            if with_stream:
                res, w = await asyncio.gather(
                    loadgen.closed_loop(url, pool, a.concurrency, a.window, warmup_requests=a.concurrency),
                    open_writer(updates, stream, a.rate, a.batch_size, a.window),
                )
                writers.append(w)
            else:
                res = await loadgen.closed_loop(url, pool, a.concurrency, a.window, warmup_requests=a.concurrency)
            parts[with_stream].append(res)
            cpu[with_stream].update(cpu_diff(before, cpu_snapshot(app)))
            log(
                f"round {r + 1}/{a.rounds} {'with   ' if with_stream else 'without'} stream: "
                f"{res.summary()['req_per_s']:.1f} req/s"
                + (f", {writers[-1].summary()['ops_per_s']:.0f} updates/s acked" if with_stream else "")
            )
    out: dict[str, Any] = {
        "concurrency": a.concurrency,
        "dist": a.dist,
        "rounds": a.rounds,
        "window_s": a.window,
        "stream": {
            "batches_per_s": a.rate,
            "ops_per_batch": a.batch_size,
            "target_ops_per_s": a.rate * a.batch_size,
            "mix": dict(MIX),
        },
    }
    for side, name in ((True, "with"), (False, "without")):
        pooled = loadgen.LoadResult.pooled(parts[side]).summary()
        pooled["per_round_req_per_s"] = [round(p.summary()["req_per_s"], 1) for p in parts[side]]
        c = cpu[side]
        wall = c.pop("wall")
        # Cores each process used over the windows (CPU seconds / wall seconds), and CPU ms per
        # answered request; machine_busy counts every process of the machine, other users' too.
        pooled["cores_used"] = {k: round(v / wall, 3) for k, v in c.items()}
        pooled["cpu_ms_per_request"] = {k: round(v / max(pooled["ok"], 1) * 1e3, 3) for k, v in c.items()}
        out[name] = pooled
    w_all = WriterStats()
    for w in writers:
        w_all.merge(w)
    out["writer"] = w_all.summary()
    out["ratios"] = {
        "throughput": ratio(out["with"]["req_per_s"], out["without"]["req_per_s"]),
        "p50": ratio(out["with"].get("p50_ms"), out["without"].get("p50_ms")),
        "p99": ratio(out["with"].get("p99_ms"), out["without"].get("p99_ms")),
    }
    return out


def staleness_buckets(feature_url: str) -> dict[float, float]:
    """The FeatureRunner's ``graph_update_staleness_seconds`` histogram (cumulative counts per
    upper bound, every worker together): acknowledgement -> applied by a worker, for every worker's
    apply of every entry (the writing worker's own apply, right after the append, included)."""
    out: dict[float, float] = {}
    text = httpx.get(feature_url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("graph_update_staleness_seconds_bucket"):
            le = float(line.split('le="', 1)[1].split('"', 1)[0])
            out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def bucket_summary(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    diff = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in sorted(after)}
    total = diff.get(float("inf"), 0.0)
    if not total:
        return {"observations": 0}
    cum = {("+Inf" if le == float("inf") else f"{le:g}"): round(c / total, 4) for le, c in diff.items()}
    bound = {
        q: next(("+Inf" if le == float("inf") else f"{le:g}") for le, c in diff.items() if c >= q * total)
        for q in (0.5, 0.99)
    }
    return {
        "observations": int(total),
        "fraction_at_most_s": cum,
        "p50_at_most_s": bound[0.5],
        "p99_at_most_s": bound[0.99],
    }


async def staleness_section(
    a: argparse.Namespace, base: str, stream: OpStream, probes: np.ndarray, dim: int, num_nodes: int, feature_url: str
) -> dict[str, Any]:
    hist_before = staleness_buckets(feature_url)
    out: dict[str, list] = {
        k: [] for k in ("arrival_s", "send_s", "rtt_s", "polls", "change", "noise", "missed", "flip_back", "errors")
    }
    rng = np.random.default_rng(a.seed + 7)
    stop_at = time.perf_counter() + a.staleness_seconds
    jobs = [open_writer(base + "/graph/updates", stream, a.rate, a.batch_size, a.staleness_seconds)]
    if a.staleness_c > 0:
        pool = make_bodies(make_dist(a.dist, num_nodes, a.seed + 3), 1, 4000)
        jobs.append(
            loadgen.closed_loop(
                base + "/predict", pool, a.staleness_c, a.staleness_seconds, warmup_requests=a.staleness_c
            )
        )
    # Each prober its own probe nodes: one prober's update must not land between another's
    # "before" and its polls.
    jobs += [
        prober(
            base,
            probes[j :: a.probers],
            dim,
            stop_at,
            a.poll_ms / 1e3,
            a.change_threshold,
            np.random.default_rng(int(rng.integers(2**31))),
            out,
        )
        for j in range(a.probers)
    ]
    done = await asyncio.gather(*jobs)
    await asyncio.sleep(0.5)  # the last entries' applies
    applied = bucket_summary(hist_before, staleness_buckets(feature_url))
    writer = done[0].summary()
    load = done[1].summary() if a.staleness_c > 0 else None
    arrival = np.asarray(out["arrival_s"])
    return {
        "seconds": a.staleness_seconds,
        "probers": a.probers,
        "poll_ms": a.poll_ms,
        "change_threshold": a.change_threshold,
        "probe_nodes": int(probes.size),
        "samples": int(arrival.size),
        "arrival": pct(arrival),
        "send": pct(out["send_s"]),
        "poll_rtt": pct(out["rtt_s"]),
        "polls_mean": float(np.mean(out["polls"])) if out["polls"] else None,
        "change_min": float(np.min(out["change"])) if out["change"] else None,
        "noise_max": float(np.max(out["noise"])) if out["noise"] else None,
        "missed_within_5s": len(out["missed"]),
        "missed": out["missed"][:20],
        "flip_backs": len(out["flip_back"]),
        "errors": dict(Counter(out["errors"])),
        "writer": writer,
        "applied_by_workers": applied,
        "predict_load": None
        if load is None
        else {k: load.get(k) for k in ("req_per_s", "p50_ms", "p99_ms", "error_count")},
    }


async def ingest_section(a: argparse.Namespace, base: str, stream: OpStream) -> list[dict[str, Any]]:
    rows = []
    for spec in a.ingest.split(","):
        writers, size = (int(x) for x in spec.split(":"))
        stats = await closed_writers(base + "/graph/updates", stream, writers, size, a.ingest_seconds)
        row = {"writers": writers, "ops_per_batch": size, **stats.summary()}
        rows.append(row)
        log(
            f"ingest {writers} writer(s) x {size} ops/batch: {row['ops_per_s']:.0f} ops/s acked, "
            f"{row['batches_per_s']:.1f} batches/s"
        )
    return rows


def guarded(results: dict[str, Any], name: str, fn: Any) -> Any:
    """``results[name] = fn()``; a failure is recorded (``results["errors"][name]``) and the run goes on."""
    try:
        results[name] = fn()
        return results[name]
    except Exception as exc:
        import traceback

        results.setdefault("errors", {})[name] = traceback.format_exc()[-3000:]
        log(f"{name} FAILED: {type(exc).__name__}: {exc}")
        return None
    finally:
        write(RUN)


def app_sections(a: argparse.Namespace, results: dict[str, Any], tmp: str) -> None:
    info = ensure_store(HOME_100K, [], log)
    tag = store_snapshot_tag(HOME_100K)
    from runners.feature.snapshot import load_snapshot

    snap = load_snapshot(tag)
    n, dim = snap.num_nodes, snap.feature_dim
    probes, closure = probe_nodes(snap.indptr, snap.indices, a.probe_nodes, a.seed)
    capacity = 2 * n  # GSAGE_GRAPH_CAPACITY's default
    env = {
        "GSAGE_AUTH_ENABLED": "0",
        "GSAGE_RATE_LIMIT_PER_S": "0",
        "GSAGE_REDIS_URL": "",
        "GSAGE_GRAPH_LOG": "file",
        "GSAGE_GRAPH_LOG_DIR": os.path.join(tmp, "update-log"),
        "GSAGE_GRPC_PORT": "0",
        "GSAGE_L1_BYTES": str(n * dim * 4 // 10),
        "GSAGE_FEATURE_WORKERS": str(a.feature_workers),
    }
    results["app"] = {
        "store": HOME_100K,
        "snapshot": tag,
        "graphsage": info.get("graphsage"),
        "nodes": n,
        "edges": snap.num_edges,
        "env": env,
        "probe_nodes": int(probes.size),
        "excluded_from_writer": int(closure.size),
    }
    stream = OpStream(n, dim, n, capacity, a.seed, excluded=closure)
    logs = os.path.join(tmp, "logs")
    os.makedirs(logs, exist_ok=True)
    app = SplitApp(HOME_100K, env, log_dir=logs)
    t = time.perf_counter()
    log(f"starting the app on {tag} ({a.feature_workers} FeatureRunner worker(s), file update log) ...")
    app.start()
    results["app"]["start_s"] = round(time.perf_counter() - t, 1)
    base = app.gateway.url
    try:
        if not a.skip_serving:
            log("-- 1. serving cost of a concurrent update stream")
            guarded(results, "serving", lambda: asyncio.run(serving_section(a, base, stream, n, app)))
        if not a.skip_staleness:
            log(f"-- 2. staleness ({a.staleness_seconds:.0f} s)")
            guarded(
                results,
                "staleness",
                lambda: asyncio.run(staleness_section(a, base, stream, probes, dim, n, app.feature.url)),
            )
        if not a.skip_ingest:
            log("-- 3. ingest ceiling")
            guarded(results, "ingest", lambda: asyncio.run(ingest_section(a, base, stream)))
        results["app"]["ops_sent"] = dict(stream.counts)
        guarded(results["app"], "graph_status", lambda: httpx.get(base + "/graph/status", timeout=10).json())
        failed = [
            line
            for line in app.feature.log_tail(200_000).splitlines()
            if "Traceback" in line or "stops applying" in line or "Error" in line
        ]
        results["app"]["feature_runner_log_errors"] = failed[:20]
        if "errors" in results:
            print(app.logs()[-6000:], file=sys.stderr)
    finally:
        app.stop()
        for svc in (app.gateway, app.feature, app.model):  # the services' own homes (a link to the store inside)
            if getattr(svc, "own_home", None):
                shutil.rmtree(svc.own_home, ignore_errors=True)


# -- the in-process sections -------------------------------------------------------------------------


def add_edge_ops(n: int, count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, count)
    dst = rng.integers(0, n, count)
    same = src == dst
    dst[same] = (dst[same] + 1) % n
    return [{"op": "add_edge", "src": s, "dst": d} for s, d in zip(src.tolist(), dst.tolist())]


def apply_ops(graph: LiveGraph, ops: list[dict], batch: int = 10_000) -> dict[str, float]:
    validate_s = apply_s = 0.0
    for i in range(0, len(ops), batch):
        part = ops[i : i + batch]
        t = time.perf_counter()
        graph.validate(part)
        validate_s += time.perf_counter() - t
        t = time.perf_counter()
        graph.apply(part, graph.sequence + 1)
        apply_s += time.perf_counter() - t
    return {
        "ops": len(ops),
        "batches": -(-len(ops) // batch),
        "validate_s": round(validate_s, 2),
        "apply_s": round(apply_s, 2),
    }


def sampling_section(a: argparse.Namespace, graph: LiveGraph) -> dict[str, Any]:
    base = graph.base
    indptr, indices = base.indptr, base.indices
    deg = np.diff(np.asarray(indptr))
    same_lists = AdjacencyOverlay(
        np.ascontiguousarray(indptr[:-1], dtype=np.int64), deg.astype(np.int64), np.array(indices)
    )
    compacted = graph.materialize()  # the same graph as one CSR: what a compaction would serve
    c_indptr, c_indices = compacted.indptr, compacted.indices
    variants = {"none": None, "same_lists": same_lists, "added_edges": graph.overlay, "compacted": "csr"}
    rng = np.random.default_rng(a.seed + 11)
    out: dict[str, Any] = {"fanout": list(FANOUT), "overlay": graph.stats().__dict__}
    mismatches = 0

    def sample(k: str, t_: np.ndarray, s_: int) -> list[np.ndarray]:
        if k == "compacted":
            return sample_tree(c_indptr, c_indices, t_, FANOUT, seed=s_)
        return sample_tree(indptr, indices, t_, FANOUT, seed=s_, overlay=variants[k])

    for name, size, calls in (("single", 1, a.sample_calls), ("batch256", 256, max(20, a.sample_calls // 10))):
        targets = [rng.integers(0, base.num_nodes, size) for _ in range(calls)]
        seeds = rng.integers(0, 2**62, calls).tolist()
        times: dict[str, list[float]] = {k: [] for k in variants}
        sampled: dict[str, int] = {k: 0 for k in variants}
        for k in variants:  # warm: compiled kernels, mapped pages
            for t_, s_ in zip(targets[:20], seeds[:20]):
                sample(k, t_, s_)
        names = list(variants)
        for i, (t_, s_) in enumerate(zip(targets, seeds)):
            # One call of each in turn, the order rotating: all meet the same machine, none always first.
            got = {}
            for k in names[i % len(names) :] + names[: i % len(names)]:
                t0 = time.perf_counter()
                layers = sample(k, t_, s_)
                times[k].append(time.perf_counter() - t0)
                sampled[k] += int(sum((layer >= 0).sum() for layer in layers[1:]))
                got[k] = layers
            # The overlay and the compacted CSR hold the same lists in the same order: same samples.
            mismatches += any(not np.array_equal(x, y) for x, y in zip(got["added_edges"], got["compacted"]))
        row: dict[str, Any] = {"targets_per_call": size, "calls": calls}
        for k in variants:
            row[k] = {
                **pct(times[k]),
                "sampled_ids_per_target": sampled[k] / (calls * size),
                "us_per_sampled_id": float(np.sum(times[k])) / max(sampled[k], 1) * 1e6,
            }
        for k in ("same_lists", "added_edges", "compacted"):
            row[f"{k}_ratio_p50"] = ratio(row[k]["p50_ms"], row["none"]["p50_ms"])
            row[f"{k}_ratio_p99"] = ratio(row[k]["p99_ms"], row["none"]["p99_ms"])
        row["added_vs_compacted_p50"] = ratio(row["added_edges"]["p50_ms"], row["compacted"]["p50_ms"])
        row["added_vs_compacted_p99"] = ratio(row["added_edges"]["p99_ms"], row["compacted"]["p99_ms"])
        out[name] = row
    out["overlay_vs_compacted_sample_mismatches"] = mismatches
    return out


async def write_log(log_dir: str, ops: list[dict], batch: int = 10_000) -> float:
    from runners.feature.update_log import FileUpdateLog

    ulog = FileUpdateLog(log_dir)
    t = time.perf_counter()
    head = await ulog.head()
    for i in range(0, len(ops), batch):
        entry = await ulog.append(ops[i : i + batch], expected_head=head)
        head = entry.sequence
    return time.perf_counter() - t


def compaction(tag: str, graph: LiveGraph, ops: list[dict], tmp: str, name: str) -> dict[str, Any]:
    """``materialize`` of ``graph`` (the snapshot + ``ops``), then ``compact`` over a file log of ``ops``."""
    from runners.feature.live import compact
    from runners.feature.update_log import FileUpdateLog

    t = time.perf_counter()
    snap = graph.materialize()
    out: dict[str, Any] = {
        "materialize_s": round(time.perf_counter() - t, 2),
        "nodes": snap.num_nodes,
        "edges": snap.num_edges,
    }
    del snap
    log_dir = os.path.join(tmp, f"log-{name}")
    out["log_write_s"] = round(asyncio.run(write_log(log_dir, ops)), 2)
    t = time.perf_counter()
    result = asyncio.run(compact(tag, FileUpdateLog(log_dir), announce=False))
    out["compact_s"] = round(time.perf_counter() - t, 2)
    out["compact_result"] = result
    shutil.rmtree(log_dir, ignore_errors=True)
    return out


def one_m_snapshot(a: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    if os.path.isdir(os.path.join(HOME_1M, "models", "graph-snapshot")):
        return store_snapshot_tag(HOME_1M), {"source": HOME_1M}
    if a.build_1m:
        t = time.perf_counter()
        ensure_store(HOME_1M, ONE_M_ARGS, log)
        return store_snapshot_tag(HOME_1M), {
            "source": f"built in {HOME_1M}",
            "build_s": round(time.perf_counter() - t, 1),
        }
    from runners.feature.snapshot import save_snapshot
    from training_export.synthetic import SyntheticGraphSpec, generate

    log("generating the 1M/10M graph in-process (the demo's spec and seed; no model; --build-1m builds the store) ...")
    t = time.perf_counter()
    snap = generate(SyntheticGraphSpec(num_nodes=1_000_000, num_edges=10_000_000), progress=False)
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    tag = save_snapshot(snap)
    return tag, {
        "source": "generated in-process, saved to a private store",
        "generate_s": round(gen_s, 1),
        "save_s": round(time.perf_counter() - t, 1),
    }


def inproc_sections(a: argparse.Namespace, results: dict[str, Any], tmp: str) -> None:
    hundred_k(a, results, tmp)  # its graph is freed before the 1M one is built
    if not a.skip_compaction and not a.skip_1m:
        log("-- 5. compaction: 1M/10M graph")
        guarded(results.setdefault("compaction", {}), "1m", lambda: one_m(a, tmp))


def one_m(a: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """The 1M/10M graph with ``--overlay-1m`` mixed updates (batches of 100; a batch the graph
    refuses is skipped and counted), then materialize and compact."""
    from runners.feature.graph import BatchRejected
    from runners.feature.snapshot import load_snapshot

    tag1m, source = one_m_snapshot(a)
    snap = load_snapshot(tag1m)
    graph = LiveGraph(snap)
    stream = OpStream(snap.num_nodes, snap.feature_dim, snap.num_nodes, graph.capacity, a.seed + 9)
    ops: list[dict] = []
    rejected: list[str] = []
    t = time.perf_counter()
    for _ in range(3 * (a.overlay_1m // 100 + 1)):
        if len(ops) >= a.overlay_1m:
            break
        batch, pending = stream.batch(min(100, a.overlay_1m - len(ops)))
        try:
            graph.validate(batch)
        except BatchRejected as exc:
            rejected.append(str(exc))
            continue
        graph.apply(batch, graph.sequence + 1)
        stream.acknowledged(pending)
        ops.extend(batch)
    row = {
        "updates": len(ops),
        "mix": dict(stream.counts),
        "source": source,
        "snapshot": tag1m,
        "overlay_setup_s": round(time.perf_counter() - t, 2),
        "overlay": graph.stats().__dict__,
        "rejected_batches": len(rejected),
        "first_rejection": rejected[0] if rejected else None,
    }
    row.update(compaction(tag1m, graph, ops, tmp, "1m"))
    return row


def hundred_k(a: argparse.Namespace, results: dict[str, Any], tmp: str) -> None:
    from runners.feature.snapshot import load_snapshot

    ensure_store(HOME_100K, [], log)
    tag = store_snapshot_tag(HOME_100K)
    snap = load_snapshot(tag)
    graph = LiveGraph(snap)
    log(f"-- 4. sampling with an overlay: applying {a.overlay_edges:,} add_edge ops to {tag} ...")
    ops = add_edge_ops(snap.num_nodes, a.overlay_edges, a.seed + 5)
    setup = {"ops": len(ops), "snapshot": tag}
    results["overlay_setup"] = setup
    if guarded(setup, "timing", lambda: apply_ops(graph, ops)) is not None:
        log(f"   validate {setup['timing']['validate_s']} s, apply {setup['timing']['apply_s']} s")
    setup["overlay"] = graph.stats().__dict__
    if not a.skip_sampling:
        guarded(results, "sampling", lambda: sampling_section(a, graph))
    if a.skip_compaction:
        return
    log("-- 5. compaction: 100k/1M graph")
    row = guarded(results.setdefault("compaction", {}), "100k", lambda: compaction(tag, graph, ops, tmp, "100k"))
    if row is not None:
        row["updates"] = len(ops)


# -- the report ----------------------------------------------------------------------------------------


def write(results: dict[str, Any]) -> None:
    path = results.get("args", {}).get("out") or RESULTS
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def f(x: Any, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def table(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        f"bench_live_graph  commit {m['commit']} ({m['uncommitted_files']} files uncommitted)  "
        f"{m['cores']} cores, load avg {m['load_avg']} -> {r.get('machine_end', {}).get('load_avg')}  "
        f"python {m['python']}{'  QUICK' if r['args']['quick'] else ''}"
    ]
    if "app" in r:
        ap = r["app"]
        lines.append(
            f"app: {ap['snapshot']} ({ap['nodes']:,} nodes, {ap['edges']:,} edges), "
            f"{ap['env']['GSAGE_FEATURE_WORKERS']} FeatureRunner worker(s), file update log, no Redis, "
            f"started in {ap.get('start_s')} s"
        )
    if "serving" in r:
        s = r["serving"]
        st = s["stream"]
        lines += [
            "",
            f"1. serving under an update stream: single-node /predict, closed loop c={s['concurrency']}, "
            f"{s['dist']} ids, {s['rounds']} rounds x {s['window_s']:g} s per side (interleaved)",
            f"   {'':<22}{'req/s':>9}{'P50 ms':>9}{'P99 ms':>9}{'errors':>8}",
        ]
        for name in ("without", "with"):
            x = s[name]
            lines.append(
                f"   {name + ' stream':<22}{x['req_per_s']:>9.1f}{f(x.get('p50_ms'), '{:.2f}'):>9}"
                f"{f(x.get('p99_ms'), '{:.2f}'):>9}{x['error_count']:>8}"
            )
        q = s["ratios"]
        lines.append(
            f"   {'ratio with/without':<22}{f(q['throughput'], '{:.3f}'):>9}{f(q['p50'], '{:.3f}'):>9}"
            f"{f(q['p99'], '{:.3f}'):>9}     (targets: throughput >= 0.9, P99 <= 1.2)"
        )
        lines.append(
            f"   per round req/s: with {s['with']['per_round_req_per_s']}, "
            f"without {s['without']['per_round_req_per_s']}"
        )
        if "cores_used" in s["with"]:
            keys = ("gateway", "feature", "model", "bench", "machine_busy")
            lines.append(
                "   cores used (CPU s / wall s), without -> with: "
                + ", ".join(
                    f"{k} {s['without']['cores_used'][k]:.2f} -> {s['with']['cores_used'][k]:.2f}" for k in keys
                )
            )
        w = s["writer"]
        lines.append(
            f"   stream: {st['batches_per_s']:g} batches/s x {st['ops_per_batch']} ops = "
            f"{st['target_ops_per_s']:g} ops/s offered; acknowledged {w['ops_per_s']:.0f} ops/s "
            f"({w['batches_per_s']:.1f} batches/s), ack P50 {f(w['ack'].get('p50_ms'), '{:.1f}')} ms "
            f"P99 {f(w['ack'].get('p99_ms'), '{:.1f}')} ms, errors {w['errors'] or 0}, dropped {w['dropped']}"
        )
    if "staleness" in r:
        s = r["staleness"]
        lines += [
            "",
            f"2. staleness: set_features acknowledged -> first /predict (no min_sequence) that reflects it; "
            f"{s['samples']} samples over {s['seconds']:g} s, stream {s['writer']['ops_per_s']:.0f} ops/s acked"
            + (
                f", /predict load c={r['args']['staleness_c']} at {s['predict_load']['req_per_s']:.0f} req/s"
                if s["predict_load"]
                else ""
            ),
            f"   {'':<40}{'P50 ms':>9}{'P99 ms':>9}{'max ms':>9}",
        ]
        for key, label in (
            ("arrival", "ack -> reflecting answer arrives"),
            ("send", "ack -> reflecting request sent"),
            ("poll_rtt", "one poll's round trip"),
        ):
            x = s[key]
            lines.append(
                f"   {label:<40}{f(x.get('p50_ms'), '{:.1f}'):>9}{f(x.get('p99_ms'), '{:.1f}'):>9}"
                f"{f(x.get('max_ms'), '{:.1f}'):>9}"
            )
        h = s.get("applied_by_workers") or {}
        if h.get("observations"):
            lines.append(
                f"   FeatureRunner histogram, ack -> applied by a worker ({h['observations']} applies, the "
                f"writing worker's own included): P50 <= {h['p50_at_most_s']} s, P99 <= {h['p99_at_most_s']} s; "
                "fraction within "
                + ", ".join(
                    f"{k} s: {v:.3f}"
                    for k, v in h["fraction_at_most_s"].items()
                    if k in ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "1")
                )
            )
        lines.append(
            f"   (target: <= 1000 ms)  polls per sample {f(s['polls_mean'], '{:.2f}')}, "
            f"not reflected within 5 s: {s['missed_within_5s']}, flip-backs after reflecting: "
            f"{s['flip_backs']}, answer change min {f(s['change_min'], '{:.3g}')} vs noise max "
            f"{f(s['noise_max'], '{:.3g}')} (threshold {s['change_threshold']:g}), errors {s['errors'] or 0}"
        )
    if "ingest" in r:
        lines += [
            "",
            "3. ingest ceiling: closed-loop writers, same op mix, no /predict load",
            f"   {'writers':>7}{'ops/batch':>10}{'batches/s':>11}{'ops/s':>9}{'ack P50 ms':>12}"
            f"{'ack P99 ms':>12}  errors",
        ]
        for x in r["ingest"]:
            lines.append(
                f"   {x['writers']:>7}{x['ops_per_batch']:>10}{x['batches_per_s']:>11.1f}{x['ops_per_s']:>9.0f}"
                f"{f(x['ack'].get('p50_ms'), '{:.1f}'):>12}{f(x['ack'].get('p99_ms'), '{:.1f}'):>12}"
                f"  {x['errors'] or 0}"
            )
    if "app" in r and "graph_status" in r["app"]:
        ws = r["app"]["graph_status"].get("workers", {})
        parts = [
            f"{k.rsplit('-', 1)[-1]}: applied {v.get('applied')}, lag {v.get('lag_entries')}, overlay "
            f"{v.get('overlay', {}).get('edges', 0):,} list entries / {v.get('overlay', {}).get('bytes', 0) / 2**20:.0f} MiB"
            for k, v in ws.items()
        ]
        lines.append(
            f"   /graph/status at the end: head {r['app']['graph_status'].get('log', {}).get('head')}; "
            + "; ".join(parts)
        )
    if "overlay_setup" in r:
        o = r["overlay_setup"]
        tm = o.get("timing") or {}
        how = (
            f"in {tm['batches']} batches, validate {tm['validate_s']} s + apply {tm['apply_s']} s"
            if tm
            else "FAILED (see errors)"
        )
        lines += [
            "",
            f"4. sampling in-process, fanout {list(FANOUT)}; overlay set-up: {o['ops']:,} add_edge ops {how} "
            f"({o['overlay']['nodes']:,} lists, {o['overlay']['edges']:,} entries, "
            f"{o['overlay']['bytes'] / 2**20:.0f} MiB)",
        ]
    if "sampling" in r:
        s = r["sampling"]
        lines.append(
            f"   {'':<10}{'graph read':<26}{'P50 ms':>9}{'P99 ms':>9}{'P50 x':>8}{'P99 x':>8}"
            f"{'ids/target':>12}{'us/id':>8}"
        )
        for name in ("single", "batch256"):
            x = s[name]
            for k, label in (
                ("none", "snapshot CSR"),
                ("same_lists", "overlay, unchanged lists"),
                ("added_edges", "snapshot + added overlay"),
                ("compacted", "compacted CSR (same graph)"),
            ):
                y = x[k]
                rp50 = "" if k == "none" else f(x[f"{k}_ratio_p50"], "{:.3f}")
                rp99 = "" if k == "none" else f(x[f"{k}_ratio_p99"], "{:.3f}")
                lines.append(
                    f"   {name if k == 'none' else '':<10}{label:<26}{y['p50_ms']:>9.4f}{y['p99_ms']:>9.4f}"
                    f"{rp50:>8}{rp99:>8}{y['sampled_ids_per_target']:>12.1f}{y['us_per_sampled_id']:>8.3f}"
                )
            lines.append(
                f"   {'':<10}{'overlay / compacted CSR':<26}{'':>18}{f(x['added_vs_compacted_p50'], '{:.3f}'):>8}"
                f"{f(x['added_vs_compacted_p99'], '{:.3f}'):>8}"
            )
        lines.append(
            "   (x: against the snapshot CSR; target: overlay <= 1.2x. The added edges make a denser graph, so "
            "more ids are sampled per target; the compacted CSR is that same graph without an overlay. "
            f"Calls whose overlay and compacted samples differ: {s['overlay_vs_compacted_sample_mismatches']})"
        )
    if "compaction" in r:
        lines += [
            "",
            "5. compaction in-process",
            f"   {'graph':<8}{'updates':>9}{'materialize s':>15}{'log write s':>13}{'compact s':>11}  result",
        ]
        for name, x in r["compaction"].items():
            if name == "errors":
                continue
            c = x["compact_result"]
            lines.append(
                f"   {name:<8}{x['updates']:>9,}{x['materialize_s']:>15.2f}{x['log_write_s']:>13.2f}"
                f"{x['compact_s']:>11.2f}  {c['num_nodes']:,} nodes, {c['num_edges']:,} edges"
            )
        for name in r["compaction"].get("errors") or {}:
            lines.append(f"   {name:<8}FAILED (see errors)")
        if "1m" in r["compaction"]:
            x = r["compaction"]["1m"]
            src = x["source"]
            lines.append(
                f"   1m graph: {src['source']}"
                + "".join(f", {k} {v} s" for k, v in src.items() if k != "source")
                + f"; overlay of {x['updates']:,} ops (mix {x['mix']}) applied in {x['overlay_setup_s']} s, "
                f"{x['rejected_batches']} batches of 100 refused"
                + (f" (first: {x['first_rejection']})" if x["first_rejection"] else "")
            )
        lines.append("   (compact = load snapshot + replay the log + materialize + save; log write = setup)")
    firsts = {}
    for key, x in (
        ("serving", r.get("serving", {}).get("writer")),
        ("staleness", r.get("staleness", {}).get("writer")),
        *((f"ingest {y['writers']}x{y['ops_per_batch']}", y) for y in r.get("ingest") or []),
    ):
        if x and x.get("first_error"):
            firsts[key] = x["first_error"]
    if firsts:
        lines += ["", "update batches refused (first answer per status):"]
        lines += [f"   {k}: {v}" for k, v in firsts.items()]
    errors = {
        **r.get("errors", {}),
        **{f"overlay_setup.{k}": v for k, v in r.get("overlay_setup", {}).get("errors", {}).items()},
        **{f"compaction.{k}": v for k, v in r.get("compaction", {}).get("errors", {}).items()},
        **{f"app.{k}": v for k, v in r.get("app", {}).get("errors", {}).items()},
    }
    if errors:
        lines += ["", "sections that failed (last lines of the traceback):"]
        for k, v in errors.items():
            lines.append(f"   {k}: " + " | ".join(v.strip().splitlines()[-3:]))
    if r.get("app", {}).get("feature_runner_log_errors"):
        lines += ["", "FeatureRunner log lines with errors:"] + [
            f"   {x[:200]}" for x in r["app"]["feature_runner_log_errors"]
        ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run (< 2 min)")
    for part in ("serving", "staleness", "ingest", "sampling", "compaction", "1m"):
        p.add_argument(f"--skip-{part}", action="store_true")
    p.add_argument("--build-1m", action="store_true", help=f"build the 1M/10M demo store in {HOME_1M} if missing")
    p.add_argument("--feature-workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--dist", choices=("zipf", "uniform"), default="zipf")
    # 12 rounds of 5 s: with 6 of 4 s the windows of one side spread wider than the effect being
    # measured on a 2-core machine, and the ratios flipped between runs (docs/performance.md).
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--window", type=float, default=5.0, help="seconds per window")
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--rate", type=float, default=20.0, help="update batches per second")
    p.add_argument("--batch-size", type=int, default=50, help="ops per update batch")
    p.add_argument("--staleness-seconds", type=float, default=20.0)
    p.add_argument("--staleness-c", type=int, default=8, help="/predict concurrency beside the probes (0: none)")
    p.add_argument("--probers", type=int, default=2)
    p.add_argument("--probe-nodes", type=int, default=40)
    p.add_argument("--poll-ms", type=float, default=5.0)
    p.add_argument("--change-threshold", type=float, default=1e-5, help="max |probability change| that counts")
    p.add_argument("--ingest", default="1:1,4:1,4:10,4:100", help="writers:ops_per_batch,...")
    p.add_argument("--ingest-seconds", type=float, default=4.0)
    p.add_argument("--overlay-edges", type=int, default=1_000_000)
    p.add_argument("--overlay-1m", type=int, default=100_000, help="updates over the 1M/10M graph")
    p.add_argument("--sample-calls", type=int, default=2000, help="single-target calls per variant (batches: /10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=RESULTS, help="the results file")
    a = p.parse_args()
    if a.quick:
        a.rounds, a.window, a.warmup = 2, 2.0, 2.0
        a.staleness_seconds, a.ingest_seconds, a.ingest = 5.0, 1.5, "4:1,4:100"
        a.overlay_edges, a.sample_calls, a.overlay_1m = 100_000, 300, 20_000
        if not os.path.isdir(os.path.join(HOME_1M, "models", "graph-snapshot")):
            a.skip_1m = True
    t0 = time.perf_counter()
    results = RUN
    results.update({"machine": machine(), "args": vars(a)})
    tmp = tempfile.mkdtemp(prefix="gsage-live-bench-")
    try:
        if not (a.skip_serving and a.skip_staleness and a.skip_ingest):
            app_sections(a, results, tmp)
        if not (a.skip_sampling and a.skip_compaction):
            inproc_sections(a, results, tmp)
    finally:
        results["machine_end"] = {"load_avg": [round(x, 2) for x in os.getloadavg()]}
        results["total_s"] = round(time.perf_counter() - t0, 1)
        write(results)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(_PRIVATE_HOME, ignore_errors=True)  # links to the shared snapshots: removed, not followed
    print(table(results))
    print(f"\n{results['total_s']} s in all; {os.path.relpath(os.path.abspath(a.out), ROOT)}")


if __name__ == "__main__":
    main()
