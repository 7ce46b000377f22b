"""The scenarios, in order, bounded in time. See ``bench/suite/__init__.py`` and docs/performance.md.

What each scenario is (its load, its tags, its row's name) is data in ``bench/suite/scenarios.py``;
the targets, and which of them are measured in interleaved windows, in ``bench/suite/targets.py``.
This module decides the order, starts and stops the services, and records the rows."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import httpx
import numpy as np
import psutil

from bench.suite import procs, promtext
from bench.suite import scenarios as sc
from bench.suite.layers import layer_of
from bench.suite.scenarios import Profile, Scenario
from bench.suite.targets import B1, B2, TARGETS, Target
from harness import load as loadgen
from harness.redis_servers import HOST, RedisServer, raw_command, redis_available
from harness.workload import bodies, make_dist

HOME_100K = "/tmp/gsage-bench-home"
HOME_1M = "/tmp/gsage-bench-home-1m"
FEATURE_DIM = 128
ROW_BYTES = FEATURE_DIM * 4
STAGES = ("sample", "l1", "l2", "origin", "fetch", "l1_fill", "assemble")
NAN_MS = float("nan")


class Budget:
    """Per-mode durations (seconds) and request caps."""

    def __init__(self, quick: bool, scale: float = 1.0) -> None:
        self.quick = quick
        self.cold = 3.0 if quick else 8.0
        self.warmup = 5.0 if quick else 20.0
        self.single = 4.0 if quick else 10.0
        self.short = 3.0 if quick else 8.0
        self.bulk = 3.0 if quick else 8.0
        self.open = 4.0 if quick else 8.0
        self.profile = 4.0 if quick else 10.0
        self.inproc = 1.0 if quick else 3.0
        self.total = 175.0 if quick else 700.0  # soft: optional scenarios are skipped past it
        self.max_requests = 50_000
        for k in ("cold", "warmup", "single", "short", "bulk", "open", "inproc"):
            setattr(self, k, getattr(self, k) * scale)
        self.profile = max(3.0, self.profile * scale)


def machine_speed() -> dict[str, float]:
    """The machine at that moment, so that runs on different machines can be told apart in their
    reports: the interpreter (a pure-Python loop of 10M additions, seconds) and a wake-up between
    two processes (a one-byte pipe ping-pong, round trip in us), which the three services pay on
    every hop. Machines with close loop times have differed several-fold in B1's CPU per request
    (the B1 rows of the report's CPU-cost table): the loop alone does not say which machine a run
    had."""
    t, x = time.perf_counter(), 0
    for i in range(10_000_000):
        x += i
    loop_s = time.perf_counter() - t
    return {"python_loop_s": loop_s, "ping_pong_us": _ping_pong_us()}


def _ping_pong_us(rounds: int = 5000) -> float:
    child_in_r, child_in_w = os.pipe()
    child_out_r, child_out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child echoes each byte, then leaves without running any cleanup
        for _ in range(rounds):
            os.read(child_in_r, 1)
            os.write(child_out_w, b"x")
        os._exit(0)
    t = time.perf_counter()
    for _ in range(rounds):
        os.write(child_in_w, b"x")
        os.read(child_out_r, 1)
    elapsed = time.perf_counter() - t
    os.waitpid(pid, 0)
    for fd in (child_in_r, child_in_w, child_out_r, child_out_w):
        os.close(fd)
    return elapsed / rounds * 1e6


def request_pool(dist: str, num_nodes: int, nodes: int, seed: int) -> list[bytes]:
    """Request bodies of ``nodes`` target ids each: fewer distinct bodies for bigger requests."""
    return bodies(make_dist(dist, num_nodes, seed), nodes, 4000 if nodes <= 8 else (400 if nodes <= 256 else 100))


def request_timeout_s(nodes: int) -> float:
    return 30.0 if nodes >= 256 else 10.0


def run_cmd(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=procs.CODE_DIR, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


def ensure_store(home: str, args: list[str], log) -> dict:
    """A demo store in ``home`` (reused when a graphsage model is already there)."""
    marker = os.path.join(home, "suite-demo.json")
    if os.path.exists(marker) and os.path.isdir(os.path.join(home, "models", "graphsage")):
        with open(marker) as f:
            return json.load(f)
    os.makedirs(home, exist_ok=True)
    existing = os.path.join(home, "demo.json")
    if os.path.exists(existing) and os.path.isdir(os.path.join(home, "models", "graphsage")):
        with open(existing) as f:
            info = json.load(f)
    else:
        log(f"building the demo store in {home}: python -m training_export demo {' '.join(args)} ...")
        t = time.perf_counter()
        out = run_cmd(
            [sys.executable, "-m", "training_export", "demo", *args],
            {"BENTOML_HOME": home, "BENTOML_DO_NOT_TRACK": "true"},
            timeout=1800,
        )
        if out.returncode != 0:
            raise RuntimeError(f"training_export demo failed:\n{out.stderr[-3000:]}")
        info = json.loads(out.stdout)
        info["build_seconds"] = round(time.perf_counter() - t, 1)
    with open(marker, "w") as f:
        json.dump(info, f)
    return info


def snapshot_counts(home: str) -> tuple[int, int]:
    out = run_cmd(
        [
            sys.executable,
            "-c",
            "import bentoml,json;m=bentoml.models.get('graph-snapshot:latest');"
            "print(json.dumps([m.info.metadata['num_nodes'], m.info.metadata['num_edges']]))",
        ],
        {"BENTOML_HOME": home},
        timeout=120,
    )
    n, e = json.loads(out.stdout.strip().splitlines()[-1])
    return int(n), int(e)


class Suite:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.b = Budget(args.quick, args.scale)
        self.out = os.path.abspath(args.out)
        self.logs = os.path.join(self.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.t0 = time.perf_counter()
        self.me = psutil.Process()
        self.results: dict[str, Any] = {
            "config": {
                "quick": args.quick,
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "loadavg_start": os.getloadavg(),
                "started_at": time.strftime("%Y-%m-%d %H:%M %Z"),
            },
            "scenarios": [],
            "baselines": {},
            "memory": {},
            "profiles": {},
            "skipped": [],
            "phases": {},
        }
        self.topologies: list[procs.Topology] = []
        self.redis: RedisServer | None = None
        self.all_procs: list[procs.Proc] = []

    # -- helpers ----------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    def over_budget(self, what: str) -> bool:
        if self.elapsed() > self.b.total:
            self.log(f"SKIP {what}: past the {self.b.total:.0f} s budget")
            self.results["skipped"].append(what)
            return True
        return False

    def scrape_all(self, topo: procs.Topology) -> dict[str, dict]:
        out = {}
        for name, svc in topo.services.items():
            try:
                out[name] = promtext.scrape(svc.url)
            except httpx.HTTPError:
                out[name] = {"hist": {}, "counter": {}}
        return out

    def load(
        self,
        name: str,
        topo: procs.Topology,
        *,
        dist: str = "zipf",
        nodes: int = 1,
        concurrency: int = 1,
        rate: float = 0.0,
        duration: float = 5.0,
        num_nodes: int = 100_000,
        tags: dict | None = None,
        record: bool = True,
        seed: int = 0,
    ) -> dict:
        pool = request_pool(dist, num_nodes, nodes, seed)
        before = self.scrape_all(topo)
        info0 = self.cache_info(topo)
        cpu0 = topo.cpu_seconds()
        me0 = sum(self.me.cpu_times()[:2])
        load0 = os.getloadavg()[0]
        timeout = request_timeout_s(nodes)
        if rate > 0:
            res = asyncio.run(loadgen.open_loop(topo.url, pool, rate, duration, self.b.max_requests, timeout, nodes))
        else:
            res = asyncio.run(
                loadgen.closed_loop(
                    topo.url,
                    pool,
                    concurrency,
                    duration,
                    self.b.max_requests,
                    timeout,
                    nodes,
                    warmup_requests=concurrency,
                )
            )
        cpu1 = topo.cpu_seconds()
        me1 = sum(self.me.cpu_times()[:2])
        after = self.scrape_all(topo)
        info1 = self.cache_info(topo)
        s = res.summary()
        row: dict[str, Any] = {
            "name": name,
            "topology": topo.name,
            "dist": dist,
            **(tags or {}),
            **s,
            "cdf": res.cdf(),
            "cpu_util": {k: (cpu1[k] - cpu0.get(k, 0.0)) / res.elapsed_s for k in cpu1},
            "loadavg_1m": load0,
        }
        row["cpu_util"]["loadgen"] = (me1 - me0) / res.elapsed_s
        row["stages"] = self.stages(before, after)
        row["hit_ratio"] = self.hit_ratio(before.get("feature"), after.get("feature"))
        row["cache_counters"] = cache_diff(info0, info1)
        if self.redis is not None and row.get("redis") == "on":
            row["redis_keys_after"] = redis_memory(self.redis).get("keys")
        l2 = row["cache_counters"].get("l2", {})
        l2_bad = {k: l2[k] for k in ("errors", "skipped", "writes_dropped") if l2.get(k)}
        err = f" errors {s['errors']}" if s["error_count"] else ""
        if l2_bad:
            err += f" L2 {l2_bad}"
        deg = f" degraded {s['degraded']}" if s["degraded"] else ""
        hr = row["hit_ratio"]
        hit = f" hit L1+L2 {hr['combined']:.1%}" if hr else ""
        what = f"c={concurrency}" if rate <= 0 else f"rate={rate:.0f}/s"
        self.log(
            f"{name:<34} {what:<10} {s['ok']:>6} ok  p50 {s.get('p50_ms', float('nan')):7.2f}  "
            f"p99 {s.get('p99_ms', float('nan')):7.2f} ms  {s['req_per_s']:7.1f} req/s "
            f"{s['nodes_per_s']:9,.0f} nodes/s{hit}{err}{deg}"
        )
        if record:
            self.results["scenarios"].append(row)
        return row

    def run_scenario(self, s: Scenario, topo: procs.Topology, *, num_nodes: int = 100_000, rate: float = 0.0) -> dict:
        """One scenario's load on ``topo``, recorded (unless a warm-up) as a row named ``s.name``."""
        return self.load(
            s.name,
            topo,
            dist=s.dist,
            nodes=s.nodes,
            concurrency=s.concurrency,
            rate=rate,
            duration=getattr(self.b, s.duration) * s.share,
            num_nodes=num_nodes,
            tags=s.tags() if s.record else None,
            record=s.record,
            seed=s.seed,
        )

    def selected(self, items: tuple) -> list:
        """The scenarios (profiles) of ``items`` this run runs: a quick run only those marked so."""
        return [x for x in items if x.quick or not self.args.quick]

    def paired(
        self,
        sides: dict[str, procs.Topology],
        *,
        concurrency: int,
        rounds: int,
        window: float,
        tags: dict,
        seed: int = 0,
        nodes: int = 1,
    ) -> dict[str, dict]:
        """Short windows of each side in turn (A B B A, repeated), pooled per side.

        The machine is shared: a baseline measured minutes after the app reads the other tenants'
        load of that moment as its own (same code, one run to the next, T1's ratio on separate
        windows moved by more than its margin; the report shows it beside the interleaved one).
        Interleaving exposes both sides to the same background; the rounds' own ratios show
        what is left of the noise. Recorded as ``scenarios.paired_name(side)`` rows, group "paired".
        """
        pool = request_pool("zipf", 100_000, nodes, seed)
        names = list(sides)
        parts: dict[str, list[loadgen.LoadResult]] = {k: [] for k in names}
        cpu_s: dict[str, float] = dict.fromkeys(names, 0.0)  # the side's services, over its windows
        client_s: dict[str, float] = dict.fromkeys(names, 0.0)  # this process's (the load generator's)
        for r in range(rounds):
            for side in names if r % 2 == 0 else names[::-1]:
                cpu0 = sum(sides[side].cpu_seconds().values())
                client0 = sum(self.me.cpu_times()[:2])
                parts[side].append(
                    asyncio.run(
                        loadgen.closed_loop(
                            sides[side].url,
                            pool,
                            concurrency,
                            window,
                            self.b.max_requests,
                            request_timeout_s(nodes),
                            nodes,
                            warmup_requests=concurrency,
                        )
                    )
                )
                client_s[side] += sum(self.me.cpu_times()[:2]) - client0
                cpu_s[side] += sum(sides[side].cpu_seconds().values()) - cpu0
        rows = {}
        for side in names:
            res = loadgen.LoadResult.pooled(parts[side])
            row = {
                "name": sc.paired_name(side),
                "topology": sides[side].name,
                "dist": "zipf",
                **tags,
                "group": "paired",
                **res.summary(),
                "cdf": res.cdf(),
                # CPU of the side's services per request answered (warm-up requests included in the
                # CPU, not in the count: the same few per window on every side)
                "cpu_ms_per_request": cpu_s[side] / res.ok * 1e3 if res.ok else None,
                # The client shares the machine's cores: what it takes is not the services' to use.
                "client_cpu_ms_per_request": client_s[side] / res.ok * 1e3 if res.ok else None,
                "cores": (cpu_s[side] + client_s[side]) / res.elapsed_s if res.elapsed_s else None,
                "windows": [
                    {
                        "p50_ms": float(np.percentile(p.latencies_s, 50) * 1e3) if p.ok else None,
                        "p99_ms": float(np.percentile(p.latencies_s, 99) * 1e3) if p.ok else None,
                        "req_per_s": p.ok / p.elapsed_s if p.elapsed_s else 0.0,
                    }
                    for p in parts[side]
                ],
            }
            self.results["scenarios"].append(row)
            rows[side] = row
            self.log(
                f"{row['name']:<34} c={concurrency:<8} {row['ok']:>6} ok  p50 {row.get('p50_ms', NAN_MS):7.2f}  "
                f"p99 {row.get('p99_ms', NAN_MS):7.2f} ms  {row['req_per_s']:7.1f} req/s  "
                f"({rounds} windows of {window:g} s, interleaved)"
            )
        return rows

    @staticmethod
    def cache_info(topo: procs.Topology) -> dict:
        """The FeatureRunner's own cache counters per level (its ``info`` API)."""
        svc = topo.services.get("feature")
        if svc is None or topo.name.startswith("B"):
            return {}
        try:
            return httpx.post(svc.url + "/info", json={}, timeout=5).json().get("cache", {})
        except (httpx.HTTPError, ValueError):
            return {}

    @staticmethod
    def stages(before: dict, after: dict) -> dict[str, Any]:
        """Per-stage histogram diffs from the services' own /metrics."""
        out: dict[str, Any] = {}
        d = promtext.diff
        if "gateway" in after:
            g0, g1 = before["gateway"], after["gateway"]
            out["gateway_core"] = d(g0, g1, "gateway_request_seconds")
            out["gateway_server"] = d(g0, g1, "bentoml_service_request_duration_seconds", endpoint="/predict")
        if "single" in after:
            out["gateway_server"] = d(
                before["single"], after["single"], "bentoml_service_request_duration_seconds", endpoint="/predict"
            )
        # Co-located (the gateway alone): the runners' stages are in the gateway's own /metrics.
        feature = "feature" if "feature" in after else "gateway" if "gateway" in after else None
        model = "model" if "model" in after else "gateway" if "gateway" in after else None
        if feature is not None:
            f0, f1 = before[feature], after[feature]
            if feature == "feature":
                out["feature_server"] = d(f0, f1, "bentoml_service_request_duration_seconds", endpoint="/predict")
            for st in STAGES:
                out[f"feature_{st}"] = d(f0, f1, "feature_stage_seconds", stage=st)
            out["feature_batch_targets"] = d(f0, f1, "feature_batch_targets")
            out["feature_bytes"] = d(f0, f1, "feature_response_bytes")
        if model is not None:
            m0, m1 = before[model], after[model]
            if model == "model":
                out["model_server"] = d(m0, m1, "bentoml_service_request_duration_seconds", endpoint="/infer")
            out["model_queue"] = d(m0, m1, "graphsage_queue_seconds")
            out["model_compute"] = d(m0, m1, "graphsage_compute_seconds")
            out["model_batch_targets"] = d(m0, m1, "graphsage_batch_targets")
        return {k: v for k, v in out.items() if v is not None}

    @staticmethod
    def hit_ratio(before: dict | None, after: dict | None) -> dict | None:
        if not before or not after:
            return None
        c = {
            lv: promtext.counter_diff(before, after, "feature_lookups_total", level=lv) for lv in ("l1", "l2", "origin")
        }
        total = sum(c.values())
        if total <= 0:
            return None
        return {
            "lookups": int(total),
            "l1": c["l1"] / total,
            "l2": c["l2"] / total,
            "origin": c["origin"] / total,
            "combined": (c["l1"] + c["l2"]) / total,
        }

    def start(self, *topos: procs.Topology) -> None:
        t = time.perf_counter()
        names = ", ".join(tp.name for tp in topos)
        self.log(f"starting {names} ({sum(len(tp.services) for tp in topos)} services, separate processes) ...")
        for tp in topos:
            for s in tp.own():
                s.launch()
                self.all_procs.append(s)
            self.topologies.append(tp)
        for tp in topos:
            for s in tp.own():
                s.wait_ready(180)
        # First call through each entry point: the gateway's dependency clients connect lazily.
        for tp in topos:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(tp.url, json={"node_ids": [0]}, timeout=30)
        self.log(f"started {names} in {time.perf_counter() - t:.1f} s")

    def stop(self, *topos: procs.Topology) -> None:
        for tp in topos:
            tp.stop()
            if tp in self.topologies:
                self.topologies.remove(tp)

    def run_profiles(self, profiles: tuple[Profile, ...], topo: procs.Topology) -> None:
        for p in self.selected(profiles):
            prof = self.profile(topo, p.service, self.b.profile, p.scenario, p.key)
            if prof:
                self.results["profiles"][p.key] = prof

    def profile(
        self, topo: procs.Topology, service: str, seconds: float, scenario: Scenario, key: str = ""
    ) -> dict | None:
        """py-spy (sampling, non-blocking) on one service's processes while ``scenario``'s load runs
        (not recorded as a row)."""
        spy = find_py_spy()
        if spy is None:
            self.log("py-spy not installed: no profile (pip install py-spy)")
            return None
        svc = topo.services[service]
        raw = os.path.join(self.out, f"profile-{key or topo.name + '-' + service}.txt")
        cmd = [
            spy,
            "record",
            "--pid",
            str(svc.proc.pid),
            "--subprocesses",
            "--nonblocking",
            "--full-filenames",
            "-r",
            "100",
            "-d",
            str(int(seconds)),
            "-f",
            "raw",
            "-o",
            raw,
        ]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # py-spy attaches
        row = self.load(
            scenario.profiled_name,
            topo,
            duration=seconds - 1.5,
            record=False,
            dist=scenario.dist,
            nodes=scenario.nodes,
            concurrency=scenario.concurrency,
        )
        try:
            _, err = p.communicate(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        if p.returncode != 0 or not os.path.exists(raw):
            self.log(f"py-spy failed ({p.returncode}): {err[-500:]}")
            return None
        summary = summarise_profile(raw, seconds)
        summary.update(
            scenario=row["name"],
            req_per_s=row["req_per_s"],
            p99_ms=row.get("p99_ms"),
            cpu_util=row["cpu_util"],
            raw=os.path.basename(raw),
        )
        self.log(
            f"profile of {topo.name}/{service}: busy {summary['busy_fraction']:.0%} of wall time; top: "
            + ", ".join(f"{k} {v:.0%}" for k, v in list(summary["by_component"].items())[:5])
        )
        return summary

    # -- phases -----------------------------------------------------------------------------------

    def run(self) -> dict:
        a = self.args
        self.log(f"bench suite ({'quick' if a.quick else 'full'}), load average {os.getloadavg()}")
        speed = machine_speed()
        self.results["config"]["machine_speed"] = [speed]
        self.log(
            f"machine speed: a pure-Python loop of 10M additions {speed['python_loop_s']:.2f} s, "
            f"a process ping-pong {speed['ping_pong_us']:.1f} us"
        )
        self.code_dir = tempfile.mkdtemp(prefix="gsage-suite-code-")
        code = procs.snapshot_code(self.code_dir, a.code)
        self.results["config"]["code"] = code
        self.log(
            f"code under test: {a.code} snapshot of {code['git_head'][:10]} ({code['git_head_subject'][:60]})"
            + (f", uncommitted: {', '.join(code['uncommitted_in_code'])}" if code["uncommitted_in_code"] else "")
            + (
                f", ignoring uncommitted: {', '.join(code['uncommitted_ignored'])}"
                if code["uncommitted_ignored"]
                else ""
            )
        )
        info = ensure_store(HOME_100K, [], self.log)
        n100k, e100k = snapshot_counts(HOME_100K)
        self.results["config"]["store_100k"] = {
            "home": HOME_100K,
            "nodes": n100k,
            "edges": e100k,
            "graphsage": info.get("graphsage"),
        }
        if not redis_available():
            raise SystemExit("redis-server is not installed: the suite needs it for L2")
        redis = self.redis = RedisServer(os.path.join(self.logs, "redis")).start()
        try:
            self.phase_100k(redis, n100k)
            self.phase_inproc()
            if not a.quick and not a.skip_1m:
                self.phase_1m(redis)
            else:
                self.results["skipped"].append(f"{sc.G1M} graph ({'--quick' if a.quick else '--skip-1m'})")
        finally:
            for tp in list(self.topologies):
                tp.stop()
            with contextlib.suppress(Exception):
                redis.stop()
        self.results["config"]["loadavg_end"] = os.getloadavg()
        self.results["config"]["machine_speed"].append(machine_speed())
        shutil.rmtree(self.code_dir, ignore_errors=True)
        self.results["worker_restarts"] = worker_restarts(self.all_procs)
        if self.results["worker_restarts"]:
            self.log(f"WARNING: service workers restarted during the run: {self.results['worker_restarts']}")
        self.results["elapsed_s"] = round(self.elapsed(), 1)
        return self.results

    def app_env(self, redis_url: str, num_nodes: int) -> dict[str, str]:
        l1 = num_nodes * ROW_BYTES // 10  # 10% of the feature bytes (as bench/bench_features.py)
        return {
            "GSAGE_REDIS_URL": redis_url,
            "GSAGE_L1_BYTES": str(l1),
            "GSAGE_GRPC_PORT": "0",
            "GSAGE_AUTH_ENABLED": "0",
            "GSAGE_RATE_LIMIT_PER_S": "0",
        }

    def phase_100k(self, redis: RedisServer, n: int) -> None:
        a, b = self.args, self.b
        t_phase = self.elapsed()
        env_r = self.app_env(redis.url, n)
        self.results["config"]["app_env"] = env_r
        app_r = procs.real_app(sc.APP, HOME_100K, env_r, self.logs)
        app_n = procs.real_app(
            sc.APP_NOREDIS, HOME_100K, {**env_r, "GSAGE_REDIS_URL": ""}, self.logs, model=app_r.services["model"]
        )
        topos = [
            app_r,
            app_n,
            procs.trivial_app(HOME_100K, self.logs),
            procs.trivial_single(HOME_100K, self.logs),
            procs.colocated_app(sc.COLOCATED, HOME_100K, env_r, self.logs),
            procs.one_process(HOME_100K, env_r, self.logs),
        ]
        alt = None
        if not a.quick:  # what-if: the model runner's batching window, the other way from its default
            out = run_cmd(
                [sys.executable, "-c", "from common.settings import Settings;print(Settings().max_batch_delay_ms)"],
                timeout=60,
            )
            default = float(out.stdout.strip() or 0)
            alt = 2.0 if default == 0 else 0.0
            self.results["config"]["batch_delay_ms"] = {"default": default, "what_if": alt}
            topos.append(
                procs.real_app(
                    sc.batch_delay(sc.WHAT_IF_WARMUP, alt).topology,
                    HOME_100K,
                    {**env_r, "GSAGE_MAX_BATCH_DELAY_MS": f"{alt:g}"},
                    self.logs,
                )
            )
        self.start(*topos)
        on = {tp.name: tp for tp in topos}

        def run(s: Scenario, **kw: Any) -> dict:
            return self.run_scenario(s, on[s.topology], **kw)

        self.log("-- cold caches")
        for s in sc.COLD:
            run(s)
        self.log("-- warming up (zipf 32-node requests c=2, then single c=8), not recorded")
        for s in sc.WARMUP:
            run(s)

        self.log("-- warm, Redis on (L1 at 10% of the features)")
        warm = {s: run(s) for s in sc.WARM}
        for s in self.selected(sc.OPEN):
            run(s, rate=max(10.0, round(warm[sc.OPEN_LOOP_OF]["req_per_s"] * s.open_loop, -1)))

        self.log(
            "-- co-located (the three services in one process) and B5 (the same work behind one route), warmed alike"
        )
        for s in (*sc.COLOCATED_WARMUP, *sc.COLOCATED_WARM, *sc.ONE_PROCESS_WARM):
            run(s)
        if not a.no_profile and not self.over_budget("profiles"):
            self.run_profiles((sc.PROFILE_COLOCATED_C1,), on[sc.COLOCATED])

        if alt is not None:
            self.log(f"-- what-if: GSAGE_MAX_BATCH_DELAY_MS={alt:g} (own services, the same Redis)")
            for s in (sc.WHAT_IF_WARMUP, *sc.WHAT_IF):
                run(sc.batch_delay(s, alt))

        self.log(f"-- baselines {B1.id} ({B1.label}) and {B2.id} ({B2.label})")
        for s in sc.TRIVIAL:
            run(s)

        # The targets judged on interleaved windows: the app and its baseline in short turns, so
        # both meet the same background. 8 rounds, not 4: one window's P99 at c=1 varies widely
        # within a side (the "per window pair" range in the report's T1 row), and a P99 pooled over
        # 4 windows moved T1 across its bound between two runs on one machine.
        # Targets paired with the same baseline window share one interleaved run (T2 and T7: the
        # co-located and the split app against B2 at c=32), so no baseline row is recorded twice.
        rounds, window = (2, 2.0) if a.quick else (8, b.short / 2)
        for against, group in pairings(TARGETS):
            self.log(
                f"-- paired: {', '.join(t.id + ' (' + t.app[0].name + ')' for t in group)} and {against.name} "
                "in alternating windows"
            )
            sides = {t.app[0].name: on[t.app[0].topology] for t in group}
            self.paired(
                {**sides, against.name: on[against.topology]},
                concurrency=against.concurrency,
                rounds=rounds,
                window=window,
                tags={"graph": group[0].app[0].graph},
                seed=group[0].pairing.seed,
                nodes=group[0].app[0].nodes,
            )

        self.log("-- warm, Redis off (L1 10%, misses read the memory-mapped snapshot)")
        for s in sc.NOREDIS:
            run(s)

        run(sc.END_OF_PHASE)  # before the bulk scenarios (see its definition)
        # T4's floor on this machine in this run: the bare Redis round trip, no service around it.
        mget = self.results["baselines"]["redis_mget"] = redis_mget_baseline(redis, b.inproc)
        idle = mget["idle"]
        self.log(
            f"bare Redis MGET of {mget['keys_per_call']} cached rows (suite process, the FeatureRunner's "
            f"connection class): back to back p50 {mget['p50_ms']:.2f} ms, p99 {mget['p99_ms']:.2f} ms; "
            f"after {idle['idle_ms']:g} ms idle p50 {idle['p50_ms']:.2f} ms, p99 {idle['p99_ms']:.2f} ms"
        )
        profile = not a.no_profile and not self.over_budget("profiles")
        if profile:
            self.log("-- profiles under load (py-spy, non-blocking)")
            self.run_profiles(sc.PROFILES_WARM, app_r)

        self.log("-- bulk requests, Redis on")
        for s in sc.BULK:
            run(s)
        if profile:
            self.run_profiles(sc.PROFILES_BULK, app_r)

        mem = app_r.memory()
        mem["redis"] = redis_memory(redis)
        self.results["memory"][sc.G100K] = mem
        self.log("memory (RSS MiB): " + ", ".join(f"{k} {v['rss_mib']:.0f}" for k, v in mem.items()))
        self.stop(*topos[::-1])
        self.results["phases"]["100k"] = round(self.elapsed() - t_phase, 1)

    def phase_inproc(self) -> None:
        t = self.elapsed()
        self.log("-- baselines B3 (project sampler + ONNX Runtime in-process) and B4 (PyG in-process)")
        out = run_cmd(
            [sys.executable, "-m", "bench.suite.inproc", "--budget", str(self.b.inproc), "--sizes", "1,256"],
            {"BENTOML_HOME": HOME_100K, "BENTOML_DO_NOT_TRACK": "true"},
            timeout=300,
        )
        if out.returncode != 0:
            self.log(f"in-process baselines failed:\n{out.stderr[-2000:]}")
            return
        for line in out.stderr.splitlines():
            if line.strip().startswith("in-process"):
                self.log(line.strip())
        self.results["baselines"]["inproc"] = json.loads(out.stdout)
        self.results["phases"]["inproc"] = round(self.elapsed() - t, 1)

    def phase_1m(self, redis: RedisServer) -> None:
        t_phase = self.elapsed()
        info = ensure_store(
            HOME_1M,
            ["--nodes", "1000000", "--edges", "10000000", "--epochs", "1", "--max-train-nodes", "20000"],
            self.log,
        )
        n, e = snapshot_counts(HOME_1M)
        self.results["config"]["store_1m"] = {
            "home": HOME_1M,
            "nodes": n,
            "edges": e,
            "graphsage": info.get("graphsage"),
            "build_seconds": info.get("build_seconds", info.get("total_seconds")),
        }
        with contextlib.suppress(OSError):
            raw_command(redis.port, "FLUSHALL")
        app = procs.real_app(sc.APP_1M, HOME_1M, self.app_env(redis.url, n), self.logs)
        self.start(app)
        for s in sc.ONE_M:
            self.run_scenario(s, app, num_nodes=n)
        mem = app.memory()
        mem["redis"] = redis_memory(redis)
        self.results["memory"][sc.G1M] = mem
        self.log("memory (RSS MiB): " + ", ".join(f"{k} {v['rss_mib']:.0f}" for k, v in mem.items()))
        self.stop(app)
        self.results["phases"]["1m"] = round(self.elapsed() - t_phase, 1)


def pairings(targets: tuple[Target, ...]) -> list[tuple[Scenario, list[Target]]]:
    """The targets with interleaved windows, grouped by the baseline window they pair with (in
    the order of ``targets``)."""
    groups: dict[str, tuple[Scenario, list[Target]]] = {}
    for t in targets:
        if t.pairing:
            groups.setdefault(t.pairing.against.name, (t.pairing.against, []))[1].append(t)
    return list(groups.values())


def worker_restarts(services: list[procs.Proc]) -> dict[str, list[str]]:
    """Workers that (re)started more than once, with the times they were stopped, from the logs
    (an arbiter restarts a worker that died or was signalled: errors and cold caches follow)."""
    out = {}
    for svc in services:
        with contextlib.suppress(OSError):
            with open(svc.log_path, errors="replace") as log:
                lines = log.read().splitlines()
            inits = [ln for ln in lines if "] Service " in ln and ln.rstrip().endswith(" initialized")]
            stops = [ln[:19] for ln in lines if "cleanup finalized" in ln]
            if len(inits) > 1:
                out[svc.label] = stops[: len(inits) - 1]
    return out


def cache_diff(before: dict, after: dict) -> dict[str, dict[str, int]]:
    gauges = {"entries", "bytes", "capacity_bytes", "inflight_writes", "circuit_open"}
    out: dict[str, dict[str, int]] = {}
    for level, now in after.items():
        was = before.get(level, {})
        out[level] = {
            k: (v if k in gauges else v - was.get(k, 0)) for k, v in now.items() if isinstance(v, (int, float))
        }
    return out


def redis_mget_baseline(
    server: RedisServer, seconds: float, keys_per_call: int = 150, idle_s: float = 0.010
) -> dict[str, Any]:
    """Time MGETs of ``keys_per_call`` random cached feature rows (about one request's L1 misses)
    straight from this process, through the FeatureRunner's own connection class
    (``runners.feature.cache.resp``): what an L2 read costs with no service, batcher or load around it.
    ``seconds / 2`` back to back, then ``seconds`` with ``idle_s`` of sleep before each call, as
    the FeatureRunner and Redis both idle between requests at c=1 (``idle`` in the result)."""
    import redis.asyncio as aioredis

    from runners.feature.cache.resp import RespConnection, pack_command

    async def keys_cached() -> list[bytes]:
        client = aioredis.Redis.from_url(server.url)
        try:
            keys: list[bytes] = []
            async for key in client.scan_iter(match="gsf:*", count=1000):
                keys.append(key)
                if len(keys) >= 5000:
                    break
            return keys
        finally:
            await client.aclose()

    async def run(keys: list[bytes], gap_s: float, budget_s: float) -> list[float]:
        conn = RespConnection(HOST, server.port)
        rng = np.random.default_rng(0)
        times: list[float] = []
        deadline = time.perf_counter() + budget_s
        try:
            while keys and time.perf_counter() < deadline and len(times) < 20_000:
                command = pack_command(b"MGET", *[keys[i] for i in rng.integers(0, len(keys), keys_per_call)])
                if gap_s:
                    await asyncio.sleep(gap_s)
                t0 = time.perf_counter()
                await conn.execute(command)
                times.append(time.perf_counter() - t0)
            return times
        finally:
            conn.close()

    def stats(times: list[float]) -> dict[str, Any]:
        ms = np.asarray(times) * 1e3
        if ms.size == 0:
            nan = float("nan")
            return {"keys_per_call": keys_per_call, "calls": 0, "p50_ms": nan, "p99_ms": nan, "mean_ms": nan}
        return {
            "keys_per_call": keys_per_call,
            "calls": int(ms.size),
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()),
        }

    keys = asyncio.run(keys_cached())
    out = stats(asyncio.run(run(keys, 0.0, seconds / 2)))
    out["idle"] = {**stats(asyncio.run(run(keys, idle_s, seconds))), "idle_ms": idle_s * 1e3}
    return out


def redis_memory(redis: RedisServer) -> dict[str, float]:
    try:
        info = redis.info("memory")
        keys = redis.dbsize()
    except OSError:
        return {}
    return {
        "rss_mib": int(info.get("used_memory_rss", 0)) / 2**20,
        "used_mib": int(info.get("used_memory", 0)) / 2**20,
        "keys": keys,
        "processes": 1,
    }


COMPONENTS = (  # (component, substrings of a frame's file path); first match wins, deepest frame first
    ("project: services/", ("/services/",)),
    ("project: runners/", ("/runners/",)),
    ("pydantic", ("pydantic",)),
    ("aiohttp (client to runners)", ("aiohttp",)),
    ("uvicorn/h11/httptools (server)", ("uvicorn", "h11", "httptools")),
    ("starlette", ("starlette",)),
    ("opentelemetry", ("opentelemetry",)),
    ("prometheus_client", ("prometheus_client",)),
    ("bentoml", ("bentoml", "_bentoml_impl", "_bentoml_sdk")),
    ("numpy", ("numpy",)),
    ("onnxruntime", ("onnxruntime",)),
    ("redis", ("/redis/",)),
    ("json", ("/json/",)),
    ("asyncio event loop", ("asyncio", "selectors")),
    ("logging", ("/logging/",)),
)


def summarise_profile(path: str, seconds: float, rate: int = 100) -> dict[str, Any]:
    """py-spy raw (collapsed) stacks -> busy fraction, self time by component (the deepest frame
    in a known package), top leaf functions, and inclusive time of selected functions."""
    leaf: Counter[str] = Counter()
    comp: Counter[str] = Counter()
    layer: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    pids: set[str] = set()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(count)
            total += n
            frames = stack.split(";")
            if frames and frames[0].startswith("process"):
                pids.add(frames[0])
            layer[layer_of(frames)] += n
            # frames look like "func (path/file.py:line)"
            leaf[frames[-1].split(":")[0] if frames else "?"] += n
            for fr in reversed(frames):
                hit = next((name for name, keys in COMPONENTS if any(k in fr for k in keys)), None)
                if hit:
                    comp[hit] += n
                    break
            else:
                comp["other (C / interpreter)"] += n
            seen = set()
            for fr in frames:
                fn = fr.split(" (")[0]
                if fn in seen:
                    continue
                seen.add(fn)
                incl[fn] += n
    wall_samples = seconds * rate
    return {
        "samples": total,
        "busy_fraction": total / max(wall_samples, 1),
        "processes": len(pids) or 1,
        "by_component": {k: v / max(total, 1) for k, v in comp.most_common()},
        "by_layer": {k: v / max(total, 1) for k, v in layer.most_common()},
        "top_leaf": [[k, v / max(total, 1)] for k, v in leaf.most_common(12)],
        "top_inclusive": [[k, v / max(total, 1)] for k, v in incl.most_common(40)],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__)
    p.add_argument("--quick", action="store_true", help="short scenarios, no 1M graph (~3 min)")
    p.add_argument(
        "--out",
        default=None,
        help="results directory (JSON, plots, report.md, logs); default bench/results, "
        "bench/results/quick with --quick",
    )
    p.add_argument("--skip-1m", action="store_true", help="full run without the 1M/10M graph")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument(
        "--code",
        choices=("worktree", "head"),
        default="worktree",
        help="run the services from a snapshot of the working tree taken at start (default) or of HEAD",
    )
    p.add_argument("--scale", type=float, default=1.0, help="multiply every load duration (development smoke runs)")
    p.add_argument(
        "--report-from",
        metavar="SUITE_JSON",
        help="run nothing: write the report (and plots) of an earlier run's JSON into --out (default: beside the JSON)",
    )
    a = p.parse_args(argv)
    if a.report_from and not a.out:
        a.out = os.path.dirname(os.path.abspath(a.report_from))
    a.out = a.out or ("bench/results/quick" if a.quick else "bench/results")
    missing = missing_bench_extra(profiles=not a.no_profile and not a.report_from)
    if "matplotlib" in missing:  # the report comes last: fail before the 10 minutes, not after
        raise SystemExit("the report's plots need matplotlib: pip install -e '.[bench]'")
    if missing:
        print(f"warning: {', '.join(missing)} not installed: no profiles (pip install -e '.[bench]')", flush=True)
    if a.report_from:
        if not os.path.isfile(a.report_from):  # the results JSON is not committed (bench/results/*.json)
            raise SystemExit(
                f"no results JSON at {a.report_from}: a run of the suite writes it "
                "(python -m bench.suite [--quick]); it is not kept in git"
            )
        with open(a.report_from) as f:
            results = json.load(f)
        md = write_report(results, os.path.abspath(a.out))
        print(f"wrote {md} (+ plots)")
        return
    # SIGTERM (a timeout, a kill) unwinds like Ctrl-C, so run()'s finally stops every service.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    suite = Suite(a)
    suite.results["config"]["argv"] = list(sys.argv[1:] if argv is None else argv)
    results = suite.run()
    name = "suite_quick.json" if a.quick else "suite.json"
    path = os.path.join(suite.out, name)
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=float)
    suite.log(f"wrote {path}")
    md = write_report(results, suite.out)
    suite.log(f"wrote {md} (+ plots) in {suite.elapsed():.0f} s")


def write_report(results: dict, out: str) -> str:
    """The run's one written account: report.md and its plots in ``out`` (docs/performance.md is
    hand-written and links to it)."""
    from bench.suite import report

    return report.write(results, out)


def missing_bench_extra(profiles: bool) -> list[str]:
    """What of the ``bench`` extra is not installed: matplotlib (plots), py-spy (profiles)."""
    import importlib.util

    missing = [] if importlib.util.find_spec("matplotlib") else ["matplotlib"]
    if profiles and find_py_spy() is None:
        missing.append("py-spy")
    return missing


def find_py_spy() -> str | None:
    # The venv's bin/ need not be on PATH (the suite run as .venv/bin/python).
    return shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
