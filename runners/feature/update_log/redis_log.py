"""``RedisUpdateLog(client)``: the update log as a Redis Stream (standalone or Cluster; the keys share a hash tag,
hence one slot)::

    {<key>}:stream    entries with id "<sequence>-1", one field b"p" = the payload JSON above
    {<key>}:head      the last sequence (kept by trims, which only shorten the stream)
    {<key>}:workers   hash: worker -> status JSON

``append`` is one Lua script (``APPEND_SCRIPT``: compare the head, XADD, SET the head), so the
compare-and-append is atomic. It is as durable as the server is configured to be: run Redis
with ``appendonly yes`` and ``appendfsync always`` (and replicas with ``WAIT`` if wanted) for
"acknowledged means kept"; a Redis that restarts empty starts the log again from 0. Nor may
the server evict: the keys have no TTL, so ``noeviction`` or a ``volatile-*`` policy keeps
them, and a full server then refuses appends (``LogUnavailable``) instead of dropping entries.
``check_durability`` (the FeatureRunner calls it at start) reads these settings from the server,
every master of a Cluster, and logs a warning for each one that can lose acknowledged entries.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import orjson

from runners.feature.update_log import base
from runners.feature.update_log.base import (
    LogEntry,
    LogTrimmed,
    LogUnavailable,
    SequenceConflict,
    check_after,
    check_worker,
    encode_ops,
    entry_of,
    fresh_statuses,
    log,
    payload_of,
)

# KEYS: stream, head. ARGV: expected head, payload. {1, seq} appended, {0, head} a conflict.
# string.format('%d'): Lua 5.1's tostring of a number switches to exponent notation at 1e14.
APPEND_SCRIPT = """
local head = tonumber(redis.call('GET', KEYS[2]) or 0)
if head ~= tonumber(ARGV[1]) then
  return {0, head}
end
local seq = head + 1
redis.call('XADD', KEYS[1], string.format('%d-1', seq), 'p', ARGV[2])
redis.call('SET', KEYS[2], string.format('%d', seq))
return {1, seq}
"""
# KEYS: stream, head. ARGV: first id, count. The head and the entries from one moment, so that
# "nothing returned although head > after" reliably means trimmed (not appended in between).
READ_SCRIPT = """#!lua flags=no-writes
local head = tonumber(redis.call('GET', KEYS[2]) or 0)
return {head, redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])}
"""


def _redis_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisClusterException, RedisError

    # RedisClusterException (no node reachable at all) is not a RedisError; OSError covers a
    # socket error redis-py did not wrap (and TimeoutError, an OSError).
    return (RedisError, RedisClusterException, OSError)


# What a Redis server must be configured with for "acknowledged means kept" (see durability_problems).
DURABILITY_SETTINGS = ("appendonly", "appendfsync", "maxmemory-policy")
LOSS = "acknowledged graph updates can be lost"


def durability_problems(server: str, config: dict[str, str | None]) -> list[str]:
    """Why ``server``, configured as ``config`` (``DURABILITY_SETTINGS`` -> value, None where the
    server did not say), can lose acknowledged log entries; [] when it cannot."""
    problems = []
    policy = config.get("maxmemory-policy")
    if policy is None:
        problems.append(
            f"Redis {server}: maxmemory-policy could not be read; if it is not noeviction, {LOSS} "
            "when the server is full"
        )
    elif policy != "noeviction" and not policy.startswith("volatile-"):
        # volatile-* policies evict only keys with a TTL, and the log's keys have none.
        problems.append(
            f"Redis {server}: maxmemory-policy {policy} evicts keys without a TTL when the server is "
            f"full, the update log's among them: {LOSS} (use noeviction)"
        )
    appendonly, appendfsync = config.get("appendonly"), config.get("appendfsync")
    if appendonly is None:
        problems.append(f"Redis {server}: appendonly could not be read; without it, {LOSS} when the server restarts")
    elif appendonly != "yes":
        problems.append(
            f"Redis {server}: appendonly {appendonly}: the update log is not written to disk before an "
            f"update is acknowledged, so {LOSS} when the server restarts (use appendonly yes, "
            "appendfsync always)"
        )
    elif appendfsync is None:
        problems.append(
            f"Redis {server}: appendfsync could not be read; unless it is always, {LOSS} when the host fails"
        )
    elif appendfsync != "always":
        problems.append(
            f"Redis {server}: appendfsync {appendfsync}: the append-only file is not fsynced before an "
            f"update is acknowledged, so {LOSS} when the host fails (use appendfsync always)"
        )
    return problems


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _seq_of(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


class RedisUpdateLog:
    """The update log as a Redis Stream (see the module docstring). The log owns ``client``
    (``close`` closes it). ``wait`` blocks in slices of ``max_block_s``, which must stay below
    the client's socket timeout (a blocked read is a silent socket)."""

    def __init__(self, client: Any, key: str = "gsage-updates", max_block_s: float = 1.0):
        if not key or any(c in key for c in "{} \t\r\n"):
            raise ValueError(f"key must be non-empty, without braces or whitespace: {key!r}")
        self.client = client
        self.key = key
        self.max_block_s = max_block_s
        # One hash tag: a Cluster keeps the three keys in one slot, so the scripts may touch them.
        self.stream_key = f"{{{key}}}:stream"
        self.head_key = f"{{{key}}}:head"
        self.workers_key = f"{{{key}}}:workers"
        self._append = client.register_script(APPEND_SCRIPT)
        self._read = client.register_script(READ_SCRIPT)
        self._errors = _redis_errors()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        ca_file: str = "",
        key: str = "gsage-updates",
        timeout_s: float = 2.0,
        socket_timeout_s: float = 5.0,
    ) -> RedisUpdateLog:
        from common.redis_client import make_client

        client = make_client(url, timeout_s=timeout_s, socket_timeout_s=socket_timeout_s, ca_file=ca_file)
        return cls(client, key, max_block_s=socket_timeout_s / 2)

    @contextlib.contextmanager
    def _unavailable(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._errors as exc:
            raise LogUnavailable(f"redis {what} ({self.key}): {type(exc).__name__}: {exc}") from exc

    async def head(self) -> int:
        with self._unavailable("head"):
            value = await self.client.get(self.head_key)
        return int(value or 0)

    async def append(self, ops: list[dict], expected_head: int) -> LogEntry:
        """Raises LogUnavailable when Redis did not answer; after a timeout the script may have
        run (outcome unknown): a retry with the same expected_head then gets SequenceConflict."""
        ops_json = encode_ops(ops)
        acked_at = base.wall_clock()
        with self._unavailable("append"):
            ok, seq = await self._append(
                keys=[self.stream_key, self.head_key], args=[expected_head, payload_of(ops_json, acked_at)]
            )
        if not ok:
            raise SequenceConflict(expected_head, int(seq))
        return LogEntry(int(seq), orjson.loads(ops_json), acked_at)

    async def read(self, after: int, limit: int = 1000) -> list[LogEntry]:
        check_after(after)
        if limit < 1:
            return []
        with self._unavailable("read"):
            head, raw = await self._read(keys=[self.stream_key, self.head_key], args=[f"{after + 1}-0", limit])
        entries = []
        for entry_id, fields in raw:
            values = dict(zip(fields[::2], fields[1::2]))  # a script returns the flat field list
            entries.append(entry_of(_seq_of(entry_id), values[b"p"]))
        # Sequences are contiguous: a first entry past after + 1, or none although the head is
        # past after, means the wanted ones were trimmed.
        if (entries and entries[0].sequence != after + 1) or (not entries and int(head) > after):
            raise LogTrimmed(f"entry {after + 1} was trimmed from {self.stream_key}")
        return entries

    async def wait(self, after: int, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if await self.head() > after:  # also true when those entries were trimmed since
            return True
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            block_ms = max(1, int(min(remaining, self.max_block_s) * 1000))
            with self._unavailable("wait"):
                # XREAD returns ids greater than the one given: "<after>-1" -> sequences > after.
                got = await self.client.xread({self.stream_key: f"{after}-1"}, count=1, block=block_ms)
            if got:
                return True

    async def trim(self, upto: int) -> int:
        with self._unavailable("trim"):
            return int(await self.client.xtrim(self.stream_key, minid=f"{upto + 1}-0", approximate=False))

    def writer_lock(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """Nothing to take: append's compare-and-append serialises writers of every machine."""
        return contextlib.nullcontext()

    async def publish_status(self, worker: str, status: dict) -> None:
        check_worker(worker)
        doc = orjson.dumps({**status, "updated_at": base.wall_clock()})
        with self._unavailable("publish_status"):
            await self.client.hset(self.workers_key, worker, doc)

    async def statuses(self, max_age_s: float = 30.0) -> dict[str, dict]:
        with self._unavailable("statuses"):
            raw = await self.client.hgetall(self.workers_key)
        docs = {}
        for worker, value in raw.items():
            with contextlib.suppress(ValueError):
                doc = orjson.loads(value)
                if isinstance(doc, dict):
                    docs[worker.decode() if isinstance(worker, bytes) else worker] = doc
        return fresh_statuses(docs, max_age_s)

    async def check_durability(self, timeout_s: float = 10.0) -> list[str]:
        """Read ``DURABILITY_SETTINGS`` from the server (from every master of a Cluster) and log a
        WARNING for each way it can lose acknowledged entries, or that they could not be read
        (CONFIG disabled or renamed, as on some managed services; the server down). Returns the
        warnings. Warns, never refuses: a test's throwaway server keeps nothing on purpose."""
        try:
            configs = await asyncio.wait_for(self._server_configs(), timeout_s)
        except Exception as exc:
            configs = {self._describe(): exc}
        warnings = []
        for server, config in configs.items():
            if isinstance(config, BaseException):
                warnings.append(
                    f"Redis {server}: the update log's durability could not be checked "
                    f"({type(config).__name__}: {config}); unless it runs with appendonly yes, "
                    f"appendfsync always and maxmemory-policy noeviction, {LOSS}"
                )
            else:
                warnings.extend(durability_problems(server, config))
        for warning in warnings:
            log.warning("%s", warning)
        return warnings

    def _describe(self) -> str:
        kwargs = getattr(getattr(self.client, "connection_pool", None), "connection_kwargs", None) or {}
        if "path" in kwargs:
            return f"unix:{kwargs['path']}"
        if "host" in kwargs:
            return f"{kwargs['host']}:{kwargs.get('port', 6379)}"
        nodes = getattr(getattr(self.client, "nodes_manager", None), "startup_nodes", None) or {}
        return ",".join(nodes) or "(unknown)"

    async def _server_configs(self) -> dict[str, dict[str, str | None] | BaseException]:
        """Server -> its durability settings, or the error that kept them from being read."""
        from redis.asyncio import RedisCluster

        async def read(**target: Any) -> dict[str, str | None] | BaseException:
            config: dict[str, str | None] = {}
            try:
                for name in DURABILITY_SETTINGS:  # one by one: CONFIG GET takes one pattern before Redis 7
                    reply = await self.client.config_get(name, **target)
                    config[name] = _text({_text(k): v for k, v in reply.items()}.get(name))
            except self._errors as exc:
                return exc
            return config

        if isinstance(self.client, RedisCluster):
            await self.client.initialize()
            # Every master holds a share of the slots; the log's slot may move to any of them.
            return {node.name: await read(target_nodes=node) for node in self.client.get_primaries()}
        return {self._describe(): await read()}

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.aclose()
