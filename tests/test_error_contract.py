"""One error contract across hops: what a runner raised reaches the gateway's clients as it was
raised, over HTTP and over gRPC: its kind (``type``), status, message, ``param`` and a
``Retry-After`` of a value no default has.

The gateway runs as the release runs it (``start-http-server --service-name Gateway`` with its
dependencies given by ``--depends``); the FeatureRunner behind it is a fake speaking its protocol
(``common.feature_runner_api``) over HTTP, which answers each node id with a scripted error.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import httpx
import pytest

from common.errors import ApiError, ErrorBody
from common.feature_runner_api import decode_predict
from harness.app import Service, free_port

pytestmark = [pytest.mark.integration]

# node id -> what the fake FeatureRunner answers a prediction of it with
SCRIPTED = {
    1: ApiError(
        503,
        "graph update 5 is not applied here yet (applied: 3); retry shortly",
        {"Retry-After": "7"},
        type="not_applied_yet",
    ),
    2: ApiError(404, "model 'graphsage:gone' is not in the model store", type="unknown_version", param="model"),
    3: ApiError(503, "model runner unavailable: overloaded", {"Retry-After": "4"}, type="model_runner_unavailable"),
    4: ApiError(422, "op 0 (add_edge): dst: node 9 is not in the graph", type="batch_rejected", param="ops.0.dst"),
}


class FakeFeatureRunner(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/readyz" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path == "/predict":
            node = int(decode_predict(body).node_ids[0])
            self._answer(SCRIPTED[node])
        else:
            self._answer(SCRIPTED[4])

    def _answer(self, exc: ApiError) -> None:
        self.send_response(exc.status)
        for name, value in exc.raw_headers():
            self.send_header(name.decode(), value.decode())
        self.end_headers()
        self.wfile.write(exc.body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def gateway(tmp_path_factory) -> Iterator[tuple[str, int]]:
    root = tmp_path_factory.mktemp("contract")
    os.makedirs(root / "bentoml" / "models")
    fake = ThreadingHTTPServer(("127.0.0.1", 0), FakeFeatureRunner)
    thread = threading.Thread(target=fake.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{fake.server_address[1]}"
    grpc_port = free_port()
    env = {
        **os.environ,
        "BENTOML_HOME": str(root / "bentoml"),
        "GSAGE_GRPC_PORT": str(grpc_port),
        "GSAGE_BREAKER_FAILURES": "100",
    }
    service = Service(
        "Gateway", free_port(), env, depends={"FeatureRunner": url, "GraphSAGERunner": url}, log_dir=str(root)
    )
    try:
        service.start()
        yield service.url, grpc_port
    finally:
        service.stop()
        fake.shutdown()


def test_a_runners_error_reaches_an_http_client_as_raised(gateway):
    url, _ = gateway
    for node, exc in SCRIPTED.items():
        if node == 4:
            r = httpx.post(url + "/graph/updates", json={"ops": [{"op": "add_edge", "src": 1, "dst": 9}]}, timeout=10)
        else:
            r = httpx.post(url + "/predict", json={"node_ids": [node], "min_sequence": 5}, timeout=10)
        assert r.status_code == exc.status, r.text
        assert ErrorBody.model_validate_json(r.content) == exc.to_body()
        assert r.headers.get("retry-after") == exc.headers.get("Retry-After"), (node, dict(r.headers))


def test_a_runners_error_reaches_a_grpc_client_as_raised(gateway):
    from services.grpc_server import pb, pb_grpc, status_for

    _, port = gateway
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GraphSAGEStub(channel)
        for node, exc in SCRIPTED.items():
            with pytest.raises(grpc.RpcError) as info:
                if node == 4:
                    op = pb.GraphOp(add_edge=pb.Edge(src=1, dst=9))
                    stub.UpdateGraph(pb.UpdateGraphRequest(ops=[op]), timeout=10)
                else:
                    stub.Predict(pb.PredictRequest(node_ids=[node], min_sequence=5), timeout=10)
            err = info.value
            trailers = dict(err.trailing_metadata() or ())
            assert (err.code(), err.details()) == (status_for(exc.status), exc.message)
            assert trailers["error-type"] == exc.type and trailers.get("error-param") == exc.param
            if "Retry-After" in exc.headers:
                assert trailers["retry-after"] == exc.headers["Retry-After"], (node, trailers)
