"""One way to turn ``Settings.redis_url`` into a redis-py asyncio client, for the feature cache
(L2) and the gateway's rate limiter alike.

URLs: ``redis://host:port/db`` (standalone), ``redis+cluster://host:port`` (Redis Cluster, any
node as the seed), and ``rediss://`` / ``rediss+cluster://`` for TLS, verified against
``Settings.redis_ca_file`` (a PEM bundle) when set, else the system's CA store. Clients connect
lazily (a Redis that is down at start-up is a miss or a local decision, not a failed start) and
never retry on their own: the caller's circuit breaker is the retry policy.
"""

from __future__ import annotations

from typing import Any

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
SCHEMES = frozenset({"redis", "rediss", *CLUSTER_SCHEMES})


def parse_url(url: str, cluster: bool | None = None) -> tuple[str, bool]:
    """``(url redis-py understands, is_cluster)``; ``cluster`` overrides the scheme."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"not a redis URL: {url!r} (schemes: {', '.join(sorted(SCHEMES))})")
    plain = CLUSTER_SCHEMES.get(scheme)
    if plain is not None:
        return f"{plain}://{rest}", True if cluster is None else cluster
    return url, bool(cluster)


def is_tls(url: str) -> bool:
    return url.partition("://")[0] in ("rediss", "rediss+cluster")


def make_client(
    url: str, *, timeout_s: float, socket_timeout_s: float, ca_file: str = "", cluster: bool | None = None
) -> Any:
    """A lazily connected ``redis.asyncio.Redis`` or ``RedisCluster`` for ``url``."""
    from redis.asyncio import Redis, RedisCluster
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    plain_url, is_cluster = parse_url(url, cluster)
    kwargs: dict[str, Any] = dict(
        socket_connect_timeout=timeout_s, socket_timeout=socket_timeout_s, retry=Retry(NoBackoff(), 0)
    )
    if is_tls(url) and ca_file:
        kwargs["ssl_ca_certs"] = ca_file
    return (RedisCluster if is_cluster else Redis).from_url(plain_url, **kwargs)
