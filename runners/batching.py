"""An adaptive batcher: concurrent callers' items become one handler call.

One queue, ``max_concurrent`` batches in flight (default 1: a model worker computes one batch at a
time). While batches run, new items wait in the queue; the next batch takes everything waiting
(up to ``max_batch_size`` units), so batches grow with load and a lone request never waits for
company unless ``max_delay_s`` asks it to. The batcher does not know
what it batches: the handler receives a list of items and returns one result per item.
(After MLServer's ``batching/adaptive.py`` and Ray Serve's ``@serve.batch``.)

Idle fast path: with ``max_delay_s == 0``, an item that finds the queue empty and a slot free is
a batch of one whatever happens next, so ``submit`` runs the handler in the caller's own task,
skipping the queue, the collector's wake-up and a task per batch (three event-loop turns; the
batcher sits in every hop of a request: gateway coalescer, feature runner, model runner).
The worker takes a slot only once it holds an item, so an idle worker never blocks this path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


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
    ) -> None:
        self.handler = handler
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self.size_of = size_of
        self.on_batch = on_batch
        self.stats = BatchStats()
        self._queue: asyncio.Queue[tuple[T, asyncio.Future[R], float]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(max_concurrent)
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> R:
        if self.max_delay_s <= 0 and self._queue.empty() and not self._slots.locked():
            return await self._run_alone(item)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run())
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        await self._queue.put((item, future, time.perf_counter()))
        return await future

    async def _run_alone(self, item: T) -> R:
        await self._slots.acquire()  # free (checked by the caller, no await since): no suspension
        started = time.perf_counter()
        try:
            results = await self.handler([item])
            if len(results) != 1:
                raise RuntimeError(f"handler returned {len(results)} results for 1 items")
        finally:
            self._slots.release()
            self._record([(item, None, started)], started)  # type: ignore[list-item]
        return results[0]

    async def _collect(self) -> list[tuple[T, asyncio.Future[R], float]]:
        first = await self._queue.get()
        await self._slots.acquire()  # everything that queued while all slots were busy joins below
        batch = [first]
        units = self.size_of(batch[0][0])
        deadline = batch[0][2] + self.max_delay_s
        while units < self.max_batch_size:
            if self._queue.empty():
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(self._queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            else:
                nxt = self._queue.get_nowait()
            size = self.size_of(nxt[0])
            if units + size > self.max_batch_size:
                await self._requeue_front(nxt)
                break
            batch.append(nxt)
            units += size
        return batch

    async def _requeue_front(self, entry: tuple[T, asyncio.Future[R], float]) -> None:
        # asyncio.Queue has no push-front: rebuild it with the entry first (rare: only on overflow).
        rest = []
        while not self._queue.empty():
            rest.append(self._queue.get_nowait())
        for e in [entry, *rest]:
            self._queue.put_nowait(e)

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            live = [(item, fut, t) for item, fut, t in batch if not fut.cancelled()]
            if not live:
                self._slots.release()
                continue
            task = asyncio.get_running_loop().create_task(self._dispatch(live))
            self._running.add(task)  # keep a reference until it is done
            task.add_done_callback(self._running.discard)

    async def _dispatch(self, live: list[tuple[T, asyncio.Future[R], float]]) -> None:
        started = time.perf_counter()
        try:
            results = await self.handler([item for item, _, _ in live])
            if len(results) != len(live):
                raise RuntimeError(f"handler returned {len(results)} results for {len(live)} items")
        except Exception as exc:  # every caller of the batch gets the error
            for _, fut, _ in live:
                if not fut.done():
                    fut.set_exception(exc)
        else:
            for (_, fut, _), res in zip(live, results):
                if not fut.done():
                    fut.set_result(res)
        finally:
            self._slots.release()
        self._record(live, started)

    def _record(self, live: list[tuple[T, asyncio.Future[R], float]], started: float) -> None:
        now = time.perf_counter()
        s = self.stats
        s.batches += 1
        s.items += len(live)
        s.last_batch_units = sum(self.size_of(item) for item, _, _ in live)
        s.units += s.last_batch_units
        s.last_batch_queue_s = max(started - t for _, _, t in live)
        s.last_batch_compute_s = now - started
        s.queue_seconds += s.last_batch_queue_s
        s.compute_seconds += s.last_batch_compute_s
        if self.on_batch is not None:
            self.on_batch(s)
