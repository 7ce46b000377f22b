"""The feature cluster: feature rows kept in a Redis Cluster as their authority, not as a cache.

With ``GSAGE_FEATURE_SOURCE=redis`` a FeatureRunner maps no ``features.npy``: its memory holds the
graph's structure, L1 and the rows updates set since its snapshot, whatever the number of nodes
times the feature dimension. ``python -m training_export load-features`` fills the cluster from a
snapshot (``training_export.load_features``); a FeatureRunner refuses to start on a cluster that
does not hold its snapshot's rows, loaded and verified (``check``).

Keys are the L2 layout (``runners.feature.cache.l2_redis``) without expiry, under the snapshot's
``feature_set``: ``gsf:<feature set>:<id>`` for a loaded row, ``gsf:<feature set>:<id>.<s>`` for
the row update ``s`` set. The version of a row is the same in every worker (the sequence of the
update log's entry that set it, or a compacted snapshot's ``row_sequence``), so replicas at the
same sequence read the same rows, and one that is behind keeps reading the rows it expects.

- **Reads** (``read``): one ``EVAL`` per master for a request's misses. While the cluster fails
  over (a master down, its replica not promoted yet) a read fails; it is retried, the slot map
  re-discovered each time, for at most ``failover_wait_s``; then ``FeaturesUnavailable`` (503 with
  Retry-After). A row the cluster does not hold is ``FeaturesMissing`` (503): never zeros.
- **Writes** (``write``): an update's rows, written before the update is appended to the log (so
  before it is acknowledged), each master's ``EVAL`` followed by ``WAIT`` for ``write_replicas``
  of its replicas on the same connection: a row acknowledged is on a master and its replicas, and
  a failover cannot lose it. A write that cannot complete within the retry window fails the update
  (nothing appended, nothing acknowledged).
- **Manifest** (``gsf:<feature set>:_manifest``, JSON): what the loader wrote, how far it got
  (resume), the rows' count and checksum and whether a verification pass agreed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import orjson

from common.errors import KindOfError, retry_after
from common.settings import FeatureSourceSection
from runners.feature.cache.base import ROW_DTYPE, as_ids
from runners.feature.cache.l2_redis import RedisFeatureLevel

log = logging.getLogger("graphsage.features")

T = TypeVar("T")
MANIFEST = "_manifest"


class FeaturesUnavailable(KindOfError):
    """The feature cluster did not answer within the failover window."""

    status_code = 503
    headers_of_kind = retry_after(1.0)


class FeaturesMissing(KindOfError):
    """The feature cluster holds no row for some node it should (a load not finished, a lost
    shard): answered as unavailable, never as a row of zeros."""

    status_code = 503
    headers_of_kind = retry_after(1.0)


class ClusterNotLoaded(RuntimeError):
    """At start: the feature cluster does not hold this snapshot's rows, loaded and verified."""


@dataclasses.dataclass(frozen=True)
class AuthorityPolicy:
    read_timeout_s: float = 0.25
    write_timeout_s: float = 2.0
    failover_wait_s: float = 5.0
    write_replicas: int = 1
    retry_interval_s: float = 0.05  # doubled per failed try, at most 1 s

    @classmethod
    def from_section(cls, section: FeatureSourceSection) -> AuthorityPolicy:
        return cls(
            read_timeout_s=section.feature_read_timeout_s,
            write_timeout_s=section.feature_write_timeout_s,
            failover_wait_s=section.feature_failover_wait_s,
            write_replicas=section.feature_write_replicas,
        )


class FeatureAuthority:
    def __init__(
        self,
        rows: RedisFeatureLevel,
        policy: AuthorityPolicy,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.rows = rows
        self.policy = policy
        self._clock = clock
        self._sleep = sleep
        self.retries = 0
        self.unavailable = 0
        self.reads = 0
        self.rows_written = 0

    @classmethod
    def connect(
        cls, url: str, feature_set: str, dim: int, policy: AuthorityPolicy, ca_file: str = ""
    ) -> FeatureAuthority:
        rows = RedisFeatureLevel.from_url(
            url,
            feature_set,
            dim,
            ttl_s=0,  # the authority's rows never expire
            timeout_s=policy.read_timeout_s,
            retry_backoff_s=policy.retry_interval_s,
            write_timeout_s=policy.write_timeout_s,
            ca_file=ca_file,
        )
        return cls(rows, policy)

    @property
    def feature_set(self) -> str:
        return self.rows.snapshot_version

    @property
    def dim(self) -> int:
        return self.rows.dim

    # -- rows ------------------------------------------------------------------------------------

    async def read(self, ids: np.ndarray, versions: np.ndarray | None = None) -> np.ndarray:
        """The rows of ``ids`` at ``versions`` (float32 ``[n, F]``); ``FeaturesUnavailable`` or
        ``FeaturesMissing`` instead of any row the cluster did not give."""
        ids = as_ids(ids)
        self.reads += 1
        found, rows = await self._retrying("read", lambda: self.rows.read_rows(ids, versions))
        if not found.all():
            missing = ids[~found]
            raise FeaturesMissing(
                f"the feature cluster holds no row for {missing.size} of {ids.size} nodes (e.g. node "
                f"{int(missing[0])}, feature set {self.feature_set!r}): load it with `python -m training_export "
                "load-features`"
            )
        return np.asarray(rows, dtype=ROW_DTYPE)

    async def write(self, ids: np.ndarray, rows: np.ndarray, versions: np.ndarray | None = None) -> None:
        """Write rows; returns once every master and ``write_replicas`` of its replicas hold them."""
        ids = as_ids(ids)
        if ids.size == 0:
            return
        policy = self.policy
        await self._retrying(
            "write",
            lambda: self.rows.write_rows(
                ids,
                rows,
                versions,
                replicas=policy.write_replicas,
                replica_timeout_ms=max(1, int(policy.write_timeout_s * 1000 / 2)),
                timeout_s=policy.write_timeout_s,
            ),
        )
        self.rows_written += int(ids.size)

    async def _retrying(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call`` until it succeeds or the failover window has passed (then 503)."""
        deadline = self._clock() + self.policy.failover_wait_s
        pause = self.policy.retry_interval_s
        while True:
            try:
                return await call()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._clock() + pause > deadline:
                    self.unavailable += 1
                    raise FeaturesUnavailable(
                        f"the feature cluster did not take a {op} within {self.policy.failover_wait_s:g} s "
                        f"(GSAGE_FEATURE_FAILOVER_WAIT_S): {type(exc).__name__}: {exc}"
                    ) from exc
                self.retries += 1
                log.debug("feature cluster %s failed (%s: %s); retrying", op, type(exc).__name__, exc)
                await self.rows.forget_topology()
                await self._sleep(pause)
                pause = min(2 * pause, 1.0)

    # -- the manifest ----------------------------------------------------------------------------

    async def manifest(self) -> dict[str, Any] | None:
        raw = await self._retrying("read", lambda: self.rows.client.get(self.rows.key(MANIFEST)))
        return None if raw is None else dict(orjson.loads(raw))

    async def set_manifest(self, doc: dict[str, Any]) -> None:
        await self._retrying("write", lambda: self.rows.client.set(self.rows.key(MANIFEST), orjson.dumps(doc)))

    async def check(self, snapshot_tag: str) -> dict[str, Any]:
        """Raise ``ClusterNotLoaded`` unless the cluster holds this feature set, of this width,
        loaded whole and verified."""
        doc = await self.manifest()
        how = f"run `python -m training_export load-features --snapshot {snapshot_tag}` against it"
        if doc is None:
            raise ClusterNotLoaded(f"the feature cluster holds no feature set {self.feature_set!r}: {how}")
        if int(doc.get("dim", -1)) != self.dim:
            raise ClusterNotLoaded(
                f"feature set {self.feature_set!r} in the cluster has rows of {doc.get('dim')} values, "
                f"the snapshot {self.dim}"
            )
        if not doc.get("verified"):
            raise ClusterNotLoaded(
                f"feature set {self.feature_set!r} is not loaded and verified in the cluster "
                f"({doc.get('next_row', 0)} of {doc.get('rows', '?')} rows written, verified: "
                f"{bool(doc.get('verified'))}): {how}"
            )
        return doc

    def stats(self) -> dict[str, int]:
        return {
            "reads": self.reads,
            "retries": self.retries,
            "unavailable": self.unavailable,
            "rows_written": self.rows_written,
        }

    async def close(self) -> None:
        await self.rows.close()


def authority_for(cfg: Any, feature_set: str, dim: int) -> FeatureAuthority:
    """The feature cluster of ``cfg`` (``common.settings.Settings``) for one feature set."""
    return FeatureAuthority.connect(
        cfg.feature_cluster_url,
        feature_set,
        dim,
        AuthorityPolicy.from_section(cfg.feature_source_section),
        cfg.redis_ca_file,
    )


def load_without_rows(tag: str) -> Any:
    """A snapshot opened for cluster mode: its structure mapped, its rows left in the cluster."""
    from runners.feature.snapshot import load_snapshot

    return load_snapshot(tag, features=False)


class ClusterOrigin:
    """The tiered store's origin level in cluster mode: rows an update set since the snapshot
    from the live graph's overlay (every worker holds them: it applied the update), every other
    row from the feature cluster at its key version."""

    name = "origin"

    def __init__(self, authority: FeatureAuthority, graph: Any) -> None:
        self.authority = authority
        self.graph = graph
        self.num_nodes = int(graph.capacity)
        self.dim = int(graph.feature_dim)
        self.hits = 0

    async def fetch(self, ids: np.ndarray) -> np.ndarray:
        ids = as_ids(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
            raise IndexError(f"node ids must be in [0, {self.num_nodes})")
        self.hits += int(ids.size)
        over, changed = self.graph.overlay_rows(ids)
        if over.all():
            return changed
        out = np.empty((ids.size, self.dim), dtype=ROW_DTYPE)
        out[over] = changed
        rest = ids[~over]
        out[~over] = await self.authority.read(rest, self.graph.key_versions(rest))
        return out

    async def start(self) -> None:
        await self.authority.check(self.graph.base.tag)

    def rebound(self, graph: Any) -> ClusterOrigin:
        return ClusterOrigin(self.authority, graph)

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, **{f"cluster_{k}": v for k, v in self.authority.stats().items()}}

    async def close(self) -> None:
        await self.authority.close()
