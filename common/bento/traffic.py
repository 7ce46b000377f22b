"""BentoML's traffic middlewares (``bentoml._internal.server.http.traffic``, ``traffic.timeout``
and ``traffic.max_concurrency``), patched in place: the timer leak fixed, and their refusals
answered as every other error here (``common.errors.ApiError``: the ``ErrorBody`` shape, a type,
``Retry-After`` on an overload). Both sit outside a service's own middleware, so no guard of this
project ever sees what they answer.

- ``TimeoutMiddleware`` calls ``loop.call_later(timeout, ...)`` per request and never cancels it.
  Each request so leaves a timer handle, a future, a context and a bound method alive for
  ``timeout`` seconds; under load the garbage collector walks tens of thousands of them on every
  full collection, and a service's P99 climbs with them. ``docs/bentoml-timeout-timer-leak.md`` is
  the minimal reproduction, ready to report upstream; the suite's B2 baseline (a BentoML service
  doing nothing) shows the effect on latency. The patched ``__call__`` is the same logic plus
  cancelling the timer once the response has started (after that the timer could only find the
  waiter done) or the request ended; a request with no response in time still gets 504.
- ``MaxConcurrencyMiddleware`` answers a request over ``max_concurrency`` with a 429 ``{"error":
  "Too many requests"}``: the status of a caller over its rate limit, without ``Retry-After``.
  Shedding load is the service's state, not the caller's: 503 with ``Retry-After: 1``, type
  ``overloaded``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from common.errors import ApiError, retry_after, send_error

log = logging.getLogger(__name__)

_installed = False


async def _timeout_call(self: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] not in ("http", "websocket"):
        await self.app(scope, receive, send)
        return
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
    except TimeoutError:
        if fut.cancel():
            await send_error(
                send, ApiError(504, f"not able to process the request in {self.timeout} seconds", type="timeout")
            )
    else:
        timer.cancel()
        await fut
    finally:
        timer.cancel()


async def _concurrency_call(self: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] not in ("http", "websocket") or scope["path"] in self.skip_paths:
        await self.app(scope, receive, send)
        return
    if self._semaphore.locked():
        return await send_error(
            send, ApiError(503, "too many requests in flight here; retry shortly", retry_after(1.0), type="overloaded")
        )
    async with self._semaphore:
        await self.app(scope, receive, send)


def middleware_classes() -> tuple[type, type]:
    """BentoML's TimeoutMiddleware and MaxConcurrencyMiddleware (the classes ``install`` patches)."""
    from bentoml._internal.server.http.traffic import MaxConcurrencyMiddleware, TimeoutMiddleware

    return TimeoutMiddleware, MaxConcurrencyMiddleware


def install() -> bool:
    """Patch both middlewares in this process (idempotent). False, logged, if their shape is not
    the one this was written for: then BentoML runs unpatched."""
    global _installed
    if _installed:
        return True
    try:
        timeout, concurrency = middleware_classes()
    except ImportError:
        log.warning("BentoML traffic middlewares not found: not patched")
        return False
    if not hasattr(timeout, "_set_timer_out"):
        log.warning("BentoML TimeoutMiddleware changed shape: not patched")
        return False
    timeout.__call__ = _timeout_call  # type: ignore[method-assign]
    concurrency.__call__ = _concurrency_call  # type: ignore[method-assign]
    _installed = True
    return True
