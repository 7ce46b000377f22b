"""A request's headers as a guard judges them, and as everything behind the guard then sees them.

HTTP lets a request carry a header more than once, and the readers of one request disagree about
which copy counts: an ASGI app gets the list as sent, a dict built from it keeps the last copy,
and Starlette's ``Headers.get`` (what BentoML reads to choose how to deserialise a body, pickle
included) returns the first. A guard that judged one copy while BentoML acted on another let a
pickled body through with a valid token (docs/reliability.md, "Threat model").

So the headers that say what a body is or who sends it (``SINGLE_VALUED``) must come once: a
request with two is refused (400) before anything reads it. A guard then hands on a scope whose
headers it has rewritten to what it judged: exactly one ``Content-Type``, the canonical spelling
of an accepted media type, and no ``Content-Encoding``. Whatever reads the headers after the
guard reads the one value the guard admitted.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from common.errors import ApiError

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"
# Each decides how a body is read, which encoding undoes it, how it is framed, or who sends it.
SINGLE_VALUED = (
    "content-type",
    "content-encoding",
    "content-length",
    "transfer-encoding",
    "authorization",
    "x-api-key",
    "accept",
    "x-request-id",  # common.request_context: one id per request, across the hops
)
_DISPLAY = {"x-api-key": "X-API-Key", "x-request-id": "X-Request-Id"}
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class DuplicateHeader(ApiError):
    def __init__(self, name: str, count: int) -> None:
        shown = _DISPLAY.get(name, "-".join(part.capitalize() for part in name.split("-")))
        super().__init__(400, f"header {shown} sent {count} times; send it once", type="duplicate_header", param=shown)


class UnsupportedMediaType(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(415, message, param="Content-Type")


class NotAcceptable(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(406, message, param="Accept")


class RequestHeaders:
    """The single-valued headers of one request (lower-case names), each read once."""

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        """Raises ``DuplicateHeader`` for a second copy of any ``SINGLE_VALUED`` header."""
        values: dict[str, str] = {}
        counts: dict[str, int] = {}
        for key, value in raw:
            name = key.decode("latin-1").lower()
            if name in SINGLE_VALUED:
                counts[name] = counts.get(name, 0) + 1
                values[name] = value.decode("latin-1")
        for name in SINGLE_VALUED:  # the first in a fixed order: the same request, the same answer
            if counts.get(name, 0) > 1:
                raise DuplicateHeader(name, counts[name])
        self._values = values

    def get(self, name: str) -> str | None:
        return self._values.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._values

    @property
    def media_type(self) -> str:
        """``Content-Type`` without parameters, lower case; '' when absent."""
        return self._values.get("content-type", "").split(";")[0].strip().lower()

    def body_type(self, accepted: Iterable[str]) -> str:
        """The body's media type when it is one of ``accepted``; raises ``UnsupportedMediaType``
        otherwise, and for any ``Content-Encoding`` but identity (nothing here decodes one)."""
        accepted = tuple(accepted)
        kind = self.media_type
        if kind not in accepted:
            raise UnsupportedMediaType(
                f"media type {kind or '(none)'} is not accepted here; send " + " or ".join(accepted)
            )
        encoding = self._values.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            raise UnsupportedMediaType(f"content encoding {encoding} is not accepted here; send the body unencoded")
        return kind

    def check_accept(self, answer_type: str) -> None:
        """Raises ``NotAcceptable`` when an ``Accept`` header excludes ``answer_type``, the one
        media type the route answers in (errors are always JSON)."""
        accept = self._values.get("accept")
        if accept is None or not accept.strip():
            return
        family = answer_type.split("/")[0] + "/*"
        for item in accept.split(","):
            kind, *params = (part.strip().lower() for part in item.split(";"))
            if kind in (answer_type, family, "*/*") and _quality(params) > 0:
                return
        raise NotAcceptable(
            f"this route answers {answer_type}, which the Accept header ({accept.strip()[:100]}) excludes"
        )


def _quality(params: list[str]) -> float:
    """A media range's ``q`` (1 when absent, 0 when unreadable: not a preference to honour)."""
    for param in params:
        name, _, value = param.partition("=")
        if name.strip() == "q":
            try:
                return float(value.strip())
            except ValueError:
                return 0.0
    return 1.0


def with_body_type(scope: MutableMapping[str, Any], media_type: str) -> MutableMapping[str, Any]:
    """``scope`` with its headers as judged: one ``Content-Type`` (``media_type``, canonical) and
    no ``Content-Encoding``; every other header as sent."""
    kept = [(k, v) for k, v in scope.get("headers", ()) if k.lower() not in (b"content-type", b"content-encoding")]
    return {**scope, "headers": [*kept, (b"content-type", media_type.encode("latin-1"))]}
