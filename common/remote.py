"""Calling another service of this app: the gateway calls the FeatureRunner, the gateway and the
FeatureRunner call the GraphSAGERunner.

``RunnerClient`` is this project's own client for those hops, in place of the proxy that
``bentoml.depends`` hands out: that proxy sends (and reads back) ``application/vnd.bentoml+pickle``
for every call whose arguments are not a single raw body, and a pickle is code. Here a call is
``POST /<route>`` with either the binary wire format (``common.wire``, the hot paths) or JSON (the
admin calls: ``load``, ``unload``, ``models``, ``info``), the service token in ``Authorization``,
and the answer is read as bytes or JSON, never unpickled. One aiohttp session per client keeps
its connections for the life of the worker (the dependency proxy recycled its session every 100
requests and closed it under calls in flight).

What an answer means to the caller:

- a 4xx: the runner is healthy, the input was wrong -> ``RunnerRejected`` (not a breaker failure);
- ``UPSTREAM_FAILED`` (502): a FeatureRunner saying that *its* dependency, the model runner,
  failed -> ``UpstreamFailed``, which the gateway accounts to the model runner;
- any other 5xx -> ``RunnerFailed``;
- a connection lost mid-call (a worker killed, a pooled connection closed): retried, calls are
  idempotent; a refused connection is not (the runner is down).

``LocalRunner`` gives the same interface over a service instance in this process (BentoML's
development mode runs dependencies in-process); ``common.bento.dependencies.connect`` picks one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

import orjson

from common.errors import ApiError, message_from_body

log = logging.getLogger("graphsage.remote")
T = TypeVar("T")

# BentoML itself never answers 502: a runner that does is relaying its own dependency's failure.
UPSTREAM_FAILED = 502
JSON = "application/json"
OCTET_STREAM = "application/octet-stream"

# A backstop only: callers bound each call by their own deadline (breaker, WaitBudget).
DEFAULT_TIMEOUT_S = 60.0


class RunnerRejected(Exception):
    """A runner answered 4xx: it is healthy, the input was wrong (not a breaker failure)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class UpstreamFailed(Exception):
    """The FeatureRunner answered ``UPSTREAM_FAILED``: the model runner behind it is unavailable."""


class RunnerFailed(Exception):
    """A runner answered 5xx (other than ``UPSTREAM_FAILED``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def raise_for_answer(status: int, message: str) -> None:
    if 400 <= status < 500:
        raise RunnerRejected(status, message)
    if status == UPSTREAM_FAILED:
        raise UpstreamFailed(message)
    raise RunnerFailed(status, message)


class Runner(Protocol):
    """What a caller needs of a runner, wherever it runs."""

    name: str

    async def call_bytes(self, route: str, body: bytes) -> bytes: ...

    async def call_json(self, route: str, payload: dict[str, Any] | None = None, *,
                        idempotent: bool = True) -> Any: ...

    async def close(self) -> None: ...


class RunnerClient:
    """A runner over HTTP (``http://``, ``tcp://host:port`` or a ``file://`` unix socket)."""

    def __init__(self, name: str, url: str, tokens: Any, *, retry_pauses_s: tuple[float, ...],
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """``retry_pauses_s`` (``Settings.connection_retry_pauses_s``): a killed worker leaves
        several pooled keep-alive connections to it, and a retry can draw another one before the
        event loop has seen its close; by the last pause the dead ones are discarded
        (tests/test_faults.py kills a model worker under load)."""
        self.name = name
        self.url = url
        self._tokens = tokens
        self._timeout_s = timeout_s
        self._retry_pauses_s = retry_pauses_s
        self._session: Any = None

    def __repr__(self) -> str:
        return f"RunnerClient({self.name!r}, {self.url!r})"

    def _open(self) -> Any:
        import aiohttp

        scheme, _, rest = self.url.partition("://")
        connector: aiohttp.BaseConnector
        if scheme == "file":
            connector, base = aiohttp.UnixConnector(path=rest), "http://localhost"
        else:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            base = f"http://{rest}" if scheme == "tcp" else self.url
        return aiohttp.ClientSession(base.rstrip("/"), connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                                     skip_auto_headers=("User-Agent",), auto_decompress=False)

    async def call_bytes(self, route: str, body: bytes) -> bytes:
        """``POST /route`` with a binary body; the answer's bytes."""
        return await self._post(route, body, OCTET_STREAM)

    async def call_json(self, route: str, payload: dict[str, Any] | None = None, *, idempotent: bool = True) -> Any:
        """``POST /route`` with a JSON object; the answer as JSON. ``idempotent=False``: a
        connection lost mid-call is not retried (the call may have taken effect)."""
        return orjson.loads(await self._post(route, orjson.dumps(payload or {}), JSON, idempotent))

    async def _post(self, route: str, body: bytes, media_type: str, idempotent: bool = True) -> bytes:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = self._open()
        headers = {"Content-Type": media_type, **self._tokens.header()}
        for attempt in range(len(self._retry_pauses_s) + 1):
            try:
                async with self._session.post("/" + route, data=body, headers=headers) as resp:
                    answer = await resp.read()
                    if resp.status < 400:
                        return answer
                    raise_for_answer(resp.status, message_from_body(answer))
            except aiohttp.ClientConnectorError:
                raise  # refused: the runner is down, no point retrying
            except (aiohttp.ClientConnectionError, ConnectionError) as exc:
                if attempt == len(self._retry_pauses_s) or not idempotent:
                    raise
                log.info("%s: connection lost (%s); retrying", self.name, type(exc).__name__)
                await asyncio.sleep(self._retry_pauses_s[attempt])
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class LocalRunner:
    """A runner instance in this process, behind the same interface: binary routes call its
    ``<route>_body(bytes)`` method, JSON routes its API method with the payload's keywords."""

    def __init__(self, name: str, instance: Any) -> None:
        self.name = name
        self.instance = instance

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except ApiError as exc:
            raise_for_answer(exc.status, exc.message)
            raise  # unreachable: raise_for_answer always raises

    async def call_bytes(self, route: str, body: bytes) -> bytes:
        return await self._call(getattr(self.instance, f"{route}_body")(body))

    async def call_json(self, route: str, payload: dict[str, Any] | None = None, *, idempotent: bool = True) -> Any:
        answer = await self._call(getattr(self.instance, route)(**(payload or {})))
        return orjson.loads(orjson.dumps(answer))  # what a remote caller would read

    async def close(self) -> None:
        return None


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
