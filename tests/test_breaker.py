"""Circuit breaker: closed -> open after N failures -> half-open single probe -> closed/open."""

from __future__ import annotations

import asyncio

import pytest

from common.breaker import BreakerOpen, BreakerState, CircuitBreaker
from tests.virtual_time import run


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def make(failures: int = 3, reset_s: float = 2.0) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker("feature", failures=failures, reset_s=reset_s, clock=clock), clock


def test_opens_after_n_consecutive_failures():
    b, _ = make(failures=3)
    assert b.state is BreakerState.CLOSED and b.state_value == 0
    for _ in range(2):
        assert b.allow()
        b.record_failure()
    assert b.state is BreakerState.CLOSED
    b.record_success()  # resets the consecutive count
    for _ in range(2):
        b.record_failure()
    assert b.state is BreakerState.CLOSED
    b.record_failure()
    assert b.state is BreakerState.OPEN and b.state_value == 2
    assert not b.allow()
    assert b.rejected_total == 1 and b.opened_total == 1


def test_half_open_lets_exactly_one_probe_through_then_closes_on_success():
    b, clock = make(failures=1, reset_s=2.0)
    b.record_failure()
    clock.advance(1.9)
    assert not b.allow()
    assert b.retry_after_s() == pytest.approx(0.1)
    clock.advance(0.1)
    assert b.state is BreakerState.HALF_OPEN and b.state_value == 1
    assert b.allow()  # the probe
    assert not b.allow() and not b.allow()  # everyone else waits for it
    b.record_success()
    assert b.state is BreakerState.CLOSED
    assert all(b.allow() for _ in range(10))


def test_probe_failure_reopens_for_another_reset_period():
    b, clock = make(failures=2, reset_s=2.0)
    b.record_failure()
    b.record_failure()
    clock.advance(2.0)
    assert b.allow()
    b.record_failure()  # a single failure in half-open re-opens
    assert b.state is BreakerState.OPEN
    clock.advance(1.0)
    assert not b.allow()
    clock.advance(1.0)
    assert b.allow() and b.state is BreakerState.HALF_OPEN


def test_lost_probe_is_replaced_after_probe_timeout():
    b, clock = make(failures=1, reset_s=2.0)
    b.record_failure()
    clock.advance(2.0)
    assert b.allow()
    assert not b.allow()
    clock.advance(2.0)  # the probe never reported back
    assert b.allow()


def test_late_outcomes_while_open_are_ignored():
    b, clock = make(failures=1, reset_s=2.0)
    b.record_failure()
    clock.advance(1.5)
    b.record_failure()  # does not extend the open window
    b.record_success()  # does not close it either
    assert b.state is BreakerState.OPEN
    clock.advance(0.5)
    assert b.state is BreakerState.HALF_OPEN


def test_call_timeout_counts_as_failure_and_open_raises_breaker_open():
    b, _ = make(failures=2, reset_s=60.0)

    async def slow() -> str:
        await asyncio.sleep(1.0)
        return "late"

    async def ok(x: int) -> int:
        return x + 1

    async def scenario() -> None:  # on virtual time: the 0.01 s deadline comes before the 1 s call
        loop = asyncio.get_running_loop()
        assert await b.call(ok, 1, timeout_s=1.0) == 2
        for n in (1, 2):
            with pytest.raises(TimeoutError):
                await b.call(slow, timeout_s=0.01)
            assert loop.time() == 0.01 * n  # cut off at the deadline, not after slow()
        assert b.state is BreakerState.OPEN
        with pytest.raises(BreakerOpen) as info:
            await b.call(ok, 1, timeout_s=1.0)
        assert info.value.retry_after_s == 60.0  # the breaker's fake clock has not moved
        assert info.value.status_code == 503 and "feature" in str(info.value)

    run(scenario())


def test_call_exceptions_count_ignored_types_do_not():
    b, clock = make(failures=2, reset_s=1.0)

    class BadInput(Exception):
        pass

    async def reject() -> None:
        raise BadInput("422 from the runner")

    async def boom() -> None:
        raise ConnectionError("refused")

    async def ok() -> str:
        return "ok"

    async def scenario() -> None:
        for _ in range(5):
            with pytest.raises(BadInput):
                await b.call(reject, timeout_s=1.0, answered=lambda exc: isinstance(exc, BadInput))
        assert b.state is BreakerState.CLOSED
        for _ in range(2):
            with pytest.raises(ConnectionError):
                await b.call(boom, timeout_s=1.0)
        assert b.state is BreakerState.OPEN
        clock.advance(1.0)
        assert await b.call(ok, timeout_s=1.0) == "ok"  # the probe closes it
        assert b.state is BreakerState.CLOSED

    asyncio.run(scenario())


def test_cancelled_probe_releases_the_probe_slot():
    b, clock = make(failures=1, reset_s=1.0)
    b.record_failure()
    clock.advance(1.0)

    async def scenario() -> None:
        task = asyncio.ensure_future(b.call(asyncio.sleep, 10, timeout_s=None))
        await asyncio.sleep(0)
        assert not b.allow()  # the probe is in flight
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert b.state is BreakerState.HALF_OPEN
        assert b.allow()  # the next caller may probe at once

    asyncio.run(scenario())


def test_from_settings_and_validation():
    from common.settings import load_settings

    s = load_settings({"GSAGE_BREAKER_FAILURES": "7", "GSAGE_BREAKER_RESET_S": "0.5"})
    b = CircuitBreaker.from_settings("model", s)
    assert (b.failure_threshold, b.reset_s) == (7, 0.5)
    with pytest.raises(ValueError):
        CircuitBreaker("x", failures=0)


def test_each_failed_probe_doubles_the_open_time_up_to_its_cap_and_closing_resets_it():
    clock = FakeClock()
    b = CircuitBreaker("redis", failures=1, reset_s=1.0, max_reset_s=3.0, clock=clock)
    b.record_failure()
    assert b.state is BreakerState.OPEN and b.retry_after_s() == 1.0
    for expected in (2.0, 3.0, 3.0):  # doubled, then capped
        clock.advance(b.reset_s)
        assert b.allow()  # the probe
        b.record_failure()
        assert b.state is BreakerState.OPEN and b.retry_after_s() == expected
    clock.advance(b.reset_s)
    assert b.allow()
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.reset_s == 1.0
    b.record_failure()
    assert b.retry_after_s() == 1.0


def test_a_call_runs_in_the_callers_own_task():
    """No task per call: every hop of a request goes through a breaker, and a task of its own
    (``asyncio.wait_for``'s) costs event-loop turns each time; the deadline still holds."""
    b, _ = make()

    async def main() -> None:
        caller = asyncio.current_task()

        async def which_task() -> asyncio.Task[object] | None:
            return asyncio.current_task()

        assert await b.call(which_task, timeout_s=1.0) is caller
        with pytest.raises(TimeoutError):
            await b.call(asyncio.sleep, 2.0, timeout_s=1.0)
        assert asyncio.get_running_loop().time() == 1.0

    run(main())
