"""BentoML's tracing, as this project uses it.

- ``tracer``: the tracer BentoML made for this process (``BentoMLContainer.tracer_provider``: its
  exporter, sampler and resource from the service's ``tracing`` config), for spans BentoML does not
  open itself: the gateway's gRPC server, which is the project's own, not BentoML's ASGI app.
  BentoML does not install its provider as OpenTelemetry's global one, so ``trace.get_tracer``
  would give a no-op tracer whose spans carry no context to propagate.
- ``install_untraced_pass_through``: BentoML puts OpenTelemetry's ASGI middleware around every
  service. With ``GSAGE_TRACING`` off, ``common.bento.config`` excludes every URL from it, so it
  makes no span, yet it still builds each request's URL and matches it against the exclusions
  before it passes the request on. Patched, it passes the request on at once: the same behaviour
  (no span, the same scope, receive and send handed on), without that work per request.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from common.request_context import tracing_enabled

log = logging.getLogger(__name__)

_traced_call: Callable[..., Awaitable[None]] | None = None  # OpenTelemetry's own __call__, once patched


def tracer(name: str) -> Any:
    from bentoml._internal.configuration.containers import BentoMLContainer

    return BentoMLContainer.tracer_provider.get().get_tracer(name)


@contextlib.contextmanager
def server_span(name: str, carrier: Mapping[str, str], attributes: Mapping[str, str]) -> Iterator[None]:
    """A SERVER span, current for the block, continuing the trace ``carrier``'s ``traceparent``
    names (a caller's), else starting one."""
    from opentelemetry import trace
    from opentelemetry.propagate import extract

    with tracer("graphsage.grpc").start_as_current_span(
        name, context=extract(dict(carrier)), kind=trace.SpanKind.SERVER, attributes=dict(attributes)
    ):
        yield


async def _call(self: Any, scope: Any, receive: Any, send: Any) -> None:
    if not tracing_enabled():  # every URL excluded (common.bento.config): what the original does, at once
        await self.app(scope, receive, send)
        return
    assert _traced_call is not None
    await _traced_call(self, scope, receive, send)


def install_untraced_pass_through() -> bool:
    """Patch OpenTelemetry's ASGI middleware in this process (idempotent). False, logged, where
    it is missing: then BentoML runs it as it is."""
    global _traced_call
    if _traced_call is not None:
        return True
    try:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    except ImportError:
        log.warning("OpenTelemetry's ASGI middleware not found: not patched")
        return False
    _traced_call = OpenTelemetryMiddleware.__call__
    OpenTelemetryMiddleware.__call__ = _call  # type: ignore[method-assign]
    return True
