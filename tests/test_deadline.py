"""``common.deadline``: ``asyncio.timeout``'s semantics with one shared loop timer, on virtual time
(``tests.virtual_time``: deadlines are exact loop seconds, no real time passes)."""

import asyncio

import pytest

from common import deadline as deadlines
from common.deadline import deadline
from tests import virtual_time


def test_a_block_past_its_deadline_raises_timeout_error_at_the_deadline():
    async def go():
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            with deadline(0.25) as d:
                await asyncio.sleep(10)
        return loop.time() - started, d.expired(), deadlines.pending(loop)

    assert virtual_time.run(go()) == (0.25, True, 0)


def test_a_block_in_time_returns_and_leaves_nothing_registered():
    async def go():
        with deadline(1.0) as d:
            await asyncio.sleep(0.5)
        return d.expired(), deadlines.pending(asyncio.get_running_loop())

    assert virtual_time.run(go()) == (False, 0)


def test_blocks_one_after_another_arm_the_loops_timer_once():
    """What makes it cheaper than ``asyncio.timeout``: no timer armed and cancelled per block."""

    async def go():
        loop = asyncio.get_running_loop()
        armed = []
        call_at = loop.call_at

        def counting_call_at(when, callback, *args, **kwargs):
            if getattr(callback, "__name__", "") == "_fire":  # the deadlines' timer (sleep arms its own)
                armed.append(when)
            return call_at(when, callback, *args, **kwargs)

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        for _ in range(100):
            with deadline(1.0):
                await asyncio.sleep(0.001)
        return len(armed), deadlines.pending(loop)

    assert virtual_time.run(go()) == (1, 0)


def test_a_shorter_deadline_after_a_longer_one_still_fires_on_time():
    async def go():
        loop = asyncio.get_running_loop()
        outcome = {}

        async def block(name, seconds, sleep):
            try:
                with deadline(seconds):
                    await asyncio.sleep(sleep)
                outcome[name] = ("done", loop.time())
            except TimeoutError:
                outcome[name] = ("timeout", loop.time())

        await asyncio.gather(block("long", 8.0, 1.0), block("short", 0.5, 4.0), block("mid", 2.0, 3.0))
        return outcome, deadlines.pending(loop)

    outcome, pending = virtual_time.run(go())
    assert outcome == {"short": ("timeout", 0.5), "long": ("done", 1.0), "mid": ("timeout", 2.0)}
    assert pending == 0


def test_another_cancellation_is_not_taken_for_the_deadline():
    async def go():
        entered = asyncio.Event()

        async def victim():
            with deadline(5.0):
                entered.set()
                await asyncio.sleep(10)

        task = asyncio.get_running_loop().create_task(victim())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return deadlines.pending(asyncio.get_running_loop())

    assert virtual_time.run(go()) == 0


def test_nested_deadlines_each_own_their_expiry():
    async def go():
        loop = asyncio.get_running_loop()
        with deadline(2.0) as outer:
            with pytest.raises(TimeoutError):
                with deadline(0.25):
                    await asyncio.sleep(1)
            inner_done = loop.time()
            await asyncio.sleep(0.5)  # the outer block goes on: its deadline is its own
        assert not outer.expired()
        with pytest.raises(TimeoutError):
            with deadline(0.5) as outer:
                with deadline(4.0) as inner:
                    await asyncio.sleep(1)  # the outer expires: the inner lets the cancellation through
        return inner_done, outer.expired(), inner.expired(), deadlines.pending(loop)

    assert virtual_time.run(go()) == (0.25, True, False, 0)


def test_a_lifted_deadline_no_longer_applies():
    async def go():
        with deadline(0.25) as d:
            d.lift()
            await asyncio.sleep(1)
        return d.expired(), deadlines.pending(asyncio.get_running_loop())

    assert virtual_time.run(go()) == (False, 0)


def test_none_is_no_deadline_and_zero_is_already_due():
    async def go():
        loop = asyncio.get_running_loop()
        with deadline(None):
            await asyncio.sleep(100)
        registered = deadlines.pending(loop)
        started = loop.time()
        with pytest.raises(TimeoutError):
            with deadline(0):
                await asyncio.sleep(1)
        with deadline(0):
            pass  # ends before it awaits: not cancelled, then or at the next await
        await asyncio.sleep(0.125)
        return registered, loop.time() - started

    assert virtual_time.run(go()) == (0, 0.125)


def test_a_deadline_is_entered_once_and_only_on_a_running_loop():
    d = deadline(1.0)
    with pytest.raises(RuntimeError):
        d.__enter__()

    async def twice():
        with d:
            pass
        with pytest.raises(RuntimeError, match="entered once"):
            d.__enter__()

    virtual_time.run(twice())
