"""What a deadline around a hop costs: ``asyncio.timeout`` against ``common.deadline`` (prints
numbers, never asserts).

    python bench/bench_deadline.py [--blocks 200000] [--rounds 4]

In one task on one loop (uvloop, the services' loop, then asyncio's own), blocks one after another,
each awaiting a coroutine that returns at once, as a hop's deadline wraps a call that almost never
reaches it: bare (the await alone), under ``async with asyncio.timeout(60)``, and under
``with deadline(60)``; then three of each inside one another, as the co-located request's
request timeout, breaker and model-call budget are. The sides take turns in rounds; per side the
median over rounds of the microseconds per block, and the saving per request of the nested form.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.deadline import deadline


async def _returns() -> int:
    return 1


async def _bare(blocks: int, nesting: int) -> None:
    for _ in range(blocks):
        await _returns()


async def _asyncio_timeout(blocks: int, nesting: int) -> None:
    for _ in range(blocks):
        if nesting == 1:
            async with asyncio.timeout(60):
                await _returns()
        else:
            async with asyncio.timeout(60), asyncio.timeout(60), asyncio.timeout(60):
                await _returns()


async def _deadline(blocks: int, nesting: int) -> None:
    for _ in range(blocks):
        if nesting == 1:
            with deadline(60):
                await _returns()
        else:
            with deadline(60), deadline(60), deadline(60):
                await _returns()


SIDES: dict[str, Callable[[int, int], Awaitable[None]]] = {
    "bare": _bare,
    "asyncio.timeout": _asyncio_timeout,
    "common.deadline": _deadline,
}


async def _measure(blocks: int, rounds: int, nesting: int) -> dict[str, float]:
    per_block: dict[str, list[float]] = {name: [] for name in SIDES}
    order = list(SIDES)
    for r in range(rounds + 1):  # round 0 warms up
        for name in order if r % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            await SIDES[name](blocks, nesting)
            if r:
                per_block[name].append((time.perf_counter() - started) / blocks * 1e6)
    return {name: statistics.median(v) for name, v in per_block.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--blocks", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    import uvloop

    for loop_name, run in (("uvloop", uvloop.run), ("asyncio", asyncio.run)):
        for nesting in (1, 3):
            us = run(_measure(args.blocks, args.rounds, nesting))
            timeout_cost = us["asyncio.timeout"] - us["bare"]
            deadline_cost = us["common.deadline"] - us["bare"]
            print(
                f"{loop_name:8s} {nesting} nested: bare {us['bare']:.3f} us, asyncio.timeout +{timeout_cost:.3f} us, "
                f"common.deadline +{deadline_cost:.3f} us ({deadline_cost / timeout_cost:.2f}x), "
                f"saved {timeout_cost - deadline_cost:.3f} us per block"
            )


if __name__ == "__main__":
    main()
