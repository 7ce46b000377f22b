"""Answering a hot BentoML API without BentoML's per-request dispatch.

BentoML 1.4 answers an API call through Starlette's router, its ``ContextMiddleware`` and
``api_endpoint_wrapper`` -> ``api_endpoint``: an IO-descriptor parse, ``APIMethod.__get__`` (an
``inspect.signature`` per call) and dependency-injected response headers. Under concurrent load
that dispatch was a large share of a worker's CPU, and the same handler behind a plain route
answered markedly more requests per second: see the py-spy profiles of ``python -m bench.suite``,
and ``python -m bench.suite.ab --variant GSAGE_DIRECT_API=0`` for the app with and without it.

``DirectApi`` is an ASGI middleware that answers ``POST <route>`` itself, by awaiting a handler
with the raw body. Added with ``Service.add_asgi_middleware`` after the service's own guards
(auth, rate limits), it sits inside everything BentoML wraps a request in (its metrics,
tracing, concurrency limit and timeout) and in front of what it replaces. The API stays
declared with ``@bentoml.api``, calling the same handler: it documents the route in the OpenAPI
document and answers it when the middleware is left out (``GSAGE_DIRECT_API=0``). Errors are
``common.errors.ApiError`` answers, status, message and headers as raised, as the dispatched API
answers them (``common.errors.api_errors``); a validation error names its fields; anything else is
a 500 whose details stay in the log.

BentoML builds the app, middleware included, before it creates the service instance in the
worker; a ``ServiceInstance`` set in the service's ``__init__`` is how a handler reaches it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Annotated, Any

from bentoml.validators import ContentType
from pydantic import ValidationError

from common.errors import ApiError, error_response, send_error

log = logging.getLogger("graphsage.direct_api")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# The raw request body -> the response body; raises ApiError (or ValidationError) for a refusal.
Handler = Callable[[bytes], Awaitable[bytes]]

UNEXPECTED = "An unexpected error has occurred, please check the server log."
# The type of an API's raw binary body and answer (``common.wire`` bytes). The declared media type
# spares BentoML a pydantic JSON-schema build per response to find one.
BinaryBody = Annotated[bytes, ContentType("application/octet-stream")]
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
            raise ApiError.unavailable("service starting", 1.0)
        return self._value

    def handler(self, method: str) -> Handler:
        """``method`` of the instance (an ``async (bytes) -> bytes``), looked up per call."""

        async def call(body: bytes) -> bytes:
            return await getattr(self.get(), method)(body)

        return call


def as_api_error(exc: BaseException, where: str) -> ApiError:
    """What a failed handler answers: its ``ApiError`` as raised, a validation error as a 400
    that names the fields, anything else a 500 (logged here with its traceback)."""
    if isinstance(exc, ApiError):
        if exc.status >= 500:
            log.warning("%s answered %d: %s", where, exc.status, exc.message)
        return exc
    if isinstance(exc, ValidationError):
        return ApiError.invalid(exc)
    log.error("Exception on %s", where, exc_info=exc)
    return ApiError(500, UNEXPECTED)


def answers_errors(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """For an ``async`` method under ``@bentoml.api``: a failure is answered as ``DirectApi``
    answers it (BentoML's own wrapper would replace a 5xx's message, drop the headers, say
    "Authorization error" for a 401 and log every 4xx with a traceback)."""

    @functools.wraps(fn)
    async def api(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an HTTP answer
            return error_response(as_api_error(exc, fn.__name__))

    return api


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
            answer = await handler(body)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an HTTP answer
            return await send_error(send, as_api_error(exc, f"{scope['path']} [POST]"))
        headers = [(b"content-type", media_type.encode()), (b"content-length", b"%d" % len(answer)), *self._server]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
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
