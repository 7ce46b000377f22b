"""A FeatureRunner worker's live graph, kept current from the update log (no BentoML here).

- **Write path** (``submit``): under the log's writer lock, catch up to the log's head, validate
  the batch against the graph as it is then (``LiveGraph.validate``), append it with a
  compare-and-append (another writer in between: catch up and retry), apply it here, answer its
  sequence. A batch is acknowledged only once the log holds it durably; a batch that does not
  validate is refused whole, and the log never holds it.
- **Read path**: every worker tails the log (``run``) and applies new entries in order within
  ``poll_interval_s``. ``lock`` keeps a batch of predictions and a batch of updates apart, so a
  prediction sees an update entirely or not at all; after an update changed rows, L1 forgets
  them (L2 keys carry each row's version).
- **Read-your-writes** (``wait_for``): a prediction that names a ``min_sequence`` waits until
  this worker applied it, at most ``min_sequence_wait_s``.
- **Compaction**: ``compact`` folds the log into a new ``graph-snapshot:<v>`` (``log_sequence``
  recorded) and appends a ``_snapshot`` entry; each worker, when it reaches that entry, maps the
  new snapshot, replays the entries after its sequence and swaps the graph under the lock,
  between two batches: no request fails, and none changes its answer (the lists keep their
  order, the rows their values).
- **Status**: each worker publishes its applied sequence, lag (entries, and seconds: the age of
  the oldest entry it has read and not applied yet), overlay size and last snapshot switch in
  the log (``GET /graph/status``); entries that every live worker's snapshot already holds are
  trimmed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from common.errors import KindOfError
from common.feature_runner_api import NotAppliedYet
from common.graph_ops import BatchRejected
from runners.feature import update_log
from runners.feature.graph import LiveGraph
from runners.feature.snapshot import GraphSnapshot, load_snapshot, save_snapshot
from runners.feature.update_log import LogEntry, LogTrimmed, LogUnavailable, SequenceConflict, UpdateLog

log = logging.getLogger("graphsage.graph")

SNAPSHOT_OP = "_snapshot"  # internal entry: switch to a compacted snapshot (never a client's op)
READ_BATCH = 500  # replay's default (GSAGE_GRAPH_LOG_READ_BATCH for a worker)
ROW_WRITE_BATCH = 4096  # rows per write when a compaction stores the changed rows
# Writes rows (ids, rows, versions) to the feature cluster; returns once it holds them.
RowWriter = Callable[[np.ndarray, np.ndarray, np.ndarray], Awaitable[None]]
SnapshotLoader = Callable[[str], GraphSnapshot]


def batch_rows(ops: Sequence[dict], sequence: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows a batch sets (its last one for a node set twice), with the version they take:
    ``sequence``, the batch's entry in the log."""
    rows: dict[int, Any] = {}
    for op in ops:
        if op.get("op") in ("add_node", "set_features"):
            rows[int(op["id"])] = op["features"]
    ids = np.fromiter(rows, np.int64, len(rows))
    values = np.asarray(list(rows.values()), np.float32).reshape(len(rows), -1)
    return ids, values, np.full(len(rows), sequence, np.int64)


async def write_changed_rows(graph: LiveGraph, write: RowWriter, batch: int = ROW_WRITE_BATCH) -> int:
    """Every row an update set since ``graph``'s snapshot, written under its version (a
    compaction in cluster mode: the snapshot it saves holds no rows, only their versions)."""
    ids, rows, versions = graph.changed_rows()
    for start in range(0, ids.size, batch):
        end = start + batch
        await write(ids[start:end], rows[start:end], versions[start:end])
    return int(ids.size)


class TooManyOps(KindOfError):
    """A batch with more ops than ``graph_max_ops``."""

    status_code = 413


class LogBehind(KindOfError):
    """The update log's head is behind the snapshot's sequence: the snapshot was folded from
    another log (or the log was lost); serving would silently skip or repeat updates."""

    status_code = 409


class NeverIssued(KindOfError):
    """``min_sequence`` beyond the update log's head: no update with that sequence was accepted,
    so waiting cannot help (a client bug, not a transient state)."""

    status_code = 422


@dataclasses.dataclass
class Observer:
    """Metrics hooks (the service wires Prometheus; tests leave them out)."""

    applied: Callable[[str, int], None] = lambda op, n: None
    staleness: Callable[[float], None] = lambda seconds: None
    state: Callable[[dict[str, Any]], None] = lambda status: None
    # The lag in seconds, as it changes while the worker catches up (``state`` says it too, but
    # only between two catch-ups, when it is about 0 again).
    lag_seconds: Callable[[float], None] = lambda seconds: None
    # "compact": folding the log into a new snapshot; "switch": a worker serving it.
    compaction: Callable[[str, float], None] = lambda stage, seconds: None


def worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _wall_clock() -> float:
    return update_log.base.wall_clock()  # the clock of the entries' acked_at, looked up at each call


class GraphKeeper:
    def __init__(
        self,
        graph: LiveGraph,
        log_: UpdateLog,
        *,
        on_swap: Callable[[LiveGraph], None] = lambda g: None,
        on_rows_changed: Callable[[np.ndarray], None] = lambda ids: None,
        poll_interval_s: float = 0.02,
        max_ops: int = 10_000,
        capacity: int = 0,
        worker: str | None = None,
        observer: Observer | None = None,
        clock: Callable[[], float] = _wall_clock,
        timer: Callable[[], float] = time.perf_counter,
        read_batch: int = READ_BATCH,
        status_interval_s: float = 1.0,
        row_writer: RowWriter | None = None,
        load: SnapshotLoader = load_snapshot,
    ) -> None:
        """``on_swap``: the builder and the feature store start serving a new graph (compaction);
        ``on_rows_changed``: rows of these ids changed (the caches forget them). Both are called
        under ``lock``. ``clock``: the wall clock the entries' ``acked_at`` is read against
        (staleness, lag); ``timer``: what compactions and switches are timed with.
        ``row_writer``: the feature cluster's write (cluster mode): a batch's rows are written
        there before the batch is appended, a compaction's changed rows before it is announced;
        ``load``: how a compacted snapshot is opened (cluster mode: without its rows)."""
        self.graph = graph
        self.log = log_
        self.lock = asyncio.Lock()
        self.on_swap = on_swap
        self._on_rows_changed = on_rows_changed
        self.poll_interval_s = poll_interval_s
        self.max_ops = max_ops
        self.capacity = capacity
        self.worker = worker or worker_name()
        self.observer = observer or Observer()
        self.clock = clock
        self.timer = timer
        self.read_batch = read_batch
        self.status_interval_s = status_interval_s
        self.row_writer = row_writer
        self.load = load
        self.head = graph.sequence  # the log's head as last seen
        # acked_at of the oldest entry read from the log and not applied yet (None: none).
        self._pending_acked_at: float | None = None
        self._lag_reported = 0.0  # the last lag_seconds given to the observer
        self._applying = asyncio.Lock()  # one coroutine reads and applies the log at a time
        self._applied_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_status = 0.0
        self.last_compaction: dict[str, Any] | None = None
        self.last_switch: dict[str, Any] | None = None  # this worker's last switch to a compacted snapshot
        self.failed: str | None = None  # why this worker stopped applying (it then refuses reads)

    # -- the tail ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Catch up with the log (restart: snapshot + the entries after it), then tail it."""
        await self._check_head()
        await self.catch_up()
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        while True:
            try:
                await self.catch_up()
                await self._publish_status()
                if not self._wake.is_set():
                    # Until the next status is due: the log's wait itself looks for new entries
                    # every poll interval (cheaply), so an idle worker costs no round trip per poll.
                    until_status = self._next_status - time.monotonic()
                    await self.log.wait(self.graph.sequence, max(self.poll_interval_s, until_status))
                self._wake.clear()
            except asyncio.CancelledError:
                raise
            except LogUnavailable as exc:
                log.warning(
                    "update log unavailable (%s); serving the graph as applied (sequence %d)", exc, self.graph.sequence
                )
                await asyncio.sleep(max(self.poll_interval_s, 0.5))
            except Exception as exc:
                self.failed = f"{type(exc).__name__}: {exc}"
                log.exception(
                    "applying the update log failed at sequence %d; this worker stops applying", self.graph.sequence + 1
                )
                return

    async def _check_head(self) -> int:
        head = await self.log.head()
        if head < self.graph.sequence:
            raise LogBehind(
                f"the update log's head ({head}) is behind {self.graph.base.tag}, which holds the updates "
                f"up to {self.graph.sequence}: it was folded from another update log (or this one was "
                "lost); serve a snapshot of this log, or point GSAGE_GRAPH_LOG* at the log it came from"
            )
        return head

    async def catch_up(self) -> int:
        """Apply every entry after the graph's sequence; returns how many."""
        async with self._applying:
            return await self._catch_up()

    async def _catch_up(self) -> int:
        applied = 0
        while True:
            try:
                entries = await self.log.read(self.graph.sequence, self.read_batch)
            except LogTrimmed as exc:
                raise RuntimeError(
                    f"the update log no longer holds the entries after {self.graph.sequence} "
                    f"({self.graph.base.tag}): serve a newer snapshot (GSAGE_SNAPSHOT_TAG)"
                ) from exc
            if not entries:
                if self._lag_reported:  # caught up: once, not at every idle poll
                    self._report_lag(0.0)
                return applied
            self._pending_acked_at = entries[0].acked_at
            self._report_lag(self.lag_seconds())
            for entry in entries:
                self._pending_acked_at = entry.acked_at  # stays if applying it fails: the lag then grows
                await self._apply(entry)
                applied += 1
            # Every entry read is applied; whether more wait, the next read says.
            self._pending_acked_at = None

    async def _apply(self, entry: LogEntry) -> None:
        """Apply an entry of the log without validating it again: its writer validated it against
        the graph at the sequence before it (compare-and-append), which is the graph every worker
        holds when it reaches the entry; replay (restarts, compaction) applies entries the same
        way. Validating again in every worker would double each batch's cost on every reader."""
        if entry.sequence != self.graph.sequence + 1:
            return  # applied already (by the write path, or an earlier read)
        if entry.ops and entry.ops[0].get("op") == SNAPSHOT_OP:
            await self._switch(entry)
            return
        async with self.lock:
            if entry.sequence != self.graph.sequence + 1:
                return
            changed = self.graph.apply(entry.ops, entry.sequence)
            if changed:
                self._on_rows_changed(np.fromiter(changed, np.int64, len(changed)))
        for op, n in Counter(op["op"] for op in entry.ops).items():
            self.observer.applied(op, n)
        self.observer.staleness(max(0.0, self.clock() - entry.acked_at))
        self._applied(entry)

    def _report_lag(self, seconds: float) -> None:
        self._lag_reported = seconds
        self.observer.lag_seconds(seconds)

    def _applied(self, entry: LogEntry) -> None:
        self.head = max(self.head, entry.sequence)
        self._applied_event.set()  # wakes the predictions waiting for a sequence
        self._applied_event = asyncio.Event()

    # -- writing -------------------------------------------------------------------------------

    async def submit(self, ops: list[dict]) -> LogEntry:
        """Validate, append (durably), apply; raises ``BatchRejected`` (nothing appended),
        ``TooManyOps``, ``LogUnavailable`` (nothing acknowledged)."""
        if len(ops) > self.max_ops:
            raise TooManyOps(f"{len(ops)} ops in one batch; at most {self.max_ops} (GSAGE_GRAPH_MAX_OPS)")
        if not ops:
            raise BatchRejected(0, "-", "ops", "a batch needs at least one op")
        for i, op in enumerate(ops):
            if isinstance(op, dict) and op.get("op") == SNAPSHOT_OP:
                raise BatchRejected(i, SNAPSHOT_OP, "op", "is not an update op")
        async with self.log.writer_lock(), self._applying:
            while True:
                await self._catch_up()
                self.graph.validate(ops)
                if self.row_writer is not None:
                    # Before the append: an acknowledged update's rows are in the cluster. A writer
                    # that then loses the race for this sequence leaves rows under a version the
                    # winner may also use; every worker answers changed rows from its overlay, and
                    # a compaction writes them again from the log, so no answer reads those.
                    await self.row_writer(*batch_rows(ops, self.graph.sequence + 1))
                try:
                    entry = await self.log.append(ops, expected_head=self.graph.sequence)
                except SequenceConflict:
                    await self._check_head()  # a log behind the graph would conflict forever
                    continue  # a writer elsewhere appended first: catch up, validate again
                await self._apply(entry)
                return entry

    # -- read-your-writes ----------------------------------------------------------------------

    async def wait_for(self, sequence: int, timeout_s: float) -> None:
        """Return once this worker applied ``sequence``; ``NotAppliedYet`` after ``timeout_s``."""
        if sequence <= self.graph.sequence:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._wake.set()  # look at the log now rather than at the next poll
        while self.graph.sequence < sequence:
            left = deadline - loop.time()
            if left <= 0:
                head = await self.log.head()
                if sequence > head:
                    raise NeverIssued(
                        f"min_sequence {sequence} was never issued: the update log's latest sequence is "
                        f"{head}; pass the sequence an update answered"
                    )
                raise NotAppliedYet(
                    f"graph update {sequence} is not applied here yet (applied: {self.graph.sequence}); retry shortly"
                )
            event = self._applied_event
            try:
                await asyncio.wait_for(asyncio.shield(event.wait()), min(left, self.poll_interval_s))
            except TimeoutError:
                if not self._applying.locked():
                    await self.catch_up()

    # -- compaction ----------------------------------------------------------------------------

    async def _switch(self, entry: LogEntry) -> None:
        """Serve the compacted snapshot the entry names, with the entries between the snapshot's
        sequence and this one replayed (they were applied to the graph it replaces)."""
        op = entry.ops[0]
        started = self.timer()
        snapshot = await asyncio.to_thread(self.load, op["tag"])
        fresh = await replay(snapshot, self.log, entry.sequence - 1, self.capacity or self.graph.capacity)
        if fresh.sequence != entry.sequence - 1:
            raise RuntimeError(
                f"the log ended at {fresh.sequence} while replaying it onto {op['tag']} (expected {entry.sequence - 1})"
            )
        async with self.lock:
            fresh.sequence = entry.sequence
            self.graph = fresh
            self.on_swap(fresh)
        self._applied(entry)
        seconds = self.timer() - started
        replayed = entry.sequence - 1 - snapshot.log_sequence
        self.last_switch = {
            "snapshot": op["tag"],
            "sequence": entry.sequence,
            "replayed": replayed,
            "seconds": round(seconds, 3),
        }
        self.observer.compaction("switch", seconds)
        log.info(
            "serving %s (log sequence %d) after %d replayed updates, switched in %.2f s",
            op["tag"],
            snapshot.log_sequence,
            replayed,
            seconds,
        )

    async def compact(self, upto: int | None = None) -> dict[str, Any]:
        """Fold the log into a new snapshot and tell every worker to serve it (``_snapshot``)."""
        if upto is not None and upto > (head := await self.log.head()):
            raise NeverIssued(f"upto {upto} was never issued: the update log's head is {head}")
        started = self.timer()
        result = await compact(
            self.graph.base.tag,
            self.log,
            upto,
            self.capacity or self.graph.capacity,
            row_writer=self.row_writer,
            load=self.load,
        )
        self.observer.compaction("compact", self.timer() - started)
        self.last_compaction = result
        return result

    # -- status --------------------------------------------------------------------------------

    def lag_seconds(self) -> float:
        """How long the oldest entry this worker has read and not applied yet has been
        acknowledged; 0 when it applied everything it read."""
        pending = self._pending_acked_at
        return 0.0 if pending is None else max(0.0, self.clock() - pending)

    def status(self) -> dict[str, Any]:
        stats = self.graph.stats()
        return {
            "applied": self.graph.sequence,
            "head_seen": self.head,
            "lag_entries": max(0, self.head - self.graph.sequence),
            "lag_seconds": round(self.lag_seconds(), 3),
            "snapshot": self.graph.base.tag,
            "snapshot_sequence": self.graph.base.log_sequence,
            "overlay": dataclasses.asdict(stats),
            "capacity": self.graph.capacity,
            "last_switch": self.last_switch,
            "failed": self.failed,
        }

    async def _publish_status(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_status:
            return
        self._next_status = now + self.status_interval_s
        self.head = max(self.head, await self.log.head())
        status = self.status()
        self.observer.state(status)
        await self.log.publish_status(self.worker, status)
        await self._trim()

    async def _trim(self) -> None:
        """Entries every live worker's snapshot holds are no longer needed by anyone."""
        statuses = await self.log.statuses()
        if not statuses:
            return
        safe = min(int(s.get("snapshot_sequence", 0)) for s in statuses.values())
        if safe > 0:
            removed = await self.log.trim(safe)
            if removed:
                log.info("trimmed %d update log entries up to %d (folded into every worker's snapshot)", removed, safe)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass


async def replay(snapshot: GraphSnapshot, log_: UpdateLog, upto: int | None = None, capacity: int = 0) -> LiveGraph:
    """``snapshot`` with the log's entries after its sequence (up to ``upto``, default the head)
    applied: the current graph, in memory (a compaction, a switch, training on the living graph).
    The entries are applied in a thread, a chunk at a time, so a worker keeps serving meanwhile."""
    graph = LiveGraph(snapshot, capacity)
    limit = await log_.head() if upto is None else upto
    while graph.sequence < limit:
        entries = [e for e in await log_.read(graph.sequence, READ_BATCH) if e.sequence <= limit]
        if not entries:
            break
        await asyncio.to_thread(_apply_all, graph, entries)
    return graph


def _apply_all(graph: LiveGraph, entries: list[LogEntry]) -> None:
    for entry in entries:
        if entry.ops and entry.ops[0].get("op") == SNAPSHOT_OP:
            graph.sequence = entry.sequence  # an earlier compaction: nothing to apply
        else:
            graph.apply(entry.ops, entry.sequence)


async def compact(
    snapshot_tag: str,
    log_: UpdateLog,
    upto: int | None = None,
    capacity: int = 0,
    announce: bool = True,
    row_writer: RowWriter | None = None,
    load: SnapshotLoader = load_snapshot,
) -> dict[str, Any]:
    """Build ``graph-snapshot:<v>`` from ``snapshot_tag`` + the log (up to ``upto``, default
    its head), recording the sequence it holds; with ``announce``, append the ``_snapshot`` entry
    that makes every FeatureRunner worker switch to it. In cluster mode (``row_writer``, ``load``
    without rows) the snapshot holds no rows: each row's version instead, and the rows updates
    set are written to the cluster (again: the same values) before the snapshot is saved."""
    started = time.perf_counter()
    base = await asyncio.to_thread(load, snapshot_tag)
    graph = await replay(base, log_, upto, capacity)
    folded = graph.sequence
    snapshot = await asyncio.to_thread(graph.materialize)
    rows_written = 0
    if not snapshot.features_here:
        if row_writer is None:
            raise RuntimeError(f"{base.tag}'s rows are in the feature cluster: compacting it needs its writer")
        rows_written = await write_changed_rows(graph, row_writer)
    seconds = time.perf_counter() - started
    snapshot.extra = {**snapshot.extra, "compacted_from": base.tag, "compaction_seconds": round(seconds, 3)}
    tag = await asyncio.to_thread(save_snapshot, snapshot, {"compacted_from": base.tag.split(":")[-1]})
    result = {
        "snapshot": tag,
        "compacted_from": base.tag,
        "log_sequence": folded,
        "updates_folded": folded - base.log_sequence,
        "seconds": round(time.perf_counter() - started, 3),
        "num_nodes": snapshot.num_nodes,
        "num_edges": snapshot.num_edges,
        "features": "in the snapshot"
        if snapshot.features_here
        else f"in the feature cluster ({rows_written} rows set)",
    }
    if announce:
        while True:
            head = await log_.head()
            try:
                entry = await log_.append([{"op": SNAPSHOT_OP, "tag": tag, "sequence": folded}], expected_head=head)
                break
            except SequenceConflict:
                continue
        result["announced_at"] = entry.sequence
    log.info("compacted %s + %d updates into %s in %.2f s", base.tag, result["updates_folded"], tag, result["seconds"])
    return result
