"""The OpenAPI document a service serves at ``/docs.json``: BentoML's, declared as the version it
is, plus the plain routes BentoML cannot see.

BentoML 1.4 (``_bentoml_sdk.service.openapi.generate_spec``) labels its document ``3.0.2`` but
fills it with pydantic 2's schemas, which are JSON Schema 2020-12: ``{"type": "null"}`` in
``anyOf`` (also in BentoML's own ``TaskStatusResponse``), ``patternProperties`` and
``propertyNames`` (``RoutingChange.weights``). That is what OpenAPI 3.1 schemas are, and no valid
3.0 document, so it is declared ``3.1.0`` here. It documents only ``@bentoml.api`` routes and
mounted FastAPI apps; routes of a plain Starlette app mounted with ``@bentoml.asgi_app`` are
added by the caller (``paths``).

``docs_route`` answers ``GET /docs.json`` with ``document(...)``: BentoML serves it from
``Service.openapi_spec``, a property of a slotted attrs class that cannot be overridden per
service, so the route goes into the Starlette app the service mounts at its root
(``@bentoml.asgi_app(app, path="/")``). ``ServiceAppFactory`` adds that ``PassiveMount`` before its
own ``docs.json`` route and Starlette takes the first match, so this route answers. (A middleware
would do too, but it would change ``Service.middlewares``, which tests/test_direct_api.py pins.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bentoml._internal.service.openapi import APP_TAG
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

OPENAPI_VERSION = "3.1.0"

PathItem = dict[str, Any]


def document(service: Any, paths: Mapping[str, PathItem] | None = None) -> dict[str, Any]:
    """``service``'s OpenAPI document as JSON values, declared 3.1, with ``paths`` added."""
    # Through JSON as BentoML's view serves it: its status codes are int keys until then.
    doc: dict[str, Any] = json.loads(json.dumps(service.openapi_spec.asdict()))
    doc["openapi"] = OPENAPI_VERSION
    doc["paths"].update(paths or {})
    return doc


def json_get(operation_id: str, description: str, schema: Mapping[str, Any]) -> PathItem:
    """A path item for a plain ``GET`` route that answers JSON matching ``schema``."""
    return {"get": {
        "tags": [APP_TAG.name],
        "operationId": operation_id,
        "description": description,
        "responses": {"200": {"description": "Successful Response",
                              "content": {"application/json": {"schema": dict(schema)}}}},
    }}


def docs_route(service: Any, paths: Mapping[str, PathItem] | None = None) -> Route:
    """``GET /docs.json`` -> ``document(service, paths)``, for the app ``service`` mounts at its
    root; built on the first request (the service is fully defined by then) and kept."""
    body: bytes | None = None

    async def docs(request: Request) -> Response:
        nonlocal body
        if body is None:  # rendered as BentoML's view renders it (JSONResponse)
            body = JSONResponse(document(service, paths)).body
        return Response(body, media_type="application/json")

    return Route("/docs.json", docs, methods=["GET"], name="openapi-spec")
