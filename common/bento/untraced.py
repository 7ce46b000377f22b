"""OpenTelemetry's ASGI middleware, which BentoML puts around every service, passing each request
straight on while ``GSAGE_TRACING`` is off.

With tracing off, ``common.bento.config`` excludes every URL from the middleware, so it makes no
span; yet it still builds each request's URL and matches it against the exclusions before it
hands the request on. Patched, it hands the request on at once: the same behaviour (no span, the
same scope, receive and send handed on) without that work per request. With tracing on, its own
``__call__`` runs as before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from common.request_context import tracing_enabled

log = logging.getLogger(__name__)

_traced_call: Callable[..., Awaitable[None]] | None = None  # OpenTelemetry's own __call__, once patched


async def _call(self: Any, scope: Any, receive: Any, send: Any) -> None:
    if not tracing_enabled():  # every URL excluded (common.bento.config): what the original does, at once
        await self.app(scope, receive, send)
        return
    assert _traced_call is not None
    await _traced_call(self, scope, receive, send)


def install() -> bool:
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
