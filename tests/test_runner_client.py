"""common.remote.RunnerClient against a real socket on loopback: what it sends (the token, the
media types, never pickle), what each answer means, and which failures it retries."""

from __future__ import annotations

import asyncio
import json

import pytest

from common.remote import LocalRunner, RunnerClient, RunnerFailed, RunnerRejected, UpstreamFailed
from common.errors import ApiError
from common.service_auth import ServiceTokens
from harness.ports import free_port

TOKEN = "t" * 24


class FakeRunner:
    """An HTTP/1.1 server that answers each request with the next scripted reply: a
    ``(status, body)`` pair, or ``None`` to drop the connection without answering."""

    def __init__(self, replies: list[tuple[int, bytes] | None]) -> None:
        self.replies = list(replies)
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.port = free_port()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            line, *fields = head.decode("latin-1").split("\r\n")
            headers = dict(f.split(": ", 1) for f in fields if f)
            headers = {k.lower(): v for k, v in headers.items()}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append((line, headers, body))
            reply = self.replies.pop(0)
            if reply is None:
                writer.close()
                return
            status, payload = reply
            writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (status, len(payload), payload))
            await writer.drain()

    async def run(self, work):
        server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        client = RunnerClient("FakeRunner", f"http://127.0.0.1:{self.port}", ServiceTokens([TOKEN]),
                              retry_pauses_s=(0.0, 0.0))
        try:
            return await work(client)
        finally:
            await client.close()
            server.close()


def test_calls_carry_the_token_and_a_json_or_binary_body_never_pickle():
    fake = FakeRunner([(200, b'{"tag": "graphsage:v1"}'), (200, b"\x00\x01raw")])

    async def work(client):
        assert await client.call_json("load", {"tag": "graphsage:v1"}) == {"tag": "graphsage:v1"}
        assert await client.call_bytes("infer", b"\x00binary") == b"\x00\x01raw"

    asyncio.run(fake.run(work))
    (line1, h1, b1), (line2, h2, b2) = fake.requests
    assert line1.startswith("POST /load ") and h1["content-type"] == "application/json"
    assert json.loads(b1) == {"tag": "graphsage:v1"}
    assert line2.startswith("POST /infer ") and h2["content-type"] == "application/octet-stream" and b2 == b"\x00binary"
    assert h1["authorization"] == h2["authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize("status, raised", [(400, RunnerRejected), (404, RunnerRejected), (422, RunnerRejected),
                                            (502, UpstreamFailed), (500, RunnerFailed), (503, RunnerFailed)])
def test_each_answer_status_means_one_thing_and_is_not_retried(status, raised):
    fake = FakeRunner([(status, json.dumps({"error": "the reason", "status": status}).encode())])

    async def work(client):
        with pytest.raises(raised) as info:
            await client.call_bytes("predict", b"x")
        return info.value

    exc = asyncio.run(fake.run(work))
    assert "the reason" in str(exc) and len(fake.requests) == 1
    if raised is RunnerRejected:
        assert exc.status == status


def test_bentomls_own_error_bodies_are_read_too():
    detail = {"error": "1 validation error for Input",
              "detail": [{"type": "missing", "loc": ["tag"], "msg": "Field required"}]}
    fake = FakeRunner([(400, json.dumps(detail).encode())])

    async def work(client):
        with pytest.raises(RunnerRejected) as info:
            await client.call_json("load", {})
        return info.value

    assert str(asyncio.run(fake.run(work))) == "invalid request: tag: Field required"


def test_a_lost_connection_is_retried_until_the_pauses_run_out():
    fake = FakeRunner([None, None, (200, b"{}")])
    assert asyncio.run(fake.run(lambda client: client.call_json("models"))) == {}
    assert len(fake.requests) == 3

    import aiohttp

    fake = FakeRunner([None, None, None])

    async def work(client):
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.call_json("models")

    asyncio.run(fake.run(work))
    assert len(fake.requests) == 3  # two retries, then the error


def test_a_refused_connection_is_not_retried():
    import aiohttp

    client = RunnerClient("Down", f"http://127.0.0.1:{free_port()}", ServiceTokens([TOKEN]), retry_pauses_s=(0.0,))

    async def work():
        try:
            with pytest.raises(aiohttp.ClientConnectorError):
                await client.call_json("models")
        finally:
            await client.close()

    asyncio.run(work())


def test_a_local_runner_answers_as_a_remote_one():
    class Instance:
        async def load(self, tag: str) -> dict:
            if tag == "missing":
                raise ApiError(404, "no such version")
            return {"tag": tag, "loaded_at": 1.5}

        async def predict_body(self, body: bytes) -> bytes:
            raise ApiError(502, "model runner unavailable: timeout")

    local = LocalRunner("Local", Instance())
    assert asyncio.run(local.call_json("load", {"tag": "v1"})) == {"tag": "v1", "loaded_at": 1.5}
    with pytest.raises(RunnerRejected):
        asyncio.run(local.call_json("load", {"tag": "missing"}))
    with pytest.raises(UpstreamFailed):
        asyncio.run(local.call_bytes("predict", b""))
