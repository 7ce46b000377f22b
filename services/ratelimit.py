"""Token-bucket rate limiting per key (an API key's name, or a client address).

A bucket holds at most ``burst`` tokens and refills at ``rate_per_s`` tokens per second; a call
costing ``cost`` tokens is admitted when the bucket holds at least ``cost``. A denied call gets
``retry_after_s``: the time until enough tokens are back (the HTTP layer rounds it *up* to whole
seconds for ``Retry-After``). ``rate_per_s <= 0`` means unlimited: everything is admitted.
A ``cost`` above ``burst`` could never be paid; it is clamped to ``burst`` (the call is admitted
when the bucket is full and drains it) so that no request is starved forever.

* ``LocalRateLimiter``: one process, a dict of buckets, an injectable clock. Idle buckets are
  pruned once there are more than ``max_keys`` (a pruned bucket was full anyway, or is the least
  recently used one), so a stream of distinct keys cannot grow memory without bound.
* ``RedisRateLimiter``: one bucket per key shared by every gateway worker and replica. The
  refill-and-take is one atomic Lua script over a hash ``gsrl:<key> -> {tokens, ts}`` that
  expires once the bucket would be full again (so idle keys cost no memory). Time comes from the
  Redis server (``TIME``), so clocks of different gateway hosts never disagree about a bucket.
  Redis trouble never fails a request: any error or a call slower than ``timeout_s`` answers
  from a per-process ``LocalRateLimiter`` with the same rate (counted in ``fallbacks``), and a
  circuit breaker keeps later calls off Redis for ``retry_backoff_s`` before one probe retries.
  While falling back the limit is per process, i.e. more lenient by the number of workers.

Both are meant for one asyncio event loop (no locks; a bucket update never awaits mid-way).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from common.breaker import CircuitBreaker
from common.errors import ApiError, retry_after_seconds
from common.redis_client import make_client
from common.settings import AccessSection, RedisSection

log = logging.getLogger(__name__)

KEY_PREFIX = "gsrl:"
# Float slack: a client that waits exactly retry_after_s must not be denied by a rounding error.
EPSILON = 1e-9


@dataclasses.dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after_s: float = 0.0  # 0 when allowed
    remaining: float = math.inf  # tokens left after this call (inf when unlimited)


ALLOW_UNLIMITED = Decision(True, 0.0, math.inf)


def rate_limited(retry_after_s: float) -> ApiError:
    """The answer to a call over its key's budget (HTTP 429, gRPC RESOURCE_EXHAUSTED)."""
    return ApiError(429, "rate limit exceeded", {"Retry-After": str(retry_after_seconds(retry_after_s))})


def _check(rate_per_s: float, burst: float) -> None:
    if not math.isfinite(rate_per_s):
        raise ValueError(f"rate_per_s must be finite, got {rate_per_s}")
    if rate_per_s > 0 and not (burst >= 1 and math.isfinite(burst)):
        raise ValueError(f"burst must be >= 1 when rate limiting is on, got {burst}")


def _check_cost(cost: float) -> None:
    if not (cost >= 0 and math.isfinite(cost)):
        raise ValueError(f"cost must be a finite number >= 0, got {cost}")


class LocalRateLimiter:
    def __init__(
        self,
        rate_per_s: float,
        burst: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ) -> None:
        _check(rate_per_s, burst)
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst)
        self.max_keys = max_keys
        self._clock = clock
        # key -> [tokens, last refill time]; ordered by last use (LRU first).
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()

    @property
    def unlimited(self) -> bool:
        return self.rate_per_s <= 0

    def __len__(self) -> int:
        return len(self._buckets)

    def try_acquire(self, key: str, cost: float = 1) -> Decision:
        """The synchronous core of ``acquire``."""
        if self.unlimited:
            return ALLOW_UNLIMITED
        _check_cost(cost)
        cost = min(float(cost), self.burst)
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = [self.burst, now]
            self._buckets[key] = bucket
            if len(self._buckets) > self.max_keys:
                self._prune(now)
        else:
            self._buckets.move_to_end(key)
            elapsed = max(0.0, now - bucket[1])
            bucket[0] = min(self.burst, bucket[0] + elapsed * self.rate_per_s)
            bucket[1] = now
        if bucket[0] >= cost - EPSILON:
            bucket[0] = max(0.0, bucket[0] - cost)
            return Decision(True, 0.0, bucket[0])
        return Decision(False, (cost - bucket[0]) / self.rate_per_s, bucket[0])

    async def acquire(self, key: str, cost: float = 1) -> Decision:
        return self.try_acquire(key, cost)

    def _prune(self, now: float) -> None:
        full_after = self.burst / self.rate_per_s
        for key in [k for k, (_, ts) in self._buckets.items() if now - ts >= full_after]:
            del self._buckets[key]  # refilled to full: forgetting it changes nothing
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)  # least recently used


# KEYS[1] bucket hash; ARGV: rate per second, burst, cost. Returns {allowed, retry_after, tokens}
# with the floats as strings (Redis truncates Lua numbers in replies to integers).
# ts is in microseconds of server time: an integer < 2^53, exact in a Lua double.
_LUA_TOKEN_BUCKET = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
local elapsed = now - ts
if elapsed < 0 then elapsed = 0 end
tokens = math.min(burst, tokens + elapsed * rate / 1000000)
local allowed = 0
local retry = 0
if tokens >= cost - 1e-9 then
  tokens = math.max(0, tokens - cost)
  allowed = 1
else
  retry = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1],
  'tokens', string.format('%.17g', tokens), 'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {allowed, string.format('%.17g', retry), string.format('%.17g', tokens)}
"""


class RedisRateLimiter:
    def __init__(
        self,
        client: Any,  # redis.asyncio.Redis or RedisCluster
        rate_per_s: float,
        burst: float,
        *,
        timeout_s: float = 0.05,
        retry_backoff_s: float = 1.0,
        key_prefix: str = KEY_PREFIX,
        fallback: LocalRateLimiter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check(rate_per_s, burst)
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst)
        self.timeout_s = timeout_s
        self.key_prefix = key_prefix
        self._client = client
        self._script = client.register_script(_LUA_TOKEN_BUCKET)
        self.local = fallback or LocalRateLimiter(rate_per_s, burst, clock=clock)
        # One failure opens it: while Redis is down, calls skip it instead of each paying
        # a timeout; after retry_backoff_s one probe call tries Redis again.
        self.breaker = CircuitBreaker(
            "ratelimit-redis",
            failures=1,
            reset_s=retry_backoff_s,
            probe_timeout_s=max(retry_backoff_s, timeout_s),
            clock=clock,
        )
        self.fallbacks = 0  # calls answered by the local limiter (error, timeout or circuit open)
        self.errors = 0  # calls where Redis failed or timed out

    @classmethod
    def from_url(
        cls,
        url: str,
        rate_per_s: float,
        burst: float,
        *,
        timeout_s: float = 0.05,
        ca_file: str = "",
        **kwargs: Any,
    ) -> RedisRateLimiter:
        """A lazily connected client (``common.redis_client``): a Redis that is down at start-up
        just means fallback."""
        # socket_timeout is a backstop; wait_for fires first.
        client = make_client(url, timeout_s=timeout_s, socket_timeout_s=max(4 * timeout_s, 0.25), ca_file=ca_file)
        return cls(client, rate_per_s, burst, timeout_s=timeout_s, **kwargs)

    @property
    def unlimited(self) -> bool:
        return self.rate_per_s <= 0

    async def acquire(self, key: str, cost: float = 1) -> Decision:
        if self.unlimited:
            return ALLOW_UNLIMITED
        _check_cost(cost)
        cost = min(float(cost), self.burst)
        if not self.breaker.allow():
            self.fallbacks += 1
            return self.local.try_acquire(key, cost)
        try:
            allowed, retry, tokens = await asyncio.wait_for(
                self._script(keys=[self.key_prefix + key], args=[self.rate_per_s, self.burst, cost]),
                self.timeout_s,
            )
        except asyncio.CancelledError:
            self.breaker.release_probe()
            raise
        except Exception as exc:
            self.breaker.record_failure()
            self.errors += 1
            self.fallbacks += 1
            if self.errors == 1 or self.errors % 1000 == 0:
                log.warning(
                    "rate limiter: Redis failed (%s: %s); deciding per process (errors=%d)",
                    type(exc).__name__,
                    exc,
                    self.errors,
                )
            return self.local.try_acquire(key, cost)
        self.breaker.record_success()
        return Decision(bool(int(allowed)), float(retry), float(tokens))

    def stats(self) -> dict[str, int]:
        return {"fallbacks": self.fallbacks, "errors": self.errors}

    async def aclose(self) -> None:
        await self._client.aclose()


RateLimiter = LocalRateLimiter | RedisRateLimiter


def build_rate_limiter(
    access: AccessSection, redis: RedisSection, *, timeout_s: float = 0.05, retry_backoff_s: float = 1.0
) -> RateLimiter:
    """From ``GSAGE_RATE_LIMIT_PER_S`` / ``GSAGE_RATE_LIMIT_BURST``; shared through Redis when
    ``GSAGE_REDIS_URL`` is set, per process otherwise or when unlimited. ``timeout_s`` and
    ``retry_backoff_s``: a Redis call's deadline and the pause after a failure (then per process)."""
    rate, burst = access.rate_limit_per_s, access.rate_limit_burst
    if rate <= 0 or not redis.redis_url:
        return LocalRateLimiter(rate, burst)
    return RedisRateLimiter.from_url(
        redis.redis_url, rate, burst, timeout_s=timeout_s, retry_backoff_s=retry_backoff_s, ca_file=redis.redis_ca_file
    )
