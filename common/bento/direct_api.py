"""Answering a hot BentoML API without BentoML's per-request dispatch.

BentoML 1.4 answers an API call through Starlette's router, its ``ContextMiddleware`` and
``api_endpoint_wrapper`` -> ``api_endpoint``: an IO-descriptor parse, ``APIMethod.__get__`` (an
``inspect.signature`` per call) and dependency-injected response headers. On a one-endpoint
service at concurrency 32 that dispatch was ~45% of the worker's CPU (py-spy); the same handler
behind a plain route answered 10.5k req/s against 5.7k through ``@bentoml.api``.

``DirectApi`` is an ASGI middleware that answers ``POST <route>`` itself, by awaiting a handler
with the raw body. Added with ``Service.add_asgi_middleware`` after the service's own guards
(auth, rate limits), it sits inside everything BentoML wraps a request in (its metrics,
tracing, concurrency limit and timeout) and in front of what it replaces. The API stays
declared with ``@bentoml.api``, calling the same handler: it documents the route in the OpenAPI
document and answers it when the middleware is left out (``GSAGE_DIRECT_API=0``). Errors get the
statuses and bodies BentoML's dispatch gives them, so BentoML's clients read them alike.

BentoML builds the app, middleware included, before it creates the service instance in the
worker; a ``ServiceInstance`` set in the service's ``__init__`` is how a handler reaches it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import orjson
from bentoml.exceptions import BentoMLException
from pydantic import ValidationError

from common.remote import http_error

log = logging.getLogger("graphsage.direct_api")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# The raw request body -> the response body; raises as a BentoML API would.
Handler = Callable[[bytes], Awaitable[bytes]]

UNEXPECTED = "An unexpected error has occurred, please check the server log."
JSON = "application/json"
OCTET_STREAM = "application/octet-stream"


class ServiceInstance:
    """The worker's service instance, for code that BentoML set up before the instance existed."""

    def __init__(self) -> None:
        self._value: Any = None

    def set(self, instance: Any) -> None:
        self._value = instance

    def get(self) -> Any:
        if self._value is None:
            raise http_error(503, "service starting")
        return self._value

    def handler(self, method: str) -> Handler:
        """``method`` of the instance (an ``async (bytes) -> bytes``), looked up per call."""

        async def call(body: bytes) -> bytes:
            return await getattr(self.get(), method)(body)

        return call


def error_answer(exc: BaseException) -> tuple[int, Any]:
    """``(status, JSON document)`` for an exception, as BentoML 1.4's ``api_endpoint_wrapper``."""
    if isinstance(exc, ValidationError):
        return 400, {"error": f"{exc.error_count()} validation error for {exc.title}",
                     "detail": exc.errors(include_context=False, include_input=False)}
    if isinstance(exc, BentoMLException):
        status = int(exc.error_code)
        if status in (401, 403):
            return status, {"error": "Authorization error"}
        if status >= 500:
            return status, {"error": UNEXPECTED}
        return status, [{"error": str(exc)}]
    return 500, {"error": UNEXPECTED}


class DirectApi:
    """``routes``: path -> ``(handler, response media type)``. Anything else passes through."""

    def __init__(self, app: Callable[..., Awaitable[None]], routes: Mapping[str, tuple[Handler, str]],
                 server_name: str = "") -> None:
        self.app = app
        self.routes = dict(routes)
        self._server = [(b"server", f"BentoML Service/{server_name}".encode())] if server_name else []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            return await self.app(scope, receive, send)
        handler, media_type = route
        body = await _read_body(receive)
        if body is None:
            return  # the client went away
        try:
            status, answer = 200, await handler(body)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an HTTP answer
            status, doc = error_answer(exc)
            if status >= 500:
                log.error("Exception on %s [POST]", scope["path"], exc_info=exc)
            answer, media_type = orjson.dumps(doc), JSON
        headers = [(b"content-type", media_type.encode()), (b"content-length", b"%d" % len(answer)), *self._server]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


async def _read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)
