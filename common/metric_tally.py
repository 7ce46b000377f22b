"""The hot path's metric updates, kept in this process and applied to prometheus_client in bulk.

BentoML runs prometheus_client in multiprocess mode, where every histogram observation and
counter increment writes the worker's memory-mapped file under a lock, and a request of the
co-located app makes about twenty of them (the gateway's answer, the FeatureRunner's stages and
lookups, the model runner's batch). A ``Tally`` instead appends the value to the child's pending
list and applies each child's pending values together: one increment per bucket hit and one of
the sum for a histogram, one increment for a counter. ``python bench/bench_metric_tally.py``
times both ways, in multiprocess mode.

When the updates land:
- at most ``PERIOD_S`` after they were made (a timer on the running event loop, armed by the first
  pending update);
- at once before this process renders ``/metrics`` (``common.bento.request_metrics``), so a scrape
  of this worker sees every update it made before the scrape; another worker of the same service
  shows its own at most ``PERIOD_S`` late;
- at once when the updating thread runs no loop (or another loop than the one whose updates
  are pending), and at the process's exit.
Gauges stay live (``in_progress`` and the breaker state are read as "now"): they do not go through
a tally.

The bulk histogram update reads three attributes of prometheus_client's ``Histogram``
(``_upper_bounds``, ``_buckets``, ``_sum``), as its own ``observe`` uses them; where they are
missing or differ in shape, the pending values go through the public ``observe`` one by one
(the same figures, without the saving), and ``tests/test_metric_tally.py`` compares the bulk
update's samples with ``observe``'s on the installed version.
"""

from __future__ import annotations

import asyncio
import atexit
import math
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

PERIOD_S = 0.1


class Tally:
    """Pending observations (histograms) and increments (counters), per prometheus_client child.

    One event loop owns the pending updates at a time: the first to update after a flush. Its
    thread is the only one that adds to them, with no lock; an update from any other thread (one
    with no loop, or another loop while this one's are pending) is applied at once, as
    prometheus_client applies it."""

    def __init__(self, period_s: float = PERIOD_S) -> None:
        self.period_s = period_s
        self._observed: dict[Any, list[float]] = {}
        self._counted: dict[Any, float] = {}
        self._owner: asyncio.AbstractEventLoop | None = None

    def observe(self, histogram: Any, value: float) -> None:
        loop = _running_loop()
        if loop is None or (loop is not self._owner and not self._claim(loop)):
            histogram.observe(value)
            return
        pending = self._observed.get(histogram)
        if pending is None:
            self._observed[histogram] = [value]
        else:
            pending.append(value)

    def inc(self, counter: Any, amount: float = 1.0) -> None:
        if amount < 0:  # as prometheus_client refuses it, at the call that made it
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        loop = _running_loop()
        if loop is None or (loop is not self._owner and not self._claim(loop)):
            counter.inc(amount)
            return
        self._counted[counter] = self._counted.get(counter, 0.0) + amount

    def flush(self) -> None:
        """Apply every pending update now."""
        observed, self._observed = self._observed, {}
        counted, self._counted = self._counted, {}
        self._owner = None
        for histogram, values in observed.items():
            observe_all(histogram, values)
        for counter, amount in counted.items():
            counter.inc(amount)

    def _claim(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Make ``loop`` (the running one) the owner, with a timer to flush; False where another
        loop owns the pending updates."""
        if self._owner is not None:
            if not self._owner.is_closed():
                return False
            self.flush()  # a loop that closed with its timer unfired (a test's asyncio.run)
        self._owner = loop
        loop.call_later(self.period_s, self._fire, loop)
        return True

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._owner is loop:  # not flushed (and claimed again) since
            self.flush()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def observe_all(histogram: Any, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for each of ``values``, as one increment per bucket hit and one of
    the sum where prometheus_client's shape allows it."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets) or not bounds:
        for value in values:
            histogram.observe(value)
        return
    hits = [0] * len(bounds)
    for value in values:
        if not math.isnan(value):  # observe() counts NaN in no bucket (every ``<=`` is false)
            hits[bisect_left(bounds, value)] += 1  # the first bound >= value, as observe()'s scan
    for bucket, n in zip(buckets, hits, strict=True):
        if n:
            bucket.inc(n)
    total.inc(math.fsum(values))


TALLY = Tally()
atexit.register(TALLY.flush)
