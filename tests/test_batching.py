"""``common.batching.AdaptiveBatcher`` on its own: no server, no model.

Each test runs on an event loop on virtual time (``tests.virtual_time``): a handler's
``asyncio.sleep`` and the batcher's ``max_delay_s`` window are timers that fire in deadline
order and take exactly their duration in loop seconds, no real time, and the batcher's clock is
the loop's (``clock=loop.time``), so queue and compute seconds are exact. ``idle()`` (every task
waits) orders the steps of a test, never a real sleep. The two dead-worker tests at the end need
no clock and run on a plain ``asyncio.run`` with the default one.

The batcher is created inside the running loop of each test: its ``asyncio.Queue`` binds to the
loop that first uses it.
"""

from __future__ import annotations

import asyncio

import pytest

from common.batching import AdaptiveBatcher, BatchStats
from tests.virtual_time import idle, run


class Recorder:
    """A handler that records every batch it receives (and the loop time it was called at);
    optional delay (loop seconds), gate and failure."""

    def __init__(self, delay_s: float = 0.0, fail_on: object = None, gate: asyncio.Event | None = None) -> None:
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.gate = gate
        self.calls: list[list] = []
        self.called_at: list[float] = []

    async def __call__(self, items: list) -> list:
        self.calls.append(list(items))
        self.called_at.append(asyncio.get_running_loop().time())
        if self.gate is not None:
            await self.gate.wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError(f"bad item {self.fail_on!r} in batch")
        return [("done", x) for x in items]


def batcher_on_loop_time(handler, **options) -> AdaptiveBatcher:
    """A batcher whose clock is the running (virtual-time) loop's."""
    return AdaptiveBatcher(handler, clock=asyncio.get_running_loop().time, **options)


def test_concurrent_submits_are_merged_into_fewer_handler_calls():
    async def main():
        handler = Recorder(delay_s=0.01)
        batcher = batcher_on_loop_time(handler, max_batch_size=256)
        results = await asyncio.gather(*(batcher.submit(i) for i in range(100)))
        assert results == [("done", i) for i in range(100)]
        # 0 finds the batcher idle and runs alone; the 99 others queue behind it: one more call.
        assert handler.calls == [[0], list(range(1, 100))]
        return batcher.stats

    stats = run(main())
    assert stats.items == 100 and stats.batches == 2


def test_batches_grow_with_load_while_one_batch_is_in_flight():
    """Items arriving while a batch computes form the next batch (one batch in flight)."""
    arrival = 2.0**-10  # ~1 ms between arrivals (binary fractions: no two deadlines coincide)
    compute = 20.25 * arrival  # a batch computes while ~20 more arrive

    async def main():
        handler = Recorder(delay_s=compute)
        batcher = batcher_on_loop_time(handler, max_batch_size=256)

        async def caller(i: int):
            await asyncio.sleep(arrival * i)  # staggered arrivals over ~60 ms
            return await batcher.submit(i)

        results = await asyncio.gather(*(caller(i) for i in range(60)))
        assert results == [("done", i) for i in range(60)]
        # each batch is everything that arrived while the one before it computed
        assert handler.calls == [[0], list(range(1, 21)), list(range(21, 41)), list(range(41, 60))]
        assert handler.called_at == [0.0, compute, 2 * compute, 3 * compute]

    run(main())


def test_max_batch_size_counts_units_and_an_oversized_item_runs_alone():
    async def main():
        handler = Recorder(delay_s=0.005)
        batcher = batcher_on_loop_time(handler, max_batch_size=10, size_of=lambda x: x)
        sizes = [3, 3, 3, 3, 4, 25, 1, 9, 2, 2, 10, 7, 7]
        results = await asyncio.gather(*(batcher.submit(s) for s in sizes))
        assert results == [("done", s) for s in sizes]
        for call in handler.calls:
            assert sum(call) <= 10 or call == [25], handler.calls
        assert [25] in handler.calls
        # FIFO: the overflow item goes back to the front, so batches follow submission order.
        assert [x for call in handler.calls for x in call] == sizes
        assert handler.calls == [[3], [3, 3, 3], [4], [25], [1, 9], [2, 2], [10], [7], [7]]
        assert batcher.stats.units == sum(sizes)

    run(main())


def test_results_reach_the_right_caller_in_order():
    async def main():
        async def square(items: list[int]) -> list[int]:
            await asyncio.sleep(0)
            return [x * x for x in items]

        batcher = AdaptiveBatcher(square, max_batch_size=7)
        values = list(range(-20, 43))
        results = await asyncio.gather(*(batcher.submit(v) for v in values))
        assert results == [v * v for v in values]

    asyncio.run(main())


def test_handler_exception_reaches_every_caller_of_the_batch_and_the_batcher_keeps_working():
    async def main():
        gate = asyncio.Event()
        handler = Recorder(fail_on="bad", gate=gate)
        batcher = batcher_on_loop_time(handler, max_batch_size=256)
        first = asyncio.ensure_future(batcher.submit("first"))  # occupies the handler
        await idle()
        assert handler.calls == [["first"]]
        doomed = [asyncio.ensure_future(batcher.submit(x)) for x in ("a", "bad", "b")]
        await idle()  # all three queued behind "first"
        gate.set()
        assert await first == ("done", "first")
        outcomes = await asyncio.gather(*doomed, return_exceptions=True)
        assert handler.calls[1] == ["a", "bad", "b"]
        assert all(isinstance(o, ValueError) and "bad item" in str(o) for o in outcomes), outcomes
        # later batches are unaffected
        assert await asyncio.gather(*(batcher.submit(i) for i in range(5))) == [("done", i) for i in range(5)]

    run(main())


def test_handler_returning_the_wrong_number_of_results_fails_the_batch_clearly():
    async def main():
        calls = 0

        async def short(items: list) -> list:
            nonlocal calls
            calls += 1
            await asyncio.sleep(0.01)  # loop time: the next submits find the handler busy
            return items[:-1] if calls in (2, 3) else items

        batcher = batcher_on_loop_time(short)
        # 0 finds the batcher idle and runs alone; 1..3 queue behind it and form one batch.
        outcomes = await asyncio.gather(*(batcher.submit(i) for i in range(4)), return_exceptions=True)
        assert outcomes[0] == 0
        assert all(isinstance(o, RuntimeError) and "2 results for 3 items" in str(o) for o in outcomes[1:]), outcomes
        with pytest.raises(RuntimeError, match="0 results for 1 items"):  # the idle path checks too
            await batcher.submit(8)
        assert await batcher.submit(9) == 9

    run(main())


def test_an_idle_batcher_runs_a_lone_item_in_the_callers_task():
    async def main():
        me = asyncio.current_task()
        seen = []

        async def handler(items: list) -> list:
            seen.append(asyncio.current_task() is me)
            return items

        batcher = batcher_on_loop_time(handler)
        assert await batcher.submit(1) == 1 and await batcher.submit(2) == 2
        assert seen == [True, True] and batcher._worker is None  # no queue, no worker task
        assert (batcher.stats.batches, batcher.stats.items, batcher.stats.last_batch_queue_s) == (2, 2, 0.0)
        # With a batching window the lone item waits for company instead (no fast path).
        windowed = batcher_on_loop_time(handler, max_delay_s=0.001)
        assert await windowed.submit(3) == 3 and seen[-1] is False
        assert windowed.stats.last_batch_queue_s == 0.001  # it waited out the window

    run(main())


def test_max_delay_waits_for_company():
    async def main():
        handler = Recorder()
        batcher = batcher_on_loop_time(handler, max_batch_size=256, max_delay_s=0.25)
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.125)  # half the window later
        second = asyncio.ensure_future(batcher.submit(2))
        assert await asyncio.gather(first, second) == [("done", 1), ("done", 2)]
        assert handler.calls == [[1, 2]]
        assert handler.called_at == [0.25]  # the window runs from the first item's arrival
        assert batcher.stats.last_batch_queue_s == 0.25

    run(main())


def test_max_delay_stops_waiting_once_the_batch_is_full():
    async def main():
        loop = asyncio.get_running_loop()
        handler = Recorder()
        batcher = batcher_on_loop_time(handler, max_batch_size=2, max_delay_s=5.0)
        assert await asyncio.gather(batcher.submit(1), batcher.submit(2)) == [("done", 1), ("done", 2)]
        assert handler.calls == [[1, 2]]
        assert handler.called_at == [0.0] and loop.time() == 0.0  # none of the 5 s window waited
        assert batcher.stats.last_batch_queue_s == 0.0

    run(main())


def test_a_lone_request_waits_out_max_delay_but_zero_adds_no_latency():
    async def lone(delay_s: float) -> float:
        loop = asyncio.get_running_loop()
        batcher = batcher_on_loop_time(Recorder(), max_delay_s=delay_s)
        await batcher.submit("warm-up")  # with a window: the worker task started
        started = loop.time()
        assert await batcher.submit("x") == ("done", "x")
        return loop.time() - started

    assert run(lone(0.125)) == 0.125  # exactly the window
    assert run(lone(0.0)) == 0.0  # no timer waited on at all


def test_cancelled_callers_do_not_break_the_batcher():
    async def main():
        gate = asyncio.Event()
        handler = Recorder(gate=gate)
        batcher = batcher_on_loop_time(handler, max_batch_size=256)
        busy = asyncio.ensure_future(batcher.submit("busy"))
        await idle()
        # cancelled while queued: never reaches the handler
        queued_then_cancelled = asyncio.ensure_future(batcher.submit("gone"))
        kept = asyncio.ensure_future(batcher.submit("kept"))
        await idle()
        queued_then_cancelled.cancel()
        # cancelled while its batch computes: the result is dropped silently
        busy.cancel()
        await idle()
        gate.set()
        assert await kept == ("done", "kept")
        with pytest.raises(asyncio.CancelledError):
            await queued_then_cancelled
        with pytest.raises(asyncio.CancelledError):
            await busy
        assert handler.calls == [["busy"], ["kept"]]
        # a caller timing out (wait_for cancels it) is the same case
        gate.clear()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(batcher.submit("slow"), 0.02)
        gate.set()
        assert await asyncio.gather(*(batcher.submit(i) for i in range(4))) == [("done", i) for i in range(4)]

    run(main())


def test_stats_record_batches_items_and_queue_vs_compute_time():
    seen: list[tuple[int, int, float, float]] = []

    def on_batch(s: BatchStats) -> None:
        seen.append((s.batches, s.last_batch_units, s.last_batch_queue_s, s.last_batch_compute_s))

    async def main():
        handler = Recorder(delay_s=0.0625)
        batcher = batcher_on_loop_time(handler, max_batch_size=256, size_of=lambda x: x, on_batch=on_batch)
        first = asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0.015625)
        # these wait in the queue behind the first batch (until 0.0625), then compute together
        rest = [asyncio.ensure_future(batcher.submit(s)) for s in (3, 4)]
        await asyncio.gather(first, *rest)
        return batcher.stats

    stats = run(main())
    assert (stats.batches, stats.items, stats.units) == (2, 3, 9)
    assert seen == [
        (1, 2, 0.0, 0.0625),  # a lone first request does not queue at all
        (2, 7, 0.0625 - 0.015625, 0.0625),  # queued behind the first batch
    ]
    assert stats.compute_seconds == seen[0][3] + seen[1][3]
    assert stats.queue_seconds == seen[0][2] + seen[1][2]
    assert stats.last_batch_units == 7


def test_max_concurrent_runs_batches_side_by_side():
    active, peak = 0, 0

    async def handler(items):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)  # loop time
        active -= 1
        return items

    async def main(limit):
        nonlocal peak
        peak = 0
        b = batcher_on_loop_time(handler, max_batch_size=1, max_concurrent=limit)
        assert await asyncio.gather(*(b.submit(i) for i in range(6))) == list(range(6))
        return peak

    assert run(main(1)) == 1
    assert run(main(3)) == 3


async def _first_in_flight(**batcher_options) -> tuple[asyncio.Event, Recorder, AdaptiveBatcher, asyncio.Future]:
    """A batcher whose first item (0) runs alone and blocks on the returned gate."""
    gate = asyncio.Event()
    handler = Recorder(gate=gate)
    b = batcher_on_loop_time(handler, **batcher_options)
    first = asyncio.ensure_future(b.submit(0))
    await idle()
    assert handler.calls == [[0]]
    return gate, handler, b, first


def test_a_partial_batch_waits_for_the_batch_in_flight_and_takes_what_arrived_meanwhile():
    async def main():
        gate, handler, b, first = await _first_in_flight(max_batch_size=8, max_concurrent=2)
        rest = [asyncio.ensure_future(b.submit(i)) for i in (1, 2, 3)]
        await idle()
        assert handler.calls == [[0]]  # a free slot, but 3 of 8 units: no second call yet
        gate.set()
        assert await asyncio.gather(first, *rest) == [("done", i) for i in range(4)]
        assert handler.calls == [[0], [1, 2, 3]]

    run(main())


def test_a_full_batch_runs_beside_the_one_in_flight():
    async def main():
        gate, handler, b, first = await _first_in_flight(max_batch_size=2, max_concurrent=2)
        pair = [asyncio.ensure_future(b.submit(i)) for i in (1, 2)]
        await idle()
        assert handler.calls == [[0], [1, 2]]  # full: pipelined with the first
        late = asyncio.ensure_future(b.submit(3))
        await idle()
        assert handler.calls == [[0], [1, 2]]  # both slots busy
        gate.set()
        assert await asyncio.gather(first, *pair, late) == [("done", i) for i in range(4)]
        assert handler.calls == [[0], [1, 2], [3]]
        assert b._in_flight == 0 and b._queued_units == 0

    run(main())


def test_with_an_overlap_ratio_a_partial_batch_starts_once_it_matches_the_batch_in_flight():
    async def main():
        gate, handler, b, first = await _first_in_flight(  # 0 holds 2 units
            max_batch_size=8, max_concurrent=2, overlap_ratio=1.0, size_of=lambda x: 2 if x == 0 else 1
        )
        one = asyncio.ensure_future(b.submit(1))
        await idle()
        assert handler.calls == [[0]]  # 1 unit < 1.0 x the 2 in flight
        two = asyncio.ensure_future(b.submit(2))
        await idle()
        assert handler.calls == [[0], [1, 2]]  # 2 units: as large as the batch in flight
        gate.set()
        assert await asyncio.gather(first, one, two) == [("done", i) for i in range(3)]
        assert b._running_units == [] and b._in_flight == 0

    run(main())


def test_a_worker_that_dies_fails_its_waiting_callers_at_once_and_the_next_submit_starts_a_new_one():
    async def main():
        gate = asyncio.Event()
        handler = Recorder(gate=gate)
        batcher = AdaptiveBatcher(handler, max_batch_size=2)
        first = asyncio.ensure_future(batcher.submit("a"))  # runs alone, holds the only slot
        await asyncio.sleep(0)
        queued = [asyncio.ensure_future(batcher.submit(x)) for x in "bcd"]
        await asyncio.sleep(0)
        batcher._worker.cancel()  # the worker dies (cancelled, or a bug in it)
        done, _ = await asyncio.wait(queued, timeout=5)  # a backstop only: they fail at once
        assert done == set(queued)
        for fut in queued:
            with pytest.raises(RuntimeError, match="batcher stopped"):
                fut.result()
        gate.set()
        assert await first == ("done", "a")
        assert await batcher.submit("e") == ("done", "e")  # a new worker (or the idle path) serves

    asyncio.run(main())


def test_a_bug_inside_the_collection_fails_the_batch_being_collected_too():
    async def main():
        gate = asyncio.Event()
        batcher = AdaptiveBatcher(Recorder(gate=gate), max_batch_size=8, max_concurrent=2, overlap_ratio=1.0)
        first = asyncio.ensure_future(batcher.submit("a"))
        await asyncio.sleep(0)

        def broken() -> float:
            raise ZeroDivisionError("bug")

        batcher._overlap_units = broken  # the collector calls it once it holds an item and a slot
        queued = asyncio.ensure_future(batcher.submit("b"))
        done, _ = await asyncio.wait([queued], timeout=5)
        assert done == {queued}
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            queued.result()
        assert batcher._in_flight == 1  # only the batch of "a": the dead collection's slot is back
        gate.set()
        assert await first == ("done", "a")

    asyncio.run(main())


def test_a_batch_runs_in_its_first_callers_context_not_the_one_that_started_the_worker():
    """The worker task outlives the request that made it: the batch's call (its request id, its
    trace span) must be its own first caller's."""
    from common import request_context

    async def caller(request_id: str, item: int) -> str:
        request_context.adopt(request_id)
        return await batcher.submit(item)

    seen: list[str] = []

    async def handler(items: list) -> list:
        seen.append(request_context.current())
        return items

    batcher: AdaptiveBatcher

    async def main():
        nonlocal batcher
        batcher = batcher_on_loop_time(handler, max_batch_size=8, max_delay_s=0.01)
        await asyncio.ensure_future(caller("first-ever", 0))  # makes the worker (max_delay: queued)
        later = [asyncio.ensure_future(caller(f"req-{i}", i)) for i in (1, 2, 3)]
        await asyncio.gather(*later)

    run(main())
    assert seen == ["first-ever", "req-1"]
