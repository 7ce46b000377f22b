"""runners.feature.live.GraphKeeper over a file update log: the write path, the tail, two workers
converging, read-your-writes, compaction and a restart, without a server."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest

from runners.feature.graph import BatchRejected, LiveGraph
from runners.feature.live import GraphKeeper, NeverIssued, NotApplied, TooManyOps, compact, replay
from runners.feature.sampling import sample_tree
from runners.feature.snapshot import load_snapshot, save_snapshot
from runners.feature.update_log import FileUpdateLog
from tests.graphs import small_graph

F = 128


def snapshot():
    snap = copy.copy(small_graph(400, 3000, seed=5))
    snap.directed = False
    return snap


def keeper(log_dir, snap=None, **kw) -> GraphKeeper:
    return GraphKeeper(LiveGraph(snap or snapshot()), FileUpdateLog(str(log_dir)), poll_interval_s=0.01, **kw)


def add_node(v: int, x: float) -> dict:
    return {"op": "add_node", "id": v, "features": [x] * F}


def neighbourhood(graph: LiveGraph, targets, seed: int = 3) -> list[np.ndarray]:
    return sample_tree(graph.base.indptr, graph.base.indices, np.asarray(targets, np.int64), (25, 10), seed=seed,
                       overlay=graph.overlay)


def test_a_batch_is_appended_then_applied_and_a_bad_one_leaves_no_trace(tmp_path):
    async def main():
        k = keeper(tmp_path)
        await k.start()
        entry = await k.submit([add_node(500, 1.0), {"op": "add_edge", "src": 500, "dst": 1}])
        assert entry.sequence == 1 and k.graph.sequence == 1 and k.graph.contains(np.array([500]))[0]
        with pytest.raises(BatchRejected, match=r"op 1 \(add_edge\): dst: node 700 is not in the graph"):
            await k.submit([{"op": "add_edge", "src": 1, "dst": 2}, {"op": "add_edge", "src": 1, "dst": 700}])
        assert await k.log.head() == 1 and k.graph.sequence == 1  # nothing of the bad batch
        assert 2 not in k.graph.neighbours(1)[-1:].tolist()
        with pytest.raises(TooManyOps):
            await k.submit([add_node(600 + i, 0.0) for i in range(k.max_ops + 1)])
        with pytest.raises(BatchRejected, match="not an update op"):
            await k.submit([{"op": "_snapshot", "tag": "x"}])
        await k.close()

    asyncio.run(main())


def test_two_workers_converge_and_a_write_to_either_is_validated_against_all_before_it(tmp_path):
    async def main():
        a, b = keeper(tmp_path), keeper(tmp_path)
        await a.start()
        await b.start()
        await a.submit([add_node(500, 1.0)])
        # b has not applied it yet, but validates against the log's head: the edge is valid.
        await b.submit([{"op": "add_edge", "src": 500, "dst": 3}])
        with pytest.raises(BatchRejected, match="exists already"):
            await b.submit([add_node(500, 2.0)])
        await a.submit([{"op": "set_features", "id": 3, "features": [9.0] * F}, {"op": "remove_edge", "src": 3, "dst": 500}])
        await asyncio.wait_for(b.wait_for(3, 5.0), 5.0)
        await asyncio.wait_for(a.wait_for(3, 5.0), 5.0)
        assert a.graph.sequence == b.graph.sequence == 3
        targets = np.flatnonzero(a.graph.present)
        for x, y in zip(neighbourhood(a.graph, targets), neighbourhood(b.graph, targets)):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(a.graph.rows(targets), b.graph.rows(targets))
        await a.close()
        await b.close()

    asyncio.run(main())


def test_read_your_writes_waits_for_the_sequence_and_refuses_after_the_wait(tmp_path):
    async def main():
        writer, reader = keeper(tmp_path), keeper(tmp_path)
        await writer.start()
        reader.poll_interval_s = 3600.0  # its tail would not look: wait_for must look itself
        await reader.start()
        entry = await writer.submit([add_node(500, 1.0)])
        await reader.wait_for(entry.sequence, 5.0)
        assert reader.graph.contains(np.array([500]))[0]
        with pytest.raises(NeverIssued, match="min_sequence 99 was never issued: .* latest sequence is 1"):
            await reader.wait_for(99, 0.05)
        async with reader._applying:  # the reader busy elsewhere: the entry is issued, not applied
            second = await writer.submit([add_node(501, 1.0)])
            with pytest.raises(NotApplied, match=f"graph update {second.sequence} is not applied here yet"):
                await reader.wait_for(second.sequence, 0.05)
        await writer.close()
        await reader.close()

    asyncio.run(main())


def test_a_restarted_worker_rebuilds_its_graph_from_the_snapshot_and_the_log(tmp_path):
    async def main():
        k = keeper(tmp_path)
        await k.start()
        for i in range(20):
            await k.submit([add_node(500 + i, float(i)), {"op": "add_edge", "src": 500 + i, "dst": i}])
        await k.close()
        again = keeper(tmp_path)  # a new process: only the snapshot and the log
        await again.start()
        assert again.graph.sequence == 20
        targets = np.flatnonzero(k.graph.present)
        for x, y in zip(neighbourhood(k.graph, targets), neighbourhood(again.graph, targets)):
            np.testing.assert_array_equal(x, y)
        await again.close()

    asyncio.run(main())


def test_compaction_folds_the_log_and_every_worker_switches_with_the_same_answers(tmp_path, model_store):
    snap = snapshot()
    tag = save_snapshot(snap)

    async def main():
        a = keeper(tmp_path, load_snapshot(tag))
        b = keeper(tmp_path, load_snapshot(tag))
        await a.start()
        await b.start()
        await a.submit([add_node(500, 1.0), {"op": "add_edge", "src": 500, "dst": 7}, {"op": "remove_node", "id": 9}])
        await a.submit([{"op": "set_features", "id": 7, "features": [3.0] * F}])
        await b.wait_for(2, 5.0)
        targets = np.flatnonzero(a.graph.present)
        before = neighbourhood(a.graph, targets), a.graph.rows(targets)
        result = await a.compact()
        assert result["log_sequence"] == 2 and result["updates_folded"] == 2 and result["announced_at"] == 3
        await a.submit([{"op": "add_edge", "src": 500, "dst": 11}])  # after the compaction
        await a.wait_for(4, 5.0)
        await b.wait_for(4, 5.0)
        for k in (a, b):
            assert k.graph.base.tag == result["snapshot"] and k.graph.base.log_sequence == 2
            assert k.graph.stats().nodes == 2  # only the edge added after the compaction: its two lists
        # The same seed, the same answers, minus the edge added after the compaction.
        later = LiveGraph(load_snapshot(result["snapshot"]))
        for x, y in zip(before[0], neighbourhood(later, targets)):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(before[1], later.rows(targets))
        # Entries every worker's snapshot holds go (after their next status).
        await a._publish_status(force=True)
        await b._publish_status(force=True)
        await a._trim()
        entries = await a.log.read(2, 10)
        assert [e.sequence for e in entries] == [3, 4]
        await a.close()
        await b.close()

    asyncio.run(main())


def test_replay_is_the_living_graph_for_training(tmp_path, model_store):
    tag = save_snapshot(snapshot())

    async def main():
        k = keeper(tmp_path, load_snapshot(tag))
        await k.start()
        await k.submit([add_node(500, 1.0), {"op": "add_edge", "src": 500, "dst": 7}])
        graph = await replay(load_snapshot(tag), k.log)
        assert graph.sequence == 1 and 500 in graph.neighbours(7).tolist()
        result = await compact(tag, k.log, announce=False)
        assert "announced_at" not in result and await k.log.head() == 1
        # A compaction up to a sequence the log never issued is the caller's error, and saves nothing.
        with pytest.raises(NeverIssued, match="upto 2 was never issued: the update log's head is 1"):
            await k.compact(upto=2)
        assert k.last_compaction is None
        await k.close()

    asyncio.run(main())


def test_a_snapshot_folded_from_another_log_is_refused_at_start(tmp_path):
    from runners.feature.live import LogBehind

    snap = snapshot()
    snap.log_sequence = 5  # as if compacted from a log that had 5 entries
    k = keeper(tmp_path / "empty-log", snap)
    with pytest.raises(LogBehind, match=r"head \(0\) is behind .* up to 5"):
        asyncio.run(k.start())
