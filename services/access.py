"""Who may call the gateway and how often: one authenticator and one rate limiter per process,
shared by the HTTP front end (``services.http_guard``) and the gRPC one (``services.grpc_server``),
so that a key's budget is one budget whichever protocol spends it.

With ``GSAGE_REDIS_URL`` set and a rate limit on, the limiter is ``RedisRateLimiter``: one bucket
per key for every worker and replica. Without Redis it is per process (each gateway worker then
allows the configured rate; one worker is the default).
"""

from __future__ import annotations

import functools
from typing import Any

from services.auth import ApiKeyAuth
from services.ratelimit import RateLimiter, build_rate_limiter


@functools.lru_cache(maxsize=1)
def gateway_access() -> tuple[ApiKeyAuth, RateLimiter]:
    """This process's authenticator and rate limiter, built once from the settings."""
    from common.settings import settings

    cfg = settings()
    return ApiKeyAuth.from_settings(cfg), build_rate_limiter(cfg)


def resolve_access(auth: ApiKeyAuth | None = None, limiter: Any | None = None) -> tuple[ApiKeyAuth, Any]:
    """The given authenticator and limiter (tests), else this process's."""
    if auth is not None and limiter is not None:
        return auth, limiter
    shared_auth, shared_limiter = gateway_access()
    # ``is None``, not ``or``: a LocalRateLimiter with no buckets yet has len() 0, i.e. is falsy.
    return (shared_auth if auth is None else auth, shared_limiter if limiter is None else limiter)
