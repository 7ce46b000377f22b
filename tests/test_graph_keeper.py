"""runners.feature.live.GraphKeeper over a file update log: the write path, the tail, two workers
converging, read-your-writes, compaction and a restart, without a server."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest

from runners.feature import update_log
from runners.feature.graph import BatchRejected, LiveGraph
from runners.feature.live import GraphKeeper, NeverIssued, NotAppliedYet, Observer, TooManyOps, compact, replay
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
    return sample_tree(
        graph.base.indptr, graph.base.indices, np.asarray(targets, np.int64), (25, 10), seed=seed, overlay=graph.overlay
    )


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
        await a.submit(
            [{"op": "set_features", "id": 3, "features": [9.0] * F}, {"op": "remove_edge", "src": 3, "dst": 500}]
        )
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
            with pytest.raises(NotAppliedYet, match=f"graph update {second.sequence} is not applied here yet"):
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


# -- observability: the lag in seconds, compaction and switch times ----------------------------


class FakeClock:
    """A clock that moves only when the test moves it (``now``), or by ``steps`` per call."""

    def __init__(self, now: float = 0.0, steps: list[float] | None = None):
        self.now = now
        self.steps = list(steps or [])

    def __call__(self) -> float:
        if self.steps:
            self.now = self.steps.pop(0)
        return self.now


def set_features(v: int, x: float) -> dict:
    return {"op": "set_features", "id": v, "features": [x] * F}


def test_the_lag_in_seconds_is_the_age_of_the_oldest_entry_read_and_not_applied(tmp_path, monkeypatch):
    clock = FakeClock(1000.0)
    monkeypatch.setattr(update_log.base, "wall_clock", clock)  # acked_at, and the keepers' default clock

    async def main():
        writer = keeper(tmp_path)
        for i in range(3):
            clock.now = 1000.0 + i
            await writer.submit([set_features(i, float(i))])
        clock.now = 1010.0
        reported: list[float] = []
        # Not started: no tail. Three entries read two at a time: the lag reported as each read begins.
        reader = keeper(tmp_path, observer=Observer(lag_seconds=reported.append), read_batch=2)
        assert reader.lag_seconds() == 0.0  # nothing read yet
        seen = []
        reader._on_rows_changed = lambda ids: seen.append(reader.status()["lag_seconds"])
        await reader.catch_up()
        assert seen == [10.0, 9.0, 8.0]  # applying entries 1, 2, 3, acknowledged at 1000, 1001, 1002
        assert reported == [10.0, 8.0, 0.0]
        assert reader.lag_seconds() == 0.0 and reader.status()["lag_seconds"] == 0.0
        # Caught up and idle: nothing more is reported.
        await reader.catch_up()
        assert reported == [10.0, 8.0, 0.0]

        # A worker that stops at an entry: its lag grows with the clock, from that entry's ack.
        clock.now = 1020.0
        await writer.submit([set_features(5, 1.0)])
        await writer.submit([set_features(6, 1.0)])

        def fail(ops, sequence):
            raise RuntimeError("a corrupt entry")

        reader.graph.apply = fail  # entry 4 cannot be applied
        clock.now = 1030.0
        with pytest.raises(RuntimeError):
            await reader.catch_up()
        clock.now = 1042.5
        assert reader.graph.sequence == 3 and reader.status()["lag_seconds"] == 22.5
        assert reported[-1] == 10.0

    asyncio.run(main())


def test_compaction_and_switch_times_are_observed_and_in_the_status(tmp_path, model_store):
    tag = save_snapshot(snapshot())
    timer = FakeClock(steps=[100.0, 102.5, 200.0, 200.75])
    times: list[tuple[str, float]] = []

    async def main():
        # Not started: no tail task, so the test orders the timer's calls (compact, then switch).
        k = keeper(tmp_path, load_snapshot(tag), observer=Observer(compaction=lambda *t: times.append(t)), timer=timer)
        await k.catch_up()
        await k.submit([add_node(500, 1.0)])
        assert k.status()["last_switch"] is None
        result = await k.compact()
        assert times == [("compact", 2.5)]
        await k.catch_up()  # the _snapshot entry: this worker switches
        assert times == [("compact", 2.5), ("switch", 0.75)]
        status = k.status()
        assert status["last_switch"] == {"snapshot": result["snapshot"], "sequence": 2, "replayed": 0, "seconds": 0.75}
        assert status["snapshot"] == result["snapshot"] and status["lag_seconds"] == 0.0
        await k.close()

    asyncio.run(main())


def test_the_lag_and_compaction_times_reach_prometheus(tmp_path):
    from prometheus_client import REGISTRY

    from runners.feature.metrics import graph_observer

    observer = graph_observer()

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    observer.lag_seconds(4.5)
    assert sample("graph_lag_seconds") == 4.5
    k = keeper(tmp_path, observer=observer)
    observer.state(k.status())  # what each status publication sets: the same figures as GET /graph/status
    assert sample("graph_lag_seconds") == 0.0 and sample("graph_lag_entries") == 0.0
    count, under = (
        sample("graph_compaction_seconds_count", stage="switch"),
        sample("graph_compaction_seconds_bucket", stage="switch", le="0.5"),
    )
    observer.compaction("switch", 0.3)
    observer.compaction("compact", 42.0)
    assert sample("graph_compaction_seconds_count", stage="switch") == count + 1
    assert sample("graph_compaction_seconds_bucket", stage="switch", le="0.5") == under + 1
    assert sample("graph_compaction_seconds_bucket", stage="compact", le="30.0") < sample(
        "graph_compaction_seconds_bucket", stage="compact", le="60.0"
    )
