"""The gateway's OpenAPI document (``/docs.json``): BentoML's, declared as the version it is, with
the project's routes BentoML cannot see and the project's error model on every operation.

BentoML 1.4 (``_bentoml_sdk.service.openapi.generate_spec``) labels its document ``3.0.2`` but
fills it with pydantic 2's schemas, which are JSON Schema 2020-12: ``{"type": "null"}`` in
``anyOf`` (also in BentoML's own ``TaskStatusResponse``), ``patternProperties`` and
``propertyNames`` (``RoutingChange.weights``). That is what OpenAPI 3.1 schemas are, and no valid
3.0 document, so it is declared ``3.1.0`` here. It documents only ``@bentoml.api`` routes: the
endpoints it lacks (the ``GET`` ones) come from their definitions (``common.endpoints``). Every
operation of an endpoint answers its errors as ``common.errors.ErrorBody`` (BentoML's own error
schemas, which no answer here has, are left out).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from common.endpoints import Endpoint, openapi_paths

OPENAPI_VERSION = "3.1.0"
BENTOML_ERROR_SCHEMAS = ("InvalidArgument", "NotFound", "InternalServerError")


def document(service: Any, endpoints: Iterable[Endpoint[Any, Any]], errors: Mapping[int, str]) -> dict[str, Any]:
    """``service``'s OpenAPI document as JSON values, declared 3.1, with every endpoint of
    ``endpoints`` documented and answering ``errors`` (status -> when) as ``ErrorBody``."""
    # Through JSON as BentoML's view serves it: its status codes are int keys until then.
    doc: dict[str, Any] = json.loads(json.dumps(service.openapi_spec.asdict()))
    doc["openapi"] = OPENAPI_VERSION
    endpoints = tuple(endpoints)
    ours, schemas = openapi_paths(endpoints, "Service APIs", errors)
    for ep in endpoints:
        method = ep.method.lower()
        theirs = doc["paths"].get(ep.path, {}).get(method)
        if theirs is None:
            doc["paths"].setdefault(ep.path, {})[method] = ours[ep.path][method]
            continue
        responses = {code: r for code, r in theirs["responses"].items() if code == "200"}
        responses.update({code: r for code, r in ours[ep.path][method]["responses"].items() if code != "200"})
        theirs["responses"] = responses
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in BENTOML_ERROR_SCHEMAS:
        components.pop(name, None)
    wanted = _referenced(doc["paths"], {**schemas, **components})
    components.update({name: schemas[name] for name in wanted if name not in components})
    return doc


def _referenced(root: Any, schemas: Mapping[str, Any]) -> set[str]:
    """The component schemas ``root`` refers to, directly or through other schemas."""
    found: set[str] = set()
    todo = [root]
    while todo:
        text = json.dumps(todo.pop())
        for name in schemas:
            if f'"#/components/schemas/{name}"' in text and name not in found:
                found.add(name)
                todo.append(schemas[name])
    return found
