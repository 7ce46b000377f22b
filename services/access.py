"""Who may call the gateway and how often: one authenticator and one rate limiter per process,
shared by the HTTP front end (``services.http_guard``) and the gRPC one (``services.grpc_server``),
so that a key's budget is one budget whichever protocol spends it.

With ``GSAGE_REDIS_URL`` set and a rate limit on, the limiter is ``RedisRateLimiter``: one bucket
per key for every worker and replica. Without Redis it is per process (each gateway worker then
allows the configured rate; one worker is the default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.auth import ApiKeyAuth
from services.ratelimit import RateLimiter


class GatewayAccess:
    """The authenticator and the rate limiter, built on first use in the process that serves
    (a Redis client belongs to the event loop of the worker that uses it)."""

    def __init__(self, build: Callable[[], tuple[ApiKeyAuth, Any]]) -> None:
        self._build = build
        self._built: tuple[ApiKeyAuth, Any] | None = None

    @classmethod
    def of(cls, auth: ApiKeyAuth, limiter: RateLimiter | Any) -> GatewayAccess:
        """Given ones (tests)."""
        return cls(lambda: (auth, limiter))

    def _get(self) -> tuple[ApiKeyAuth, Any]:
        if self._built is None:
            self._built = self._build()
        return self._built

    @property
    def auth(self) -> ApiKeyAuth:
        return self._get()[0]

    @property
    def limiter(self) -> Any:
        return self._get()[1]

    async def aclose(self) -> None:
        if self._built is not None and hasattr(self._built[1], "aclose"):
            await self._built[1].aclose()
