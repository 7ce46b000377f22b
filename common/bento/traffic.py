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
  doing nothing) shows the effect on latency. The patched ``__call__`` keeps the contract (a
  request with no response started in time gets 504; once it has started, no deadline) with one
  ``common.deadline`` in the request's own task, lifted when the response starts: nothing left
  behind, no timer of its own, and no task per request (BentoML's runs the app in one).
- ``MaxConcurrencyMiddleware`` answers a request over ``max_concurrency`` with a 429 ``{"error":
  "Too many requests"}``: the status of a caller over its rate limit, without ``Retry-After``.
  Shedding load is the service's state, not the caller's: 503 with ``Retry-After: 1``, type
  ``overloaded``.
"""

from __future__ import annotations

import logging
from typing import Any

from common.bento import request_metrics, untraced
from common.deadline import deadline
from common.errors import ApiError, retry_after, send_error

log = logging.getLogger(__name__)

_installed = False


async def _timeout_call(self: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] not in ("http", "websocket"):
        await self.app(scope, receive, send)
        return
    # In this task, under a deadline the response's start lifts (``Deadline.lift``):
    # BentoML's runs the app in a task of its own per request, and a task's start and the waits on
    # it are event-loop turns in every service of every hop.
    responding = False

    async def _send(message: Any) -> None:
        nonlocal responding
        if not responding:
            responding = True
            if not limit.expired():  # expired: the cancellation is on its way, and wins
                limit.lift()
        await send(message)

    try:
        with deadline(self.timeout) as limit:
            await self.app(scope, receive, _send)
    except TimeoutError:
        if not limit.expired() or responding:  # the app's own timeout, or past the response's start
            raise
        await send_error(
            send, ApiError(504, f"not able to process the request in {self.timeout} seconds", type="timeout")
        )


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
    """Patch both middlewares in this process (idempotent), BentoML's per-request metrics, and
    OpenTelemetry's middleware's pass-through while tracing is off (``common.bento.untraced``).
    False, logged, if their shape is not the one this was written for: then BentoML runs
    unpatched."""
    global _installed
    if _installed:
        return True
    request_metrics.install()
    untraced.install()
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
