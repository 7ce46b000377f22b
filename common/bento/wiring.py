"""What every service module here does around its ``@bentoml.service`` class, in one place.

- ``CoreHolder``: BentoML builds a service's ASGI app, middleware included, before it creates the
  service instance in the worker; the instance puts its core here, and the router finds it.
- ``expose``: every endpoint of the service's API (``common.endpoints``) answered by an
  ``EndpointRouter`` calling the core, behind the service's guard (outermost of its own
  middleware; BentoML's metrics, tracing, timeout and concurrency limit wrap both). The router
  answers past BentoML's per-request dispatch (Starlette's router, ``ContextMiddleware``, the
  IO-descriptor parse and its choice of a deserialiser by ``Content-Type``, an
  ``inspect.signature`` per call): under concurrent load that dispatch was a large share of a
  worker's CPU (the py-spy profiles of ``python -m bench.suite``), and it is what could unpickle a
  body. ``@bentoml.api`` declarations, where a service has them (the gateway's, for its OpenAPI
  document and BentoML's own clients), call the same core.
- ``service_started``: the end of a service's ``__init__``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from common.endpoints import Endpoint, EndpointRouter
from common.errors import ApiError

C = TypeVar("C")


class CoreHolder(Generic[C]):
    """The worker's core, for the middleware BentoML set up before the instance existed."""

    def __init__(self) -> None:
        self._value: C | None = None

    def set(self, core: C) -> None:
        self._value = core

    def get(self) -> C:
        if self._value is None:
            raise ApiError.unavailable("service starting", 1.0, type="starting")
        return self._value


def expose(
    service: Any,
    endpoints: Iterable[Endpoint[Any, Any]],
    holder: CoreHolder[Any],
    guard: type,
    guard_options: Mapping[str, Any] | None = None,
    documents: Mapping[str, Callable[[], dict[str, Any]]] | None = None,
) -> None:
    """``service``'s endpoints answered by the core in ``holder``, behind ``guard``.
    ``documents``: GET path -> a JSON document built on first request (a runner's OpenAPI)."""
    endpoints = tuple(endpoints)
    service.add_asgi_middleware(guard, **dict(guard_options or {}))
    service.add_asgi_middleware(
        EndpointRouter,
        endpoints=endpoints,
        target=holder.get,
        server_name=service.name,
        documents=dict(documents or {}),
    )


def service_started() -> None:
    """Start-up objects out of the collector's reach: gen-2 collections over them paused BentoML
    workers (no benchmark times the pauses; gc.callbacks under python -m bench.suite would)."""
    gc.freeze()
