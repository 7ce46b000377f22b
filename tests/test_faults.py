"""Fault injection under steady concurrent load, against real processes; each test prints its
figures (requests sent, answered in full, degraded, failed by status) and records them in
``bench/results/faults.json`` for the docs."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import psutil
import pytest

from harness.app import SplitApp, answers_under_load
from harness.load import Outcomes
from harness.redis_servers import RedisCluster3, RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results" / "faults.json"


@pytest.fixture(scope="module")
def store(demo_store):
    return demo_store.home, (demo_store.v1, demo_store.v2)


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    server = RedisServer(str(tmp_path_factory.mktemp("redis"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def app(store, redis):
    home, (v1, _) = store
    # A tiny L1 so that L2 (Redis) serves most rows and its loss is felt.
    env = {
        "GSAGE_REDIS_URL": redis.url,
        "GSAGE_L1_BYTES": "65536",
        "GSAGE_MODEL_TAGS": v1,
        "GSAGE_RUNNER_TIMEOUT_S": "2",
        "GSAGE_BREAKER_RESET_S": "1",
        "GSAGE_BREAKER_FAILURES": "3",
        "GSAGE_GRPC_PORT": "0",
    }
    app = SplitApp(home, env, model_workers=2).start()
    yield app
    app.stop()


def record(name: str, load: str, out: Outcomes, recovery_s: float | None = None) -> dict:
    failed = {str(k): v for k, v in out.items() if not str(k).startswith("graphsage:") and k != "degraded"}
    row = {
        "fault": name,
        "load": load,
        "sent": sum(out.values()),
        "answered": sum(v for k, v in out.items() if str(k).startswith("graphsage:")),
        "degraded": out.get("degraded", 0),
        "failed": sum(failed.values()),
        "failed_by_status": failed,
        "recovery_s": recovery_s,
        "first_messages": out.first_message,
    }
    print(f"\n{name}: {json.dumps(row)}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    rows[name] = row
    RESULTS.write_text(json.dumps(rows, indent=2))
    return row


def l2_hits(app: SplitApp) -> float:
    text = httpx.get(app.feature.url + "/metrics").text
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith('feature_lookups_total{level="l2"')
    )


async def _with_fault(app: SplitApp, seconds: float, concurrency: int, fault) -> Outcomes:
    load = asyncio.create_task(
        answers_under_load(
            app.gateway.url + "/predict",
            {},
            seconds,
            concurrency,
            lambda w, n: {"node_ids": [(w * 389 + n * 7) % 4000]},
        )
    )
    await fault()
    return await load


def test_redis_killed_then_restarted(app, redis):
    async def fault() -> None:
        await asyncio.sleep(2.0)
        redis.kill()
        await asyncio.sleep(3.0)
        await asyncio.to_thread(redis.restart)

    out = asyncio.run(_with_fault(app, 9.0, 8, fault))
    row = record("redis_l2_killed_and_restarted", "8 concurrent single-node requests, 9 s", out)
    assert row["failed"] == 0 and row["degraded"] == 0, row
    metrics = httpx.get(app.feature.url + "/metrics").text
    assert any(
        line.startswith("feature_l2_errors_total ") and float(line.split()[-1]) > 0 for line in metrics.splitlines()
    ), "L2 failures are counted on /metrics"
    before = l2_hits(app)
    asyncio.run(
        answers_under_load(app.gateway.url + "/predict", {}, 2.0, 4, lambda w, n: {"node_ids": [(w * 13 + n) % 500]})
    )
    assert l2_hits(app) > before, "L2 hits should resume after the restart"


def test_one_model_worker_killed(app):
    arbiter = psutil.Process(app.model.proc.pid)
    workers = [p for p in arbiter.children(recursive=True) if "GraphSAGERunner" in " ".join(p.cmdline())]
    assert len(workers) >= 2, workers

    async def fault() -> None:
        await asyncio.sleep(2.0)
        workers[0].kill()

    out = asyncio.run(_with_fault(app, 6.0, 16, fault))
    row = record("one_model_worker_killed", "16 concurrent single-node requests, 6 s, 2 workers", out)
    assert row["failed"] == 0, row  # a connection lost mid-call is retried (idempotent)


def test_feature_runner_killed_then_restarted(app):
    timeline: dict[str, float] = {}

    async def fault() -> None:
        await asyncio.sleep(1.5)
        app.feature.kill()
        await asyncio.sleep(2.5)
        await asyncio.to_thread(app.feature.start)
        timeline["restarted"] = time.monotonic()

    out = asyncio.run(_with_fault(app, 10.0, 8, fault))
    client = httpx.Client(timeout=5)
    recovery = None
    while recovery is None and time.monotonic() - timeline["restarted"] < 10:
        if not client.post(app.gateway.url + "/predict", json={"node_ids": [1]}).json()["degraded"]:
            recovery = time.monotonic() - timeline["restarted"]
    row = record(
        "feature_runner_killed_and_restarted",
        "8 concurrent single-node requests, 10 s",
        out,
        recovery_s=None if recovery is None else round(recovery, 2),
    )
    assert row["failed"] == 0 and row["degraded"] > 0, row
    assert recovery is not None and recovery <= 5.0, row


def test_hot_load_of_a_new_version_under_load(app, store):
    _, (v1, v2) = store

    async def fault() -> None:
        await asyncio.sleep(1.0)
        r = await asyncio.to_thread(
            httpx.post, app.model.url + "/load", json={"tag": v2}, timeout=30, headers=app.service_headers
        )
        assert r.status_code == 200, r.text

    out = asyncio.run(_with_fault(app, 4.0, 8, fault))
    row = record("model_version_hot_load", "8 concurrent single-node requests, 4 s", out)
    assert row["failed"] == 0, row
    # Both versions on both model workers (the load reached one; the other follows within ~0.5 s).
    deadline = time.monotonic() + 10
    while True:
        seen = {}
        for _ in range(30):
            doc = httpx.post(app.model.url + "/models", json={}, headers=app.service_headers, timeout=10).json()
            seen[doc["worker_pid"]] = {m["tag"] for m in doc["loaded"]}
        if len(seen) == 2 and all(tags == {v1, v2} for tags in seen.values()):
            break
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)


def test_redis_cluster_master_killed_replica_takes_over(store, tmp_path):
    """3 masters + 3 replicas as L2; a master is SIGKILLed under load: no request fails (L2
    misses fall back to the origin), the cluster promotes the replica, L2 hits resume."""
    home, (v1, _) = store
    cluster = RedisCluster3(str(tmp_path), replicas=1).start()
    env = {
        "GSAGE_REDIS_URL": cluster.url,
        "GSAGE_L1_BYTES": "65536",
        "GSAGE_MODEL_TAGS": v1,
        "GSAGE_L2_RETRY_BACKOFF_S": "0.5",
        "GSAGE_GRPC_PORT": "0",
    }
    app = SplitApp(home, env).start()
    try:
        masters = [n for n in cluster.nodes if cluster.roles().get(n.port) == "master"]
        victim = masters[0]
        takeover: dict[str, float] = {}

        async def fault() -> None:
            await asyncio.sleep(2.0)
            victim.kill()
            killed = time.monotonic()
            while time.monotonic() - killed < 20 and list(cluster.roles().values()).count("master") < 3:
                await asyncio.sleep(0.1)  # the replica's promotion, after the node timeout (1 s)
            survivors = [n for n in cluster.nodes if n is not victim]
            await asyncio.to_thread(cluster.wait_state, "ok", 20.0, survivors)
            takeover["s"] = round(time.monotonic() - killed, 2)

        out = asyncio.run(_with_fault(app, 9.0, 8, fault))
        row = record(
            "redis_cluster_master_killed",
            "8 concurrent single-node requests, 9 s, 3 masters + 3 replicas",
            out,
            recovery_s=takeover.get("s"),
        )
        assert row["failed"] == 0 and row["degraded"] == 0, row
        assert sum(1 for r in cluster.roles().values() if r == "master") == 3, "a replica should be promoted"
        before = l2_hits(app)
        asyncio.run(
            answers_under_load(
                app.gateway.url + "/predict", {}, 3.0, 4, lambda w, n: {"node_ids": [(w * 13 + n) % 500]}
            )
        )
        assert l2_hits(app) > before, "L2 hits should resume on the promoted replica"
    finally:
        app.stop()
        cluster.stop()
