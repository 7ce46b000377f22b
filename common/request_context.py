"""A request's id and trace context, carried across the hops (gateway -> FeatureRunner -> model runner).

- **Request id**: the gateway takes the client's ``X-Request-Id`` when it is a plain token (at most
  64 characters of ``[A-Za-z0-9._:-]``), else makes one, and answers with it; every internal call
  carries it (``outgoing``) and each runner adopts the one it was sent, so one id names the request
  in every service's logs and spans.
- **Traces** (``GSAGE_TRACING``): BentoML wraps each service in OpenTelemetry's ASGI middleware,
  which opens a span per request (exported by ``GSAGE_TRACING_OTLP_ENDPOINT``). An internal call
  carries the W3C ``traceparent`` of the span it is made in (OpenTelemetry's propagator), so the
  callee's span joins the caller's trace: one slow request can be followed hop by hop. The span
  gets the request id as its ``request.id`` attribute. A batch merged from several requests (the
  gateway's coalescer, the runners' batchers) travels under its first request's id and trace, in
  a ``batch`` span (``merged``) that names every member's id (``request.ids``) and links to each
  member's span; each other member's span gets a ``merged into batch`` event naming the batch's
  span, so a request's trace leads to the batch that served it whichever request led it. The
  gateway's gRPC calls get their span from ``common.bento.tracing`` (BentoML traces HTTP only) and
  answer the id in their trailing metadata.

The id lives in a context variable: set by the service's outermost middleware, it is seen by the
handler and by every call the handler makes in that task.
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Iterator, Sequence
from contextvars import Context, ContextVar
from typing import Any

REQUEST_ID_HEADER = "x-request-id"
_VALID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_current: ContextVar[str] = ContextVar("gsage_request_id", default="")
_tracing = {"on": False}
# The version (4) and variant (RFC 4122) bits of a random UUID, as uuid.UUID(version=4) sets them.
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def enable_tracing(on: bool) -> None:
    """Carry ``traceparent`` on internal calls (the service's tracing setting, at start)."""
    _tracing["on"] = on


def tracing_enabled() -> bool:
    return _tracing["on"]


def new_request_id() -> str:
    """A random version-4 UUID as 32 hex digits, like ``uuid.uuid4().hex``, from ``random``'s
    generator (seeded from the OS at import and again in each forked child) instead of a system
    call per request: an id names a request in the logs, it guards nothing."""
    return "%032x" % (random.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET)


def adopt(presented: str | None) -> str:
    """This request's id: ``presented`` when it is a plain token, else a new one; set as current."""
    request_id = presented if presented and _VALID.match(presented) else new_request_id()
    _current.set(request_id)
    if _tracing["on"]:
        from opentelemetry import trace

        trace.get_current_span().set_attribute("request.id", request_id)
    return request_id


def current() -> str:
    return _current.get()


def outgoing() -> dict[str, str]:
    """The headers of an internal call made for the current request."""
    request_id = _current.get()
    headers = {"X-Request-Id": request_id} if request_id else {}
    if _tracing["on"]:
        from opentelemetry.propagate import inject

        inject(headers)
    return headers


_NOT_TRACED: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


def merged(members: Sequence[Context]) -> contextlib.AbstractContextManager[None]:
    """The block of a call made for a batch of requests (``members``: each request's context, the
    first the one the call runs in): a ``batch`` span when tracing and the batch merged several."""
    if not _tracing["on"] or len(members) < 2:
        return _NOT_TRACED
    return _batch_span(members)


@contextlib.contextmanager
def _batch_span(members: Sequence[Context]) -> Iterator[None]:
    from opentelemetry import trace

    from common.bento import tracing

    spans: list[Any] = [m.run(trace.get_current_span) for m in members]
    links = [trace.Link(s.get_span_context()) for s in spans if s.get_span_context().is_valid]
    ids = [m.get(_current, "") for m in members]
    attributes = {"batch.size": len(members), "request.ids": ids}
    with tracing.tracer("graphsage.batching").start_as_current_span(
        "batch", links=links, attributes=attributes
    ) as span:
        batch = span.get_span_context()
        event = {"batch.trace_id": format(batch.trace_id, "032x"), "batch.span_id": format(batch.span_id, "016x")}
        for member in spans[1:]:
            member.add_event("merged into batch", event)
        yield
