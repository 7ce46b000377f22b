"""The lean L2 read connection (runners/feature/cache/resp.py) against a real redis-server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import redis.asyncio as aioredis

from harness.redis_servers import raw_command
from runners.feature.cache.l2_redis import RedisFeatureLevel
from runners.feature.cache.resp import RespConnection, RespError, pack_command


def test_pack_command_is_a_resp_array_of_bulk_strings():
    assert pack_command(b"MGET", b"a", b"") == b"*3\r\n$4\r\nMGET\r\n$1\r\na\r\n$0\r\n\r\n"


@pytest.mark.parametrize("version", ["graph-snapshot:abc", "snap:é%d"])
def test_the_l2_mget_command_packs_its_keys(version):
    level = RedisFeatureLevel.from_url(
        "redis://127.0.0.1:1/0", version, 4, ttl_s=1, timeout_s=0.1, retry_backoff_s=0.1
    )  # connects lazily: nothing is sent
    ids = np.array([0, 7, 10, 99, 12345, 2**40, 2**62])
    assert level.mget_command(ids) == pack_command(b"MGET", *level._keys(ids))


def test_l2_decode_counts_hits_misses_and_corrupt_rows():
    level = RedisFeatureLevel.from_url("redis://127.0.0.1:1/0", "v", 2, ttl_s=1, timeout_s=0.1, retry_backoff_s=0.1)
    a, b = np.array([1, 2], "<f4").tobytes(), np.array([3, 4], "<f4").tobytes()
    found, rows = level._decode([a, b])
    assert found.all() and rows.tolist() == [[1, 2], [3, 4]]
    found, rows = level._decode([a, None, b"short", b])
    assert found.tolist() == [True, False, False, True] and rows.tolist() == [[1, 2], [3, 4]]
    assert (level.hits, level.misses, level.corrupt) == (4, 2, 1)


@pytest.mark.integration
def test_concurrent_callers_get_their_own_replies(redis_standalone):
    async def body():
        conn = RespConnection("127.0.0.1", redis_standalone.port)
        await conn.execute(pack_command(b"MSET", *[x for i in range(200) for x in (b"k%d" % i, b"v%d" % i)]))
        keys = [[b"k%d" % i for i in range(j, j + 20)] + [b"missing"] for j in range(0, 180, 9)]
        replies = await asyncio.gather(*(conn.execute(pack_command(b"MGET", *ks)) for ks in keys))
        for ks, reply in zip(keys, replies):
            assert reply == [k.replace(b"k", b"v") for k in ks[:-1]] + [None]
        with pytest.raises(RespError, match="WRONGTYPE"):
            await conn.execute(pack_command(b"LPUSH", b"k1", b"x"))
        assert await conn.execute(pack_command(b"GET", b"k7")) == b"v7"  # an error reply leaves it usable
        conn.close()

    asyncio.run(body())


@pytest.mark.integration
def test_a_caller_that_gives_up_closes_the_connection_and_the_next_reconnects(redis_standalone):
    async def body():
        conn = RespConnection("127.0.0.1", redis_standalone.port)
        await conn.execute(pack_command(b"SET", b"a", b"1"))
        redis_standalone.pause()
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await conn.execute(pack_command(b"GET", b"a"))
        finally:
            redis_standalone.resume()
        # The stalled GET's reply must not be taken for this one (it reads b"1", this one b"2").
        await conn.execute(pack_command(b"SET", b"b", b"2"))
        assert await conn.execute(pack_command(b"GET", b"b")) == b"2"
        redis_standalone.kill()
        with pytest.raises(ConnectionError):
            await conn.execute(pack_command(b"GET", b"b"))
        redis_standalone.start()
        assert await conn.execute(pack_command(b"PING")) == b"PONG"
        conn.close()

    asyncio.run(body())


@pytest.mark.integration
def test_like_takes_auth_and_db_from_the_redis_py_client(redis_standalone):
    server = redis_standalone
    assert raw_command(server.port, "CONFIG", "SET", "requirepass", "s3cret").startswith(b"+OK")

    async def body():
        client = aioredis.Redis.from_url(f"redis://:s3cret@127.0.0.1:{server.port}/3")
        await client.set(b"x", b"in db 3")
        conn = RespConnection.like(client)
        assert conn is not None
        assert await conn.execute(pack_command(b"GET", b"x")) == b"in db 3"
        wrong = RespConnection("127.0.0.1", server.port, password="nope")
        with pytest.raises(RespError):
            await wrong.execute(pack_command(b"PING"))
        conn.close()
        await client.aclose()
        assert RespConnection.like(aioredis.Redis.from_url(f"rediss://127.0.0.1:{server.port}")) is None

    asyncio.run(body())
