"""Baseline B5 (``bench.suite.one_process``): the app's work in one process behind uvicorn. What it
answers must be a prediction per node from the configured version, or the suite's ratios to it
compare the app with something that does less."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tests.conftest import bentoml_home

pytestmark = pytest.mark.integration


@pytest.fixture
def work(demo_store, monkeypatch):
    from bench.suite.one_process import OneProcess

    monkeypatch.setenv("GSAGE_MODEL_TAGS", demo_store.v1)
    monkeypatch.setenv("GSAGE_REDIS_URL", "")
    with bentoml_home(demo_store.home):
        yield OneProcess()


def _predict(work, body: dict) -> dict:
    return json.loads(asyncio.run(work.predict(json.dumps(body).encode())))


@pytest.mark.parametrize("size", [1, 40])  # under and over GSAGE_PREMEAN_MIN_TARGETS
def test_it_answers_every_node_from_the_configured_version(work, demo_store, size):
    ids = list(range(3, 3 + size))
    answer = _predict(work, {"node_ids": ids, "seed": 5})
    assert answer["model"] == demo_store.v1
    assert [p["node_id"] for p in answer["predictions"]] == ids
    probs = np.array([p["probs"] for p in answer["predictions"]])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    assert [p["label"] for p in answer["predictions"]] == probs.argmax(axis=1).tolist()
    # The same seed samples the same neighbourhood; another may not.
    assert _predict(work, {"node_ids": ids, "seed": 5}) == answer


def test_the_asgi_app_refuses_before_it_has_loaded_and_answers_404_elsewhere():
    from bench.suite.one_process import App

    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}"}

    async def send(message: dict) -> None:
        sent.append(message)

    app = App()
    asyncio.run(app({"type": "http", "path": "/readyz", "method": "GET"}, receive, send))
    asyncio.run(app({"type": "http", "path": "/nowhere", "method": "GET"}, receive, send))
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [503, 404]
