"""A circuit breaker per dependency (the FeatureRunner, the model runner, Redis).

States::

    CLOSED ──N consecutive failures──▶ OPEN ──reset_s elapsed──▶ HALF_OPEN
      ▲                                  ▲                          │
      └────────── probe succeeds ────────┼──── probe fails ─────────┘

* CLOSED: every call goes through; a success resets the consecutive-failure count.
* OPEN: nothing goes through (``allow()`` is False, ``call`` raises ``BreakerOpen`` at once, so
  the gateway answers a degraded response or 503 instead of queueing behind a dead dependency).
* HALF_OPEN: exactly ONE probe is let through at a time; its success closes the breaker, its
  failure re-opens it for another ``reset_s``. A probe that never reports back (its caller was
  cancelled, or a caller of ``allow()`` forgot to record) is considered lost after
  ``probe_timeout_s`` and the next caller becomes the probe, so the breaker can never stick.
* Outcomes reported while OPEN (late answers of calls admitted before it opened) are ignored.

The breaker is meant for one asyncio event loop (it takes no locks). ``state`` is an ``IntEnum``
whose values are the Prometheus gauge encoding: 0 closed, 1 half-open, 2 open (``state_value``).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from common.deadline import deadline
from common.settings import RunnerCallsSection

log = logging.getLogger(__name__)

T = TypeVar("T")


class BreakerState(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class BreakerOpen(Exception):
    """The dependency is considered down; the call was not attempted (-> degraded or 503)."""

    status_code = 503

    def __init__(self, name: str, retry_after_s: float) -> None:
        self.name = name
        self.retry_after_s = max(0.0, retry_after_s)
        super().__init__(f"{name} is unavailable (circuit open); retry in {self.retry_after_s:.1f}s")


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        failures: int = 5,
        reset_s: float = 2.0,
        *,
        probe_timeout_s: float | None = None,
        max_reset_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_state_change: Callable[[str, BreakerState, BreakerState], None] | None = None,
    ) -> None:
        """``max_reset_s``: each failed probe doubles the time the breaker stays open, up to
        this (None: always ``reset_s``); closing resets it."""
        if failures < 1:
            raise ValueError(f"failures must be >= 1, got {failures}")
        if reset_s < 0:
            raise ValueError(f"reset_s must be >= 0, got {reset_s}")
        self.name = name
        self.failure_threshold = failures
        self.base_reset_s = reset_s
        self.max_reset_s = reset_s if max_reset_s is None else max(reset_s, max_reset_s)
        self.reset_s = reset_s  # the current open time
        self.probe_timeout_s = reset_s if probe_timeout_s is None else probe_timeout_s
        self._clock = clock
        self._on_state_change = on_state_change
        self._state = BreakerState.CLOSED
        self._consecutive_failures = 0
        self._opened_at = 0.0
        self._probe_started: float | None = None  # set while a half-open probe is in flight
        # Counters for metrics.
        self.opened_total = 0
        self.rejected_total = 0

    @classmethod
    def from_settings(cls, name: str, calls: RunnerCallsSection, **kwargs: Any) -> CircuitBreaker:
        """``failures`` / ``reset_s`` from ``GSAGE_BREAKER_FAILURES`` / ``GSAGE_BREAKER_RESET_S``."""
        return cls(name, calls.breaker_failures, calls.breaker_reset_s, **kwargs)

    # -- state -----------------------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The current state; an OPEN breaker whose ``reset_s`` has elapsed reads HALF_OPEN."""
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.reset_s:
            self._transition(BreakerState.HALF_OPEN)
        return self._state

    @property
    def state_value(self) -> int:
        """0 closed, 1 half-open, 2 open: the value of the Prometheus gauge."""
        return int(self.state)

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive_failures

    def retry_after_s(self) -> float:
        """Seconds until the breaker lets a probe through (0 when it would now)."""
        if self._state is BreakerState.OPEN:
            return max(0.0, self._opened_at + self.reset_s - self._clock())
        if self._state is BreakerState.HALF_OPEN and self._probe_started is not None:
            return max(0.0, self._probe_started + self.probe_timeout_s - self._clock())
        return 0.0

    def _transition(self, new: BreakerState) -> None:
        old, self._state = self._state, new
        if new is BreakerState.OPEN:
            if old is BreakerState.HALF_OPEN:  # a failed probe: the dependency is still down
                self.reset_s = min(2 * self.reset_s, self.max_reset_s)
            self._opened_at = self._clock()
            self.opened_total += 1
        elif new is BreakerState.CLOSED:
            self.reset_s = self.base_reset_s
        if new is not BreakerState.HALF_OPEN:
            self._probe_started = None
        if old is not new:
            level = logging.INFO if new is BreakerState.CLOSED else logging.WARNING
            log.log(level, "circuit %s: %s -> %s", self.name, old.name, new.name)
            if self._on_state_change is not None:
                self._on_state_change(self.name, old, new)

    # -- admission and outcomes ------------------------------------------------------------------

    def allow(self) -> bool:
        """May a call go to the dependency now? In HALF_OPEN, True for the single probe only."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN:
            now = self._clock()
            if self._probe_started is None or now - self._probe_started >= self.probe_timeout_s:
                self._probe_started = now  # this caller is the probe
                return True
        self.rejected_total += 1
        return False

    def record_success(self) -> None:
        if self._state is BreakerState.OPEN:
            return  # a late answer; the probe decides
        self._consecutive_failures = 0
        if self._state is BreakerState.HALF_OPEN:
            self._transition(BreakerState.CLOSED)

    def record_failure(self) -> None:
        if self._state is BreakerState.OPEN:
            return  # already open; a late failure does not extend the window
        self._consecutive_failures += 1
        if self._state is BreakerState.HALF_OPEN or self._consecutive_failures >= self.failure_threshold:
            self._transition(BreakerState.OPEN)

    def release_probe(self) -> None:
        """The probe ended without an outcome (e.g. cancelled): let the next caller probe."""
        if self._state is BreakerState.HALF_OPEN:
            self._probe_started = None

    async def call(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        timeout_s: float | None,
        answered: Callable[[BaseException], bool] = lambda exc: False,
        **kwargs: Any,
    ) -> T:
        """``await fn(*args, **kwargs)`` under ``timeout_s`` (None: no deadline), guarded.

        Raises ``BreakerOpen`` without calling ``fn`` when not allowed. A timeout
        (``TimeoutError``) or any other exception counts as a failure and is re-raised; one for
        which ``answered`` is true (e.g. the dependency rejecting bad input: it did answer) counts
        as a success and is re-raised. Cancellation of the caller counts as neither.
        """
        if not self.allow():
            raise BreakerOpen(self.name, self.retry_after_s())
        try:
            # In the caller's task: wait_for would wrap the call in a task of its own (three more
            # event-loop turns on every hop of a request); the deadline shares the loop's timer.
            with deadline(timeout_s):
                result = await fn(*args, **kwargs)
        except Exception as exc:  # TimeoutError included
            if answered(exc):
                self.record_success()
            else:
                self.record_failure()
            raise
        except BaseException:  # CancelledError, KeyboardInterrupt: no outcome
            self.release_probe()
            raise
        self.record_success()
        return result

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker({self.name!r}, state={self.state.name}, "
            f"failures={self._consecutive_failures}/{self.failure_threshold})"
        )
