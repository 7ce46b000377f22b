"""services.http_guard: the gateway's checks before any parser, without a server."""

from __future__ import annotations

import asyncio
import json

import pytest

from common.errors import ApiError, ErrorBody, send_error
from services.access import GatewayAccess
from services.auth import SCOPES, ApiKeyAuth, KeyEntry, generate_key, hash_key
from services.http_guard import HttpGuard
from services.ratelimit import LocalRateLimiter

KEY, OTHER = generate_key(), generate_key()
PICKLE = "application/vnd.bentoml+pickle"


async def ok(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def run(app, headers, path="/predict", method="POST", body=b'{"node_ids": [1]}', chunks=None, max_body_bytes=1 << 20):
    """The guard over ``app``, the body arriving whole or in ``chunks``: (the answer's start
    message, its body)."""
    sent = []
    parts = [body] if chunks is None else list(chunks)
    messages = [{"type": "http.request", "body": c, "more_body": i < len(parts) - 1} for i, c in enumerate(parts)]

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    access = GatewayAccess.of(ApiKeyAuth([KeyEntry("k", hash_key(KEY), SCOPES)]), LocalRateLimiter(0, 1))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
    }
    asyncio.run(HttpGuard(app, access, max_body_bytes=max_body_bytes)(scope, receive, send))
    start, out = sent
    return start, out["body"]


def call(headers, path="/predict", method="POST", body=b'{"node_ids": [1]}'):
    """(status, error message or None, the headers the app was handed or None)."""
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["headers"])
        await ok(scope, receive, send)

    start, out = run(app, headers, path, method, body)
    error = json.loads(out).get("error") if start["status"] != 200 else None
    return start["status"], error, seen[0] if seen else None


JSON_TYPE = ("Content-Type", "application/json")


@pytest.mark.parametrize("header, value", [("Authorization", f"Bearer {KEY}"), ("X-API-Key", KEY)])
def test_a_credential_sent_twice_is_refused_whatever_the_order(header, value):
    wrong = f"Bearer {OTHER}" if header == "Authorization" else OTHER
    for pair in ((value, value), (wrong, value), (value, wrong)):
        status, error, seen = call([JSON_TYPE, (header, pair[0]), (header, pair[1])])
        assert (status, seen) == (400, None) and error == f"header {header} sent 2 times; send it once"
    assert call([JSON_TYPE, (header, value)])[0] == 200


def test_a_pickle_type_beside_json_is_refused_in_either_order_and_json_passes_as_one_header():
    for types in ((PICKLE, "application/json"), ("application/json", PICKLE)):
        status, error, seen = call([*(("Content-Type", t) for t in types), ("X-API-Key", KEY)])
        assert (status, seen) == (400, None) and "Content-Type sent 2 times" in error
    status, error, seen = call([("Content-Type", f"{PICKLE}, application/json"), ("X-API-Key", KEY)])
    assert status == 415 and seen is None
    status, _, seen = call([("Content-Type", "APPLICATION/JSON;charset=utf-8"), ("X-API-Key", KEY)])
    assert status == 200 and [v for k, v in seen if k == b"content-type"] == [b"application/json"]


def test_encoded_bodies_and_accepts_without_json_are_refused():
    assert call([JSON_TYPE, ("Content-Encoding", "gzip"), ("X-API-Key", KEY)])[0] == 415
    assert call([JSON_TYPE, ("Accept", "application/octet-stream"), ("X-API-Key", KEY)])[0] == 406
    assert call([JSON_TYPE, ("Accept", "application/json, */*;q=0.1"), ("X-API-Key", KEY)])[0] == 200


def test_the_projects_errors_pass_untouched_and_bentomls_own_get_the_one_shape():
    """A 503 raised here keeps its own Retry-After, type and message; a 503 BentoML writes itself
    (no mark) becomes an ErrorBody with a Retry-After of 1; a plain-text 404 likewise."""
    own = ApiError.unavailable("model runner unavailable: circuit open", 2.5, type="model_runner_unavailable")

    async def raising(scope, receive, send):
        await send_error(send, own)

    def foreign(status, body, content_type=b"text/plain"):
        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
            await send({"type": "http.response.body", "body": body})

        return app

    start, body = run(raising, [JSON_TYPE, ("X-API-Key", KEY)])
    assert (start["status"], dict(start["headers"])[b"retry-after"]) == (503, b"3")
    assert ErrorBody.model_validate_json(body) == own.to_body()
    for app, status, message, kind in (
        (foreign(503, b"Service Busy"), 503, "Service Busy", "unavailable"),
        (foreign(404, b"Not Found"), 404, "Not Found", "not_found"),
        (foreign(400, b'{"error": "bad thing"}', b"application/json"), 400, "bad thing", "invalid_request"),
    ):
        start, body = run(app, [JSON_TYPE, ("X-API-Key", KEY)])
        doc = ErrorBody.model_validate_json(body)
        assert (start["status"], doc.status, doc.error, doc.type) == (status, status, message, kind)
        assert (dict(start["headers"]).get(b"retry-after") == b"1") == (status == 503)


def streamed(headers, chunks, max_body_bytes=10):
    """The guard with a ``max_body_bytes`` limit over an app that reads the whole body, the body
    arriving in ``chunks``: (status, the bytes the app read)."""
    read = []

    async def app(scope, receive, send):
        more = True
        while more:
            message = await receive()
            read.append(message["body"])
            more = message["more_body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    start, _ = run(app, headers, chunks=chunks, max_body_bytes=max_body_bytes)
    return start["status"], b"".join(read)


def test_a_body_past_the_limit_is_refused_by_its_length_or_as_it_streams():
    """A Content-Length over the limit: 413 before the app reads a byte. No Content-Length
    (chunked): counted as it streams, 413 once past the limit. With a Transfer-Encoding beside a
    Content-Length the body is counted too (the server frames it by the encoding, so the length
    it declares bounds nothing)."""
    auth = [JSON_TYPE, ("X-API-Key", KEY)]
    assert streamed([*auth, ("Content-Length", "11")], [b"x" * 11]) == (413, b"")
    assert streamed([*auth, ("Content-Length", "10")], [b"x" * 4, b"x" * 6]) == (200, b"x" * 10)
    assert streamed(auth, [b"x" * 6, b"x" * 4]) == (200, b"x" * 10)
    assert streamed(auth, [b"x" * 6, b"x" * 6]) == (413, b"x" * 6)
    chunked = [*auth, ("Content-Length", "4"), ("Transfer-Encoding", "chunked")]
    assert streamed(chunked, [b"x" * 6, b"x" * 6]) == (413, b"x" * 6)
