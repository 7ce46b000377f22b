"""Calling a dependency service: what its answers mean to the caller (the gateway calls the
FeatureRunner, the FeatureRunner calls the GraphSAGERunner).

- a 4xx answer: the dependency is healthy, the input was wrong -> ``RunnerRejected`` (not a
  breaker failure);
- a connection lost mid-call (a worker killed, a pooled connection closed): retried, calls are
  idempotent; a refused connection is not (the dependency is down);
- ``UPSTREAM_FAILED`` (502): a FeatureRunner saying that *its* dependency, the model runner,
  failed, which the gateway accounts to the model runner, not to the FeatureRunner.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, TypeVar

from bentoml.exceptions import BentoMLException

log = logging.getLogger("graphsage.remote")
T = TypeVar("T")

# BentoML itself never answers 502: a runner that does is relaying its own dependency's failure.
UPSTREAM_FAILED = 502

# A killed worker leaves several pooled keep-alive connections to it; a retry can draw another one
# before the event loop has seen its close (a 503 in 1 of 4 runs of tests/test_faults.py with one
# retry). The last retry waits a moment, by which time the dead connections are discarded.
CONNECTION_RETRY_PAUSES_S = (0.0, 0.02)

_ERROR_CLASSES: dict[int, type[BentoMLException]] = {}


def http_error(status: int, message: str) -> BentoMLException:
    """A BentoML exception that BentoML answers with ``status`` and ``{"error": message}``."""
    if status not in _ERROR_CLASSES:
        _ERROR_CLASSES[status] = type(f"Http{status}", (BentoMLException,), {"error_code": HTTPStatus(status)})
    return _ERROR_CLASSES[status](message)


def remote_status(exc: BaseException) -> int | None:
    """The HTTP status a dependency answered with, if the exception carries one."""
    code = getattr(exc, "error_code", None)
    try:
        return int(code) if code is not None else None
    except (TypeError, ValueError):
        return None


class RunnerRejected(Exception):
    """A runner answered 4xx: it is healthy, the input was wrong (not a breaker failure)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class UpstreamFailed(Exception):
    """The FeatureRunner answered ``UPSTREAM_FAILED``: the model runner behind it is unavailable."""


def _connection_lost(exc: BaseException) -> bool:
    import aiohttp

    return isinstance(exc, (ConnectionError, aiohttp.ClientConnectionError)) and not isinstance(
        exc, aiohttp.ClientConnectorError)  # refused: the runner is down, no point retrying


def rejecting_client_errors(fn: Callable[..., Awaitable[bytes]]) -> Callable[..., Awaitable[bytes]]:
    """Wrap a runner call: its 4xx answers raise ``RunnerRejected``, its 502 ``UpstreamFailed``,
    and a connection lost mid-call is retried."""

    async def call(*args: Any, **kwargs: Any) -> bytes:
        for attempt in range(len(CONNECTION_RETRY_PAUSES_S) + 1):
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                status = remote_status(exc)
                if status is not None and 400 <= status < 500:
                    raise RunnerRejected(status, error_message(exc)) from exc
                if status == UPSTREAM_FAILED:
                    raise UpstreamFailed(error_message(exc)) from exc
                if attempt < len(CONNECTION_RETRY_PAUSES_S) and _connection_lost(exc):
                    log.info("runner connection lost (%s); retrying", type(exc).__name__)
                    await asyncio.sleep(CONNECTION_RETRY_PAUSES_S[attempt])
                    continue
                raise
        raise AssertionError("unreachable")

    return call


class WaitBudget:
    """Seconds a caller may spend waiting on one dependency over several calls, spent only while
    it waits: the FeatureRunner's own work between its model runner calls (sampling, fetching,
    its batcher's queue) is not the model runner's time, and a slow FeatureRunner must not be
    reported as a slow model runner (a 503 and a model-breaker failure instead of its own)."""

    def __init__(self, seconds: float) -> None:
        self.left = seconds

    async def wait(self, call: Awaitable[T]) -> T:
        """``await call`` within what is left; ``TimeoutError`` once it is spent."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            return await asyncio.wait_for(call, max(0.0, self.left))
        finally:
            self.left -= loop.time() - started


def failure_reason(exc: BaseException) -> str:
    """A short reason for logs and error messages: ``timeout`` or the exception's type."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    return type(exc).__name__


def error_message(exc: BaseException) -> str:
    """The runner's own error text: BentoML wraps it as JSON (``[{"error": ...}]``)."""
    text = str(exc) or type(exc).__name__
    try:
        body = json.loads(text)
        while isinstance(body, list) and body:
            body = body[0]
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            text = body["error"]
    except ValueError:
        pass
    return text[:500]
