"""TLS, with a self-signed certificate made at test time: the gateway's HTTP and gRPC front ends
(certificate and key from the settings) and Redis over ``rediss://`` for the feature cache and the
rate limiter (the server verified against the configured CA)."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import numpy as np
import pytest

from harness.app import SplitApp, free_port
from harness.redis_servers import RedisServer, redis_available
from harness.tls import self_signed
from runners.feature.cache import RedisFeatureLevel
from services.ratelimit import RedisRateLimiter

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return self_signed(str(tmp_path_factory.mktemp("tls")))


@pytest.fixture
def tls_redis(tmp_path, cert):
    if not redis_available():
        pytest.skip("redis-server / redis-cli not installed")
    with RedisServer(str(tmp_path / "redis"), tls=cert) as server:
        yield server


def test_the_feature_cache_reads_and_writes_redis_over_tls(tls_redis, cert):
    rows = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)

    async def run(ca_file: str) -> tuple[np.ndarray, np.ndarray, int]:
        l2 = RedisFeatureLevel.from_url(
            tls_redis.tls_url, "graph-snapshot:tls", 8, ttl_s=60, timeout_s=2.0, retry_backoff_s=0.1, ca_file=ca_file
        )
        try:
            await l2.put(np.arange(4), rows)
            hit, got = await l2.get(np.arange(4))
            return got, hit, l2.errors
        finally:
            await l2.close()

    got, hit, errors = asyncio.run(run(cert.ca_file))
    assert errors == 0 and hit.all()
    np.testing.assert_array_equal(got, rows)
    assert tls_redis.dbsize() == 4  # the rows are in this server, written over its TLS port
    # Without the CA the self-signed server is not trusted: every call fails, nothing is read.
    _, hit, errors = asyncio.run(run(""))
    assert errors >= 1 and not hit.any()


def test_the_rate_limiter_shares_its_buckets_over_tls(tls_redis, cert):
    async def run() -> tuple[list[bool], dict]:
        limiter = RedisRateLimiter.from_url(
            tls_redis.tls_url, rate_per_s=0.001, burst=2, timeout_s=2.0, ca_file=cert.ca_file
        )
        try:
            return [(await limiter.acquire("key")).allowed for _ in range(3)], limiter.stats()
        finally:
            await limiter.aclose()

    allowed, stats = asyncio.run(run())
    assert allowed == [True, True, False] and stats == {"fallbacks": 0, "errors": 0}


def test_the_gateway_serves_https_and_grpc_over_tls(demo_store, cert, tmp_path):
    from services.grpc_client import predict as grpc_predict

    grpc_port = free_port()
    app = SplitApp(
        demo_store.home,
        {
            "GSAGE_MODEL_TAGS": demo_store.v1,
            "GSAGE_GRPC_PORT": str(grpc_port),
            "GSAGE_TLS_CERT_FILE": cert.cert_file,
            "GSAGE_TLS_KEY_FILE": cert.key_file,
        },
        log_dir=str(tmp_path),
    )
    try:
        app.start()
        https = app.gateway.url
        assert https.startswith("https://")
        body = {"node_ids": [1, 2, 3], "seed": 11}
        r = httpx.post(https + "/predict", json=body, verify=cert.ca_file, timeout=30)
        assert r.status_code == 200 and not r.json()["degraded"], r.text
        with pytest.raises(httpx.ConnectError):  # the certificate is verified, not trusted blindly
            httpx.post(https + "/predict", json=body, timeout=30)
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on the gateway's port
            httpx.post(https.replace("https://", "http://") + "/predict", json=body, timeout=5)
        # The runners stay plain HTTP on their internal hop (they carry no certificate).
        assert httpx.get(app.model.url + "/readyz", timeout=5).status_code == 200
        target = f"127.0.0.1:{grpc_port}"
        answer = grpc_predict(target, body["node_ids"], seed=11, tls_ca_file=cert.ca_file)
        assert [p["label"] for p in answer["predictions"]] == [p["label"] for p in r.json()["predictions"]]
        with pytest.raises(grpc.RpcError) as plain:
            grpc_predict(target, body["node_ids"], seed=11, timeout_s=5)
        assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        app.stop()
