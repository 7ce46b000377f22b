"""The split app in cluster mode (``GSAGE_FEATURE_SOURCE=redis``): the snapshot's rows loaded into
a Redis Cluster (3 masters + 3 replicas) by ``python -m training_export load-features``, then
``features.npy`` removed from the store: the three services start, answer as the local mode did
for the same seed, and an update is read back through the gateway (``min_sequence``); two whole
apps over one log and one cluster agree, switch to a compaction under load, and serve on after
``python -m training_export prune-features`` deleted the row versions it superseded."""

from __future__ import annotations

import json
import os

import httpx
import numpy as np
import pytest
import redis

from harness.app import SplitApp, run_export, running
from harness.redis_servers import RedisCluster3, RedisServer, redis_available
from tests.conftest import bentoml_home, private_store

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not redis_available(), reason="redis-server / redis-cli not installed"),
]
REQUESTS = [{"node_ids": [0, 7, 42], "seed": 11}, {"node_ids": list(range(100, 140)), "seed": 3}]


def _probs(answer: dict) -> np.ndarray:
    return np.array([p["probabilities"] for p in answer["predictions"]])


def _answers(app: SplitApp) -> list[np.ndarray]:
    out = []
    for body in REQUESTS:
        r = httpx.post(app.gateway.url + "/predict", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["degraded"] is False, (r.text, app.logs()[-3000:])
        out.append(_probs(r.json()))
    return out


def _hits(cluster: RedisCluster3) -> int:
    return sum(int(n.info("stats").get("keyspace_hits", 0)) for n in cluster.nodes if n.proc is not None)


def test_the_app_serves_from_the_feature_cluster_without_features_npy(demo_store, tmp_path):
    home = private_store(demo_store, tmp_path)
    from common.bento.store import get_entry

    with bentoml_home(home):
        entry = get_entry("graph-snapshot:latest")
    env = {"GSAGE_MODEL_TAGS": demo_store.v1, "GSAGE_SNAPSHOT_TAG": entry.tag}
    with (
        RedisCluster3(str(tmp_path / "cluster"), replicas=1) as cluster,
        RedisServer(str(tmp_path / "log")) as log_redis,
    ):
        local = SplitApp(home, {**env, "GSAGE_GRAPH_LOG_DIR": str(tmp_path / "file-log")}, log_dir=str(tmp_path))
        with running(local):
            want = _answers(local)
        report = run_export(home, "load-features", "--snapshot", entry.tag, "--redis-url", cluster.url)
        assert report["verified"] and report["rows_found"] == report["rows"], report
        os.remove(os.path.join(entry.path, "features.npy"))
        cluster_env = {
            **env,
            "GSAGE_FEATURE_SOURCE": "redis",
            "GSAGE_FEATURE_REDIS_URL": cluster.url,
            "GSAGE_GRAPH_LOG_REDIS_URL": log_redis.url,
        }
        (tmp_path / "cluster-app").mkdir()
        app = SplitApp(home, cluster_env, log_dir=str(tmp_path / "cluster-app"))
        hits_before = _hits(cluster)
        with running(app):
            for got, expected in zip(_answers(app), want, strict=True):
                np.testing.assert_allclose(got, expected, atol=1e-6)
            dim = int(report["dim"])
            ack = httpx.post(
                app.gateway.url + "/graph/updates",
                json={"ops": [{"op": "set_features", "id": 7, "features": [3.0] * dim}]},
                timeout=30,
            )
            assert ack.status_code == 200, (ack.text, app.logs()[-3000:])
            after = httpx.post(
                app.gateway.url + "/predict",
                json={"node_ids": [7], "seed": 11, "min_sequence": ack.json()["sequence"]},
                timeout=30,
            )
            assert after.status_code == 200, after.text
            assert not np.allclose(_probs(after.json()), want[0][1:2])
            assert _hits(cluster) > hits_before  # the rows came from the cluster


def test_two_replicas_of_each_service_agree_and_switch_to_a_compaction_without_a_failed_request(demo_store, tmp_path):
    """Two gateways and two FeatureRunners (two whole apps) over one update log and one feature
    cluster: an update made through one is read back through the other with ``min_sequence``, both
    answer alike for the same seed, and a compaction under load on both loses no request."""
    import asyncio

    from common.bento.store import get_entry
    from harness.load import closed_loop
    from tests.conftest import wait_for

    home = private_store(demo_store, tmp_path)
    with bentoml_home(home):
        entry = get_entry("graph-snapshot:latest")
    with (
        RedisCluster3(str(tmp_path / "cluster"), replicas=1) as cluster,
        RedisServer(str(tmp_path / "log")) as log_redis,
    ):
        report = run_export(home, "load-features", "--snapshot", entry.tag, "--redis-url", cluster.url)
        assert report["verified"], report
        env = {
            "GSAGE_MODEL_TAGS": demo_store.v1,
            "GSAGE_SNAPSHOT_TAG": entry.tag,
            "GSAGE_FEATURE_SOURCE": "redis",
            "GSAGE_FEATURE_REDIS_URL": cluster.url,
            "GSAGE_GRAPH_LOG_REDIS_URL": log_redis.url,
        }
        apps = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            apps.append(SplitApp(home, env, log_dir=str(tmp_path / name)))
        a, b = apps
        with running(a), running(b):
            ack = httpx.post(
                a.gateway.url + "/graph/updates",
                json={"ops": [{"op": "set_features", "id": 7, "features": [2.0] * int(report["dim"])}]},
                timeout=30,
            )
            assert ack.status_code == 200, ack.text
            body = {"node_ids": [7, 8, 9], "seed": 5, "min_sequence": ack.json()["sequence"]}
            answers = [httpx.post(app.gateway.url + "/predict", json=body, timeout=30) for app in apps]
            assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
            np.testing.assert_allclose(_probs(answers[1].json()), _probs(answers[0].json()), atol=1e-6)

            bodies = [_body(i) for i in range(400)]

            async def compaction_under_load():
                loads = [closed_loop(app.gateway.url + "/predict", bodies, 4, 6.0) for app in apps]
                compact = asyncio.to_thread(httpx.post, a.gateway.url + "/admin/graph/compact", json={}, timeout=60)
                return await asyncio.gather(*loads, compact)

            load_a, load_b, compacted = asyncio.run(compaction_under_load())
            assert compacted.status_code == 200, compacted.text
            assert load_a.ok > 0 and load_b.ok > 0 and not load_a.errors and not load_b.errors, (
                load_a.errors,
                load_b.errors,
            )
            result = compacted.json()
            with bentoml_home(home):
                folded = get_entry(result["snapshot"])
            assert not os.path.exists(os.path.join(folded.path, "features.npy"))  # row versions, not rows
            after = {**body, "min_sequence": result["announced_at"]}

            def switched(app: SplitApp) -> bool:
                r = httpx.post(app.gateway.url + "/predict", json=after, timeout=30)
                return r.status_code == 200 and np.allclose(_probs(r.json()), _probs(answers[0].json()), atol=1e-6)

            for app in apps:
                assert wait_for(lambda app=app: switched(app), 30), app.logs()[-3000:]

            # Once both FeatureRunners report the compacted snapshot in the log, the row versions it
            # superseded are pruned (row 7 as loaded); under load again, no request misses a row.
            def statuses() -> list[dict]:
                raw = redis.Redis.from_url(log_redis.url).hgetall("{gsage-updates}:workers")
                return [json.loads(v) for v in raw.values()]

            assert wait_for(lambda: {s["snapshot"] for s in statuses()} == {result["snapshot"]}, 30), statuses()
            prune_env = {"GSAGE_GRAPH_LOG_REDIS_URL": log_redis.url, "GSAGE_FEATURE_REDIS_URL": cluster.url}
            pruned = run_export(home, "prune-features", env=prune_env)
            assert pruned["passed"] and pruned["snapshot"] == result["snapshot"], pruned
            assert pruned["versions_deleted"] >= 1 and len(pruned["workers"]) == 2, pruned
            fresh = [json.dumps({"node_ids": [1000 + i], "seed": i}).encode() for i in range(400)]
            after_prune = [asyncio.run(closed_loop(app.gateway.url + "/predict", fresh, 4, 3.0)) for app in apps]
            assert all(r.ok > 0 and not r.errors for r in after_prune), [r.errors for r in after_prune]
            assert all(switched(app) for app in apps)


def _body(i: int) -> bytes:
    return json.dumps({"node_ids": [i % 500], "seed": i}).encode()


def test_a_feature_runner_whose_memory_limit_is_below_the_features_serves_from_the_cluster(tmp_path):
    """A graph whose features (200k x 512 float32: 391 MB) are larger than the FeatureRunner's
    memory limit (a cgroup, as a container's limit): in cluster mode it starts and serves the same
    rows the snapshot holds, the limit never reached."""
    import asyncio

    from common.feature_runner_api import FEATURE_TENSOR
    from common.settings import load_settings
    from harness.app import Service, service_headers
    from harness.memory_limit import MemoryLimit
    from harness.ports import free_port
    from harness.ready_stub import ReadyStub
    from runners.feature.cache.tiered import build_feature_store
    from runners.feature.graph import LiveGraph
    from runners.feature.neighbourhood import NeighbourhoodBuilder
    from runners.feature.snapshot import load_snapshot, save_snapshot
    from training_export.synthetic import SyntheticGraphSpec, generate

    why_not = MemoryLimit.available()
    if why_not:
        pytest.skip(why_not)
    home = str(tmp_path / "bentoml")
    with bentoml_home(home):
        snap = generate(SyntheticGraphSpec(num_nodes=200_000, num_edges=1_000_000, feature_dim=512), progress=False)
        tag = save_snapshot(snap)
    features_bytes = snap.features.nbytes
    with RedisCluster3(str(tmp_path / "cluster"), replicas=1) as cluster:
        report = run_export(
            home, "load-features", "--snapshot", tag, "--redis-url", cluster.url, "--batch-rows", "1024"
        )
        assert report["verified"], report
        env = {
            **os.environ,
            "BENTOML_HOME": home,
            "BENTOML_DO_NOT_TRACK": "true",
            "GSAGE_SNAPSHOT_TAG": tag,
            "GSAGE_FEATURE_SOURCE": "redis",
            "GSAGE_FEATURE_REDIS_URL": cluster.url,
            "GSAGE_GRAPH_LOG_DIR": str(tmp_path / "log"),
            "GSAGE_L1_BYTES": str(16 << 20),
        }
        # The model runner is never called by /features; its URL only has to answer /readyz.
        stub = ReadyStub()
        svc = Service("FeatureRunner", free_port(), env, depends={"GraphSAGERunner": stub.url}, log_dir=str(tmp_path))
        with MemoryLimit(int(features_bytes * 0.9)) as limit:
            svc.launch()
            try:
                limit.enter(svc.proc.pid)
                svc.wait_ready(180)
                targets = [0, 17, 4242, 199_999]
                answers = [
                    httpx.post(
                        svc.url + "/features",
                        json={"node_ids": [t], "fanout": [10, 5], "seed": 3},
                        headers=service_headers(env),
                        timeout=30,
                    )
                    for t in targets
                ]
                assert all(r.status_code == 200 for r in answers), [r.text[:300] for r in answers]
                for _ in range(200):  # enough requests to touch many rows across the cluster
                    r = httpx.post(
                        svc.url + "/features",
                        json={"node_ids": [int(np.random.randint(200_000))], "fanout": [25, 10]},
                        headers=service_headers(env),
                        timeout=30,
                    )
                    assert r.status_code == 200, r.text[:300]
                figures = limit.figures()
            finally:
                svc.stop()
                stub.stop()
        assert figures["limit_hit"] == 0 and figures["max_usage_mb"] < features_bytes / 2**20, figures
    # The rows served are the snapshot's (the local mode, in this process, for the same seeds).
    with bentoml_home(home):
        graph = LiveGraph(load_snapshot(tag))
        cfg = load_settings({})
        local = NeighbourhoodBuilder(
            graph, build_feature_store(cfg.feature_cache, cfg.redis, graph.base.features, tag, graph), (25, 10), 64, 0
        )
        for t, r in zip(targets, answers, strict=True):
            want = asyncio.run(local.build([local.validate(np.array([t]), (10, 5), 3)]))[0]
            np.testing.assert_array_equal(FEATURE_TENSOR.decode(r.content).features, want.features)
