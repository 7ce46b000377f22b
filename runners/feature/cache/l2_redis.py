"""L2: feature rows in Redis, standalone or Cluster, through redis-py's asyncio client (hiredis).

Key layout, one string key per (snapshot, node)::

    gsf:<snapshot_version>:<node_id>[.<feature version>]  ->  F * 4 bytes: the row as little-endian float32
    e.g.  gsf:graph-snapshot:k3x9qz:42      gsf:graph-snapshot:k3x9qz:42.3 (its row after 3 updates)

* The feature version (``runners.feature.graph.LiveGraph.feature_versions``) counts the updates
  of a node's row since the snapshot, so a worker that applied an update never reads a copy
  written before it, and one that has not applied it yet keeps reading the one it expects: every
  worker applies the same log and so counts alike. Old versions age out by TTL.

* The snapshot version is part of the key, so two snapshots served side by side (a rollout, a
  canary) never read each other's rows, and a retired version needs no cleanup: its keys age
  out by TTL (``PX``). A cached value is only ever a function of its key.
* No hash tag: the version may not contain ``{`` or ``}``, otherwise every key would hash to the
  one slot of that tag. In a Cluster the keys therefore spread over the 16384 slots, i.e. the
  features are sharded across the masters by node id.
* A value whose length is not ``4 * F`` (a foreign writer, a different width) is a miss and is
  counted as ``corrupt``; it is never reshaped into garbage.

Round trips and commands. redis-py spends tens of microseconds of event-loop CPU per queued
command (more in a cluster pipeline than in a standalone one), so the number of *commands*
matters as much as the number of round trips; both are kept at one per master (``python
bench/bench_cache.py [--cluster]`` times the reads and writes below):

* standalone read: one ``MGET`` of all the request's keys, on a lean pipelined connection of
  its own (``runners/feature/cache/resp.py``; redis-py's for TLS and unix sockets).
* standalone write: one ``EVAL`` of ``SET_SCRIPT`` (``SET key row PX ttl`` in a Lua loop). A
  transaction-free pipeline of N ``SET``s cost milliseconds of client CPU for one request's rows
  (``bench/bench_cache.py`` times the ``EVAL`` as "L2 put"; no benchmark times the pipeline).
* Cluster (``redis+cluster://host:port`` or ``cluster=True``): a key per node id means nearly one
  slot per key, and ``MGET``/``mget_nonatomic`` need one command per slot (one round trip per
  master, but milliseconds of client CPU for one request's keys). Instead the keys are grouped
  by the master that owns their slot (redis-py's slot map) and each master gets one ``EVAL``
  of ``GET_SCRIPT`` / ``SET_SCRIPT``; the scripts carry ``flags=allow-cross-slot-keys`` (Redis
  >= 7.0) and get the keys as ``ARGV``, which Redis allows as long as every key is local to that
  master. All masters are queried concurrently. If a master answers with an error instead (a
  slot moved during resharding, Redis < 7), the request falls back to ``mget_nonatomic`` / a
  pipeline of ``SET``s, which follow ``MOVED``, and ``fallbacks`` is counted; after 3 fallbacks
  in a row the scripts pause for 60 s (``use_scripts=False`` turns them off).
  ``CLUSTERDOWN``/``TRYAGAIN`` are outages, not script trouble: they fail the call like a refused
  connection.

Faults never leave this module: every round trip runs under a deadline (``timeout_s`` plus
``timeout_per_key_s`` per key for reads, so a bulk read is not cut off at a single-node budget;
``write_timeout_s`` for writes), redis-py's own retries are off, and any failure (timeout,
connection refused, ``MOVED`` it could not follow, cluster down) counts one ``error`` and answers
"all missed". It also opens a circuit: for ``backoff`` seconds (``retry_backoff_s``, doubled per
consecutive failure up to ``max_backoff_s``) no call touches Redis (counted as ``skipped``).
After that a single probe call is let through; success closes the circuit and resets the backoff.
A Cluster client is closed before its probe so that the probe re-discovers the topology.

Writes stay off the request's critical path: ``put_background`` schedules ``put`` as a task, keeps
a reference to it (the loop holds only weak ones), and drops the write, counting the rows, once
``max_inflight_writes`` tasks are pending: under overload the cache is the first thing to give.
With ``write_delay_s > 0`` the rows of several requests are coalesced into one write, sent after
that delay or once ``write_batch_rows`` rows wait: a warm cache still misses a few rows in most
requests, and one EVAL per request was a Redis round trip of feature-runner CPU each time.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import numpy as np
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.crc import key_slot
from redis.exceptions import ClusterDownError, ResponseError, TryAgainError

from common.breaker import BreakerState, CircuitBreaker
from common.redis_client import make_client

from .base import ROW_DTYPE, all_missed, as_ids
from .resp import RespConnection

log = logging.getLogger(__name__)

KEY_PREFIX = "gsf"
WIRE_DTYPE = np.dtype("<f4")
SCRIPT_FAILURES_BEFORE_PAUSE = 3
# Outage errors: they mean "Redis cannot serve", not "the script path cannot", so no fallback.
_OUTAGE_ERRORS = (ClusterDownError, TryAgainError)

# Keys come in ARGV (undeclared): declared keys of several slots are refused (CROSSSLOT) before
# the script runs; allow-cross-slot-keys lets it touch any key the node owns. Lua turns a missing
# key into false, which goes back as a nil bulk string.
GET_SCRIPT = """#!lua flags=allow-cross-slot-keys,no-writes
local rows = {}
for i = 1, #ARGV do rows[i] = redis.call('GET', ARGV[i]) end
return rows
"""
# ARGV = ttl_ms (0: no expiry), key_1..key_n, row_1..row_n
SET_SCRIPT = """#!lua flags=allow-cross-slot-keys
local ttl = tonumber(ARGV[1])
local n = (#ARGV - 1) / 2
for i = 2, n + 1 do
  if ttl > 0 then
    redis.call('SET', ARGV[i], ARGV[i + n], 'PX', ttl)
  else
    redis.call('SET', ARGV[i], ARGV[i + n])
  end
end
return n
"""


class ReplicasBehind(RuntimeError):
    """A master took a write that fewer of its replicas than asked for hold (``WAIT``)."""


def row_key_prefix(snapshot_version: str) -> bytes:
    if not snapshot_version or any(c in snapshot_version for c in "{} \t\r\n"):
        raise ValueError(f"snapshot_version must be non-empty, without braces or whitespace: {snapshot_version!r}")
    return f"{KEY_PREFIX}:{snapshot_version}:".encode()


def _len_or_missing(value: bytes | None) -> int:
    return -1 if value is None else len(value)


class RedisFeatureLevel:
    name = "l2"

    def __init__(
        self,
        client: Redis | RedisCluster,
        snapshot_version: str,
        dim: int,
        *,
        ttl_s: float,
        timeout_s: float,
        retry_backoff_s: float,
        timeout_per_key_s: float = 0.0,
        max_backoff_s: float | None = None,
        write_timeout_s: float | None = None,
        max_inflight_writes: int = 64,
        write_delay_s: float = 0.0,
        write_batch_rows: int = 1024,
        use_scripts: bool = True,
        script_pause_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.cluster = isinstance(client, RedisCluster)
        # Standalone reads skip redis-py (runners/feature/cache/resp.py says why;
        # bench/bench_cache.py times both, "L2 MGET").
        self._reads = None if self.cluster else RespConnection.like(client)
        self.use_snapshot(snapshot_version)
        self.dim = dim
        self.row_bytes = dim * WIRE_DTYPE.itemsize
        self._ttl_ms = int(ttl_s * 1000) if ttl_s > 0 else None  # None: no expiry
        self.timeout_s = timeout_s
        self.timeout_per_key_s = timeout_per_key_s
        self.write_timeout_s = write_timeout_s or max(4 * timeout_s, 0.25)
        self.retry_backoff_s = retry_backoff_s
        self.max_backoff_s = max_backoff_s if max_backoff_s is not None else 8 * retry_backoff_s
        self.max_inflight_writes = max_inflight_writes
        self._clock = clock
        # One failure opens it; each failed probe doubles the wait, up to max_backoff_s.
        self.breaker = CircuitBreaker(
            "redis-l2",
            failures=1,
            reset_s=retry_backoff_s,
            max_reset_s=self.max_backoff_s,
            probe_timeout_s=max(retry_backoff_s, self.write_timeout_s),
            clock=clock,
        )
        self._writes: set[asyncio.Task[None]] = set()
        self.write_delay_s = write_delay_s
        self.write_batch_rows = write_batch_rows
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # coalesced (ids, rows, versions)
        self._pending_rows = 0
        self._pending_timer: asyncio.TimerHandle | None = None
        self.hits = 0
        self.misses = 0
        self.errors = 0
        self.skipped = 0
        self.corrupt = 0
        self.writes = 0
        self.writes_dropped = 0
        self.fallbacks = 0
        self._use_scripts = use_scripts
        self.script_pause_s = script_pause_s
        self._script_fallbacks = 0  # consecutive
        self._scripts_paused_until = 0.0

    @classmethod
    def from_url(
        cls,
        url: str,
        snapshot_version: str,
        dim: int,
        *,
        ttl_s: float,
        timeout_s: float,
        retry_backoff_s: float,
        cluster: bool | None = None,
        ca_file: str = "",
        **kwargs: Any,
    ) -> RedisFeatureLevel:
        """Build the client lazily connected: a Redis that is down at start-up is just a miss."""
        write_timeout = kwargs.get("write_timeout_s") or max(4 * timeout_s, 0.25)
        # socket_timeout is a backstop; the asyncio deadlines fire first.
        client = make_client(url, timeout_s=timeout_s, socket_timeout_s=write_timeout, ca_file=ca_file, cluster=cluster)
        return cls(
            client,
            snapshot_version,
            dim,
            ttl_s=ttl_s,
            timeout_s=timeout_s,
            retry_backoff_s=retry_backoff_s,
            **kwargs,
        )

    # -- reads ---------------------------------------------------------------------------------

    async def get(self, ids: np.ndarray, versions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``versions``: each id's feature version (None: all 0)."""
        ids = as_ids(ids)
        n = ids.size
        if n == 0:
            return all_missed(0, self.dim)
        if not await self._admit():
            self.skipped += 1
            self.misses += n
            return all_missed(n, self.dim)
        try:
            async with asyncio.timeout(self.read_deadline_s(n)):
                values = await self._read(self._names(ids, versions))
        except asyncio.CancelledError:
            self.breaker.release_probe()  # a cancelled probe must not wedge the circuit half-open
            raise
        except Exception as exc:
            self._on_failure(exc, "get")
            self.misses += n
            return all_missed(n, self.dim)
        self._on_success()
        return self._decode(values)

    async def read_rows(
        self, ids: np.ndarray, versions: np.ndarray | None = None, timeout_s: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """One read of ``ids``' rows: which were found, and those rows. No circuit, and faults are
        raised: the feature cluster (``runners.feature.authority``), whose caller decides whether
        to retry, reads through this."""
        ids = as_ids(ids)
        if ids.size == 0:
            return all_missed(0, self.dim)
        async with asyncio.timeout(timeout_s if timeout_s is not None else self.read_deadline_s(ids.size)):
            values = await self._read(self._names(ids, versions))
        return self._decode(values)

    def read_deadline_s(self, n_keys: int) -> float:
        return self.timeout_s + n_keys * self.timeout_per_key_s

    async def _read(self, names: list[str]) -> list[bytes | None]:
        if self._reads is not None:
            return await self._reads.execute(self.mget_command(names))
        return await self._mget(self._keys(names))

    def mget_command(self, names: list[str] | np.ndarray) -> bytes:
        """``pack_command(b"MGET", *self._keys(ids))``, built as one string, several times faster
        (a bulk string's header depends only on the id's digit count). No benchmark compares the
        two: a ``timeit`` of both on one request's ids would."""
        if isinstance(names, np.ndarray):
            names = self._names(names)
        heads = self._bulk_heads
        body = "\r\n".join([heads[len(s)] + s for s in names])
        return f"*{len(names) + 1}\r\n$4\r\nMGET\r\n{body}\r\n".encode()

    async def _mget(self, keys: list[bytes]) -> list[bytes | None]:
        if not self.cluster:
            return cast(list[bytes | None], await self._client.mget(keys))
        await self._client.initialize()  # no-op once the slot map is known
        if self._scripts_enabled():
            groups = self._by_master(keys)
            replies = await self._run_scripts(
                [
                    self._client.execute_command("EVAL", GET_SCRIPT, 0, *[keys[p] for p in pos], target_nodes=node)
                    for node, pos in groups
                ]
            )
            if replies is not None:
                values: list[bytes | None] = [None] * len(keys)
                for (_, pos), reply in zip(groups, replies):
                    for p, value in zip(pos, reply):
                        values[p] = value
                return values
        return cast(list[bytes | None], await cast(RedisCluster, self._client).mget_nonatomic(keys))

    def _scripts_enabled(self) -> bool:
        return self._use_scripts and self._clock() >= self._scripts_paused_until

    async def _run_scripts(self, calls: Sequence[Awaitable[Any]]) -> list[Any] | None:
        """The scripts' replies, or None when Redis refused a script (this request then takes the
        plain path); an outage is raised as it is."""
        try:
            replies = await asyncio.gather(*calls)
        except _OUTAGE_ERRORS:
            raise
        except ResponseError as exc:
            self._script_failed(exc)
            return None
        self._script_fallbacks = 0
        return replies

    def _script_failed(self, exc: ResponseError) -> None:
        """A script was refused: this request takes the plain path; pause scripts if it lasts."""
        self.fallbacks += 1
        self._script_fallbacks += 1
        if self._script_fallbacks >= SCRIPT_FAILURES_BEFORE_PAUSE:
            self._script_fallbacks = 0
            self._scripts_paused_until = self._clock() + self.script_pause_s
            log.warning("L2: Lua scripts keep failing (%s); plain commands for %.0fs", exc, self.script_pause_s)

    def _by_master(self, keys: list[bytes]) -> list[tuple[ClusterNode, list[int]]]:
        """Positions of ``keys`` grouped by the master that owns their slot."""
        node_of_slot = cast(RedisCluster, self._client).nodes_manager.get_node_from_slot
        groups: dict[str, tuple[ClusterNode, list[int]]] = {}
        for pos, slot in enumerate(map(key_slot, keys)):
            node = node_of_slot(slot)
            group = groups.get(node.name)
            if group is None:
                groups[node.name] = group = (node, [])
            group[1].append(pos)
        return list(groups.values())

    def _decode(self, values: list[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
        n = len(values)
        try:
            every_row_whole = set(map(len, values)) == {self.row_bytes}  # type: ignore[arg-type]  # None: TypeError
        except TypeError:  # a miss (None)
            every_row_whole = False
        if every_row_whole:
            self.hits += n
            rows = np.frombuffer(b"".join(cast(list[bytes], values)), dtype=WIRE_DTYPE).astype(ROW_DTYPE, copy=False)
            return np.ones(n, dtype=bool), rows.reshape(n, self.dim)
        lengths = np.fromiter(map(_len_or_missing, values), dtype=np.int64, count=n)
        found = lengths == self.row_bytes
        n_found = int(found.sum())
        self.corrupt += int(np.count_nonzero(lengths >= 0)) - n_found
        self.hits += n_found
        self.misses += n - n_found
        payload = b"".join(itertools.compress(cast(list[bytes], values), found.tolist()))
        rows = np.frombuffer(payload, dtype=WIRE_DTYPE).astype(ROW_DTYPE, copy=False)
        return found, rows.reshape(n_found, self.dim)

    # -- writes --------------------------------------------------------------------------------

    async def put(self, ids: np.ndarray, rows: np.ndarray, versions: np.ndarray | None = None) -> None:
        ids = as_ids(ids)
        n = ids.size
        if n == 0:
            return
        if not await self._admit():
            self.skipped += 1
            self.writes_dropped += n
            return
        try:
            async with asyncio.timeout(self.write_timeout_s):
                await self._write(self._keys(self._names(ids, versions)), self._payloads(rows, n))
        except asyncio.CancelledError:
            self.breaker.release_probe()
            raise
        except Exception as exc:
            self._on_failure(exc, "put")
            self.writes_dropped += n
            return
        self._on_success()
        self.writes += n

    async def write_rows(
        self,
        ids: np.ndarray,
        rows: np.ndarray,
        versions: np.ndarray | None = None,
        *,
        replicas: int = 0,
        replica_timeout_ms: int = 1000,
        timeout_s: float | None = None,
    ) -> None:
        """Write ``ids``' rows, each master's in one ``EVAL``; with ``replicas``, each master's
        ``WAIT`` on the same connection then requires that many of its replicas to hold them
        (``ReplicasBehind`` otherwise), so a failover cannot lose a row this returned for. Faults
        are raised (no circuit, no script fallback: the feature cluster needs Redis >= 7)."""
        ids = as_ids(ids)
        n = ids.size
        if n == 0:
            return
        keys, values = self._keys(self._names(ids, versions)), self._payloads(rows, n)
        async with asyncio.timeout(timeout_s if timeout_s is not None else self.write_timeout_s):
            if self.cluster:
                await self._client.initialize()
                groups: list[tuple[Any, list[int]]] = list(self._by_master(keys))
            else:
                groups = [(None, list(range(n)))]
            pipes = []
            for node, pos in groups:
                route = {"target_nodes": node} if node is not None else {}
                pipe = self._client.pipeline() if self.cluster else self._client.pipeline(transaction=False)
                ttl = self._ttl_ms or 0
                pipe.execute_command(
                    "EVAL", SET_SCRIPT, 0, ttl, *[keys[p] for p in pos], *[values[p] for p in pos], **route
                )
                if replicas:
                    pipe.execute_command("WAIT", replicas, replica_timeout_ms, **route)
                pipes.append(pipe.execute())
            replies = await asyncio.gather(*pipes)
        if replicas:
            for (node, _), reply in zip(groups, replies):
                if int(reply[1]) < replicas:
                    where = node.name if node is not None else "the server"
                    raise ReplicasBehind(f"{where}: {reply[1]} of {replicas} replicas took the rows")

    def _payloads(self, rows: np.ndarray, n: int) -> list[memoryview]:
        payload = np.ascontiguousarray(rows, dtype=WIRE_DTYPE).reshape(n, self.dim).tobytes()
        view = memoryview(payload)
        rb = self.row_bytes
        return [view[o : o + rb] for o in range(0, n * rb, rb)]

    async def _write(self, keys: list[bytes], values: list[memoryview]) -> None:
        if self.cluster:
            await self._client.initialize()
        if self._scripts_enabled():
            ttl = self._ttl_ms or 0
            if self.cluster:
                groups = self._by_master(keys)
                calls = [
                    self._client.execute_command(
                        "EVAL",
                        SET_SCRIPT,
                        0,
                        ttl,
                        *[keys[p] for p in pos],
                        *[values[p] for p in pos],
                        target_nodes=node,
                    )
                    for node, pos in groups
                ]
            else:
                calls = [self._client.execute_command("EVAL", SET_SCRIPT, 0, ttl, *keys, *values)]
            if await self._run_scripts(calls) is not None:
                return
        pipe = self._client.pipeline() if self.cluster else self._client.pipeline(transaction=False)
        for key, value in zip(keys, values):
            pipe.set(key, value, px=self._ttl_ms)
        await pipe.execute()

    def put_background(self, ids: np.ndarray, rows: np.ndarray, versions: np.ndarray | None = None) -> None:
        """Write off the caller's critical path (coalesced when ``write_delay_s`` > 0); dropped
        while the circuit is open or too many writes are in flight.

        ``rows`` must not be mutated afterwards (the tiered store passes a fresh gather).
        """
        n = int(np.size(ids))
        if n == 0:
            return
        if self.breaker.state is BreakerState.OPEN:
            self.skipped += 1
            self.writes_dropped += n
            return
        if self.write_delay_s <= 0:
            self._start_write(ids, rows, versions)
            return
        self._pending.append((ids, rows, np.zeros(n, np.int64) if versions is None else versions))
        self._pending_rows += n
        if self._pending_rows >= self.write_batch_rows:
            self._send_pending()
        elif self._pending_timer is None:
            self._pending_timer = asyncio.get_running_loop().call_later(self.write_delay_s, self._send_pending)

    def _send_pending(self) -> None:
        if self._pending_timer is not None:
            self._pending_timer.cancel()
            self._pending_timer = None
        if not self._pending:
            return
        ids = np.concatenate([i for i, _, _ in self._pending])
        rows = np.concatenate([r for _, r, _ in self._pending])
        versions = np.concatenate([v for _, _, v in self._pending])
        self._pending.clear()
        self._pending_rows = 0
        self._start_write(ids, rows, versions)

    def _start_write(self, ids: np.ndarray, rows: np.ndarray, versions: np.ndarray | None = None) -> None:
        if len(self._writes) >= self.max_inflight_writes:
            self.writes_dropped += int(np.size(ids))
            return
        task = asyncio.get_running_loop().create_task(self.put(ids, rows, versions))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def flush(self) -> None:
        """Send the coalesced rows now and wait for the background writes pending."""
        self._send_pending()
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    # -- circuit -------------------------------------------------------------------------------

    async def _admit(self) -> bool:
        """True when this call may touch Redis: circuit closed, or it is the one probe."""
        probe = self.breaker.state is not BreakerState.CLOSED
        if not self.breaker.allow():
            return False
        if probe and self.cluster:
            # Forget the slot map and connections: the probe re-discovers the topology.
            try:
                await self._client.aclose()
            except Exception:
                pass
        return True

    def _on_failure(self, exc: BaseException, op: str) -> None:
        self.errors += 1
        opened = self.breaker.opened_total
        self.breaker.record_failure()
        if self.breaker.opened_total != opened:  # this failure opened it (late ones are ignored)
            level = logging.WARNING if self.breaker.reset_s == self.breaker.base_reset_s else logging.DEBUG
            log.log(
                level,
                "L2 %s failed (%s: %s); bypassing Redis for %.2fs",
                op,
                type(exc).__name__,
                exc,
                self.breaker.reset_s,
            )

    def _on_success(self) -> None:
        if self.breaker.state is not BreakerState.CLOSED:
            log.info("L2 reachable again after %d openings of its circuit", self.breaker.opened_total)
        self.breaker.record_success()

    @property
    def circuit_open(self) -> bool:
        return self.breaker.state is not BreakerState.CLOSED

    # -- misc ----------------------------------------------------------------------------------

    @property
    def client(self) -> Redis | RedisCluster:
        return self._client

    def key(self, name: str) -> bytes:
        """The key of ``name`` under this level's prefix (a row's id, or a document's name)."""
        return self._prefix + name.encode()

    async def forget_topology(self) -> None:
        """Close the connections (and a Cluster client's slot map): the next call asks the
        cluster who owns what, e.g. the replica promoted by a failover."""
        try:
            await self._client.aclose()
        except Exception:
            pass

    def use_snapshot(self, snapshot_version: str) -> None:
        """Key rows by ``snapshot_version`` from now on (a FeatureRunner switched snapshots)."""
        self.snapshot_version = snapshot_version
        prefix = row_key_prefix(snapshot_version)
        self._prefix = prefix
        # "$<key length>\r\n<prefix>" per length of a key name (mget_command)
        self._bulk_heads = [f"${len(prefix) + d}\r\n{prefix.decode()}" for d in range(41)]

    @staticmethod
    def _names(ids: np.ndarray, versions: np.ndarray | None = None) -> list[str]:
        """Each id's key name after the prefix: ``<id>``, or ``<id>.<version>`` once its row changed."""
        if versions is None or not versions.any():
            return list(map(str, ids.tolist()))
        return [f"{i}.{v}" if v else str(i) for i, v in zip(ids.tolist(), versions.tolist())]

    def _keys(self, names: list[str] | np.ndarray) -> list[bytes]:
        if isinstance(names, np.ndarray):
            names = self._names(names)
        prefix = self._prefix
        return [prefix + s.encode() for s in names]

    def stats(self) -> dict[str, int]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "skipped": self.skipped,
            "corrupt": self.corrupt,
            "writes": self.writes,
            "writes_dropped": self.writes_dropped,
            "fallbacks": self.fallbacks,
            "inflight_writes": len(self._writes),
            "pending_write_rows": self._pending_rows,
            "circuit_open": int(self.circuit_open),
        }

    async def close(self, flush_timeout_s: float = 1.0) -> None:
        """Let pending writes finish (bounded), then close the connections."""
        try:
            async with asyncio.timeout(flush_timeout_s):
                await self.flush()
        except TimeoutError:
            for task in list(self._writes):
                task.cancel()
        if self._reads is not None:
            self._reads.close()
        try:
            await self._client.aclose()
        except Exception:
            pass
