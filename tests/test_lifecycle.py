"""Lifecycle of the services as separate processes: a SIGTERMed FeatureRunner sends the write-back
it buffered for Redis before it exits, and an admin load or unload reaches every model worker."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from common.service_auth import ensure_shared_token
from harness.app import Service, free_port, service_headers

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _env(demo_store, **extra: str) -> dict[str, str]:
    ensure_shared_token()  # the processes of a test share one service token
    return {
        **os.environ,
        "BENTOML_HOME": demo_store.home,
        "BENTOML_DO_NOT_TRACK": "true",
        "GSAGE_MODEL_TAGS": demo_store.v1,
        "GSAGE_GRPC_PORT": "0",
        **extra,
    }


def _wait(predicate, timeout_s: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_sigtermed_feature_runner_flushes_its_buffered_write_back(demo_store, redis_standalone, tmp_path):
    env = _env(
        demo_store,
        GSAGE_REDIS_URL=redis_standalone.url,
        GSAGE_L2_WRITE_DELAY_MS="600000",
        GSAGE_L2_WRITE_BATCH_ROWS="1000000",  # held back until the end
        GSAGE_SCAN_MIN_TARGETS="0",
        # The update log on disk: Redis then holds the feature rows only, which the test counts.
        GSAGE_GRAPH_LOG="file",
        GSAGE_GRAPH_LOG_DIR=str(tmp_path / "update-log"),
    )
    model = Service("GraphSAGERunner", free_port(), env, log_dir=str(tmp_path))
    feature = Service("FeatureRunner", free_port(), env, depends={"GraphSAGERunner": model.url}, log_dir=str(tmp_path))
    headers = service_headers(env)
    try:
        model.start()
        feature.start()
        r = httpx.post(
            feature.url + "/features", json={"node_ids": [1, 2, 3, 4, 5], "seed": 1}, headers=headers, timeout=30
        )
        assert r.status_code == 200, r.text
        info = httpx.post(feature.url + "/info", json={}, headers=headers, timeout=10).json()
        pending = info["cache"]["l2"]["pending_write_rows"]
        assert pending > 0 and redis_standalone.dbsize() == 0  # buffered, not yet sent
        feature.stop(signal.SIGTERM)
        assert feature.proc.returncode is not None
        assert redis_standalone.dbsize() == pending, feature.log_tail()  # every buffered row arrived
    finally:
        feature.stop()
        model.stop()


def test_an_admin_load_and_unload_reach_every_model_worker(demo_store, tmp_path):
    env = _env(demo_store, GSAGE_MODEL_WORKERS="2", GSAGE_MODEL_SYNC_INTERVAL_S="0.2")
    headers = service_headers(env)
    model = Service("GraphSAGERunner", free_port(), env, log_dir=str(tmp_path))

    def loaded_per_worker() -> dict[int, set[str]]:
        """What each worker has loaded: a new connection per call lands on either worker."""
        seen: dict[int, set[str]] = {}
        for _ in range(40):
            doc = httpx.post(model.url + "/models", json={}, headers=headers, timeout=10).json()
            seen[doc["worker_pid"]] = {m["tag"] for m in doc["loaded"]}
        return seen

    try:
        model.start()
        assert len(_wait(loaded_per_worker, what="both workers answering")) == 2
        r = httpx.post(model.url + "/load", json={"tag": demo_store.v2}, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        _wait(
            lambda: (lambda s: len(s) == 2 and all(demo_store.v2 in tags for tags in s.values()))(loaded_per_worker()),
            what="v2 on both workers",
        )
        r = httpx.post(model.url + "/unload", json={"tag": demo_store.v1}, headers=headers, timeout=60)
        assert r.status_code == 200 and r.json()["unloaded"], r.text
        _wait(
            lambda: (lambda s: len(s) == 2 and all(tags == {demo_store.v2} for tags in s.values()))(
                loaded_per_worker()
            ),
            what="v1 gone from both workers",
        )
    finally:
        model.stop()
