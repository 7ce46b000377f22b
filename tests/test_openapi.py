"""The gateway's OpenAPI document (``/docs.json``) is valid for the version it declares and
documents every public route: ``POST /predict``, ``POST /admin/routing`` and ``GET /models``."""

from __future__ import annotations

import asyncio
import copy
import functools
from typing import Any

import httpx
import pytest

openapi_spec_validator = pytest.importorskip(
    "openapi_spec_validator", reason="openapi-spec-validator is not installed (pip install -e '.[dev]')"
)

PUBLIC_OPERATIONS = [
    ("/predict", "post"),
    ("/admin/routing", "post"),
    ("/models", "get"),
    ("/graph/updates", "post"),
    ("/graph/status", "get"),
    ("/admin/graph/compact", "post"),
    ("/admin/shadow", "get"),
]


def served_in_process() -> dict[str, Any]:
    """``GET /docs.json`` from the Gateway's own ASGI app, middleware included: the served bytes,
    not a rebuilt copy of them."""
    return copy.deepcopy(_served_in_process())


@functools.cache  # one app per process: BentoML registers its Prometheus metrics as it builds one
def _served_in_process() -> dict[str, Any]:
    from services.gateway import Gateway

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=Gateway.to_asgi())
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.get("/docs.json")

    r = asyncio.run(get())
    assert r.status_code == 200, r.text
    return r.json()


def assert_valid(doc: dict[str, Any]) -> None:
    # validate() picks the validator from the document's own `openapi` field.
    openapi_spec_validator.validate(doc)
    for path, method in PUBLIC_OPERATIONS:
        assert method in doc["paths"].get(path, {}), f"{method.upper()} {path} is not documented"


def test_served_document_is_valid_openapi_with_every_public_route():
    doc = served_in_process()
    assert_valid(doc)
    models = doc["paths"]["/models"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert models["type"] == "object"


def test_optional_fields_keep_null_where_bentoml_flattens_them():
    """BentoML flattens a request body's ``anyOf`` to its first member; an optional field must still
    admit its ``null`` default there (the validator checks defaults against their schema)."""
    body = served_in_process()["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    for field in ("version", "fanout", "routing_key", "seed"):
        assert "null" in body["properties"][field]["type"], body["properties"][field]


@pytest.mark.integration
def test_document_served_by_the_running_gateway_is_valid(demo_store):
    from harness.app import SplitApp

    app = SplitApp(demo_store.home, {"GSAGE_MODEL_TAGS": demo_store.v1, "GSAGE_GRPC_PORT": "0"})
    try:
        app.start()
        r = httpx.get(app.gateway.url + "/docs.json", timeout=10)
        assert r.status_code == 200, r.text
        assert_valid(r.json())
        assert r.json() == served_in_process()
    finally:
        app.stop()
