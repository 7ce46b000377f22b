"""The gateway's gRPC front end (services.grpc_server) against a fake of the gateway's core, and
against the real core over fake runners: no BentoML service is constructed.

The aio server runs on its own event loop in a background thread; the tests call it with the
blocking grpc client (as services.grpc_client does).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import subprocess
import sys
import threading
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from common.errors import ApiError
from common.settings import load_settings, settings
from services import grpc_codegen, ratelimit
from services.access import GatewayAccess
from services.auth import ApiKeyAuth, KeyEntry, generate_key, hash_key, write_entries
from services.grpc_server import SERVICE_NAME, pb, pb_grpc, start_grpc_server, status_for
from services.protocol import NodePrediction, PredictRequest, PredictResponse

ERROR_BASE = 9_000_000  # node id ERROR_BASE + s: the fake core raises ApiError(s)


class FakeCore:
    """``predict`` computes a fixed-shape answer from the request (and records it)."""

    def __init__(self) -> None:
        self.requests: list[PredictRequest] = []

    async def predict(self, req: PredictRequest) -> PredictResponse:
        self.requests.append(req)
        for node in req.node_ids:
            if ERROR_BASE <= node < ERROR_BASE + 1000:
                status = node - ERROR_BASE
                raise ApiError(status, f"fake error {status}", {"Retry-After": "3"} if status in (429, 503) else None)
        if req.routing_key == "degrade":
            return PredictResponse(
                model=f"{req.model}:v1",
                precision="none",
                degraded=True,
                degraded_reason="feature runner unavailable: timeout",
                predictions=[NodePrediction(node_id=n, stale=n == 5) for n in req.node_ids],
            )
        preds = []
        for n in req.node_ids:
            probs = [0.25, 0.75] if n % 2 else [0.5, 0.5]
            multilabel = req.model == "tags"
            preds.append(
                NodePrediction(
                    node_id=n,
                    label=None if multilabel else n % 2,
                    labels=[1] if multilabel else None,
                    score=probs[1],
                    probabilities=probs,
                    embedding=[float(n), -1.5] if req.embedding else None,
                )
            )
        return PredictResponse(model=f"{req.model}:{req.version or 'v1'}", precision="int8", predictions=preds)

    async def models(self) -> dict[str, Any]:
        return {
            "routing": {"default_model": "graphsage", "models": {}},
            "model_runner": {"loaded": [{"tag": "graphsage:v1"}, {"tag": "graphsage:v2"}]},
            "feature_runner": {"error": "unavailable: ConnectError"},
        }


def access_from_settings() -> GatewayAccess:
    """What the gateway builds from its settings: the key file's auth, the configured rate limit."""
    cfg = load_settings()
    return GatewayAccess(
        lambda: (ApiKeyAuth.from_settings(cfg.access), ratelimit.build_rate_limiter(cfg.access, cfg.redis))
    )


class ServerThread:
    def __init__(self, core: Any, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        limits = {
            "host": "127.0.0.1",
            "max_receive_bytes": load_settings().max_body_bytes,
            "max_concurrent_rpcs": 64,
            **kw,
        }
        port = limits.pop("port", 0)
        self.server = self.call(start_grpc_server(core, access_from_settings(), port, **limits))
        self.port = self.server.bound_port if self.server is not None else None
        self.target = f"127.0.0.1:{self.port}"

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        if self.server is not None:
            self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def env(monkeypatch):
    """Settings from a clean environment, re-read per test and after it."""
    for name in ("GSAGE_AUTH_ENABLED", "GSAGE_API_KEYS_FILE", "GSAGE_RATE_LIMIT_PER_S", "GSAGE_RATE_LIMIT_BURST"):
        monkeypatch.delenv(name, raising=False)
    settings.cache_clear()
    yield monkeypatch
    settings.cache_clear()


@pytest.fixture
def serve(env):
    started: list[ServerThread] = []

    def start(core: Any = None, **kw: Any) -> ServerThread:
        settings.cache_clear()
        st = ServerThread(core or FakeCore(), **kw)
        started.append(st)
        return st

    yield start
    for st in started:
        st.close()


@pytest.fixture
def channel_to():
    channels: list[grpc.Channel] = []

    def open_(st: ServerThread) -> grpc.Channel:
        ch = grpc.insecure_channel(st.target)
        channels.append(ch)
        return ch

    yield open_
    for ch in channels:
        ch.close()


def rpc_error(fn: Any, *args: Any, **kw: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, timeout=5, **kw)
    return info.value


# --- Predict round trip ---------------------------------------------------------------------------


def test_predict_round_trip_field_by_field(serve, channel_to):
    gw = FakeCore()
    st = serve(gw)
    stub = pb_grpc.GraphSAGEStub(channel_to(st))
    reply = stub.Predict(pb.PredictRequest(node_ids=[3, 4, 3], embedding=True), timeout=5)
    assert reply.model == "graphsage:v1" and reply.precision == "int8"
    assert reply.degraded is False and reply.degraded_reason == ""
    assert [p.node_id for p in reply.predictions] == [3, 4, 3]
    odd, even = reply.predictions[0], reply.predictions[1]
    assert odd.HasField("label") and odd.label == 1 and even.label == 0
    assert odd.HasField("score") and odd.score == 0.75
    assert list(odd.probabilities) == [0.25, 0.75] and list(even.probabilities) == [0.5, 0.5]
    assert list(odd.labels) == []
    assert list(odd.embedding) == [3.0, -1.5]
    assert odd.stale is False
    req = gw.requests[-1]
    assert req.node_ids == [3, 4, 3] and req.model == "graphsage" and req.embedding is True


def test_optional_fields_absent_vs_present(serve, channel_to):
    gw = FakeCore()
    st = serve(gw)
    stub = pb_grpc.GraphSAGEStub(channel_to(st))
    stub.Predict(pb.PredictRequest(node_ids=[1]), timeout=5)
    absent = gw.requests[-1]
    assert (absent.version, absent.routing_key, absent.seed, absent.fanout) == (None, None, None, None)
    assert absent.model == "graphsage" and absent.embedding is False

    reply = stub.Predict(
        pb.PredictRequest(node_ids=[1], model="m", version="v7", fanout=[5, 2], routing_key="", seed=0), timeout=5
    )
    present = gw.requests[-1]
    # seed 0 and routing key "" are present values, not "absent".
    assert (present.model, present.version, present.routing_key, present.seed, present.fanout) == (
        "m",
        "v7",
        "",
        0,
        [5, 2],
    )
    assert reply.model == "m:v7"
    assert list(reply.predictions[0].embedding) == []  # not asked for

    # Multilabel: no label, a list of labels; degraded: no label, no score, stale flag, reason.
    ml = stub.Predict(pb.PredictRequest(node_ids=[2], model="tags"), timeout=5).predictions[0]
    assert not ml.HasField("label") and list(ml.labels) == [1] and ml.HasField("score")
    deg = stub.Predict(pb.PredictRequest(node_ids=[4, 5], routing_key="degrade"), timeout=5)
    assert deg.degraded and deg.degraded_reason.startswith("feature runner unavailable") and deg.precision == "none"
    assert [(p.HasField("label"), p.HasField("score"), p.stale) for p in deg.predictions] == [
        (False, False, False),
        (False, False, True),
    ]


@pytest.mark.parametrize(
    "request_kw, fragment",
    [
        ({"node_ids": []}, "node_ids"),
        ({"node_ids": [1, -2]}, "node_ids.1"),
        ({"node_ids": [1], "seed": 2**63}, "seed"),
        ({"node_ids": [1], "version": ""}, "version"),
        ({"node_ids": [1], "model": "bad name!"}, "model"),
        ({"node_ids": [1], "fanout": [0]}, "fanout"),
    ],
)
def test_invalid_fields_are_invalid_argument(serve, channel_to, request_kw, fragment):
    gw = FakeCore()
    st = serve(gw)
    err = rpc_error(pb_grpc.GraphSAGEStub(channel_to(st)).Predict, pb.PredictRequest(**request_kw))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("invalid request: ") and fragment in err.details()
    assert gw.requests == []  # never reached the core


@pytest.mark.parametrize(
    "status, code",
    [
        (400, grpc.StatusCode.INVALID_ARGUMENT),
        (422, grpc.StatusCode.INVALID_ARGUMENT),
        (413, grpc.StatusCode.INVALID_ARGUMENT),
        (404, grpc.StatusCode.NOT_FOUND),
        (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (503, grpc.StatusCode.UNAVAILABLE),
        (502, grpc.StatusCode.UNAVAILABLE),
        (504, grpc.StatusCode.DEADLINE_EXCEEDED),
        (500, grpc.StatusCode.INTERNAL),
    ],
)
def test_api_error_mapping(serve, channel_to, status, code):
    st = serve()
    err = rpc_error(pb_grpc.GraphSAGEStub(channel_to(st)).Predict, pb.PredictRequest(node_ids=[ERROR_BASE + status]))
    assert err.code() == code
    assert err.details() == f"fake error {status}"
    trailers = dict(err.trailing_metadata() or ())
    if status in (429, 503):
        assert trailers["retry-after"] == "3"
    if status == 502:  # every UNAVAILABLE says when to retry, as every HTTP 503 does
        assert trailers["retry-after"] == "1"
    assert status_for(status) == code


def test_unexpected_exception_is_internal_without_details(serve, channel_to):
    class Broken(FakeCore):
        async def predict(self, req):
            raise KeyError("secret internals")

    st = serve(Broken())
    err = rpc_error(pb_grpc.GraphSAGEStub(channel_to(st)).Predict, pb.PredictRequest(node_ids=[1]))
    assert err.code() == grpc.StatusCode.INTERNAL and "secret" not in err.details()


def test_malformed_bytes_are_invalid_argument(serve, channel_to):
    st = serve()
    raw = channel_to(st).unary_unary(f"/{SERVICE_NAME}/Predict", request_serializer=None, response_deserializer=None)
    for garbage in (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\x0a\x05\x01", b"\x08"):
        err = rpc_error(raw, garbage)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (garbage, err)
    rng = random.Random(1234)
    for _ in range(25):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        try:
            raw(data, timeout=5)  # by chance a valid request: fine
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (data, err)
    # Bytes that decode to an empty request: a validation error, also INVALID_ARGUMENT.
    assert rpc_error(raw, b"").code() == grpc.StatusCode.INVALID_ARGUMENT


def test_oversized_message_rejected_by_grpc(serve, channel_to):
    gw = FakeCore()
    st = serve(gw)
    raw = channel_to(st).unary_unary(f"/{SERVICE_NAME}/Predict", request_serializer=None, response_deserializer=None)
    limit = load_settings({}).max_body_bytes
    big = pb.PredictRequest(node_ids=[2**40] * (limit // 4)).SerializeToString()  # 6-byte varints
    assert len(big) > limit
    assert rpc_error(raw, big).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert gw.requests == []


# --- auth and rate limits ---------------------------------------------------------------------


@pytest.fixture
def keys(env, tmp_path):
    predict_key, admin_key = generate_key(), generate_key()
    path = str(tmp_path / "keys.json")
    write_entries(
        path,
        [
            KeyEntry("client", hash_key(predict_key), frozenset({"predict"})),
            KeyEntry("ops", hash_key(admin_key), frozenset({"admin"})),
        ],
    )
    env.setenv("GSAGE_AUTH_ENABLED", "1")
    env.setenv("GSAGE_API_KEYS_FILE", path)
    return {"predict": predict_key, "admin_only": admin_key}


def test_auth(serve, channel_to, keys):
    st = serve()
    stub = pb_grpc.GraphSAGEStub(channel_to(st))
    req = pb.PredictRequest(node_ids=[1])
    err = rpc_error(stub.Predict, req)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert dict(err.trailing_metadata())["www-authenticate"] == "Bearer"
    assert rpc_error(stub.Predict, req, metadata=[("x-api-key", "gsk_wrong")]).code() == grpc.StatusCode.UNAUTHENTICATED
    assert (
        rpc_error(stub.Predict, req, metadata=[("authorization", "Basic abc")]).code()
        == grpc.StatusCode.UNAUTHENTICATED
    )
    err = rpc_error(stub.Predict, req, metadata=[("authorization", f"Bearer {keys['admin_only']}")])
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "predict" in err.details()
    assert keys["admin_only"] not in err.details()
    assert (
        stub.Predict(req, metadata=[("authorization", f"Bearer {keys['predict']}")], timeout=5).model == "graphsage:v1"
    )
    assert stub.Predict(req, metadata=[("x-api-key", keys["predict"])], timeout=5).model == "graphsage:v1"
    # A credential sent twice is refused whatever the order (a wrong one before the valid one included).
    for name, good, bad in (
        ("authorization", f"Bearer {keys['predict']}", "Bearer gsk_wrong"),
        ("x-api-key", keys["predict"], "gsk_wrong"),
    ):
        for pair in ((bad, good), (good, bad), (good, good)):
            err = rpc_error(stub.Predict, req, metadata=[(name, pair[0]), (name, pair[1])])
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "sent 2 times" in err.details(), name
    # ListModels needs the same scope.
    assert rpc_error(stub.ListModels, pb.ListModelsRequest()).code() == grpc.StatusCode.UNAUTHENTICATED
    assert stub.ListModels(pb.ListModelsRequest(), metadata=[("x-api-key", keys["predict"])], timeout=5).loaded_models


def test_auth_is_checked_before_validation(serve, channel_to, keys):
    st = serve()
    err = rpc_error(pb_grpc.GraphSAGEStub(channel_to(st)).Predict, pb.PredictRequest(node_ids=[]))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED


def test_rate_limit(serve, channel_to, keys, env):
    env.setenv("GSAGE_RATE_LIMIT_PER_S", "0.5")
    env.setenv("GSAGE_RATE_LIMIT_BURST", "2")
    # The limiter the settings build, on a clock that stands still: however long the calls take,
    # no token comes back between them and the wait for the next one is exactly 1 / 0.5 s.
    env.setattr(ratelimit, "LocalRateLimiter", functools.partial(ratelimit.LocalRateLimiter, clock=lambda: 0.0))
    st = serve()
    stub = pb_grpc.GraphSAGEStub(channel_to(st))
    md = [("x-api-key", keys["predict"])]
    for _ in range(2):
        stub.Predict(pb.PredictRequest(node_ids=[1]), metadata=md, timeout=5)
    err = rpc_error(stub.Predict, pb.PredictRequest(node_ids=[1]), metadata=md)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details() == "rate limit exceeded"
    assert dict(err.trailing_metadata())["retry-after"] == "2"


# --- ListModels, health, reflection, ports ----------------------------------------------------


def test_list_models(serve, channel_to):
    st = serve()
    reply = pb_grpc.GraphSAGEStub(channel_to(st)).ListModels(pb.ListModelsRequest(), timeout=5)
    assert json.loads(reply.routing_json) == {"default_model": "graphsage", "models": {}}
    assert list(reply.loaded_models) == ["graphsage:v1", "graphsage:v2"]
    assert json.loads(reply.details_json)["feature_runner"] == {"error": "unavailable: ConnectError"}


def test_health_serving(serve, channel_to):
    st = serve()
    stub = health_pb2_grpc.HealthStub(channel_to(st))
    for name in ("", SERVICE_NAME):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    err = rpc_error(stub.Check, health_pb2.HealthCheckRequest(service="nope"))
    assert err.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_service(serve, channel_to):
    st = serve()
    stub = reflection_pb2_grpc.ServerReflectionStub(channel_to(st))
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME),
    ]
    listed, files = list(stub.ServerReflectionInfo(iter(requests), timeout=5))
    names = {s.name for s in listed.list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FileDescriptorProto.FromString(files.file_descriptor_response.file_descriptor_proto[0])
    assert fd.name == "graphsage/v1/predict.proto" and fd.package == "graphsage.v1"


def test_port_in_use_returns_none(serve):
    first = serve()
    second = serve(port=first.port)
    assert second.server is None
    assert first.server is not None


# --- client helper, codegen, imports ------------------------------------------------------------


def test_client_helper_and_cli(serve, capsys, keys):
    from services import grpc_client

    st = serve()
    out = grpc_client.predict(st.target, [1, 2], api_key=keys["predict"], seed=9, embedding=True)
    assert out["model"] == "graphsage:v1" and out["degraded"] is False
    assert out["predictions"][0] == {
        "node_id": 1,
        "label": 1,
        "labels": [],
        "score": 0.75,
        "probabilities": [0.25, 0.75],
        "embedding": [1.0, -1.5],
        "stale": False,
    }
    assert grpc_client.main(["--target", st.target, "--node-ids", "1,2,3", "--api-key", keys["predict"]]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [p["node_id"] for p in printed["predictions"]] == [1, 2, 3]
    assert grpc_client.main(["--target", st.target, "--node-ids", "1"]) == 1
    assert json.loads(capsys.readouterr().err)["code"] == "UNAUTHENTICATED"
    assert grpc_client.list_models(st.target, keys["predict"])["loaded_models"] == ["graphsage:v1", "graphsage:v2"]


def test_codegen_writes_relative_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(grpc_codegen, "GEN_DIR", tmp_path / "grpc_gen")
    assert grpc_codegen.stale_reasons()
    grpc_codegen.ensure_stubs()
    assert grpc_codegen.stale_reasons() == []
    text = (tmp_path / "grpc_gen/graphsage/v1/predict_pb2_grpc.py").read_text()
    assert "from . import predict_pb2 as" in text and "from graphsage" not in text
    for pkg in ("", "graphsage", "graphsage/v1"):
        assert (tmp_path / "grpc_gen" / pkg / "__init__.py").exists()


def test_grpc_server_does_not_import_torch():
    code = "import sys, services.grpc_server, services.grpc_client; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- the real core over fake runners ---------------------------------------------------------------


class FakeFeaturePipeline:
    """The FeatureRunner's endpoints as its core answers them (``common.feature_runner_api``)."""

    def __init__(self) -> None:
        self.ops: list[dict] = []

    async def predict(self, batch):
        import numpy as np

        from common import wire
        from common.feature_runner_api import NotAppliedYet

        if batch.min_sequence > len(self.ops):
            raise NotAppliedYet(f"graph update {batch.min_sequence} is not applied here yet")
        probs = np.stack([np.full(batch.node_ids.size, 0.25), np.full(batch.node_ids.size, 0.75)], 1)
        return wire.Packed.of(
            {"probs": probs.astype(np.float32)}, {"model": batch.model, "precision": "fp32", "task": "multiclass"}
        )

    async def graph_update(self, ops):
        from common.graph_ops import GraphUpdateAck

        self.ops.extend(ops)
        return GraphUpdateAck(accepted=len(ops), sequence=len(self.ops))

    async def info(self):
        return {"graph_snapshot": "graph-snapshot:test"}


def real_core():
    """``services.core.GatewayCore`` as the gateway assembles it, its runners in this process."""
    from common.breaker import CircuitBreaker
    from common.feature_runner_api import FeatureRunnerApi
    from common.model_runner_api import ModelRunnerApi
    from common.remote import LocalTransport
    from services.admin import Admin
    from services.core import GatewayCore
    from services.graph_updates import GraphUpdates
    from services.prediction import PredictionCore
    from services.routing import RoutingTable
    from services.shadow import ShadowCanary

    feature = FeatureRunnerApi(LocalTransport("FeatureRunner", FakeFeaturePipeline()))
    model = ModelRunnerApi(LocalTransport("GraphSAGERunner", object()))
    routing = RoutingTable.in_memory("graphsage:v1")
    prediction = PredictionCore(routing, feature.predict, CircuitBreaker("f"), CircuitBreaker("m"), timeout_s=5.0)
    admin = Admin(
        routing,
        ShadowCanary(routing.shadow_for, feature.predict),
        feature,
        model,
        compaction_timeout_s=5.0,
        describe_timeout_s=5.0,
    )
    return GatewayCore(prediction, GraphUpdates(feature, 5.0, 5.0), admin, max_nodes_per_request=8, explain_max_nodes=2)


def test_grpc_over_the_real_core(serve, channel_to):
    st = serve(real_core())
    stub = pb_grpc.GraphSAGEStub(channel_to(st))
    answer = stub.Predict(pb.PredictRequest(node_ids=[3, 4], seed=1), timeout=5)
    assert answer.model == "graphsage:v1" and [p.label for p in answer.predictions] == [1, 1]
    err = rpc_error(stub.Predict, pb.PredictRequest(node_ids=list(range(9))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "GSAGE_MAX_NODES_PER_REQUEST" in err.details()
    assert dict(err.trailing_metadata())["error-param"] == "node_ids"
    # Read-your-writes through the core: the fake runner's refusal, as it raised it.
    err = rpc_error(stub.Predict, pb.PredictRequest(node_ids=[3], min_sequence=1))
    trailers = dict(err.trailing_metadata())
    assert err.code() == grpc.StatusCode.UNAVAILABLE and trailers["error-type"] == "not_applied_yet"
    assert trailers["retry-after"] == "1"
    ack = stub.UpdateGraph(pb.UpdateGraphRequest(ops=[pb.GraphOp(add_edge=pb.Edge(src=1, dst=2))]), timeout=5)
    assert (ack.accepted, ack.sequence) == (1, 1)
    assert stub.Predict(pb.PredictRequest(node_ids=[3], min_sequence=1), timeout=5).predictions[0].label == 1
    err = rpc_error(stub.UpdateGraph, pb.UpdateGraphRequest(ops=[pb.GraphOp()]))  # an op of no kind
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and dict(err.trailing_metadata())["error-param"] == "ops.0.op"
