"""common.bento.direct_api: hot routes answered without BentoML's dispatch, the rest passed through.
The real services answer through it in tests/test_e2e.py and tests/test_faults.py."""

import asyncio
import json
import logging

import pytest
from pydantic import BaseModel

from common.bento.direct_api import JSON, OCTET_STREAM, UNEXPECTED, DirectApi, ServiceInstance, as_api_error
from common.errors import ApiError


class Small(BaseModel):
    x: int


async def _inner(scope, receive, send):
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b"inner"})


def _call(app, method="POST", path="/hot", chunks=(b"body",), scope_type="http"):
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": scope_type, "method": method, "path": path}, receive, send))
    return sent


def _status_headers_body(sent):
    start, body = sent
    return start["status"], dict(start["headers"]), body["body"]


def _app(handler, media_type=OCTET_STREAM):
    return DirectApi(_inner, {"/hot": (handler, media_type)}, server_name="Svc")


def test_the_route_is_answered_by_the_handler_with_the_whole_body():
    seen = []

    async def handler(body: bytes) -> bytes:
        seen.append(body)
        return body[::-1]

    status, headers, body = _status_headers_body(_call(_app(handler), chunks=(b"ab", b"cd", b"e")))
    assert seen == [b"abcde"] and (status, body) == (200, b"edcba")
    assert headers == {b"content-type": OCTET_STREAM.encode(), b"content-length": b"5",
                       b"server": b"BentoML Service/Svc"}


@pytest.mark.parametrize("method,path,scope_type", [("GET", "/hot", "http"), ("POST", "/other", "http"),
                                                    ("POST", "/hot/x", "http"), ("POST", "/hot", "websocket")])
def test_everything_else_passes_through(method, path, scope_type):
    async def handler(body: bytes) -> bytes:
        raise AssertionError("not this route")

    sent = _call(_app(handler), method, path, scope_type=scope_type)
    assert sent[0]["status"] == 299 and sent[1]["body"] == b"inner"


def test_a_client_that_went_away_gets_nothing_and_the_handler_is_not_called():
    async def handler(body: bytes) -> bytes:
        raise AssertionError("called")

    assert _call(_app(handler), chunks=()) == []


def _raising(exc):
    async def handler(body: bytes) -> bytes:
        raise exc

    return handler


def test_errors_keep_their_status_message_and_headers(caplog):
    try:
        Small.model_validate_json(b'{"x": "a"}')
    except Exception as exc:  # noqa: BLE001
        invalid = exc
    cases = [
        (invalid, 400, "invalid request: x: Input should be a valid integer, unable to parse string as an integer", {}),
        (ApiError(404, "no such version"), 404, "no such version", {}),
        (ApiError(422, "wrong width"), 422, "wrong width", {}),
        (ApiError(401, "no key", {"WWW-Authenticate": "Bearer"}), 401, "no key", {b"www-authenticate": b"Bearer"}),
        (ApiError.unavailable("model runner down: circuit open", 2.5), 503, "model runner down: circuit open",
         {b"retry-after": b"3"}),
        (ApiError(502, "model runner unavailable: timeout"), 502, "model runner unavailable: timeout", {}),
        (RuntimeError("boom"), 500, UNEXPECTED, {}),
    ]
    with caplog.at_level(logging.INFO, logger="graphsage.direct_api"):
        for exc, status, message, extra in cases:
            got_status, headers, body = _status_headers_body(_call(_app(_raising(exc))))
            assert (got_status, json.loads(body)) == (status, {"error": message, "status": status}), exc
            assert headers[b"content-type"] == JSON.encode()
            assert {k: headers[k] for k in extra} == extra
            assert as_api_error(exc, "here").status == status
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["Exception on /hot [POST]", "Exception on here"]  # the bug only
    assert all(r.exc_info for r in errors)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 4 and all(not r.exc_info for r in caplog.records if r.levelno == logging.WARNING)


def test_the_service_instance_is_looked_up_per_call():
    ref = ServiceInstance()

    class Service:
        def __init__(self, tag):
            self.tag = tag

        async def work(self, body: bytes) -> bytes:
            return self.tag + body

    app = _app(ref.handler("work"))
    status, _, body = _status_headers_body(_call(app))  # before the worker created it
    assert (status, json.loads(body)) == (503, {"error": "service starting", "status": 503})
    ref.set(Service(b"one:"))
    assert _status_headers_body(_call(app))[::2] == (200, b"one:body")
    ref.set(Service(b"two:"))
    assert _status_headers_body(_call(app))[::2] == (200, b"two:body")


def test_each_service_serves_its_hot_api_directly_behind_its_guards():
    from runners.feature.service import FeatureRunner
    from runners.graphsage.service import GraphSAGERunner
    from services.gateway import Gateway
    from common.service_auth import ServiceGuard
    from services.http_guard import HttpGuard

    for service, apis, expected in ((Gateway, ["predict"], [HttpGuard, DirectApi]),
                                    (FeatureRunner, ["predict", "graph_update"], [ServiceGuard, DirectApi]),
                                    (GraphSAGERunner, ["infer"], [ServiceGuard, DirectApi])):
        assert [cls for cls, _ in service.middlewares] == expected, service.name
        routes = dict(service.middlewares)[DirectApi]["routes"]
        assert list(routes) == [service.apis[api].route for api in apis], service.name


def test_the_http_guard_keeps_a_503s_reason_and_retry_after():
    """The gateway's stack (HttpGuard around the direct API): a 503's own Retry-After and message
    reach the client unchanged; only a 503 that carries none (BentoML's load shedding) gets the
    guard's default of 1 s."""
    from services.auth import ApiKeyAuth
    from services.http_guard import HttpGuard

    async def shedding(scope, receive, send):
        await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"Service Busy"})

    def answer(app):
        guard = HttpGuard(app, auth=ApiKeyAuth([], enabled=False), max_body_bytes=1 << 20)
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/hot", "headers": [(b"content-type", b"application/json")]}
        asyncio.run(guard(scope, receive, send))
        start, body = sent
        return start["status"], dict(start["headers"]), json.loads(body["body"])

    down = _app(_raising(ApiError.unavailable("model runner unavailable: circuit open", 2.5)), JSON)
    status, headers, body = answer(down)
    assert (status, headers[b"retry-after"]) == (503, b"3")
    assert body == {"error": "model runner unavailable: circuit open", "status": 503}
    status, headers, body = answer(shedding)
    assert (status, headers[b"retry-after"], body["error"]) == (503, b"1", "Service Busy")
