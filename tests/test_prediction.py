"""The gateway's prediction core without BentoML: coalescing, isolation of bad requests, degraded
answers and 503s, against a fake FeatureRunner.predict (which, like the real one, raises
``ModelRunnerUnavailable`` for a model runner that failed). Every error reaches the caller as the
runner raised it.

On an event loop on virtual time (``tests.virtual_time``): the fake runner's 10 ms and the
core's 1 s deadline are loop seconds, so no call times out because the machine is busy, and the
breakers run on the loop's clock."""

import asyncio

import numpy as np
import pytest

from common import wire
from common.breaker import BreakerState, CircuitBreaker
from common.errors import ApiError
from common.feature_runner_api import ModelRunnerUnavailable, NotAppliedYet, PredictBatch
from common.remote import ServiceUnavailable
from services.prediction import PredictionCore
from services.protocol import PredictRequest
from tests.virtual_time import run


class FakeRunners:
    """predict() derives probabilities from ids and seeds, so an answer depends only on
    (node, seed), as the real sampler guarantees."""

    def __init__(self) -> None:
        self.feature_calls: list[int] = []
        self.features_down = False
        self.model_down = False
        self.applied = 0  # the graph update sequence this fake FeatureRunner has applied
        self.precision = "fp32"  # what the fake model runner says it served
        self.alternate_precision = False  # fp32 and int8 by turns, one per model call
        self.calls: list[tuple[list[int], str]] = []  # (node ids, precision) per model call

    async def predict(self, batch: PredictBatch) -> wire.Packed:
        await asyncio.sleep(0.01)  # loop time: concurrent requests find the runner busy
        node_ids = batch.node_ids.tolist()
        if self.features_down:
            raise ServiceUnavailable("FeatureRunner", "unreachable (ClientConnectorError)")
        if 999 in node_ids:
            raise ApiError(400, "unknown node ids [999]", param="node_ids")
        if batch.min_sequence > self.applied:
            raise NotAppliedYet(f"graph update {batch.min_sequence} is not applied here yet")
        self.feature_calls.append(len(node_ids))
        if self.model_down:
            raise ModelRunnerUnavailable("model runner unavailable: service_unavailable")
        precision = ("int8" if len(self.calls) % 2 else "fp32") if self.alternate_precision else self.precision
        self.calls.append((node_ids, precision))
        ids, seeds = batch.node_ids, batch.seeds
        logits = np.stack([np.sin(ids * 1.0 + seeds % 97 + k) for k in range(3)], 1).astype(np.float32)
        probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        return wire.Packed.of(
            {"logits": logits, "probs": probs.astype(np.float32)},
            {"model": batch.model, "backend": "fake", "precision": precision, "task": "multiclass"},
        )


class OneRoute:
    def choose(self, model, version, routing_key):
        return version or "graphsage:v1"


def core(runners: FakeRunners, model_failures: int = 100) -> PredictionCore:
    """Inside the (virtual-time) loop: the breakers' clock is the loop's."""
    clock = asyncio.get_running_loop().time
    return PredictionCore(
        OneRoute(),
        runners.predict,
        CircuitBreaker("f", failures=100, clock=clock),
        CircuitBreaker("m", failures=model_failures, reset_s=60, clock=clock),
        timeout_s=1.0,
    )


def test_concurrent_requests_are_merged_without_changing_answers():
    runners = FakeRunners()
    reqs = [PredictRequest(node_ids=[i, i + 1], seed=i) for i in range(40)]

    async def main():
        c = core(runners)
        merged = await asyncio.gather(*(c.predict(r) for r in reqs))
        alone = [await core(FakeRunners()).predict(r) for r in reqs]
        return merged, alone

    merged, alone = run(main())
    assert [m.to_dict() for m in merged] == [a.to_dict() for a in alone]
    assert len(runners.feature_calls) < len(reqs) / 4, runners.feature_calls  # far fewer runner calls
    assert sum(runners.feature_calls) == 80


def test_each_merged_request_says_the_precision_of_the_call_that_answered_it():
    runners = FakeRunners()
    runners.alternate_precision = True
    reqs = [PredictRequest(node_ids=[2 * i, 2 * i + 1], seed=i) for i in range(40)]

    async def main():
        c = core(runners)
        return await asyncio.gather(*(c.predict(r) for r in reqs))

    answers = run(main())
    served = {node: precision for nodes, precision in runners.calls for node in nodes}
    assert len(runners.calls) < len(reqs) and set(served.values()) == {"fp32", "int8"}  # merged, both seen
    for req, answer in zip(reqs, answers):
        assert answer.to_dict()["precision"] == served[req.node_ids[0]] == served[req.node_ids[1]]


def test_a_rejected_request_does_not_fail_the_others_in_its_batch():
    runners = FakeRunners()
    reqs = [PredictRequest(node_ids=[1, 999] if i == 3 else [i], seed=1) for i in range(8)]

    async def main():
        c = core(runners)
        return await asyncio.gather(*(c.predict(r) for r in reqs), return_exceptions=True)

    out = run(main())
    assert isinstance(out[3], ApiError) and out[3].status == 400 and "999" in out[3].message
    assert out[3].param == "node_ids"  # as the runner raised it
    assert all(not isinstance(o, Exception) for i, o in enumerate(out) if i != 3)


def test_one_callers_unapplied_min_sequence_does_not_fail_the_others_in_its_batch():
    runners = FakeRunners()
    reqs = [PredictRequest(node_ids=[i], seed=1, min_sequence=7 if i == 2 else None) for i in range(6)]

    async def main():
        c = core(runners)
        return await asyncio.gather(*(c.predict(r) for r in reqs), return_exceptions=True)

    out = run(main())
    assert isinstance(out[2], NotAppliedYet) and out[2].status == 503 and "not applied" in out[2].message
    assert out[2].headers.get("Retry-After") == "1" and out[2].type == "not_applied_yet"
    assert all(not isinstance(o, Exception) for i, o in enumerate(out) if i != 2)


def test_feature_runner_down_degrades_and_model_runner_down_is_503():
    runners = FakeRunners()

    runners.precision = "int8"

    async def main():
        c = core(runners)
        assert (await c.predict(PredictRequest(node_ids=[5], seed=1))).to_dict()["precision"] == "int8"
        runners.features_down = True
        degraded = await c.predict(PredictRequest(node_ids=[5, 6], seed=1))
        runners.features_down, runners.model_down = False, True
        with pytest.raises(ApiError) as info:
            await c.predict(PredictRequest(node_ids=[5], seed=1))
        return degraded, info.value

    degraded, error = run(main())
    first, second = degraded.to_response().predictions
    assert degraded.degraded and first.stale and first.label is not None and second.label is None
    assert first.probabilities and not second.probabilities and not second.stale
    assert degraded.to_response().precision == "int8"  # the precision of the answer it repeats
    assert isinstance(error, ModelRunnerUnavailable) and error.status == 503 and error.headers["Retry-After"] == "1"
    assert error.message == "model runner unavailable: service_unavailable"


def test_a_model_runner_failure_opens_the_model_breaker_not_the_feature_one():
    runners = FakeRunners()
    runners.model_down = True

    async def call(c):
        with pytest.raises(ApiError) as info:
            await c.predict(PredictRequest(node_ids=[5], seed=1))
        return info.value

    async def scenario():
        c = core(runners, model_failures=2)
        first = [await call(c) for _ in range(2)]
        calls_before = len(runners.feature_calls)
        fast = await call(c)  # open: answered without calling the FeatureRunner at all
        return c, first, fast, calls_before

    c, first, fast, calls_before = run(scenario())
    assert all(e.status == 503 for e in first) and fast.status == 503
    assert c.model_breaker.state is BreakerState.OPEN and c.feature_breaker.state is BreakerState.CLOSED
    assert len(runners.feature_calls) == calls_before
    assert fast.headers["Retry-After"] == "60"  # opened at this very loop time: the full reset_s
