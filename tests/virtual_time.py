"""An asyncio event loop on virtual time, for unit tests whose subject waits on timers.

``run(coro)`` is ``asyncio.run(coro)`` on a ``VirtualTimeLoop``: the same selector event loop, but
``loop.time()`` starts at 0.0 and moves only when every task waits (nothing ready to run, no I/O
pending), and then straight to the earliest timer's deadline. So ``asyncio.sleep(0.25)`` takes no
real time and exactly 0.25 loop seconds, ``asyncio.wait_for(aw, 0.125)`` times out exactly 0.125
loop seconds after it started, and events happen in the order of their deadlines whatever the
machine's load. Durations are then exact values to assert (choose binary fractions, 0.25, 0.125,
so that sums and differences are exact floats too).

``await idle()`` returns once every other task waits, without moving the clock: the deterministic
form of "let everything that can run, run" (rather than a number of ``asyncio.sleep(0)`` turns).

The loop is for code that runs on the loop alone: a thread (``run_in_executor``) works in real
time, and the clock would jump past it. A loop with nothing to run, no timer due and no ``idle()``
waiter can never make progress: it raises ``Deadlock`` rather than hang the test run.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    pass


class _Selector(selectors.DefaultSelector):
    """Never blocks: where the loop would wait ``timeout`` seconds, it tells the loop instead."""

    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or (timeout is not None and timeout <= 0):
            return events
        self.loop._quiescent()
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0
        self._idle_waiters: list[asyncio.Future[None]] = []

    def time(self) -> float:
        return self._now

    def idle(self) -> asyncio.Future[None]:
        """A future that completes once nothing else can run (see ``idle()``)."""
        waiter = self.create_future()
        self._idle_waiters.append(waiter)
        return waiter

    def _quiescent(self) -> None:
        """Nothing is ready and no I/O is pending: wake the idle waiters, else jump to the next timer."""
        waiters, self._idle_waiters = self._idle_waiters, []
        waiters = [w for w in waiters if not w.done()]
        if waiters:
            for w in waiters:
                w.set_result(None)
        elif self._scheduled:  # cancelled timers are popped off its head before each select
            self._now = max(self._now, self._scheduled[0].when())
        else:
            raise Deadlock("every task waits, on no timer and no I/O: the test can never finish")


async def idle() -> None:
    """Return once every other task of this (virtual-time) loop waits; the clock does not move."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop), "idle() needs tests.virtual_time.run"
    await loop.idle()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a fresh ``VirtualTimeLoop``."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
