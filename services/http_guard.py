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
- Rate limits per key (429 with Retry-After); adds Retry-After to any 503 (load shedding, a
  model runner down) that lacks one.
Errors are JSON ``{"error": ..., "status": ...}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from common.errors import ApiError, message_from_body, send_error
from common.request_headers import BODY_METHODS, JSON, RequestHeaders, with_body_type
from services.auth import ApiKeyAuth, AuthError
from services.ratelimit import rate_limited
from services.access import resolve_access

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


class HttpGuard:
    def __init__(self, app: Callable[..., Awaitable[None]], auth: ApiKeyAuth | None = None,
                 limiter: Any | None = None, max_body_bytes: int | None = None) -> None:
        from common.settings import settings

        self.app = app
        self.auth, self.limiter = resolve_access(auth, limiter)
        self.max_body_bytes = settings().max_body_bytes if max_body_bytes is None else max_body_bytes

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
        if scope["path"] in PUBLIC_PATHS or scope["path"].startswith("/docs"):
            return await self.app(scope, receive, send)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await send_json(send, 413, f"request body larger than {self.max_body_bytes} bytes")
        needed = required_scope(scope["path"])
        try:
            principal = self.auth.check(headers.get("authorization"), headers.get("x-api-key"), needed)
        except AuthError as exc:
            return await send_error(send, exc)
        decision = await self.limiter.acquire(principal.name)
        if not decision.allowed:
            return await send_error(send, rate_limited(decision.retry_after_s))
        await self._forward(scope, receive, send)

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise BodyTooLarge()
            return message

        error_start: Message | None = None
        error_body = b""

        async def tracking_send(message: Message) -> None:
            nonlocal started, error_start, error_body
            if message["type"] == "http.response.start":
                started = True
                if message.get("status", 200) >= 400:  # rewritten into our error schema below
                    error_start = message
                    return
            elif error_start is not None:
                error_body += message.get("body", b"")
                if message.get("more_body"):
                    return
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in error_start.get("headers", [])
                           if k.lower() not in (b"content-length", b"content-type")}
                if error_start["status"] == 503:
                    headers.setdefault("retry-after", "1")
                return await send_json(send, error_start["status"], message_from_body(error_body), headers)
            await send(message)

        try:
            await self.app(scope, counted_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await send_json(send, 413, f"request body larger than {self.max_body_bytes} bytes")
