"""A fix for BentoML's request-timeout middleware, which leaves a live timer behind every request.

``bentoml._internal.server.http.traffic.TimeoutMiddleware`` (1.4.x, ``traffic.timeout``) calls
``loop.call_later(timeout, ...)`` per request and never cancels it. Each request so leaves a
timer handle, a future, a context and a bound method alive for ``timeout`` seconds; under load
the garbage collector walks tens of thousands of them on every full collection, and a service's
P99 climbs with them. ``docs/bentoml-timeout-timer-leak.md`` is the minimal reproduction, ready
to report upstream; the suite's B2 baseline (a BentoML service doing nothing) shows the effect
on latency.

``install()`` replaces the middleware's ``__call__`` with the same logic plus cancelling the
timer once the response has started (after that the timer could only find the waiter done) or
the request ended. The timeout itself behaves as before: 504 if no response started in time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

_installed = False


async def _call(self: Any, scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] not in ("http", "websocket"):
        return await self.app(scope, receive, send)
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    timer = loop.call_later(self.timeout, self._set_timer_out, waiter)

    async def _send(message: Any) -> None:
        if not waiter.done():
            waiter.set_result(None)
        await send(message)

    fut = asyncio.ensure_future(self.app(scope, receive, _send), loop=loop)
    try:
        await waiter
    except asyncio.TimeoutError:
        if fut.cancel():
            from starlette.responses import JSONResponse

            resp = JSONResponse({"error": f"Not able to process the request in {self.timeout} seconds"},
                                status_code=504)
            await resp(scope, receive, send)
    else:
        timer.cancel()
        await fut
    finally:
        timer.cancel()


def middleware_class() -> type:
    """BentoML's TimeoutMiddleware (the class ``install`` patches)."""
    from bentoml._internal.server.http.traffic import TimeoutMiddleware

    return TimeoutMiddleware


def install() -> bool:
    """Patch BentoML's TimeoutMiddleware in this process (idempotent). False, logged, if its
    shape is not the one this fix was written for: then BentoML runs unpatched."""
    global _installed
    if _installed:
        return True
    try:
        TimeoutMiddleware = middleware_class()  # noqa: N806 - a class
    except ImportError:
        log.warning("BentoML TimeoutMiddleware not found: timer fix not installed")
        return False
    if not hasattr(TimeoutMiddleware, "_set_timer_out"):
        log.warning("BentoML TimeoutMiddleware changed shape: timer fix not installed")
        return False
    TimeoutMiddleware.__call__ = _call  # type: ignore[method-assign]
    _installed = True
    return True
