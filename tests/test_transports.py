"""common.remote's transports against a real socket on loopback: what a call sends (the token, the
endpoint's media type, never pickle), how an answer comes back (the same ApiError, kind and
headers included), and which failures are retried."""

from __future__ import annotations

import asyncio
import json

import pytest

from common.errors import ApiError
from common.feature_runner_api import ModelRunnerUnavailable
from common.model_runner_api import INFER, LOAD, MODELS, LoadRequest, ModelRunnerApi
from common.remote import HttpTransport, LocalTransport, ServiceUnavailable
from common.service_auth import ServiceTokens
from harness.ports import free_port

TOKEN = "t" * 24
INFO = {
    "tag": "graphsage:v1",
    "backend": "onnx-cpu",
    "precision": "fp32",
    "aggregator": "mean",
    "fanout": [2],
    "feature_dim": 4,
    "num_classes": 2,
    "task": "multiclass",
    "input_layouts": ["levels-v1"],
    "loaded_at": 1.5,
}


class FakeRunner:
    """An HTTP/1.1 server that answers each request with the next scripted reply: a
    ``(status, body[, headers])`` tuple, or ``None`` to drop the connection without answering."""

    def __init__(self, replies: list[tuple | None]) -> None:
        self.replies = list(replies)
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.port = free_port()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            line, *fields = head.decode("latin-1").split("\r\n")
            headers = {k.lower(): v for k, v in (f.split(": ", 1) for f in fields if f)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append((line, headers, body))
            reply = self.replies.pop(0)
            if reply is None:
                writer.close()
                return
            status, payload, *extra = reply
            more = "".join(f"{k}: {v}\r\n" for k, v in (extra[0] if extra else {}).items()).encode()
            writer.write(
                b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n%s"
                % (status, more, len(payload), payload)
            )
            await writer.drain()

    async def run(self, work):
        server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        transport = HttpTransport(
            "FakeRunner", f"http://127.0.0.1:{self.port}", ServiceTokens([TOKEN]), retry_pauses_s=(0.0, 0.0)
        )
        try:
            return await work(ModelRunnerApi(transport))
        finally:
            await transport.close()
            server.close()


def test_calls_carry_the_token_and_their_endpoints_media_type_never_pickle():
    fake = FakeRunner(
        [(200, json.dumps(INFO).encode()), (200, json.dumps({"loaded": [], "batches": {}, "worker_pid": 1}).encode())]
    )

    async def work(client):
        assert (await client.load("graphsage:v1")).tag == "graphsage:v1"
        assert (await client.models()).worker_pid == 1

    asyncio.run(fake.run(work))
    (line1, h1, b1), (line2, h2, b2) = fake.requests
    assert line1.startswith("POST /load ") and h1["content-type"] == "application/json"
    assert json.loads(b1) == {"tag": "graphsage:v1"}
    assert line2.startswith("POST /models ") and b2 == b"{}"
    assert h1["authorization"] == h2["authorization"] == f"Bearer {TOKEN}"
    assert INFER.takes.media_type == "application/octet-stream"


@pytest.mark.parametrize(
    "status, kind, cls",
    [
        (400, "invalid_request", ApiError),
        (404, "unknown_version", ApiError),
        (422, "incompatible_input", ApiError),
        (503, "model_runner_unavailable", ModelRunnerUnavailable),
        (500, "internal", ApiError),
    ],
)
def test_an_error_comes_back_as_the_same_error_and_is_not_retried(status, kind, cls):
    """The runner's ErrorBody and its Retry-After (a value no default has) cross the hop."""
    body = {"error": "the reason", "status": status, "type": kind, "param": "tag"}
    fake = FakeRunner([(status, json.dumps(body).encode(), {"Retry-After": "7", "X-Other": "no"})])

    async def work(client):
        with pytest.raises(ApiError) as info:
            await client.load("graphsage:v1")
        return info.value

    exc = asyncio.run(fake.run(work))
    assert isinstance(exc, cls) and (exc.status, exc.type, exc.message, exc.param) == (
        status,
        kind,
        "the reason",
        "tag",
    )
    assert exc.headers == {"Retry-After": "7"} and len(fake.requests) == 1


def test_an_answer_that_is_no_error_body_keeps_its_status_and_text():
    fake = FakeRunner([(502, b"Bad Gateway from a proxy")])

    async def work(client):
        with pytest.raises(ApiError) as info:
            await client.load("graphsage:v1")
        return info.value

    exc = asyncio.run(fake.run(work))
    assert (exc.status, exc.type, exc.message) == (502, "bad_gateway", "Bad Gateway from a proxy")


def test_a_refused_token_is_this_services_fault_not_the_clients():
    fake = FakeRunner([(401, b'{"error": "service token not accepted", "status": 401, "type": "unauthenticated"}')])

    async def work(client):
        with pytest.raises(ServiceUnavailable) as info:
            await client.models()
        return info.value

    exc = asyncio.run(fake.run(work))
    assert exc.status == 503 and "GSAGE_SERVICE_TOKENS" in exc.message


def test_a_lost_connection_is_retried_until_the_pauses_run_out():
    report = json.dumps({"loaded": [], "batches": {}, "worker_pid": 3}).encode()
    fake = FakeRunner([None, None, (200, report)])

    async def models(client):
        return await client.models()

    assert asyncio.run(fake.run(models)).worker_pid == 3
    assert len(fake.requests) == 3

    fake = FakeRunner([None, None, None])

    async def work(client):
        with pytest.raises(ServiceUnavailable) as info:
            await client.models()
        return info.value

    assert asyncio.run(fake.run(work)).sent is True  # it may have reached the runner
    assert len(fake.requests) == 3  # two retries, then the error


def test_a_refused_connection_is_not_retried_and_says_nothing_was_sent():
    transport = HttpTransport("Down", f"http://127.0.0.1:{free_port()}", ServiceTokens([TOKEN]), retry_pauses_s=(0.0,))

    async def work():
        try:
            with pytest.raises(ServiceUnavailable) as info:
                await transport.call(MODELS, None)
            return info.value
        finally:
            await transport.close()

    exc = asyncio.run(work())
    assert exc.sent is False and "unreachable" in exc.message


def test_a_local_core_answers_as_a_remote_one():
    class Core:
        async def load(self, request: LoadRequest):
            if request.tag == "missing":
                raise ApiError(404, "no such version", type="unknown_version")
            return request.tag

    local = LocalTransport("Local", Core())
    assert asyncio.run(local.call(LOAD, LoadRequest(tag="v1"))) == "v1"
    with pytest.raises(ApiError) as info:
        asyncio.run(local.call(LOAD, LoadRequest(tag="missing")))
    assert info.value.type == "unknown_version"
