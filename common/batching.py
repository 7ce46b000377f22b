"""An adaptive batcher: concurrent callers' items become one handler call.

One queue, ``max_concurrent`` batches in flight (default 1: a model worker computes one batch at a
time). While batches run, new items wait in the queue; the next batch takes everything waiting
(up to ``max_batch_size`` units), so batches grow with load and a lone request never waits for
company unless ``max_delay_s`` asks it to. The batcher does not know
what it batches: the handler receives a list of items and returns one result per item.
(After MLServer's ``batching/adaptive.py`` and Ray Serve's ``@serve.batch``.)

Several slots (``max_concurrent > 1``) are for pipelining: while batches are in flight, the next
starts only once it is full (``max_batch_size`` units waiting) or, with ``overlap_ratio``, once
it holds that many times the units of the largest batch in flight; a smaller one waits for a
running batch to finish and takes what arrived meanwhile. The gateway's coalescer thus pipelines
bulk calls (the FeatureRunner builds one call's tensor while the model runner computes
another's) and single-node traffic runs as two calls of similar size side by side, not as a
call of one for each request that found a slot free (measured worse) nor as one call at a time
(the runners then took turns instead of working side by side). ``overlap_ratio=1`` beat
overlapping only full batches on single-node traffic and matched it on bulk; 0.5 and 2 were each
worse. ``python -m bench.suite.ab --variant GSAGE_COALESCE_OVERLAP_RATIO=<r>`` measures a ratio
against the app's default, in interleaved windows.

Idle fast path: with ``max_delay_s == 0``, an item that finds the queue empty and nothing in
flight is a batch of one whatever happens next, so ``submit`` runs the handler in the caller's
own task, skipping the queue, the collector's wake-up and a task per batch (three event-loop
turns; the batcher sits in every hop of a request: gateway coalescer, feature runner, model
runner). The worker takes a slot only once it holds an item, so an idle worker never blocks
this path.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from common import request_context

T = TypeVar("T")
R = TypeVar("R")


class _Entry(NamedTuple, Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    arrived: float
    # The caller's context (its request id, its trace span): the batch's call runs in its first
    # caller's, not in whichever request's the long-lived worker task was made in.
    context: contextvars.Context


@dataclass
class BatchStats:
    batches: int = 0
    items: int = 0
    units: int = 0
    queue_seconds: float = 0.0
    compute_seconds: float = 0.0
    last_batch_units: int = 0
    last_batch_queue_s: float = 0.0
    last_batch_compute_s: float = 0.0


class AdaptiveBatcher(Generic[T, R]):
    def __init__(
        self,
        handler: Callable[[list[T]], Awaitable[list[R]]],
        max_batch_size: int = 256,
        max_delay_s: float = 0.0,
        size_of: Callable[[T], int] = lambda _: 1,
        on_batch: Callable[[BatchStats], None] | None = None,
        max_concurrent: int = 1,
        overlap_ratio: float = math.inf,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``overlap_ratio``: beside batches in flight, a partial batch starts once it holds at
        least this many times the units of the largest of them (inf: only a full batch starts).
        ``clock``: seconds, for each item's arrival, the ``max_delay_s`` window and the stats. The
        window's wait itself is the event loop's timer, so a test fakes both at once: a loop on
        virtual time and ``clock=loop.time`` (tests/test_batching.py)."""
        self.handler = handler
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self.size_of = size_of
        self.on_batch = on_batch
        self.overlap_ratio = overlap_ratio
        self.stats = BatchStats()
        self._clock = clock
        self._queue: asyncio.Queue[_Entry[T, R]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(max_concurrent)
        self._in_flight = 0  # slots held: batches running, or being collected by the worker
        self._running_units: list[int] = []  # units of each batch running
        self._queued_units = 0
        self._changed = asyncio.Event()  # an item queued or a batch done: a waiting partial batch looks again
        self._running: set[asyncio.Task[None]] = set()
        self._collecting: list[_Entry[T, R]] = []  # taken off the queue, not yet dispatched

    async def submit(self, item: T) -> R:
        if self.max_delay_s <= 0 and self._queue.empty() and self._in_flight == 0:
            return await self._run_alone(item)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run())
            self._worker.add_done_callback(self._worker_stopped)
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queued_units += self.size_of(item)
        await self._queue.put(_Entry(item, future, self._clock(), contextvars.copy_context()))
        self._changed.set()
        return await future

    async def _run_alone(self, item: T) -> R:
        await self._take_slot()  # free (checked by the caller, no await since): no suspension
        units = self.size_of(item)
        self._running_units.append(units)
        started = self._clock()
        try:
            results = await self.handler([item])
            if len(results) != 1:
                raise RuntimeError(f"handler returned {len(results)} results for 1 items")
        finally:
            self._running_units.remove(units)
            self._release_slot()
            self._record([item], [started], started)
        return results[0]

    async def _take_slot(self) -> None:
        await self._slots.acquire()
        self._in_flight += 1

    def _release_slot(self) -> None:
        self._slots.release()
        self._in_flight -= 1
        self._changed.set()

    def _dequeued(self, entry: _Entry[T, R]) -> _Entry[T, R]:
        self._queued_units -= self.size_of(entry.item)
        return entry

    def _worker_stopped(self, worker: asyncio.Task[None]) -> None:
        """The worker ended (a bug, or cancelled): fail every caller it would have served now,
        rather than leave them to their timeouts; the next ``submit`` starts a new worker."""
        reason = "cancelled" if worker.cancelled() else repr(worker.exception())
        error = RuntimeError(f"batcher stopped ({reason}); the request was not run")
        waiting = self._collecting
        self._collecting = []
        while not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        self._queued_units = 0
        for entry in waiting:
            if not entry.future.done():
                entry.future.set_exception(error)
        if self._in_flight > len(self._running_units):  # a slot taken by the collection that died
            self._release_slot()

    async def _collect(self) -> list[_Entry[T, R]]:
        first = self._dequeued(await self._queue.get())
        batch = self._collecting = [first]
        await self._take_slot()  # everything that queued while all slots were busy joins below
        units = self.size_of(first.item)
        while self._in_flight > 1 and units + self._queued_units < self._overlap_units():
            self._changed.clear()  # another batch runs and this one is too small: wait for either to change
            await self._changed.wait()
        deadline = first.arrived + self.max_delay_s
        while units < self.max_batch_size:
            if self._queue.empty():
                remaining = deadline - self._clock()
                if remaining <= 0:
                    break
                try:
                    nxt = self._dequeued(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            else:
                nxt = self._dequeued(self._queue.get_nowait())
            size = self.size_of(nxt.item)
            if units + size > self.max_batch_size:
                await self._requeue_front(nxt)
                break
            batch.append(nxt)
            units += size
        return batch

    def _overlap_units(self) -> float:
        """The units a batch needs to start beside the ones running."""
        largest = max(self._running_units, default=self.max_batch_size)
        return min(self.max_batch_size, self.overlap_ratio * largest)

    async def _requeue_front(self, entry: _Entry[T, R]) -> None:
        # asyncio.Queue has no push-front: rebuild it with the entry first (rare: only on overflow).
        rest = []
        while not self._queue.empty():
            rest.append(self._queue.get_nowait())
        for e in [entry, *rest]:
            self._queue.put_nowait(e)
        self._queued_units += self.size_of(entry.item)

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            self._collecting = []
            live = [entry for entry in batch if not entry.future.cancelled()]
            if not live:
                self._release_slot()
                continue
            units = sum(self.size_of(entry.item) for entry in live)
            self._running_units.append(units)  # before the task starts: the next _collect sees it
            task = asyncio.get_running_loop().create_task(self._dispatch(live, units), context=live[0].context.copy())
            self._running.add(task)  # keep a reference until it is done
            task.add_done_callback(self._running.discard)

    async def _dispatch(self, live: list[_Entry[T, R]], units: int) -> None:
        started = self._clock()
        try:
            with request_context.merged([entry.context for entry in live]):
                results = await self.handler([entry.item for entry in live])
            if len(results) != len(live):
                raise RuntimeError(f"handler returned {len(results)} results for {len(live)} items")
        except Exception as exc:  # every caller of the batch gets the error
            for entry in live:
                if not entry.future.done():
                    entry.future.set_exception(exc)
        else:
            for entry, res in zip(live, results):
                if not entry.future.done():
                    entry.future.set_result(res)
        finally:
            self._running_units.remove(units)
            self._release_slot()
        self._record([e.item for e in live], [e.arrived for e in live], started)

    def _record(self, items: list[T], arrivals: list[float], started: float) -> None:
        now = self._clock()
        s = self.stats
        s.batches += 1
        s.items += len(items)
        s.last_batch_units = sum(self.size_of(item) for item in items)
        s.units += s.last_batch_units
        s.last_batch_queue_s = max(started - t for t in arrivals)
        s.last_batch_compute_s = now - started
        s.queue_seconds += s.last_batch_queue_s
        s.compute_seconds += s.last_batch_compute_s
        if self.on_batch is not None:
            self.on_batch(s)
