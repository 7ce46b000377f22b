"""common.endpoints: each endpoint answered by its core method through its codecs, errors in the
one error shape, everything else passed through; the three services wire their endpoints behind
their guards (common.bento.wiring)."""

import asyncio
import json
import logging

import pytest
from pydantic import BaseModel

from common.bento.wiring import CoreHolder
from common.endpoints import NO_BODY, UNEXPECTED, Binary, Endpoint, EndpointRouter, JsonModel, as_api_error
from common.errors import ANSWER_MARK, ApiError, ErrorBody


class Small(BaseModel):
    x: int


REVERSE = Endpoint(
    "reverse",
    "/hot",
    Binary(lambda b: b, lambda b: b, "bytes"),
    Binary(lambda b: b, lambda b: b, "b"),
    "reverse the body",
)
DOUBLE = Endpoint("double", "/double", JsonModel(Small), JsonModel(Small), "double x")
STATUS = Endpoint("status", "/status", NO_BODY, JsonModel(Small), "a report", method="GET")


class Core:
    def __init__(self, tag: bytes = b"") -> None:
        self.tag = tag
        self.seen: list = []

    async def reverse(self, body: bytes) -> bytes:
        self.seen.append(body)
        return self.tag + body[::-1]

    async def double(self, small: Small) -> Small:
        return Small(x=2 * small.x)

    async def status(self) -> Small:
        return Small(x=7)


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


def _router(core, endpoints=(REVERSE, DOUBLE, STATUS), documents=None):
    return EndpointRouter(_inner, endpoints, lambda: core, server_name="Svc", documents=documents)


def test_an_endpoint_is_answered_by_its_core_method_with_the_whole_body():
    core = Core()
    status, headers, body = _status_headers_body(_call(_router(core), chunks=(b"ab", b"cd", b"e")))
    assert core.seen == [b"abcde"] and (status, body) == (200, b"edcba")
    assert headers == {
        b"content-type": b"application/octet-stream",
        b"content-length": b"5",
        b"server": b"BentoML Service/Svc",
    }


def test_json_endpoints_decode_and_encode_their_models_and_get_endpoints_take_no_body():
    router = _router(Core())
    assert _status_headers_body(_call(router, path="/double", chunks=(b'{"x": 21}',)))[::2] == (200, b'{"x":42}')
    assert _status_headers_body(_call(router, method="GET", path="/status", chunks=(b"",)))[::2] == (200, b'{"x":7}')
    status, _, body = _status_headers_body(_call(router, method="GET", path="/status", chunks=(b'{"a": 1}',)))
    assert status == 400 and "takes no parameters" in json.loads(body)["error"]


@pytest.mark.parametrize(
    "method,path,scope_type",
    [
        ("GET", "/hot", "http"),
        ("POST", "/other", "http"),
        ("POST", "/hot/x", "http"),
        ("POST", "/status", "http"),
        ("POST", "/hot", "websocket"),
    ],
)
def test_everything_else_passes_through(method, path, scope_type):
    sent = _call(_router(Core()), method, path, scope_type=scope_type)
    assert sent[0]["status"] == 299 and sent[1]["body"] == b"inner"


def test_a_document_is_built_once_and_served_on_get():
    built = []
    router = _router(Core(), documents={"/docs.json": lambda: built.append(1) or {"openapi": "3.1.0"}})
    for _ in range(2):
        assert _status_headers_body(_call(router, "GET", "/docs.json"))[::2] == (200, b'{"openapi":"3.1.0"}')
    assert built == [1]


def test_a_client_that_went_away_gets_nothing_and_the_core_is_not_called():
    core = Core()
    assert _call(_router(core), chunks=()) == [] and core.seen == []


class Raising:
    def __init__(self, exc):
        self.exc = exc

    async def reverse(self, body):
        raise self.exc


def test_errors_keep_their_kind_status_message_param_and_headers_in_the_one_shape(caplog):
    try:
        Small.model_validate_json(b'{"x": "a"}')
    except Exception as exc:
        invalid = exc
    cases = [
        (
            invalid,
            400,
            "invalid_request",
            "invalid request: x: Input should be a valid integer, unable to parse string as an integer",
            "x",
            {},
        ),
        (ApiError(404, "no such version", type="unknown_version"), 404, "unknown_version", "no such version", None, {}),
        (ApiError(422, "wrong width"), 422, "unprocessable", "wrong width", None, {}),
        (
            ApiError(401, "no key", {"WWW-Authenticate": "Bearer"}),
            401,
            "unauthenticated",
            "no key",
            None,
            {b"www-authenticate": b"Bearer"},
        ),
        (
            ApiError.unavailable("model runner down: circuit open", 2.5),
            503,
            "unavailable",
            "model runner down: circuit open",
            None,
            {b"retry-after": b"3"},
        ),
        (RuntimeError("boom"), 500, "internal", UNEXPECTED, None, {}),
    ]
    with caplog.at_level(logging.INFO, logger="graphsage.endpoints"):
        for exc, status, kind, message, param, extra in cases:
            sent = _call(_router(Raising(exc)))
            assert sent[0][ANSWER_MARK] is True  # a guard passes it on untouched
            got_status, headers, body = _status_headers_body(sent)
            doc = ErrorBody.model_validate_json(body)
            assert (got_status, doc.status, doc.type, doc.error, doc.param) == (status, status, kind, message, param)
            assert headers[b"content-type"] == b"application/json"
            assert {k: headers[k] for k in extra} == extra
            assert as_api_error(exc, "here").status == status
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["Exception on /hot [POST]", "Exception on here"]  # the bug only
    assert all(r.exc_info for r in errors)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2 and all(not r.exc_info for r in caplog.records if r.levelno == logging.WARNING)


def test_the_core_is_looked_up_per_call():
    holder: CoreHolder[Core] = CoreHolder()
    router = EndpointRouter(_inner, [REVERSE], holder.get)
    status, _, body = _status_headers_body(_call(router))  # before the worker created it
    assert status == 503 and json.loads(body)["type"] == "starting"
    holder.set(Core(b"one:"))
    assert _status_headers_body(_call(router))[::2] == (200, b"one:ydob")
    holder.set(Core(b"two:"))
    assert _status_headers_body(_call(router))[::2] == (200, b"two:ydob")


def test_each_service_serves_its_endpoints_behind_its_guard():
    from common import feature_runner_api, model_runner_api
    from common.endpoints import EndpointRouter as Router
    from common.service_auth import ServiceGuard
    from runners.feature.service import FeatureRunner
    from runners.graphsage.service import GraphSAGERunner
    from services import api
    from services.gateway import Gateway
    from services.http_guard import HttpGuard

    for service, endpoints, guard in (
        (Gateway, api.ENDPOINTS, HttpGuard),
        (FeatureRunner, feature_runner_api.ENDPOINTS, ServiceGuard),
        (GraphSAGERunner, model_runner_api.ENDPOINTS, ServiceGuard),
    ):
        assert [cls for cls, _ in service.middlewares] == [guard, Router], service.name
        assert dict(service.middlewares)[Router]["endpoints"] == endpoints, service.name
    # The runners declare no BentoML API: nothing there could choose a deserialiser by Content-Type.
    assert not FeatureRunner.apis and not GraphSAGERunner.apis
    assert {a.route for a in Gateway.apis.values()} == {ep.path for ep in api.ENDPOINTS if ep.method == "POST"}
