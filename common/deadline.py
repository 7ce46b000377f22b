"""``with deadline(seconds):``: ``asyncio.timeout`` for the hops of a request, one loop timer for all.

Every hop of a request runs under a deadline that it almost never reaches: BentoML's request
timeout (``common.bento.traffic``), the gateway's breaker around the FeatureRunner call
(``common.breaker``) and the FeatureRunner's budget for the model runner (``common.remote``), all in
the request's own task. ``asyncio.timeout`` arms a loop timer on entry and cancels it on exit, and on
uvloop (the services' loop) that pair is most of the cost of the block
(``python bench/bench_deadline.py`` measures both).

Here the deadlines of a loop share one timer. Entering registers the deadline and arms the timer
only when it is due before the one armed; leaving unregisters it. When the timer fires it expires
the deadlines that are due and re-arms for the earliest of the rest, so the timer goes off about
once per the shortest deadline's length, whatever the request rate, and it holds no reference to
a block that has ended: the registry holds only the blocks running now.

The semantics are ``asyncio.timeout``'s (Python 3.11 ``asyncio.timeouts``, which this follows):
when the deadline passes the task is cancelled, and the block raises ``TimeoutError`` unless
another cancellation of the task was requested meanwhile (then ``CancelledError`` goes on).
``None`` is no deadline. ``lift()`` removes the deadline while the block goes on (what
``Timeout.reschedule(None)`` does). It is a plain ``with`` block: nothing in it awaits, and an
``async with`` costs two coroutines more per block.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from types import TracebackType

# A block's states (plain ints: the checks run on every hop of every request).
_CREATED, _ENTERED, _EXPIRING, _EXPIRED, _EXITED = range(5)  # EXPIRING: cancelled for it, not yet left


class _Timer:
    """The deadlines pending on one loop and the one timer armed for the earliest."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[Deadline, None] = {}  # insertion-ordered, O(1) removal
        self.handle: asyncio.TimerHandle | None = None
        self.armed_at = math.inf

    def add(self, deadline: Deadline) -> None:
        self.pending[deadline] = None
        if deadline.when < self.armed_at:
            self._arm(deadline.when)

    def discard(self, deadline: Deadline) -> None:
        # The timer stays armed: it fires, finds nothing due and re-arms for the next (or not at
        # all), which costs less than a cancel and a re-arm on every block.
        self.pending.pop(deadline, None)

    def _arm(self, when: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed_at = when
        self.handle = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.handle, self.armed_at = None, math.inf
        now = self.loop.time()
        due = [d for d in self.pending if d.when <= now]
        for d in due:
            del self.pending[d]
            d._expire()
        if self.pending:
            self._arm(min(d.when for d in self.pending))


_timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Timer] = weakref.WeakKeyDictionary()
_last: list[_Timer | None] = [None]  # the last loop's (a process serves on one loop)


def _timer_of(loop: asyncio.AbstractEventLoop) -> _Timer:
    timer = _last[0]
    if timer is not None and timer.loop is loop:
        return timer
    timer = _timers.get(loop)
    if timer is None:
        timer = _timers[loop] = _Timer(loop)
    _last[0] = timer
    return timer


def pending(loop: asyncio.AbstractEventLoop) -> int:
    """How many deadlines of ``loop`` are registered (blocks running now)."""
    timer = _timers.get(loop)
    return len(timer.pending) if timer is not None else 0


class Deadline:
    """One ``with deadline(s)`` block (``asyncio.Timeout``'s protocol, its timer shared)."""

    __slots__ = ("_cancelling", "_state", "_task", "_timer", "seconds", "when")

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.when = math.inf  # loop time, once entered (inf: no deadline)
        self._state = _CREATED
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._timer: _Timer | None = None

    def expired(self) -> bool:
        """The deadline passed (the task was cancelled for it)."""
        return self._state == _EXPIRING or self._state == _EXPIRED

    def lift(self) -> None:
        """No deadline from now on for this block (none after it expired: the cancellation is on
        its way)."""
        if self._state == _ENTERED and self._timer is not None:
            self._timer.discard(self)
            self._timer = None
        self.when = math.inf

    def __enter__(self) -> Deadline:
        if self._state != _CREATED:
            raise RuntimeError("a deadline is entered once")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline must be used inside a task")
        self._state, self._task, self._cancelling = _ENTERED, task, task.cancelling()
        if self.seconds is not None:
            loop = task.get_loop()
            self.when = loop.time() + self.seconds
            if self.seconds <= 0:  # already due: at the loop's next turn, as asyncio.timeout (a block
                loop.call_soon(self._due_now)  # that ends before it awaits is not cancelled)
            else:
                self._timer = _timer_of(loop)
                self._timer.add(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._state == _EXPIRING:
            self._state = _EXPIRED
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc  # no other cancellation since: this one is ours
            return
        if self._timer is not None:
            self._timer.discard(self)
        self._state = _EXITED

    def _due_now(self) -> None:
        if self._state == _ENTERED and self.when != math.inf:  # not left, not lifted
            self._expire()

    def _expire(self) -> None:
        assert self._task is not None
        self._task.cancel()
        self._state = _EXPIRING


def deadline(seconds: float | None) -> Deadline:
    """``with deadline(s):`` inside a task: the task is cancelled ``s`` seconds after the block is
    entered and the block raises ``TimeoutError``; ``None``: no deadline."""
    return Deadline(seconds)
