"""Calling a dependency: the wait budget the FeatureRunner gives the model runner per request."""

import asyncio

import pytest

from common.remote import WaitBudget


def test_only_the_wait_spends_the_budget():
    async def run() -> float:
        budget = WaitBudget(1.0)
        await asyncio.sleep(0.5)  # the caller's own work before the call: not the dependency's time
        assert await budget.wait(asyncio.sleep(0.05, result="answer")) == "answer"
        return budget.left

    left = asyncio.run(run())
    assert 0.5 < left < 0.96  # counted from the start, 0.45 at most would be left


def test_calls_share_one_budget_and_the_last_times_out_when_it_is_spent():
    async def run() -> None:
        budget = WaitBudget(0.15)
        await budget.wait(asyncio.sleep(0.1))
        with pytest.raises(TimeoutError):
            await budget.wait(asyncio.sleep(0.2))
        assert budget.left <= 0.0
        with pytest.raises(TimeoutError):  # spent: no further call is awaited at all
            await budget.wait(asyncio.sleep(0.0))

    asyncio.run(run())
