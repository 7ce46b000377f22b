"""services.http_guard: the gateway's checks before any parser, without a server."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.auth import SCOPES, ApiKeyAuth, KeyEntry, generate_key, hash_key
from services.ratelimit import LocalRateLimiter
from services.http_guard import HttpGuard

KEY, OTHER = generate_key(), generate_key()
PICKLE = "application/vnd.bentoml+pickle"


def call(headers, path="/predict", method="POST", body=b'{"node_ids": [1]}'):
    """(status, error message or None, the headers the app was handed or None)."""
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["headers"])
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    guard = HttpGuard(app, auth=ApiKeyAuth([KeyEntry("k", hash_key(KEY), SCOPES)]),
                      limiter=LocalRateLimiter(0, 1), max_body_bytes=1 << 20)
    scope = {"type": "http", "method": method, "path": path,
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers]}
    asyncio.run(guard(scope, receive, send))
    start, out = sent
    error = json.loads(out["body"]).get("error") if start["status"] != 200 else None
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
