"""ASGI middleware in front of the gateway's HTTP routes: what must happen before any parsing.

- Refuses a request that sends ``Content-Type``, ``Authorization``, ``X-API-Key`` or another
  header of ``common.request_headers.SINGLE_VALUED`` twice (400), every body that is not JSON or
  is encoded (415: BentoML's internal pickle media type, multipart and form bodies never reach a
  parser from outside), and an ``Accept`` that excludes JSON (406); what passes carries the one
  ``Content-Type`` judged here.
- Rejects oversized bodies early (413), by Content-Length and by counting streamed bytes.
- Authenticates (401) and authorizes by scope (403): ``/admin/*`` needs ``admin``,
  ``POST /graph/updates`` ``graph``, the rest of the API ``predict``; health, metrics and the
  OpenAPI document are public.
- Rate limits per key (429 with Retry-After).
Every error answer is an ``ErrorBody``: the project's pass through as raised; the few that BentoML
writes itself (its router's 404 and 405) are rewritten into that shape
(``common.bento.foreign_errors``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from common.bento.foreign_errors import in_one_shape
from common.errors import ApiError, send_error
from common.request_context import REQUEST_ID_HEADER, adopt
from common.request_headers import BODY_METHODS, JSON, RequestHeaders, with_body_type
from services.access import GatewayAccess
from services.auth import AuthError
from services.ratelimit import rate_limited

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PUBLIC_PATHS = ("/livez", "/readyz", "/healthz", "/metrics", "/docs.json", "/docs", "/schema.json")


class BodyTooLarge(Exception):
    pass


async def send_json(send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    await send_error(send, ApiError(status, message, headers))


def required_scope(path: str) -> str:
    """The key scope a route needs: ``/admin/*`` admin, writing the graph graph, the rest predict."""
    if path.startswith("/admin"):
        return "admin"
    return "graph" if path == "/graph/updates" else "predict"


def with_request_id(send: Send, request_id: str) -> Send:
    """``send`` with the request's id in the answer's headers (``common.request_context``)."""
    header = (b"x-request-id", request_id.encode())

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), header]}
        await send(message)

    return sending


class HttpGuard:
    def __init__(self, app: Callable[..., Awaitable[None]], access: GatewayAccess, max_body_bytes: int) -> None:
        self.app = app
        self.access = access
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            headers = RequestHeaders(scope.get("headers", ()))
            if scope.get("method") in BODY_METHODS:
                # Only JSON, on every route: BentoML's internal pickle type and multipart/form bodies
                # are refused before any parser sees them, and what passes has one Content-Type.
                scope = with_body_type(scope, headers.body_type((JSON,)))
                headers.check_accept(JSON)
        except ApiError as exc:
            return await send_error(send, exc)
        send = with_request_id(in_one_shape(send), adopt(headers.get(REQUEST_ID_HEADER)))
        if scope["path"] in PUBLIC_PATHS or scope["path"].startswith("/docs"):
            return await self.app(scope, receive, send)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await send_json(send, 413, f"request body larger than {self.max_body_bytes} bytes")
        needed = required_scope(scope["path"])
        try:
            principal = self.access.auth.check(headers.get("authorization"), headers.get("x-api-key"), needed)
        except AuthError as exc:
            return await send_error(send, exc)
        decision = await self.access.limiter.acquire(principal.name)
        if not decision.allowed:
            return await send_error(send, rate_limited(decision.retry_after_s))
        if length is not None and "transfer-encoding" not in headers:
            # Framed by its Content-Length, checked above: the HTTP server hands on no byte past
            # it (a further byte starts the next request), so there is nothing to count.
            return await self.app(scope, receive, send)
        await self._forward(scope, receive, send)

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``app`` with the body counted as it streams in (chunked, no Content-Length): 413 once
        past ``max_body_bytes``."""
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise BodyTooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await send_json(send, 413, f"request body larger than {self.max_body_bytes} bytes")
