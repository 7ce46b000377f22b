"""The hot path's metric tally (``common.metric_tally``): the same samples as prometheus_client's
own ``observe`` and ``inc``, applied when the timer fires, at a flush, or at once with no loop."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from common.metric_tally import Tally, observe_all

BOUNDS = (0.001, 0.005, 0.01, 0.1)
VALUES = [0.0, 0.001, 0.0010001, 0.005, 0.004999, 0.02, 0.1, 0.5, math.inf, -1.0, 3.0, 0.001, float("nan")]


def _histogram(registry: CollectorRegistry, labelled: bool) -> Any:
    h = Histogram("t_seconds", "t", ["stage"] if labelled else [], buckets=BOUNDS, registry=registry)
    return h.labels("a") if labelled else h


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _same(a: dict, b: dict) -> bool:
    """Equal samples; sums to rounding (the bulk update adds them in another order), NaN as NaN."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if not (x == y or (math.isnan(x) and math.isnan(y)) or (k[0].endswith("_sum") and math.isclose(x, y))):
            return False
    return True


@pytest.mark.parametrize("labelled", [False, True])
@pytest.mark.parametrize("values", [VALUES, [v for v in VALUES if not math.isnan(v)], [0.003]])
def test_the_bulk_update_gives_observes_samples(labelled, values):
    one_by_one, bulk = CollectorRegistry(), CollectorRegistry()
    h = _histogram(one_by_one, labelled)
    for v in values:
        h.observe(v)
    observe_all(_histogram(bulk, labelled), values)
    assert _same(_samples(bulk), _samples(one_by_one)), (_samples(bulk), _samples(one_by_one))


def test_a_histogram_of_another_shape_gets_observe_one_by_one():
    seen: list[float] = []

    class Other:
        def observe(self, value: float) -> None:
            seen.append(value)

    observe_all(Other(), [1.0, 2.0])
    assert seen == [1.0, 2.0]


def _pair() -> tuple[CollectorRegistry, Any, Any]:
    registry = CollectorRegistry()
    h = Histogram("w_seconds", "w", buckets=BOUNDS, registry=registry)
    c = Counter("w_calls", "w", ["kind"], registry=registry).labels("x")
    return registry, h, c


def _counted(registry: CollectorRegistry) -> tuple[float, float]:
    s = _samples(registry)
    return s["w_seconds_count", ()], s["w_calls_total", (("kind", "x"),)]


def test_updates_wait_for_the_timer_then_land_together():
    registry, h, c = _pair()
    tally = Tally(period_s=0)  # the timer fires on the loop's next turn: no clock involved

    async def go() -> list[tuple[float, float]]:
        for _ in range(3):
            tally.observe(h, 0.002)
            tally.inc(c, 2)
        seen = [_counted(registry)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        seen.append(_counted(registry))
        tally.observe(h, 0.002)  # the next update arms a timer again
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        seen.append(_counted(registry))
        return seen

    assert asyncio.run(go()) == [(0, 0), (3, 6), (4, 6)]


def test_a_flush_applies_everything_pending_at_once():
    registry, h, c = _pair()
    tally = Tally(period_s=3600)

    async def go() -> tuple[tuple[float, float], tuple[float, float]]:
        tally.observe(h, 0.002)
        tally.inc(c)
        before = _counted(registry)
        tally.flush()
        return before, _counted(registry)

    assert asyncio.run(go()) == ((0, 0), (1, 1))


def test_without_a_running_loop_an_update_lands_at_once():
    registry, h, c = _pair()
    tally = Tally(period_s=3600)
    tally.observe(h, 0.002)
    tally.inc(c, 5)
    assert _counted(registry) == (1, 5)


def test_a_loop_that_stopped_with_its_timer_pending_does_not_hold_the_next_updates():
    registry, h, c = _pair()
    tally = Tally(period_s=3600)
    asyncio.run(_observe_once(tally, h))  # armed on a loop that then closes, its timer unfired
    tally.period_s = 0

    async def later() -> None:
        await _observe_once(tally, h)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(later())
    assert _counted(registry) == (2, 0)


async def _observe_once(tally: Tally, h: Any) -> None:
    tally.observe(h, 0.002)


def test_a_negative_increment_is_refused_at_the_call():
    _, _, c = _pair()
    with pytest.raises(ValueError):
        Tally().inc(c, -1)


def test_an_update_from_another_loop_lands_at_once_while_one_loop_owns_the_pending():
    registry, h, _ = _pair()
    tally = Tally(period_s=3600)

    async def go() -> tuple[float, float]:
        tally.observe(h, 0.002)  # pending, owned by this loop
        other = threading.Thread(target=lambda: asyncio.run(_observe_once(tally, h)))
        other.start()
        other.join()
        return _counted(registry)

    assert asyncio.run(go()) == (1, 0)  # the other loop's, applied; this loop's, still pending
    tally.flush()
    assert _counted(registry) == (2, 0)
