"""The living graph end to end: the three services as separate processes (two FeatureRunner
workers, Redis for L2), graph updates over HTTP and gRPC, predictions that reflect them, and a
mirror of the graph in this process that computes what the answers must be."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import httpx
import numpy as np
import pytest

from common.feature_tensor import decode
from harness.app import SplitApp, answers_under_load, free_port
from harness.redis_servers import RedisServer, redis_available
from runners.feature.graph import LiveGraph
from runners.feature.sampling import sample_tree
from runners.feature.tree_layout import compact
from services.auth import KeyEntry, generate_key, hash_key, write_entries
from tests.conftest import bentoml_home, private_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SEED = 4242


class Mirror:
    """The graph as this test expects the service to hold it: every accepted batch applied."""

    def __init__(self, home: str, model_tag: str, capacity: int = 40_000) -> None:
        from runners.feature.snapshot import load_snapshot
        from runners.graphsage.model_artifacts import load_artifacts

        with bentoml_home(home):
            self.snapshot = load_snapshot()
            self.artifacts = load_artifacts(model_tag)
        self.graph = LiveGraph(self.snapshot, capacity)
        self.lock = threading.Lock()

    def apply(self, ops: list[dict], sequence: int) -> None:
        with self.lock:
            assert sequence == self.graph.sequence + 1, (sequence, self.graph.sequence)
            self.graph.validate(ops)
            self.graph.apply(ops, sequence)

    def probs(self, node_ids: list[int], seed: int = SEED) -> np.ndarray:
        """What the model answers on the mirrored graph (float32 rows, the full-rows layout)."""
        import onnxruntime as ort

        g = self.graph
        tree = sample_tree(
            g.base.indptr,
            g.base.indices,
            np.array(node_ids),
            self.artifacts.config.fanout,
            seed=seed,
            overlay=g.overlay,
        )
        unique, index = compact(tree)
        sess = ort.InferenceSession(self.artifacts.onnx_path, providers=["CPUExecutionProvider"])
        return sess.run(["probs"], {"features": g.rows(unique), **{f"idx{d}": i for d, i in enumerate(index)}})[0]

    @property
    def dim(self) -> int:
        return self.snapshot.feature_dim


@pytest.fixture(scope="module")
def env(tmp_path_factory, demo_store):
    if not redis_available():
        pytest.skip("redis-server not installed")
    root = tmp_path_factory.mktemp("living")
    home = private_store(demo_store, root)
    keys = {scope: generate_key() for scope in ("predict", "graph", "admin")}
    write_entries(str(root / "keys.json"), [KeyEntry(s, hash_key(k), frozenset({s})) for s, k in keys.items()])
    redis = RedisServer(str(root / "redis")).start()
    settings_env = {
        "GSAGE_AUTH_ENABLED": "1",
        "GSAGE_API_KEYS_FILE": str(root / "keys.json"),
        "GSAGE_MODEL_TAGS": demo_store.v1,
        "GSAGE_REDIS_URL": redis.url,
        "GSAGE_GRAPH_LOG": "file",
        "GSAGE_GRAPH_LOG_DIR": str(root / "log"),
        "GSAGE_FEATURE_TRANSPORT_DTYPE": "float32",
        "GSAGE_FEATURE_WORKERS": "2",
        "GSAGE_GRPC_PORT": str(free_port()),
        "GSAGE_L1_BYTES": str(4 << 20),
        "GSAGE_GRAPH_CAPACITY": "40000",
    }
    yield {
        "home": home,
        "v1": demo_store.v1,
        "keys": keys,
        "settings": settings_env,
        "root": root,
        "redis": redis,
        "demo_store": demo_store,
    }
    redis.stop()


@pytest.fixture(scope="module")
def app(env):
    app = SplitApp(env["home"], env["settings"], log_dir=str(env["root"]))
    app.start()
    yield app
    app.stop()


@pytest.fixture(scope="module")
def mirror(env, app):
    return Mirror(env["home"], env["v1"])


def headers(env, scope: str = "predict") -> dict[str, str]:
    return {"Authorization": f"Bearer {env['keys'][scope]}"}


def update(app, env, mirror, ops: list[dict], scope: str = "graph") -> httpx.Response:
    r = httpx.post(app.gateway.url + "/graph/updates", json={"ops": ops}, headers=headers(env, scope), timeout=30)
    if r.status_code == 200:
        mirror.apply(ops, r.json()["sequence"])
    return r


def predict(app, env, node_ids: list[int], seed: int = SEED, **extra) -> httpx.Response:
    return httpx.post(
        app.gateway.url + "/predict",
        json={"node_ids": node_ids, "seed": seed, **extra},
        headers=headers(env),
        timeout=30,
    )


def probs_of(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array([p["probabilities"] for p in r.json()["predictions"]], dtype=np.float32)


def fresh_id(mirror) -> int:
    with mirror.lock:
        return int(np.flatnonzero(~mirror.graph.present[mirror.snapshot.num_nodes :])[0]) + mirror.snapshot.num_nodes


def test_only_a_graph_key_writes_the_graph(app, env, mirror):
    ops = [{"op": "set_features", "id": 1, "features": [0.5] * mirror.dim}]
    for scope in ("predict", "admin"):
        assert update(app, env, mirror, ops, scope).status_code == 403
    assert httpx.post(app.gateway.url + "/graph/updates", json={"ops": ops}, timeout=10).status_code == 401


def test_a_new_node_with_features_and_edges_is_predicted_as_the_updated_graph_computes(app, env, mirror):
    new = fresh_id(mirror)
    ops = [
        {"op": "add_node", "id": new, "features": [0.25] * mirror.dim, "label": 1},
        {"op": "add_edge", "src": new, "dst": 10},
        {"op": "add_edge", "src": 11, "dst": new},
    ]
    r = update(app, env, mirror, ops)
    assert r.status_code == 200 and r.json()["accepted"] == 3, r.text
    got = probs_of(predict(app, env, [new, 10, 11], min_sequence=r.json()["sequence"]))
    np.testing.assert_allclose(got, mirror.probs([new, 10, 11]), atol=1e-5)


def test_an_added_edge_is_in_the_sampled_neighbourhood_of_a_node_under_the_fanout(app, env, mirror):
    degrees = mirror.snapshot.degrees()
    low = int(np.flatnonzero((degrees > 0) & (degrees < 10))[0])
    new = fresh_id(mirror)
    marker = 42.0
    r = update(
        app,
        env,
        mirror,
        [{"op": "add_node", "id": new, "features": [marker] * mirror.dim}, {"op": "add_edge", "src": low, "dst": new}],
    )
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while True:  # either FeatureRunner worker answers; both apply the update within a moment
        tensor = httpx.post(
            app.feature.url + "/features",
            json={"node_ids": [low], "seed": SEED},
            headers=app.service_headers,
            timeout=10,
        )
        ft = decode(tensor.content)
        rows = np.flatnonzero((ft.features == marker).all(axis=1))
        if rows.size or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rows.size == 1 and rows[0] in ft.index[1].reshape(-1).tolist()  # a hop-1 neighbour of low


def test_set_features_changes_the_node_and_its_neighbours_answers_through_l1_and_redis(app, env, mirror):
    from harness.redis_servers import raw_command

    # A neighbour whose degree is under the first fanout samples every neighbour, v among them.
    fanout = mirror.artifacts.config.fanout[0]
    v, neighbour = next(
        (v, int(u))
        for v in range(20, 400)
        for u in mirror.graph.neighbours(v)
        if mirror.graph.neighbours(int(u)).size <= fanout
    )
    before = probs_of(predict(app, env, [v, neighbour]))
    for _ in range(3):  # warm L1 and Redis with the old rows
        predict(app, env, [v, neighbour])
    # Redis holds v's old row (written back behind the answers) before the update.
    deadline = time.monotonic() + 10
    while f":{v}".encode() not in raw_command(env["redis"].port, "KEYS", f"*:{v}"):
        assert time.monotonic() < deadline, "v's row never reached Redis"
        time.sleep(0.2)
    r = update(app, env, mirror, [{"op": "set_features", "id": v, "features": [3.0] * mirror.dim}])
    assert r.status_code == 200, r.text
    for _ in range(4):  # every worker, every cache level: never the old row again
        after = probs_of(predict(app, env, [v, neighbour], min_sequence=r.json()["sequence"]))
        np.testing.assert_allclose(after, mirror.probs([v, neighbour]), atol=1e-5)
    # Both answers moved: the node's own and its neighbour's, through the new row.
    assert not np.allclose(before[0], after[0], atol=1e-3) and not np.allclose(before[1], after[1], atol=1e-3)


def test_remove_edge_and_remove_node(app, env, mirror):
    v = 30
    u = int(mirror.graph.neighbours(v)[0])
    r = update(app, env, mirror, [{"op": "remove_edge", "src": v, "dst": u}])
    assert r.status_code == 200, r.text
    seq = r.json()["sequence"]
    assert u not in mirror.graph.neighbours(v).tolist() and v not in mirror.graph.neighbours(u).tolist()
    np.testing.assert_allclose(probs_of(predict(app, env, [v, u], min_sequence=seq)), mirror.probs([v, u]), atol=1e-5)
    neighbours = mirror.graph.neighbours(u).tolist()[:3]
    r = update(app, env, mirror, [{"op": "remove_node", "id": u}])
    assert r.status_code == 200, r.text
    gone = predict(app, env, [u], min_sequence=r.json()["sequence"])
    assert gone.status_code == 404 and str(u) in gone.json()["error"], gone.text
    np.testing.assert_allclose(probs_of(predict(app, env, neighbours)), mirror.probs(neighbours), atol=1e-5)


@pytest.mark.parametrize(
    "ops, status, names",
    [
        (
            [{"op": "add_edge", "src": 1, "dst": 2}, {"op": "add_edge", "src": 1, "dst": 10**7}],
            422,
            "op 1 (add_edge): dst",
        ),
        ([{"op": "set_features", "id": 3, "features": [1.0, 2.0]}], 422, "op 0 (set_features): features"),
        (
            [{"op": "add_edge", "src": 1, "dst": 2}, {"op": "add_node", "id": 5, "features": [0.0] * 128}],
            422,
            "op 1 (add_node): id: node 5 exists already",
        ),
        (
            [{"op": "set_features", "id": 3, "features": ["NaN"] * 128}],
            422,
            "op 0 (set_features): features: must be finite numbers, got 'NaN'",
        ),
        ([{"op": "add_edge", "src": 1, "dst": 2}, {"op": "add_edge", "src": 1}], 400, "op 1 (add_edge): dst: missing"),
        ([{"op": "add_edge", "src": 1, "dst": 2}, {"op": "merge", "id": 1}], 400, "op 1 (merge): op: must be one of"),
        ([{"op": "remove_edge", "src": 1, "dst": 1}], 422, "op 0 (remove_edge): dst"),
        # past the capacity (GSAGE_GRAPH_CAPACITY=40000), an unknown id inside the range, Infinity
        ([{"op": "add_node", "id": 40_000, "features": [0.0] * 128}], 422, "op 0 (add_node): id"),
        (
            [{"op": "add_edge", "src": 1, "dst": 2}, {"op": "set_features", "id": 39_999, "features": [0.0] * 128}],
            422,
            "op 1 (set_features): id",
        ),
        (
            [{"op": "add_node", "id": 39_998, "features": ["Infinity"] + [0.0] * 127}],
            422,
            "op 0 (add_node): features: must be finite numbers, got 'Infinity'",
        ),
    ],
)
def test_a_bad_batch_is_refused_whole_naming_the_op(app, env, mirror, ops, status, names):
    head = httpx.get(app.gateway.url + "/graph/status", headers=headers(env), timeout=10).json()["log"]["head"]
    r = update(app, env, mirror, ops)
    assert r.status_code == status and names in r.json()["error"], r.text
    assert r.json()["type"] == "batch_rejected" and r.json()["param"].startswith("ops."), r.text
    after = httpx.get(app.gateway.url + "/graph/status", headers=headers(env), timeout=10).json()["log"]["head"]
    assert after == head  # nothing of the batch reached the log (the mirror applies only accepted batches)


def test_read_your_writes_over_http_and_grpc(app, env, mirror):
    from services.grpc_client import predict as grpc_predict
    from services.grpc_gen.graphsage.v1 import predict_pb2 as pb
    from services.grpc_gen.graphsage.v1 import predict_pb2_grpc as pb_grpc

    target = f"127.0.0.1:{app.env['GSAGE_GRPC_PORT']}"
    new = fresh_id(mirror)
    r = update(
        app,
        env,
        mirror,
        [{"op": "add_node", "id": new, "features": [0.75] * mirror.dim}, {"op": "add_edge", "src": new, "dst": 40}],
    )
    answer = grpc_predict(target, [new], env["keys"]["predict"], seed=SEED, min_sequence=r.json()["sequence"])
    np.testing.assert_allclose([answer["predictions"][0]["probabilities"]], mirror.probs([new]), atol=1e-5)
    # Written over gRPC, read over HTTP.
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GraphSAGEStub(channel)
        op = pb.GraphOp(add_edge=pb.Edge(src=new, dst=41))
        ack = stub.UpdateGraph(
            pb.UpdateGraphRequest(ops=[op]), metadata=[("authorization", f"Bearer {env['keys']['graph']}")]
        )
        mirror.apply([{"op": "add_edge", "src": new, "dst": 41}], ack.sequence)
        with pytest.raises(grpc.RpcError) as denied:
            stub.UpdateGraph(
                pb.UpdateGraphRequest(ops=[op]), metadata=[("authorization", f"Bearer {env['keys']['predict']}")]
            )
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as bad:
            stub.UpdateGraph(
                pb.UpdateGraphRequest(ops=[pb.GraphOp(add_edge=pb.Edge(src=new, dst=10**7))]),
                metadata=[("authorization", f"Bearer {env['keys']['graph']}")],
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "op 0 (add_edge): dst" in bad.value.details()
    got = probs_of(predict(app, env, [new], min_sequence=ack.sequence))
    np.testing.assert_allclose(got, mirror.probs([new]), atol=1e-5)
    far = predict(app, env, [new], min_sequence=ack.sequence + 1000)  # no update was ever answered with it
    assert far.status_code == 422 and f"min_sequence {ack.sequence + 1000} was never issued" in far.json()["error"]


def test_two_feature_runner_workers_converge_to_the_same_state(app, env, mirror):
    status = httpx.get(app.gateway.url + "/graph/status", headers=headers(env), timeout=10).json()
    deadline = time.monotonic() + 10
    while len(status["workers"]) < 2 or any(w["applied"] != status["log"]["head"] for w in status["workers"].values()):
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
        status = httpx.get(app.gateway.url + "/graph/status", headers=headers(env), timeout=10).json()
    assert {w["overlay"]["edges"] for w in status["workers"].values()} == {mirror.graph.stats().edges}
    ids = [10, 11, 20, 40]
    answers = {
        probs_of(
            httpx.post(
                app.gateway.url + "/predict", json={"node_ids": ids, "seed": SEED}, headers=headers(env), timeout=30
            )
        ).tobytes()
        for _ in range(12)
    }
    assert len(answers) == 1  # whichever worker answered


def test_compaction_under_load_fails_no_request_and_changes_no_answer(app, env, mirror):
    """Load runs from before the compaction until every worker has switched to the new snapshot,
    and a moment after: the switches happen under load."""
    import collections

    ids = [10, 11, 20, 40]
    before = probs_of(predict(app, env, ids))

    def status() -> dict:
        return httpx.get(app.gateway.url + "/graph/status", headers=headers(env), timeout=10).json()

    async def scenario():
        outcomes: collections.Counter = collections.Counter()
        stop = asyncio.Event()

        async def load() -> None:
            while not stop.is_set():
                outcomes.update(
                    await answers_under_load(
                        app.gateway.url + "/predict",
                        headers(env),
                        1.0,
                        8,
                        lambda w, n: {"node_ids": [(w * 97 + n) % 4000], "seed": n},
                    )
                )

        task = asyncio.create_task(load())
        await asyncio.sleep(1.0)
        r = await asyncio.to_thread(
            httpx.post, app.gateway.url + "/admin/graph/compact", json={}, headers=headers(env, "admin"), timeout=120
        )
        assert r.status_code == 200, r.text
        compacted = r.json()
        deadline = time.monotonic() + 30
        while True:
            workers = (await asyncio.to_thread(status))["workers"]
            if len(workers) == 2 and all(w["snapshot"] == compacted["snapshot"] for w in workers.values()):
                break
            assert time.monotonic() < deadline, workers
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        stop.set()
        await task
        return compacted, outcomes

    compacted, outcomes = asyncio.run(scenario())
    assert set(outcomes) == {env["v1"]} and sum(outcomes.values()) > 50, outcomes  # every request answered in full
    assert compacted["log_sequence"] >= 1
    with mirror.lock:
        mirror.graph.sequence = compacted["announced_at"]  # the announcement takes a sequence
    np.testing.assert_array_equal(probs_of(predict(app, env, ids)), before)


def test_a_feature_runner_killed_during_10000_updates_keeps_every_acknowledged_one(app, env, mirror):
    """A stream of 10,000 updates (add_node batches) while the FeatureRunner is SIGKILLed and
    restarted: each acknowledged node is there after the restart; nothing half-applied."""
    first = fresh_id(mirror)
    acked: list[int] = []
    stop_at = first + 10_000

    def appended(client: httpx.Client) -> bool:
        """After an unknown outcome: did the batch reach the log? (Once the FeatureRunner answers.)"""
        while True:
            status = client.get(app.gateway.url + "/graph/status", headers=headers(env))
            if status.status_code == 200:
                return status.json()["log"]["head"] > mirror.graph.sequence
            time.sleep(0.1)

    def stream() -> None:
        v = first
        with httpx.Client(timeout=30) as client:
            while v < stop_at:
                ops = [{"op": "add_node", "id": i, "features": [float(i % 7)] * mirror.dim} for i in range(v, v + 50)]
                try:
                    r = client.post(
                        app.gateway.url + "/graph/updates", json={"ops": ops}, headers=headers(env, "graph")
                    )
                    status, sequence = r.status_code, r.json().get("sequence") if r.status_code == 200 else None
                except httpx.HTTPError:
                    status, sequence = None, None
                if status == 200:
                    mirror.apply(ops, sequence)
                elif status in (None, 503) and appended(client):
                    mirror.apply(ops, mirror.graph.sequence + 1)  # it was appended, its answer lost
                elif status in (None, 503):
                    time.sleep(0.05)
                    continue  # not appended: send it again
                else:
                    raise AssertionError(r.text)
                acked.extend(range(v, v + 50))
                v += 50

    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            stream()
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=guarded)
    writer.start()
    deadline = time.monotonic() + 120
    while len(acked) < 3000 and time.monotonic() < deadline:
        time.sleep(0.05)
    app.feature.kill()
    killed_at = len(acked)
    time.sleep(0.5)
    app.feature.start()
    writer.join(timeout=180)
    assert not errors, errors
    assert not writer.is_alive() and len(acked) == 10_000, len(acked)
    assert killed_at < 10_000
    for lo in range(0, len(acked), 1000):
        chunk = acked[lo : lo + 1000]
        r = httpx.post(
            app.gateway.url + "/predict",
            json={"node_ids": chunk, "seed": 1, "min_sequence": mirror.graph.sequence},
            headers=headers(env),
            timeout=60,
        )
        assert r.status_code == 200 and not r.json()["degraded"], r.text[:300]


@pytest.fixture(scope="module")
def redis_log_app(env, tmp_path_factory):
    root = tmp_path_factory.mktemp("living-redis")
    redis = RedisServer(str(root / "redis")).start()
    settings_env = {
        **env["settings"],
        "GSAGE_REDIS_URL": redis.url,
        "GSAGE_GRAPH_LOG": "redis",
        "GSAGE_FEATURE_WORKERS": "1",
        "GSAGE_GRPC_PORT": "0",
    }
    settings_env.pop("GSAGE_GRAPH_LOG_DIR")
    app = SplitApp(private_store(env["demo_store"], root), settings_env, log_dir=str(root))
    try:
        app.start()
        yield app, redis, app.env["BENTOML_HOME"]
    finally:
        app.stop()
        redis.stop()


def test_the_redis_streams_log_serves_updates_and_refuses_them_while_redis_is_down(redis_log_app, env):
    app, redis, home = redis_log_app
    mirror = Mirror(home, env["v1"])
    new = mirror.snapshot.num_nodes + 7
    r = update(
        app,
        env,
        mirror,
        [{"op": "add_node", "id": new, "features": [0.5] * mirror.dim}, {"op": "add_edge", "src": new, "dst": 3}],
    )
    assert r.status_code == 200 and r.json()["sequence"] == 1, r.text
    np.testing.assert_allclose(probs_of(predict(app, env, [new, 3], min_sequence=1)), mirror.probs([new, 3]), atol=1e-5)
    status = httpx.get(app.gateway.url + "/graph/status", headers=headers(env), timeout=10).json()
    assert status["log"] == {"kind": "redis", "head": 1}
    redis.kill()
    try:
        down = update(app, env, mirror, [{"op": "add_edge", "src": new, "dst": 4}])
        assert (
            down.status_code == 503 and down.headers["retry-after"] and "nothing was accepted" in down.json()["error"]
        )
        served = predict(app, env, [new, 3])  # serving goes on with what was applied
        np.testing.assert_allclose(probs_of(served), mirror.probs([new, 3]), atol=1e-5)
    finally:
        redis.start()
