"""One error type from the core to the wire: ``ApiError`` (status, message, headers).

Every layer raises it (a runner rejecting a tensor, the gateway's breaker refusing a call, a
guard refusing a key) and every front end renders it the same way, without losing a part:

- HTTP: ``{"error": message, "status": status}`` with the error's own headers (``Retry-After``,
  ``WWW-Authenticate``), through ``send_error`` (ASGI) or ``error_response`` (a handler's answer);
- gRPC (``services.grpc_server``): the status mapped to a code, the message as details, the
  headers as trailers.

Error bodies that BentoML itself writes (its request validation, an unknown route) and the
answers of a runner called over HTTP are read back into a message by ``message_from_body``, the
one parser of error bodies here. A validation error names each field and why
(``describe_validation``), over HTTP and gRPC alike.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

import orjson

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

JSON = "application/json"
MAX_MESSAGE_CHARS = 1000
MAX_VALIDATION_ITEMS = 5


class ApiError(Exception):
    """An answer that is not a result: ``status`` (HTTP), ``message`` (for the caller) and
    ``headers`` (kept on the way out). A subsystem's own errors subclass ``KindOfError``."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.headers = dict(headers or {})

    @classmethod
    def unavailable(cls, message: str, retry_after_s: float) -> ApiError:
        """503 with ``Retry-After`` in whole seconds (at least 1)."""
        return cls(503, message, {"Retry-After": str(retry_after_seconds(retry_after_s))})

    @classmethod
    def invalid(cls, exc: Any, what: str = "request") -> ApiError:
        """400 from a pydantic ``ValidationError``, naming each field and the reason."""
        return cls(400, describe_validation(exc.errors(include_url=False), what, exc.error_count()))

    @property
    def body(self) -> bytes:
        return orjson.dumps({"error": self.message, "status": self.status})

    def raw_headers(self, content_length: int | None = None) -> list[tuple[bytes, bytes]]:
        body_len = len(self.body) if content_length is None else content_length
        raw = [(b"content-type", JSON.encode()), (b"content-length", str(body_len).encode())]
        return raw + [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in self.headers.items()]

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r})"


class KindOfError(ApiError):
    """A family of errors with a status of its own: ``status_code`` on the class, a message per
    instance (``raise UnknownModel("no model 'x'")``)."""

    status_code = 500
    headers_of_kind: dict[str, str] = {}

    def __init__(self, message: str) -> None:
        super().__init__(type(self).status_code, message, type(self).headers_of_kind)


def retry_after_seconds(seconds: float) -> int:
    return max(1, math.ceil(seconds)) if math.isfinite(seconds) else 1


def describe_validation(errors: Iterable[Mapping[str, Any]], what: str = "request", count: int | None = None) -> str:
    """``invalid request: node_ids.0: Input should be greater than or equal to 0; ...``"""
    errors = list(errors)
    parts = []
    for err in errors[:MAX_VALIDATION_ITEMS]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or what
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    more = (len(errors) if count is None else count) - len(parts)
    return f"invalid {what}: " + "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def message_from_body(body: bytes) -> str:
    """One clear message from an error body: ours (``{"error", "status"}``), BentoML's
    (``{"error"}``, ``[{"error"}]``, a validation error with ``detail``) or plain text."""
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")[:MAX_MESSAGE_CHARS] or "error"
    while isinstance(doc, list) and len(doc) == 1 and isinstance(doc[0], dict):
        doc = doc[0]
    if isinstance(doc, dict) and isinstance(doc.get("detail"), list) and doc["detail"] \
            and all(isinstance(d, dict) and "msg" in d for d in doc["detail"]):
        return describe_validation(doc["detail"])[:MAX_MESSAGE_CHARS]
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        text = doc["error"]
        return (message_from_body(text.encode()) if text[:1] in "[{" else text)[:MAX_MESSAGE_CHARS] or "error"
    return orjson.dumps(doc).decode()[:MAX_MESSAGE_CHARS]


async def send_error(send: Send, exc: ApiError) -> None:
    """Answer an ASGI request with ``exc``."""
    body = exc.body
    await send({"type": "http.response.start", "status": exc.status, "headers": exc.raw_headers(len(body))})
    await send({"type": "http.response.body", "body": body})


def error_response(exc: ApiError) -> Any:
    """``exc`` as a Starlette response, for a handler to return (BentoML passes it through)."""
    from starlette.responses import Response

    return Response(exc.body, status_code=exc.status, headers=exc.headers, media_type=JSON)
