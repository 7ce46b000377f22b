"""Calling another service of this app: the gateway calls the FeatureRunner, the gateway and the
FeatureRunner call the GraphSAGERunner. A call names an ``Endpoint`` (``common.endpoints``) and
passes a typed value; the transport encodes it with the endpoint's codec and decodes the answer.

- ``HttpTransport``: the service over HTTP. This project's own client, in place of the proxy that
  ``bentoml.depends`` hands out: that proxy sends (and reads back) ``application/vnd.bentoml+pickle``
  for every call whose arguments are not a single raw body, and a pickle is code. Here a body is
  JSON or a binary format of this project's, with the service token in ``Authorization``, and an
  answer is read by the endpoint's codec, never unpickled. One aiohttp session per client keeps
  its connections for the life of the worker (the dependency proxy recycled its session every
  100 requests and closed it under calls in flight).
- ``LocalTransport``: a core in this process (BentoML's development mode runs dependencies
  in-process): the same endpoint, the same core method, the value as it is.

Either way an error is the ``ApiError`` the service raised (``ApiError.from_answer``): its kind,
status, message, param and ``Retry-After`` cross the hop, and the caller decides by the kind. A
service that cannot be reached, or that refuses this service's own token, raises
``ServiceUnavailable`` (503): the caller's configuration or the callee's health, never the
client's input. A connection lost mid-call is retried (for idempotent endpoints); a refused
connection is not (the service is down).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

from common.deadline import deadline
from common.endpoints import Endpoint, NoBody
from common.errors import ApiError, retry_after
from common.request_context import outgoing

log = logging.getLogger("graphsage.remote")
T = TypeVar("T")
I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

# A backstop only: callers bound each call by their own deadline (breaker, WaitBudget).
DEFAULT_TIMEOUT_S = 60.0


class ServiceUnavailable(ApiError):
    """A service of this app could not answer: unreachable, or it refused this service's token.
    ``sent``: the request may have reached it (a connection lost mid-call): its effect is unknown."""

    def __init__(self, service: str, reason: str, sent: bool = False) -> None:
        super().__init__(503, f"{service} unavailable: {reason}", retry_after(1.0), type="service_unavailable")
        self.service = service
        self.sent = sent


class Tokens(Protocol):
    def header(self) -> dict[str, str]: ...


class Transport(Protocol):
    """How a caller reaches one service, wherever it runs."""

    name: str

    async def call(self, endpoint: Endpoint[I, O], value: I) -> O: ...

    async def start(self) -> None:
        """Before the first call: a service in this process starts (a server needs nothing)."""

    async def close(self) -> None: ...


class Lifecycle(Protocol):
    """What starts and stops a service run in this process (``common.bento.dependencies``)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class HttpTransport:
    """A service over HTTP (``http://``, ``tcp://host:port`` or a ``file://`` unix socket)."""

    def __init__(
        self,
        name: str,
        url: str,
        tokens: Tokens,
        *,
        retry_pauses_s: tuple[float, ...],
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """``retry_pauses_s`` (``connection_retry_pauses_s``): a killed worker leaves several
        pooled keep-alive connections to it, and a retry can draw another one before the event
        loop has seen its close; by the last pause the dead ones are discarded
        (tests/test_faults.py kills a model worker under load)."""
        self.name = name
        self.url = url
        self._tokens = tokens
        self._timeout_s = timeout_s
        self._retry_pauses_s = retry_pauses_s
        self._session: Any = None

    def __repr__(self) -> str:
        return f"HttpTransport({self.name!r}, {self.url!r})"

    async def start(self) -> None:
        return None

    def _open(self) -> Any:
        import aiohttp

        scheme, _, rest = self.url.partition("://")
        connector: aiohttp.BaseConnector
        if scheme == "file":
            connector, base = aiohttp.UnixConnector(path=rest), "http://localhost"
        else:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            base = f"http://{rest}" if scheme == "tcp" else self.url
        return aiohttp.ClientSession(
            base.rstrip("/"),
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self._timeout_s),
            skip_auto_headers=("User-Agent",),
            auto_decompress=False,
        )

    async def call(self, endpoint: Endpoint[I, O], value: I) -> O:
        """``endpoint`` with ``value``; its decoded answer, or the service's ``ApiError``."""
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = self._open()
        headers = {"Content-Type": endpoint.takes.media_type, **self._tokens.header(), **outgoing()}
        body = None if isinstance(endpoint.takes, NoBody) and endpoint.method == "GET" else endpoint.takes.encode(value)
        for attempt in range(len(self._retry_pauses_s) + 1):
            try:
                async with self._session.request(endpoint.method, endpoint.path, data=body, headers=headers) as resp:
                    answer = await resp.read()
                    if resp.status < 400:
                        return endpoint.answers.decode(answer)
                    raise self._refusal(resp.status, answer, resp.headers)
            except aiohttp.ClientConnectorError as exc:  # refused: the service is down, no point retrying
                raise ServiceUnavailable(self.name, f"unreachable ({type(exc).__name__})") from exc
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as exc:
                # Lost mid-call, the answer cut off included (its worker killed while answering).
                if attempt == len(self._retry_pauses_s) or not endpoint.idempotent:
                    raise ServiceUnavailable(self.name, f"connection lost ({type(exc).__name__})", sent=True) from exc
                log.info("%s: connection lost (%s); retrying", self.name, type(exc).__name__)
                await asyncio.sleep(self._retry_pauses_s[attempt])
        raise AssertionError("unreachable")

    def _refusal(self, status: int, answer: bytes, headers: Any) -> ApiError:
        if status == 401:  # this service's own token: a deployment fault, not the client's
            return ServiceUnavailable(
                self.name,
                "it refused this service's token (GSAGE_SERVICE_TOKENS or "
                "GSAGE_SERVICE_TOKENS_FILE must be the same in every service)",
            )
        return ApiError.from_answer(status, answer, headers)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class LocalTransport:
    """A service's core in this process, behind the same interface. ``lifecycle``: what starts
    and stops the service (its startup and shutdown hooks, which BentoML runs only for the
    service a process was started for); ``start`` and ``close`` run it."""

    def __init__(self, name: str, core: Any, lifecycle: Lifecycle | None = None) -> None:
        self.name = name
        self.core = core
        self._lifecycle = lifecycle

    async def call(self, endpoint: Endpoint[I, O], value: I) -> O:
        return await endpoint.call(self.core, value)

    async def start(self) -> None:
        if self._lifecycle is not None:
            await self._lifecycle.start()

    async def close(self) -> None:
        if self._lifecycle is not None:
            await self._lifecycle.stop()


class WaitBudget:
    """Seconds a caller may spend waiting on one dependency over several calls, spent only while
    it waits: the FeatureRunner's own work between its model runner calls (sampling, fetching,
    its batcher's queue) is not the model runner's time, and a slow FeatureRunner must not be
    reported as a slow model runner."""

    def __init__(self, seconds: float) -> None:
        self.left = seconds

    async def wait(self, call: Awaitable[T]) -> T:
        """``await call`` within what is left; ``TimeoutError`` once it is spent."""
        if self.left <= 0:  # spent: the call is not started at all
            if inspect.iscoroutine(call):
                call.close()
            raise TimeoutError
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with deadline(self.left):  # in the caller's task, as the breaker's
                return await call
        finally:
            self.left -= loop.time() - started


def failure_reason(exc: BaseException) -> str:
    """A short reason for logs and error messages: ``timeout``, an error's type, or the
    exception's class."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, ApiError):
        return exc.type
    return type(exc).__name__
