"""One error type from the core to the wire, across every hop: ``ApiError``.

An ``ApiError`` is an answer that is not a result: ``status`` (HTTP), ``message`` (for the
caller), ``type`` (what went wrong, machine-readable), ``param`` (the field or header at fault,
for bad input) and ``headers`` (``Retry-After``, ``WWW-Authenticate``). Every layer raises it and
every front end renders it the same way, without losing a part:

- HTTP: the body is ``ErrorBody`` (``{"error", "status", "type"[, "param"]}``, declared in the
  OpenAPI document of every service) with the error's own headers;
- a hop between the services: the caller reads the answer back into the same error
  (``from_answer``): the same kind (a ``KindOfError`` subclass the caller knows is rebuilt as that
  class), status, message, param and headers, so that what a runner said reaches a client
  unchanged and a caller acts on the kind, never on a status code;
- gRPC (``services.grpc_server``): the status mapped to a code, the message as details, the
  type, param and headers as trailers.

A family of errors with a meaning of its own subclasses ``KindOfError``: ``status_code`` and
``error_type`` on the class (the type defaults to the class name in snake case), a message per
instance. Every subclass is registered by its type, which is how ``from_answer`` finds it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, ClassVar

import orjson
from pydantic import BaseModel, Field

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

JSON = "application/json"
MAX_MESSAGE_CHARS = 1000
MAX_VALIDATION_ITEMS = 5
# The headers an error carries across a hop (the rest of a response's headers are the hop's own).
CARRIED_HEADERS = ("retry-after", "www-authenticate")
# The ASGI message key that marks an answer as an ApiError's: a guard passes it on untouched
# and translates only answers without it (BentoML's own).
ANSWER_MARK = "graphsage.error"

# The type of an error that names no kind of its own, by status.
TYPES_BY_STATUS = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "timeout",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "unprocessable",
    429: "rate_limited",
    500: "internal",
    501: "not_implemented",
    502: "bad_gateway",
    503: "unavailable",
    504: "timeout",
}


class ErrorBody(BaseModel):
    """Every error answer's body, on every route of every service."""

    error: str = Field(description="What went wrong, for a person: names the field and the reason for bad input.")
    status: int = Field(ge=400, le=599, description="The HTTP status of the answer.")
    type: str = Field(
        pattern=r"^[a-z][a-z0-9_]*$",
        description="What went wrong, for a program: e.g. `invalid_request`, `unknown_version`, "
        "`rate_limited`, `model_runner_unavailable`.",
    )
    param: str | None = Field(
        None, description="The field (`node_ids.0`) or header (`Content-Type`) at fault, for bad input."
    )


def type_for_status(status: int) -> str:
    return TYPES_BY_STATUS.get(status, "client_error" if 400 <= status < 500 else "server_error")


class ApiError(Exception):
    """An answer that is not a result. ``type`` defaults to the status's (``TYPES_BY_STATUS``)."""

    kinds: ClassVar[dict[str, type[KindOfError]]] = {}

    def __init__(
        self,
        status: int,
        message: str,
        headers: Mapping[str, str] | None = None,
        *,
        type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.headers = dict(headers or {})
        self.type = type or type_for_status(self.status)
        self.param = param

    @classmethod
    def unavailable(cls, message: str, retry_after_s: float, *, type: str | None = None) -> ApiError:
        """503 with ``Retry-After`` in whole seconds (at least 1)."""
        return cls(503, message, retry_after(retry_after_s), type=type)

    @classmethod
    def invalid(cls, exc: Any, what: str = "request") -> ApiError:
        """400 from a pydantic ``ValidationError``, naming each field and the reason; ``param``
        is the first field at fault."""
        errors = exc.errors(include_url=False)
        return cls(
            400, describe_validation(errors, what, exc.error_count()), param=_location(errors[0]) if errors else None
        )

    def to_body(self) -> ErrorBody:
        return ErrorBody(error=self.message, status=self.status, type=self.type, param=self.param)

    @property
    def body(self) -> bytes:
        doc: dict[str, Any] = {"error": self.message, "status": self.status, "type": self.type}
        if self.param is not None:
            doc["param"] = self.param
        return orjson.dumps(doc)

    def raw_headers(self, content_length: int | None = None) -> list[tuple[bytes, bytes]]:
        body_len = len(self.body) if content_length is None else content_length
        raw = [(b"content-type", JSON.encode()), (b"content-length", str(body_len).encode())]
        return raw + [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in self.headers.items()]

    @classmethod
    def from_answer(cls, status: int, body: bytes, headers: Mapping[str, str]) -> ApiError:
        """The error a service answered with (``status``, its ``ErrorBody`` and response
        ``headers``), rebuilt as the same error: a registered kind as its own class. An answer
        that is no ``ErrorBody`` (a proxy's, a crash page) becomes a plain error of its status."""
        carried = {name.title(): value for name, value in headers.items() if name.lower() in CARRIED_HEADERS}
        try:
            doc = ErrorBody.model_validate_json(body)
        except ValueError:
            text = body.decode("utf-8", "replace").strip()[:MAX_MESSAGE_CHARS]
            return ApiError(status, text or f"HTTP {status}", carried)
        kind = cls.kinds.get(doc.type)
        err = ApiError.__new__(kind) if kind is not None else ApiError.__new__(ApiError)
        ApiError.__init__(err, doc.status, doc.error, carried, type=doc.type, param=doc.param)
        return err

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.type}, {self.message!r})"


class KindOfError(ApiError):
    """A family of errors with a meaning of its own: ``status_code``, ``error_type`` (default:
    the class name in snake case) and ``headers_of_kind`` on the class, a message per instance
    (``raise UnknownModel("no model 'x'")``)."""

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = ""
    headers_of_kind: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "error_type" not in cls.__dict__:
            cls.error_type = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        known = ApiError.kinds.get(cls.error_type)
        if known is not None and known.__qualname__ != cls.__qualname__:  # (a module reloaded: the same)
            raise TypeError(
                f"error type {cls.error_type!r} of {cls.__module__}.{cls.__qualname__} is already "
                f"{known.__module__}.{known.__qualname__}'s: one kind, one type"
            )
        ApiError.kinds[cls.error_type] = cls

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(
            type(self).status_code, message, type(self).headers_of_kind, type=type(self).error_type, param=param
        )


def retry_after_seconds(seconds: float) -> int:
    return max(1, math.ceil(seconds)) if math.isfinite(seconds) else 1


def retry_after(seconds: float) -> dict[str, str]:
    """The ``Retry-After`` header of an error that clears in ``seconds``."""
    return {"Retry-After": str(retry_after_seconds(seconds))}


def _location(err: Mapping[str, Any]) -> str | None:
    return ".".join(str(p) for p in err.get("loc", ()) if p != "body") or None


def describe_validation(errors: Iterable[Mapping[str, Any]], what: str = "request", count: int | None = None) -> str:
    """``invalid request: node_ids.0: Input should be greater than or equal to 0; ...``"""
    errors = list(errors)
    parts = [f"{_location(err) or what}: {err.get('msg', 'invalid')}" for err in errors[:MAX_VALIDATION_ITEMS]]
    more = (len(errors) if count is None else count) - len(parts)
    return f"invalid {what}: " + "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


async def send_error(send: Send, exc: ApiError) -> None:
    """Answer an ASGI request with ``exc`` (marked as an ApiError's answer: ``ANSWER_MARK``)."""
    body = exc.body
    await send(
        {"type": "http.response.start", "status": exc.status, "headers": exc.raw_headers(len(body)), ANSWER_MARK: True}
    )
    await send({"type": "http.response.body", "body": body})
