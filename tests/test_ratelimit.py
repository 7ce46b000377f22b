"""Token buckets: local (fake clock) and shared through a throw-away redis-server."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from services.ratelimit import (
    Decision,
    LocalRateLimiter,
    RedisRateLimiter,
    build_rate_limiter,
)


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def acquire(limiter, key: str, cost: float = 1) -> Decision:
    return asyncio.run(limiter.acquire(key, cost))


def test_burst_then_deny_with_sensible_retry_after():
    clock = FakeClock()
    lim = LocalRateLimiter(rate_per_s=2.0, burst=5, clock=clock)
    decisions = [lim.try_acquire("k") for _ in range(5)]
    assert all(d.allowed for d in decisions)
    assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0]
    denied = acquire(lim, "k")
    assert not denied.allowed
    assert denied.retry_after_s == pytest.approx(0.5)  # one token at 2/s
    assert math.ceil(denied.retry_after_s) == 1  # what Retry-After carries
    assert not lim.try_acquire("k", cost=3).allowed
    assert lim.try_acquire("k", cost=3).retry_after_s == pytest.approx(1.5)


def test_refill_with_a_fake_clock_is_capped_at_burst():
    clock = FakeClock()
    lim = LocalRateLimiter(rate_per_s=10.0, burst=3, clock=clock)
    for _ in range(3):
        assert lim.try_acquire("k").allowed
    assert not lim.try_acquire("k").allowed
    clock.advance(0.1)  # exactly one token back
    assert lim.try_acquire("k").allowed
    assert not lim.try_acquire("k").allowed
    clock.advance(3600)  # a long idle: still only `burst` tokens
    assert sum(lim.try_acquire("k").allowed for _ in range(10)) == 3
    clock.advance(-5)  # a clock going backwards never mints tokens
    assert not lim.try_acquire("k").allowed


def test_buckets_are_per_key():
    clock = FakeClock()
    lim = LocalRateLimiter(rate_per_s=1.0, burst=2, clock=clock)
    assert lim.try_acquire("a").allowed and lim.try_acquire("a").allowed
    assert not lim.try_acquire("a").allowed
    assert lim.try_acquire("b").allowed and lim.try_acquire("b").allowed
    assert not lim.try_acquire("b").allowed


def test_unlimited_and_cost_rules():
    lim = LocalRateLimiter(rate_per_s=0, burst=1)
    assert all(lim.try_acquire("k", cost=1e6).allowed for _ in range(1000))
    assert len(lim) == 0  # no state kept at all
    clock = FakeClock()
    lim = LocalRateLimiter(rate_per_s=1.0, burst=4, clock=clock)
    big = lim.try_acquire("k", cost=100)  # clamped to burst: admitted when full, drains it
    assert big.allowed and big.remaining == 0
    assert lim.try_acquire("k", cost=0).allowed
    with pytest.raises(ValueError):
        lim.try_acquire("k", cost=-1)
    with pytest.raises(ValueError):
        LocalRateLimiter(rate_per_s=1.0, burst=0)


def test_idle_buckets_are_pruned_beyond_max_keys():
    clock = FakeClock()
    lim = LocalRateLimiter(rate_per_s=1.0, burst=2, clock=clock, max_keys=100)
    for i in range(100):
        lim.try_acquire(f"k{i}")
    clock.advance(10)  # all of them are full again
    lim.try_acquire("new")
    assert len(lim) == 1
    for i in range(250):
        lim.try_acquire(f"busy{i}")
    assert len(lim) <= 100


def test_build_rate_limiter_from_settings():
    from common.settings import load_settings

    cfg = load_settings({})
    assert build_rate_limiter(cfg.access, cfg.redis).try_acquire("k").allowed  # unlimited default
    cfg = load_settings({"GSAGE_RATE_LIMIT_PER_S": "5", "GSAGE_RATE_LIMIT_BURST": "7"})
    lim = build_rate_limiter(cfg.access, cfg.redis)
    assert isinstance(lim, LocalRateLimiter) and (lim.rate_per_s, lim.burst) == (5.0, 7.0)


# -- Redis: a real redis-server on a free port (the `redis_standalone` fixture) -------------------


@pytest.mark.integration
def test_redis_bucket_is_shared_between_limiter_instances(redis_standalone):
    async def scenario() -> None:
        a = RedisRateLimiter.from_url(redis_standalone.url, rate_per_s=1.0, burst=5, timeout_s=1.0)
        b = RedisRateLimiter.from_url(redis_standalone.url, rate_per_s=1.0, burst=5, timeout_s=1.0)
        try:
            got = [await (a if i % 2 else b).acquire("client") for i in range(5)]
            assert all(d.allowed for d in got)
            denied_a, denied_b = await a.acquire("client"), await b.acquire("client")
            assert not denied_a.allowed and not denied_b.allowed
            assert 0.5 < denied_b.retry_after_s <= 1.0
            assert (await a.acquire("other")).allowed  # per key
            # Refill in real (server) time: 1 token/s, so after ~1.1 s one more is admitted.
            await asyncio.sleep(1.1)
            assert (await b.acquire("client")).allowed
            assert not (await a.acquire("client")).allowed
            assert a.fallbacks == b.fallbacks == 0
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(scenario())
    # Idle buckets expire on their own (TTL = time to refill + 1 s).
    assert redis_standalone.dbsize() == 2


@pytest.mark.integration
def test_redis_down_falls_back_to_local_and_recovers(redis_standalone):
    async def scenario() -> None:
        lim = RedisRateLimiter.from_url(
            redis_standalone.url, rate_per_s=1.0, burst=3, timeout_s=0.2, retry_backoff_s=0.3
        )
        try:
            assert (await lim.acquire("k")).allowed
            redis_standalone.kill()
            t0 = time.perf_counter()
            decisions = [await lim.acquire("k") for _ in range(5)]
            elapsed = time.perf_counter() - t0
            # Never an exception; the local bucket (fresh, burst 3) decides.
            assert [d.allowed for d in decisions] == [True, True, True, False, False]
            assert lim.fallbacks == 5 and lim.errors == 1  # the breaker spares the rest
            assert elapsed < 1.0
            redis_standalone.start()  # same port, empty data
            await asyncio.sleep(0.35)  # past retry_backoff_s: the next call probes Redis
            assert (await lim.acquire("k")).allowed
            assert lim.fallbacks == 5
            assert redis_standalone.dbsize() == 1
        finally:
            await lim.aclose()

    asyncio.run(scenario())


@pytest.mark.integration
@pytest.mark.slow
def test_one_budget_per_key_across_gateway_workers_and_both_protocols(demo_store, redis_standalone, tmp_path):
    """Two gateway workers, HTTP and gRPC, Redis configured: a key's burst is spent once,
    whichever worker and protocol spend it (per-process buckets would allow it per worker and
    per protocol, several times over)."""
    import grpc
    import httpx

    from harness.app import SplitApp, free_port
    from services.grpc_client import predict as grpc_predict

    burst, rate = 6, 0.05  # a refill every 20 s: within the test the budget is the burst alone
    grpc_port = free_port()
    app = SplitApp(
        demo_store.home,
        {
            "GSAGE_MODEL_TAGS": demo_store.v1,
            "GSAGE_GATEWAY_WORKERS": "2",
            "GSAGE_GRPC_PORT": str(grpc_port),
            "GSAGE_REDIS_URL": redis_standalone.url,
            "GSAGE_RATE_LIMIT_PER_S": str(rate),
            "GSAGE_RATE_LIMIT_BURST": str(burst),
        },
        log_dir=str(tmp_path),
    )
    try:
        app.start()
        started = time.monotonic()
        http = [
            httpx.post(app.gateway.url + "/predict", json={"node_ids": [i]}, timeout=30).status_code for i in range(4)
        ]  # a new connection each: the kernel spreads them over the workers
        grpc_codes = []
        for i in range(4):
            try:
                grpc_predict(f"127.0.0.1:{grpc_port}", [i], timeout_s=30)
                grpc_codes.append("OK")
            except grpc.RpcError as exc:
                grpc_codes.append(exc.code().name)
        http += [
            httpx.post(app.gateway.url + "/predict", json={"node_ids": [i]}, timeout=30).status_code for i in range(8)
        ]
        elapsed = time.monotonic() - started
        # The budget lives in Redis, not in a worker: the bucket both protocols spent is there
        # (a per-process limiter would give the same counts if every call met one worker).
        from harness.redis_servers import raw_command

        assert b"gsrl:" in raw_command(redis_standalone.port, "KEYS", "gsrl:*")
    finally:
        app.stop()
    allowed = http.count(200) + grpc_codes.count("OK")
    refill = math.floor(elapsed * rate)
    assert burst <= allowed <= burst + refill, (http, grpc_codes, elapsed)
    assert set(http) <= {200, 429} and set(grpc_codes) <= {"OK", "RESOURCE_EXHAUSTED"}
    assert http[:4] == [200] * 4 and grpc_codes[:2] == ["OK", "OK"]  # the burst, in order of spending
    assert "RESOURCE_EXHAUSTED" in grpc_codes and 429 in http  # refused on both protocols once spent
