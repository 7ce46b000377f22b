"""Calling a dependency: the wait budget the FeatureRunner gives the model runner per request.

On an event loop on virtual time (``tests.virtual_time``): ``WaitBudget`` measures with the
loop's clock and times out with the loop's timers, so the caller's work, the calls and the
timeouts take exact loop seconds (binary fractions: exact float arithmetic) and no real time.
"""

import asyncio

import pytest

from common.remote import WaitBudget
from tests.virtual_time import run


def test_only_the_wait_spends_the_budget():
    async def main() -> float:
        loop = asyncio.get_running_loop()
        budget = WaitBudget(1.0)
        await asyncio.sleep(0.5)  # the caller's own work before the call: not the dependency's time
        assert await budget.wait(asyncio.sleep(0.25, result="answer")) == "answer"
        assert loop.time() == 0.75
        return budget.left

    assert run(main()) == 0.75  # 1.0 less the 0.25 waited; counted from the start, 0.25 would be left


def test_calls_share_one_budget_and_the_last_times_out_when_it_is_spent():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        budget = WaitBudget(0.25)
        await budget.wait(asyncio.sleep(0.125))
        assert budget.left == 0.125
        with pytest.raises(TimeoutError):
            await budget.wait(asyncio.sleep(0.5))
        assert loop.time() == 0.25 and budget.left == 0.0  # cut off the moment the budget ran out
        started = []

        async def call() -> None:
            started.append(True)

        with pytest.raises(TimeoutError):  # spent: no further call is awaited at all
            await budget.wait(call())
        assert started == [] and loop.time() == 0.25 and budget.left == 0.0

    run(main())


def test_a_wait_runs_in_the_callers_own_task():
    async def main() -> None:
        caller = asyncio.current_task()

        async def which_task() -> asyncio.Task[object] | None:
            return asyncio.current_task()

        assert await WaitBudget(1.0).wait(which_task()) is caller

    run(main())
