"""The co-located deployment: the three services in one process (the gateway started with no
``--depends``; ``common.bento.dependencies``). The same answers as the split app for the same
seed, the living graph followed (read-your-writes), one model registry for the gateway's admin
calls and the FeatureRunner's predictions, and nothing started beside the gateway."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from harness.app import ColocatedApp, SplitApp, running
from tests.conftest import bentoml_home, private_store

pytestmark = pytest.mark.integration


def _probs(answer: dict) -> np.ndarray:
    return np.array([p["probabilities"] for p in answer["predictions"]])


@pytest.fixture(scope="module")
def apps(demo_store, tmp_path_factory):
    roots = {name: tmp_path_factory.mktemp(name) for name in ("split", "colocated")}
    env = {"GSAGE_MODEL_TAGS": demo_store.v1}
    split = SplitApp(
        private_store(demo_store, roots["split"]),
        {**env, "GSAGE_GRAPH_LOG_DIR": str(roots["split"] / "log")},
        log_dir=str(roots["split"]),
    )
    colocated = ColocatedApp(
        private_store(demo_store, roots["colocated"]),
        {**env, "GSAGE_GRAPH_LOG_DIR": str(roots["colocated"] / "log")},
        log_dir=str(roots["colocated"]),
    )
    with running(split), running(colocated):
        yield split, colocated


@pytest.mark.parametrize("ids", [[0, 7, 42], list(range(100, 140))])  # under and over the premean threshold
def test_the_same_seed_gets_the_same_answer_as_the_split_app(apps, ids):
    split, colocated = apps
    body = {"node_ids": ids, "seed": 11}
    a = httpx.post(split.gateway.url + "/predict", json=body, timeout=30)
    b = httpx.post(colocated.gateway.url + "/predict", json=body, timeout=30)
    assert a.status_code == b.status_code == 200, (a.text, b.text, colocated.logs())
    assert a.json()["model"] == b.json()["model"] and b.json()["degraded"] is False
    np.testing.assert_allclose(_probs(b.json()), _probs(a.json()), atol=1e-6)


def test_an_update_is_read_back_and_replayed_after_a_restart_and_admin_calls_reach_the_serving_registry(
    apps, demo_store
):
    _, colocated = apps
    url = colocated.gateway.url
    from runners.feature.snapshot import load_snapshot

    with bentoml_home(colocated.env["BENTOML_HOME"]):
        dim = load_snapshot("graph-snapshot:latest").feature_dim
    before = httpx.post(url + "/predict", json={"node_ids": [7], "seed": 3}, timeout=30).json()
    ack = httpx.post(
        url + "/graph/updates", json={"ops": [{"op": "set_features", "id": 7, "features": [3.0] * dim}]}, timeout=30
    )
    assert ack.status_code == 200, (ack.text, colocated.logs())
    after = httpx.post(
        url + "/predict", json={"node_ids": [7], "seed": 3, "min_sequence": ack.json()["sequence"]}, timeout=30
    )
    assert after.status_code == 200 and after.json()["degraded"] is False, after.text
    assert not np.allclose(_probs(after.json()), _probs(before))
    # Restarted, the process replays the update log before it serves (the FeatureRunner's
    # startup hook, which BentoML runs only for the gateway: the transport runs it here).
    colocated.stop()
    colocated.start()
    again = httpx.post(url + "/predict", json={"node_ids": [7], "seed": 3}, timeout=30)
    assert again.status_code == 200, (again.text, colocated.logs())
    np.testing.assert_allclose(_probs(again.json()), _probs(after.json()), atol=1e-6)
    # The gateway's model runner is the FeatureRunner's: a version loaded by the admin call is
    # the one that is listed, and it answers a pinned request.
    models = httpx.get(url + "/models", timeout=30).json()
    assert demo_store.v1 in [m["tag"] for m in models["model_runner"]["loaded"]], models
    pinned = httpx.post(url + "/predict", json={"node_ids": [7], "version": demo_store.v2}, timeout=60)
    assert pinned.status_code == 200 and pinned.json()["model"] == demo_store.v2, pinned.text
    listed = httpx.get(url + "/models", timeout=30).json()["model_runner"]["loaded"]
    assert {demo_store.v1, demo_store.v2} <= {m["tag"] for m in listed}


def test_nothing_runs_beside_the_gateway(apps):
    _, colocated = apps
    commands = [" ".join(p.cmdline()) for p in colocated.gateway.tree()]
    assert all("--depends" not in c for c in commands), commands
    assert not [c for c in commands if "FeatureRunner" in c or "GraphSAGERunner" in c], commands
