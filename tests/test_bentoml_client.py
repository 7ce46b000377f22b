"""BentoML's own clients against the running gateway: ``SyncHTTPClient`` and ``AsyncHTTPClient``
read ``/schema.json`` and decode the answer with it, so its declared shape must admit the ``null``
the answer carries (``labels`` of a multiclass model, ``embedding`` when not asked for)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import bentoml
import httpx
import pytest

from harness.app import SplitApp

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BODIES = [
    {"node_ids": [1, 2, 3], "seed": 11},  # labels and embedding null
    {"node_ids": [1, 2, 3, 40, 41], "seed": 11, "embedding": True},  # the column renderer, with embeddings
    {"node_ids": [1, 2], "seed": 11, "explain": True},  # a nested object (the explanation) per node
]


@pytest.fixture(scope="module")
def gateway_url(demo_store) -> Iterator[str]:
    app = SplitApp(demo_store.home, {"GSAGE_MODEL_TAGS": demo_store.v1, "GSAGE_GRPC_PORT": "0"})
    try:
        app.start()
        yield app.gateway.url
    finally:
        app.stop()


def plain_post(url: str, body: dict[str, Any]) -> Any:
    r = httpx.post(url + "/predict", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("body", BODIES, ids=["plain", "embedding", "explain"])
def test_sync_client_returns_the_answer(gateway_url, body):
    expected = plain_post(gateway_url, body)
    with bentoml.SyncHTTPClient(gateway_url) as client:
        got = client.predict(**body)
    assert got == expected
    assert all(p["labels"] is None for p in got["predictions"])
    assert all(("explanation" in p) == bool(body.get("explain")) for p in got["predictions"])


@pytest.mark.parametrize("body", BODIES, ids=["plain", "embedding", "explain"])
def test_async_client_returns_the_answer(gateway_url, body):
    async def call() -> Any:
        async with bentoml.AsyncHTTPClient(gateway_url) as client:
            return await client.predict(**body)

    expected = plain_post(gateway_url, body)
    got = asyncio.run(call())
    assert got == expected
    if body.get("embedding"):
        assert all(isinstance(p["embedding"], list) and p["embedding"] for p in got["predictions"])
    else:
        assert all(p["embedding"] is None for p in got["predictions"])
