"""common.bento.direct_api: hot routes answered without BentoML's dispatch, the rest passed through.
The real services answer through it in tests/test_e2e.py and tests/test_faults.py."""

import asyncio
import json
import logging

import pytest
from pydantic import BaseModel

from common.bento.direct_api import JSON, OCTET_STREAM, UNEXPECTED, DirectApi, ServiceInstance, error_answer
from common.remote import http_error


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


def test_errors_get_bentomls_statuses_and_bodies(caplog):
    try:
        Small.model_validate_json(b'{"x": "a"}')
    except Exception as exc:  # noqa: BLE001
        invalid = exc
    cases = [
        (invalid, 400, {"error": "1 validation error for Small", "detail": [{"type": "int_parsing", "loc": ["x"]}]}),
        (http_error(404, "no such version"), 404, [{"error": "no such version"}]),
        (http_error(422, "wrong width"), 422, [{"error": "wrong width"}]),
        (http_error(401, "secret detail"), 401, {"error": "Authorization error"}),
        (http_error(502, "model runner down"), 502, {"error": UNEXPECTED}),
        (RuntimeError("boom"), 500, {"error": UNEXPECTED}),
    ]
    with caplog.at_level(logging.ERROR, logger="graphsage.direct_api"):
        for exc, status, doc in cases:
            got_status, headers, body = _status_headers_body(_call(_app(_raising(exc))))
            got = json.loads(body)
            if isinstance(doc, dict) and "detail" in doc:  # pydantic's wording and docs URL vary by version
                got["detail"] = [{k: item[k] for k in ("type", "loc")} for item in got["detail"]]
            assert (got_status, got) == (status, doc), exc
            assert headers[b"content-type"] == JSON.encode()
            assert error_answer(exc)[0] == status
    logged = [r.getMessage() for r in caplog.records]
    assert logged == ["Exception on /hot [POST]"] * 2  # the 5xx only: 502 and the unexpected one


def test_the_service_instance_is_looked_up_per_call():
    ref = ServiceInstance()

    class Service:
        def __init__(self, tag):
            self.tag = tag

        async def work(self, body: bytes) -> bytes:
            return self.tag + body

    app = _app(ref.handler("work"))
    status, _, body = _status_headers_body(_call(app))  # before the worker created it
    assert (status, json.loads(body)) == (503, {"error": UNEXPECTED})
    ref.set(Service(b"one:"))
    assert _status_headers_body(_call(app))[::2] == (200, b"one:body")
    ref.set(Service(b"two:"))
    assert _status_headers_body(_call(app))[::2] == (200, b"two:body")


def test_each_service_serves_its_hot_api_directly_behind_its_guards():
    from runners.feature.service import FeatureRunner
    from runners.graphsage.service import GraphSAGERunner
    from services.gateway import Gateway
    from services.http_guard import HttpGuard

    for service, api, expected in ((Gateway, "predict", [HttpGuard, DirectApi]),
                                   (FeatureRunner, "predict", [DirectApi]), (GraphSAGERunner, "infer", [DirectApi])):
        assert [cls for cls, _ in service.middlewares] == expected, service.name
        routes = dict(service.middlewares)[DirectApi]["routes"]
        assert list(routes) == [service.apis[api].route], service.name
