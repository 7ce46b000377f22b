"""Cluster mode against a real Redis Cluster (3 masters + 3 replicas on loopback): the loader
(resume, verification, the store's record), answers equal to the local mode's, updates written
to the cluster before they are acknowledged, replicas over one Redis Streams log that converge, a
late replica that catches up, a compaction that rewrites no rows, a master killed during a
stream of updates with every acknowledged update readable afterwards, and the prune of the row
versions no replica reads any more."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import os

import numpy as np
import pytest
from redis.crc import key_slot

from common.settings import load_settings
from harness.redis_servers import RedisCluster3, redis_available
from runners.feature.authority import (
    AuthorityPolicy,
    ClusterNotLoaded,
    ClusterOrigin,
    FeatureAuthority,
    FeaturesMissing,
    FeaturesUnavailable,
    load_without_rows,
)
from runners.feature.cache.tiered import build_feature_store
from runners.feature.graph import LiveGraph
from runners.feature.live import GraphKeeper
from runners.feature.neighbourhood import NeighbourhoodBuilder
from runners.feature.snapshot import load_snapshot, save_snapshot
from runners.feature.update_log.redis_log import RedisUpdateLog
from tests.graphs import small_graph
from training_export.load_features import FEATURES_ENTRY, load_features
from training_export.prune_features import WorkersBehind, prune_features, superseded

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server / redis-cli not installed")
POLICY = AuthorityPolicy(read_timeout_s=0.5, write_timeout_s=2.0, failover_wait_s=15.0, write_replicas=1)
FANOUT = (10, 5)
_REPLICA_NUMBERS = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with RedisCluster3(str(tmp_path_factory.mktemp("feature-cluster")), replicas=1) as c:
        yield c


@pytest.fixture
def stored(model_store):
    snap = copy.copy(small_graph(600, 5000, seed=11))
    snap.directed = False
    save_snapshot(snap)
    return snap


def authority(cluster, snap, policy: AuthorityPolicy = POLICY) -> FeatureAuthority:
    return FeatureAuthority.connect(cluster.url, snap.feature_set, snap.feature_dim, policy)


async def loaded(cluster, snap) -> None:
    a = authority(cluster, snap)
    try:
        report = await load_features(snap, a, batch_rows=128, progress=False)
        assert report.verified, report
    finally:
        await a.close()


@dataclasses.dataclass
class Replica:
    """One FeatureRunner's core parts in cluster mode (as ``runners.feature.service`` wires them)."""

    keeper: GraphKeeper
    builder: NeighbourhoodBuilder
    authority: FeatureAuthority

    @classmethod
    def start_over(cls, cluster, tag: str, log_url: str) -> Replica:
        snap = load_without_rows(tag)
        graph = LiveGraph(snap)
        auth = authority(cluster, snap)
        cfg = load_settings({})
        store = build_feature_store(
            cfg.feature_cache, cfg.redis, snap.features, snap.tag, graph, cluster_origin=ClusterOrigin(auth, graph)
        )
        builder = NeighbourhoodBuilder(graph, store, (25, 10), 4096, 0)

        def serve(g: LiveGraph) -> None:
            builder.graph = g
            store.rebind(g)

        keeper = GraphKeeper(
            graph,
            RedisUpdateLog.from_url(log_url),
            on_swap=serve,
            on_rows_changed=store.invalidate,
            poll_interval_s=0.01,
            row_writer=auth.write,
            load=load_without_rows,
            worker=f"replica-{next(_REPLICA_NUMBERS)}",  # as separate processes are: each its own status
        )
        return cls(keeper, builder, auth)

    async def start(self) -> Replica:
        await self.builder.store.start()
        await self.keeper.start()
        return self

    async def tensor(self, ids, seed: int = 7):
        request = self.builder.validate(np.asarray(ids, np.int64), FANOUT, seed)
        async with self.keeper.lock:
            return (await self.builder.build([request]))[0]

    async def rows(self, ids) -> np.ndarray:
        return await self.builder.store.fetch(np.asarray(ids, np.int64))

    async def close(self) -> None:
        await self.keeper.close()
        await self.keeper.log.close()
        await self.builder.store.close()


def same_tensor(x, y) -> None:
    np.testing.assert_array_equal(x.features, y.features)
    for a, b in zip(x.index, y.index, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_loader_resumes_verifies_and_records_the_snapshot_in_the_store(cluster, stored, monkeypatch):
    from training_export.cli import main

    async def interrupted_then_resumed():
        a = authority(cluster, stored)
        try:
            with pytest.raises(InterruptedError):
                await load_features(stored, a, batch_rows=100, progress=False, stop_after_batches=2)
            doc = await a.manifest()
            assert doc is not None and doc["next_row"] == 200 and not doc["verified"]
            with pytest.raises(ClusterNotLoaded, match="not loaded and verified"):
                await a.check(stored.tag)
            report = await load_features(stored, a, batch_rows=100, progress=False)
            assert (report.resumed_from, report.rows_written) == (200, stored.num_nodes - 200)
            assert report.verified and report.rows_found == stored.num_nodes and report.rows_differing == 0
            await a.check(stored.tag)
            rows = await a.read(np.arange(stored.num_nodes))
            np.testing.assert_array_equal(rows, stored.features)
            # A row changed behind the loader's back: the next verification finds it.
            await a.rows.client.set(a.rows.key("5"), np.full(stored.feature_dim, 3, "<f4").tobytes())
            again = await load_features(stored, a, batch_rows=100, progress=False)
            assert again.rows_written == 0 and not again.verified and again.rows_differing == 1
            with pytest.raises(ClusterNotLoaded):
                await a.check(stored.tag)
        finally:
            await a.close()

    asyncio.run(interrupted_then_resumed())
    # The command: --restart loads every row again; verified, it records the load in the store.
    monkeypatch.setenv("GSAGE_FEATURE_WRITE_REPLICAS", "1")
    assert main(["load-features", "--snapshot", stored.tag, "--redis-url", cluster.url, "--restart"]) == 0
    import bentoml

    entries = [m for m in bentoml.models.list() if m.tag.name == FEATURES_ENTRY]
    assert len(entries) == 1 and entries[0].info.labels["feature_set"] == stored.feature_set
    assert entries[0].info.metadata["verified"] and entries[0].info.metadata["rows"] == stored.num_nodes


def test_a_runner_refuses_an_unloaded_cluster_and_a_missing_row_is_never_zeros(cluster, stored):
    async def main():
        other = copy.copy(stored)
        other.extra = {**stored.extra, "feature_set": "never-loaded"}
        a = authority(cluster, other)
        try:
            with pytest.raises(ClusterNotLoaded, match="holds no feature set 'never-loaded'"):
                await a.check(stored.tag)
            with pytest.raises(FeaturesMissing, match="no row for 2 of 2 nodes"):
                await a.read(np.array([1, 2]))
        finally:
            await a.close()

    asyncio.run(main())


def test_cluster_mode_answers_equal_the_local_modes_for_the_same_seed(cluster, stored, redis_standalone):
    async def main():
        await loaded(cluster, stored)
        local_graph = LiveGraph(load_snapshot(stored.tag))
        cfg = load_settings({})
        local_store = build_feature_store(
            cfg.feature_cache, cfg.redis, local_graph.base.features, stored.tag, local_graph
        )
        local = NeighbourhoodBuilder(local_graph, local_store, (25, 10), 4096, 0)
        remote = await Replica.start_over(cluster, stored.tag, redis_standalone.url).start()
        try:
            assert not remote.keeper.graph.base.features_here  # features.npy not mapped
            targets = np.arange(0, stored.num_nodes, 7)
            for seed in (1, 2):
                want = (await local.build([local.validate(targets, FANOUT, seed)]))[0]
                for _ in range(2):  # L1 cold, then warm
                    same_tensor(await remote.tensor(targets, seed), want)
        finally:
            await remote.close()

    asyncio.run(main())


def test_updates_reach_the_cluster_before_the_ack_and_replicas_converge_and_catch_up(cluster, stored, redis_standalone):
    new_row = np.full(stored.feature_dim, 0.25, np.float32)

    async def main():
        await loaded(cluster, stored)
        a = await Replica.start_over(cluster, stored.tag, redis_standalone.url).start()
        b = await Replica.start_over(cluster, stored.tag, redis_standalone.url).start()
        late = None
        try:
            entry = await a.keeper.submit(
                [
                    {"op": "set_features", "id": 3, "features": new_row.tolist()},
                    {"op": "add_node", "id": 700, "features": (new_row * 2).tolist()},
                    {"op": "add_edge", "src": 700, "dst": 3},
                ]
            )
            # In the cluster under their versioned keys as soon as the update is acknowledged.
            rows = await a.authority.read(np.array([3, 700]), np.array([entry.sequence] * 2))
            np.testing.assert_array_equal(rows, [new_row, new_row * 2])
            np.testing.assert_array_equal(
                (await a.authority.read(np.array([3])))[0], stored.features[3]
            )  # the loaded row stays for replicas behind
            await b.keeper.wait_for(entry.sequence, 5.0)  # read-your-writes on the other replica
            np.testing.assert_array_equal(await b.rows([3, 700, 4]), [new_row, new_row * 2, stored.features[4]])
            await a.keeper.submit([{"op": "set_features", "id": 4, "features": (new_row * 3).tolist()}])
            await b.keeper.wait_for(2, 5.0)
            targets = np.array([3, 4, 700, 10, 11])
            same_tensor(await a.tensor(targets), await b.tensor(targets))
            # A replica started late catches up from snapshot + log before it serves.
            late = await Replica.start_over(cluster, stored.tag, redis_standalone.url).start()
            assert late.keeper.graph.sequence == 2
            same_tensor(await late.tensor(targets), await a.tensor(targets))
            # Compaction: the new snapshot holds row versions, not rows; every replica switches.
            before = await a.tensor(targets)
            result = await a.keeper.compact()
            assert "in the feature cluster" in result["features"]
            from common.bento.store import get_entry

            assert not os.path.exists(os.path.join(get_entry(result["snapshot"]).path, "features.npy"))
            for r in (a, b, late):
                await r.keeper.wait_for(result["announced_at"], 10.0)
                assert (
                    r.keeper.graph.base.tag == result["snapshot"] and r.keeper.graph.overlay_rows(targets)[0].sum() == 0
                )
                r.builder.store.l1.invalidate(targets)  # read the rows from the cluster, by row_sequence
                same_tensor(await r.tensor(targets), before)
        finally:
            for r in (a, b, late):
                if r is not None:
                    await r.close()

    asyncio.run(main())


def test_a_master_killed_during_updates_loses_no_acknowledged_update(cluster, stored, redis_standalone):
    async def main():
        await loaded(cluster, stored)
        writer = await Replica.start_over(cluster, stored.tag, redis_standalone.url).start()
        reader = authority(cluster, stored)
        # Its slot map known before the kill (the URL's node may be the victim: a client that
        # never reached the cluster has no other node to ask; a running FeatureRunner has).
        await reader.check(stored.tag)
        acked: list[tuple[int, int, float]] = []
        refused = 0
        rng = np.random.default_rng(0)
        victim = next(n for n in cluster.nodes if cluster.roles().get(n.port) == "master")
        restarted = False
        try:
            for i in range(60):
                if i == 20:
                    victim.kill()
                    # A read now waits out the failover and is answered by the promoted replica.
                    np.testing.assert_array_equal(await reader.read(np.arange(stored.num_nodes)), stored.features)
                if i > 20 and not restarted and list(cluster.roles().values()).count("master") == 3:
                    victim.restart()  # it rejoins as the promoted master's replica: WAIT can succeed again
                    restarted = True
                v = int(rng.integers(0, stored.num_nodes))
                value = float(i + 1)
                try:
                    entry = await writer.keeper.submit(
                        [{"op": "set_features", "id": v, "features": [value] * stored.feature_dim}]
                    )
                except FeaturesUnavailable:
                    refused += 1
                    continue
                acked.append((v, entry.sequence, value))
            assert len(acked) + refused == 60 and len(acked) >= 40, (len(acked), refused)
            assert await writer.keeper.log.head() == len(acked)  # a refused update was never appended
            # Every acknowledged update's row is in the cluster, after the failover.
            ids = np.array([v for v, _, _ in acked])
            rows = await reader.read(ids, np.array([s for _, s, _ in acked]))
            np.testing.assert_array_equal(rows[:, 0], [x for _, _, x in acked])
        finally:
            await reader.close()
            await writer.close()
            if not restarted:
                victim.restart()
            cluster.wait_state("ok")
            cluster.wait_replicas_synced()

    asyncio.run(main())


def test_a_slot_that_stays_unreachable_is_a_clear_503_and_no_update_is_acknowledged(tmp_path, stored, redis_standalone):
    policy = dataclasses.replace(POLICY, failover_wait_s=0.5, write_replicas=0)

    async def main(c: RedisCluster3):
        a = authority(c, stored, policy)
        try:
            await load_features(stored, a, batch_rows=256, progress=False)
        finally:
            await a.close()
        r = await Replica.start_over(c, stored.tag, redis_standalone.url).start()
        r.authority.policy = policy
        try:
            victim = c.nodes[1]
            head = await r.keeper.log.head()
            # A row whose key (version head + 1: the batch's sequence) lives on the victim.
            v = next(
                i
                for i in range(stored.num_nodes)
                if c.master_of_slot(key_slot(r.authority.rows.key(f"{i}.{head + 1}"))).port == victim.port
            )
            victim.kill()  # no replica: its slots stay down
            with pytest.raises(FeaturesUnavailable, match="GSAGE_FEATURE_FAILOVER_WAIT_S"):
                await r.rows(np.arange(stored.num_nodes))
            with pytest.raises(FeaturesUnavailable, match="nothing was accepted|did not take a write"):
                await r.keeper.submit([{"op": "set_features", "id": v, "features": [1.0] * stored.feature_dim}])
            assert await r.keeper.log.head() == head  # nothing appended, nothing acknowledged
        finally:
            await r.close()

    with RedisCluster3(str(tmp_path / "down"), replicas=0) as c:
        asyncio.run(main(c))


def test_superseded_versions_are_the_ones_a_compacted_snapshot_no_longer_names():
    names = [b"3", b"3.1", b"3.2", b"3.6", b"4", b"4.4", b"5", b"_manifest", b"900.2", b"x.1"]
    row_sequence = np.zeros(600, np.int64)
    row_sequence[[3, 4]] = [2, 4]
    dead, rows = superseded(names, row_sequence, 600, upto=4)
    # 3 and 3.1: older than the snapshot's version 2; 4: older than 4.4; 3.6 came after the
    # compaction; 5 is the snapshot's own; 900 is outside the snapshot; the rest are not rows.
    assert [names[p] for p in dead] == [b"3", b"3.1", b"4"] and rows == 8
    assert superseded(names, None, 600, upto=4)[0] == [1, 2, 5]  # no row_sequence: every row as loaded


def test_pruning_waits_for_every_worker_and_deletes_only_unread_versions(cluster, stored, redis_standalone):
    row = np.full(stored.feature_dim, 0.5, np.float32)

    async def statuses_at(log, sequence: int, workers: int) -> dict:
        for _ in range(200):  # the workers publish their status every second
            statuses = await log.statuses()
            if len(statuses) >= workers and all(s["snapshot_sequence"] >= sequence for s in statuses.values()):
                return statuses
            await asyncio.sleep(0.05)
        raise AssertionError(f"the workers did not report snapshot sequence {sequence}: {statuses}")

    async def main():
        await loaded(cluster, stored)
        a = await Replica.start_over(cluster, stored.tag, redis_standalone.url).start()
        b = await Replica.start_over(cluster, stored.tag, redis_standalone.url).start()
        log = RedisUpdateLog.from_url(redis_standalone.url)
        late = pruner = None
        try:
            for k in range(3):  # row 3 set three times: versions 1, 2, 3
                await a.keeper.submit([{"op": "set_features", "id": 3, "features": (row * (k + 1)).tolist()}])
            await a.keeper.submit([{"op": "set_features", "id": 4, "features": (row * 9).tolist()}])  # 4.4
            result = await a.keeper.compact()  # folds 1..4
            after = await a.keeper.submit([{"op": "set_features", "id": 3, "features": (row * 7).tolist()}])
            for r in (a, b):
                await r.keeper.wait_for(after.sequence, 10.0)
            snap = load_without_rows(result["snapshot"])
            assert snap.log_sequence == 4 and snap.feature_set == stored.feature_set
            pruner = authority(cluster, snap)
            key = pruner.rows.key

            # A worker that still serves the loaded snapshot holds the prune back, by name.
            await log.publish_status("stale-worker", {"snapshot": stored.tag, "snapshot_sequence": 0})
            with pytest.raises(WorkersBehind, match="stale-worker"):
                await prune_features(snap, pruner, await log.statuses(), progress=False)
            await log.client.hdel(log.workers_key, "stale-worker")
            statuses = await statuses_at(log, 4, workers=2)

            dry = await prune_features(snap, pruner, statuses, dry_run=True, progress=False)
            assert dry.versions_deleted == 4 and await pruner.rows.client.exists(key("3.1")) == 1
            targets = np.array([3, 4, 5, 10, 11])
            before = await a.tensor(targets)
            report = await prune_features(snap, pruner, statuses, progress=False)
            # Deleted: 3 and 4 as loaded, 3.1 and 3.2; kept: 3.3 (the snapshot's), 4.4, 3.6 (after it;
            # 5 is the compaction's announcement).
            assert (report.versions_deleted, report.versions_kept) == (4, stored.num_nodes + 1), report
            held = [
                await pruner.rows.client.exists(key(n))
                for n in ("3", "3.1", "3.2", "3.3", "4", "4.4", f"3.{after.sequence}", "5")
            ]
            assert held == [0, 0, 0, 1, 0, 1, 1, 1]
            # Recorded: the next scheduled run skips the scan; a rescan finds nothing left (idempotent).
            again = await prune_features(snap, pruner, statuses, progress=False)
            assert again.skipped and again.keys_scanned == 0 and (await pruner.manifest())["pruned_to"] == 4
            rescan = await prune_features(snap, pruner, statuses, rescan=True, progress=False)
            assert not rescan.skipped and rescan.keys_scanned > 0 and rescan.versions_deleted == 0

            # Every replica, and one started now from the compacted snapshot, serves the same answers
            # from the cluster (L1 emptied): no row it reads was deleted.
            late = await Replica.start_over(cluster, result["snapshot"], redis_standalone.url).start()
            for r in (a, b, late):
                r.builder.store.l1.invalidate(targets)
                same_tensor(await r.tensor(targets), before)
        finally:
            for r in (a, b, late):
                if r is not None:
                    await r.close()
            if pruner is not None:
                await pruner.close()
            await log.close()

    asyncio.run(main())
