"""The shadow canary without BentoML: the prediction core answers from the primary and its hook
offers each answered request to ``services.shadow.ShadowCanary``, against fake FeatureRunner calls
whose answers depend on (node, seed, version) only, as the real sampler's do.

On an event loop on virtual time (``tests.virtual_time``): the fakes' 10 ms are loop seconds, the
breakers and the canary run on the loop's clock, and ``drain()`` waits for the shadow's work
instead of any sleep."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random

import numpy as np
import pytest

from common import wire
from common.breaker import BreakerState, CircuitBreaker
from common.feature_runner_api import ModelRunnerUnavailable, PredictBatch
from common.feature_tensor import LAYOUT, PREMEAN
from services.answer import MULTILABEL_THRESHOLD
from services.prediction import PredictionCore
from services.promotion import PromotionBar, PromotionRefused, require_agreement
from services.protocol import PredictRequest
from services.routing import InvalidShadow, RoutingTable, Shadow, parse_table
from services.routing_cli import main
from services.shadow import ShadowCanary
from services.shadow_stats import (
    DIFF_EDGES,
    LogHistogram,
    PairStats,
    compare,
    load_stats,
    merge_stats,
    worker_stats_path,
)
from tests.virtual_time import run

V1, V2 = "graphsage:v1", "graphsage:v2"
CLASSES = 4
P99_BIN = 10 ** (1 / 20)  # the histogram's bin ratio: a reported P99 is within it of the exact one


def fake_probs(model: str, ids: np.ndarray, seeds: np.ndarray, multilabel: bool = False) -> np.ndarray:
    """A function of (node, seed, version) only; v2 differs from v1 on every third node."""
    shift = 0.0 if model == V1 else np.where(ids % 3 == 0, 1.3, 0.0)
    logits = np.stack([np.sin(ids * 1.0 + seeds % 97 + k * (1.0 + shift)) for k in range(CLASSES)], 1)
    if multilabel:
        return (1 / (1 + np.exp(-3 * logits))).astype(np.float32)
    return (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)


class FakeFeatureRunner:
    """FeatureRunner.predict for the core (``primary``) and the canary (``shadow``) apart, so a
    test can tell whose calls saw which seeds; ``failing`` versions raise, ``gate`` holds the
    shadow's calls until set."""

    def __init__(self, multilabel: bool = False, premean_from: int | None = None) -> None:
        """``premean_from``: answers name the premean layout for the primary's calls of at least
        this many nodes, as the model runner's do (None: no layout named)."""
        self.multilabel = multilabel
        self.premean_from = premean_from
        self.calls: dict[str, list[tuple[str, list[int], list[int]]]] = {"primary": [], "shadow": []}
        self.started: dict[str, list[float]] = {"primary": [], "shadow": []}
        self.layouts: dict[str, list[str | None]] = {"primary": [], "shadow": []}
        self.failing: set[str] = set()
        self.gate: asyncio.Event | None = None

    async def _predict(self, side: str, batch: PredictBatch) -> wire.Packed:
        model, node_ids, seeds = batch.model, batch.node_ids.tolist(), batch.seeds.tolist()
        self.calls[side].append((model, node_ids, seeds))
        self.started[side].append(asyncio.get_running_loop().time())
        layout = batch.layout
        if side == "primary" and self.premean_from is not None:
            layout = PREMEAN if len(node_ids) >= self.premean_from else LAYOUT
        self.layouts[side].append(layout)
        meta = {"model": model, "task": "multilabel" if self.multilabel else "multiclass"}
        if layout is not None:
            meta["layout"] = layout
        await asyncio.sleep(0.01)
        if side == "shadow" and self.gate is not None:
            await self.gate.wait()
        if model in self.failing:
            raise ModelRunnerUnavailable(f"model runner unavailable: {model} failed")
        probs = fake_probs(model, batch.node_ids, batch.seeds, self.multilabel)
        return wire.Packed.of({"probs": probs}, meta)

    async def primary(self, batch: PredictBatch) -> wire.Packed:
        return await self._predict("primary", batch)

    async def shadow(self, batch: PredictBatch) -> wire.Packed:
        return await self._predict("shadow", batch)

    def seen(self, side: str) -> list[tuple[int, int]]:
        return sorted((n, s) for _, ids, seeds in self.calls[side] for n, s in zip(ids, seeds))


class PinnedRoute:
    """The routing table's two answers the core and the canary need: a version, and its shadow."""

    def __init__(self, shadow: str | None, share: float = 1.0) -> None:
        self.target = Shadow(shadow, share) if shadow else None

    def choose(self, model, version, routing_key):
        return version or V1

    def shadow_for(self, tag: str) -> Shadow | None:
        return self.target


class Recorder:
    """A ShadowObserver that keeps what it was told."""

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}

    def compared(self, primary, shadow, comparison, confusion, primary_s, shadow_s) -> None:
        self.outcomes["compared"] = self.outcomes.get("compared", 0) + len(primary_s)

    def counted(self, primary, shadow, outcome, requests) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + requests


def make(
    runners: FakeFeatureRunner, shadow: str | None = V1, share: float = 1.0, failures: int = 100, **canary_kw
) -> tuple[PredictionCore, ShadowCanary]:
    """Inside the (virtual-time) loop: every breaker and the canary on the loop's clock."""
    clock = asyncio.get_running_loop().time
    route = PinnedRoute(shadow, share)
    canary_kw.setdefault("breaker", CircuitBreaker("shadow", failures=3, reset_s=60, clock=clock))
    canary = ShadowCanary(route.shadow_for, runners.shadow, clock=clock, rng=random.Random(7), **canary_kw)
    core = PredictionCore(
        route,
        runners.primary,
        CircuitBreaker("f", failures=failures, clock=clock),
        CircuitBreaker("m", failures=failures, reset_s=60, clock=clock),
        timeout_s=1.0,
        shadow=canary,
    )
    return core, canary


def requests(n: int, seeded: bool = True) -> list[PredictRequest]:
    return [
        PredictRequest(node_ids=[(7 * i + k) % 50 for k in range(1 + i % 4)], seed=1000 + i if seeded else None)
        for i in range(n)
    ]


def test_the_shadow_sees_the_primarys_neighbourhood_same_version_equal_answers():
    """No seed from the client: the one drawn for the request serves both sides."""
    runners = FakeFeatureRunner()

    async def main():
        core, canary = make(runners, shadow=V1)
        answers = await asyncio.gather(*(core.predict(r) for r in requests(30, seeded=False)))
        await canary.drain()
        return answers, canary.pairs

    answers, pairs = run(main())
    stats = pairs[(V1, V1)]
    assert stats.requests == 30 and stats.predictions == sum(len(a.node_ids) for a in answers)
    assert stats.agreement == 1.0 and stats.diff.max == 0.0 and stats.diff.quantile(0.99) == 0.0
    assert stats.failed == stats.dropped == 0
    assert runners.seen("shadow") == runners.seen("primary")  # the same (node, seed) pairs, one by one
    assert len(runners.calls["shadow"]) < 30  # requests waiting together make one shadow call


def test_a_shadow_call_waits_for_batch_nodes_or_the_oldest_requests_linger():
    """Off the response path, the shadow merges more than the primary: a call starts once
    ``batch_nodes`` nodes wait, else when the oldest waiting request has waited ``linger_s``."""
    runners = FakeFeatureRunner()
    reqs = requests(7)  # 1, 2, 3, 4, 1, 2, 3 nodes, one at a time: the primary answers every 0.01 s

    async def main():
        core, canary = make(runners, shadow=V1, batch_nodes=10, linger_s=0.045)
        answers = [await core.predict(r) for r in reqs]
        await canary.drain()
        return answers

    run(main())
    offered = runners.started["primary"]
    shadow_sizes = [len(ids) for _, ids, _ in runners.calls["shadow"]]
    # 1+2+3+4 = 10 nodes wait once the fourth is answered: the call starts then, no linger.
    assert runners.started["shadow"][0] == pytest.approx(offered[3] + 0.01) and shadow_sizes[0] == 10
    # 1+2+3 = 6 < 10: they leave once the fifth (the oldest) has waited 0.045 s.
    assert runners.started["shadow"][1] == pytest.approx(offered[4] + 0.01 + 0.045) and shadow_sizes[1] == 6
    assert runners.seen("shadow") == runners.seen("primary")


def test_lingering_workers_share_the_queue_without_losing_a_request():
    """Two workers may both wait for the same requests; the one that finds them taken goes back
    to waiting (it once took from an empty queue and died, to be replaced at the next offer)."""
    runners = FakeFeatureRunner()
    runners.gate = asyncio.Event()
    reqs = requests(12)

    async def main():
        core, canary = make(runners, shadow=V1, max_inflight=2, batch_nodes=4, linger_s=0.045)
        await core.predict(reqs[0])
        workers = list(canary._workers)
        for r in reqs[1:]:  # the third fills a call (1 + 2 + 3 nodes), held at the gate
            await core.predict(r)
        runners.gate.set()
        await canary.drain()
        return canary, workers, list(canary._workers), [w.done() for w in workers]

    canary, first, last, done = run(main())
    assert canary.pairs[(V1, V1)].requests == 12 and canary.pairs[(V1, V1)].failed == 0
    assert len(first) == 2 and last == first and done == [False, False]  # the same two, alive
    assert runners.seen("shadow") == runners.seen("primary")


def test_the_shadow_runs_on_its_primarys_input_layout():
    """The model runner's answer names the layout (premean for larger calls of a mean model);
    merged shadow calls ask for it, so a version shadowing itself answers bit for bit the same."""
    runners = FakeFeatureRunner(premean_from=3)
    reqs = requests(8)

    async def main():
        core, canary = make(runners, shadow=V1, batch_nodes=1000, linger_s=1.0)
        for r in reqs:
            await core.predict(r)
        await canary.drain()
        return canary.pairs[(V1, V1)]

    stats = run(main())
    primary_layout = {
        (n, s): p
        for (_, ids, seeds), p in zip(runners.calls["primary"], runners.layouts["primary"])
        for n, s in zip(ids, seeds)
    }
    shadow_layout = {
        (n, s): p
        for (_, ids, seeds), p in zip(runners.calls["shadow"], runners.layouts["shadow"])
        for n, s in zip(ids, seeds)
    }
    assert shadow_layout == primary_layout and set(primary_layout.values()) == {PREMEAN, LAYOUT}
    assert len(runners.calls["shadow"]) == 2  # all waited together: one call per layout
    assert stats.requests == 8 and stats.agreement == 1.0 and stats.diff.max == 0.0


def direct_figures(reqs: list[PredictRequest], multilabel: bool = False) -> dict:
    """Agreement, differences and confusion computed straight from the two versions' answers."""
    p = np.concatenate(
        [fake_probs(V1, np.array(r.node_ids), np.full(len(r.node_ids), r.seed), multilabel) for r in reqs]
    )
    q = np.concatenate(
        [fake_probs(V2, np.array(r.node_ids), np.full(len(r.node_ids), r.seed), multilabel) for r in reqs]
    )
    diff = np.abs(p.astype(np.float64) - q).max(1)
    if multilabel:
        pon, qon = p >= MULTILABEL_THRESHOLD, q >= MULTILABEL_THRESHOLD
        agree = (pon == qon).all(1)
        confusion = np.zeros((CLASSES, 2, 2), np.int64)
        for j in range(CLASSES):
            for a in (0, 1):
                for b in (0, 1):
                    confusion[j, a, b] = np.sum((pon[:, j] == a) & (qon[:, j] == b))
    else:
        agree = p.argmax(1) == q.argmax(1)
        confusion = np.zeros((CLASSES, CLASSES), np.int64)
        for a, b in zip(p.argmax(1), q.argmax(1)):
            confusion[a, b] += 1
    exact_p99 = np.sort(diff)[math.ceil(0.99 * len(diff)) - 1]
    return {
        "p": p,
        "predictions": len(diff),
        "agreed": int(agree.sum()),
        "mean": float(diff.mean()),
        "p99": float(exact_p99),
        "confusion": confusion,
    }


@pytest.mark.parametrize("multilabel", [False, True], ids=["multiclass", "multilabel"])
def test_agreement_figures_equal_a_direct_computation(multilabel):
    runners = FakeFeatureRunner(multilabel)
    reqs = requests(80)

    async def main():
        core, canary = make(runners, shadow=V2)
        answers = await asyncio.gather(*(core.predict(r) for r in reqs))
        await canary.drain()
        return answers, canary.pairs[(V1, V2)]

    answers, stats = run(main())
    want = direct_figures(reqs, multilabel)
    # The primary's answers are the primary's: nothing of the shadow's leaks in.
    np.testing.assert_array_equal(np.concatenate([a.probs for a in answers]), want["p"])
    assert (stats.requests, stats.predictions, stats.agreed) == (80, want["predictions"], want["agreed"])
    assert 0 < want["agreed"] < want["predictions"]  # the versions disagree somewhere, not everywhere
    assert stats.diff.total / stats.diff.n == pytest.approx(want["mean"], rel=1e-12)
    assert want["p99"] <= stats.diff.quantile(0.99) <= want["p99"] * P99_BIN
    np.testing.assert_array_equal(stats.confusion, want["confusion"])
    report = stats.report()
    assert report["agreement"] == want["agreed"] / want["predictions"]
    if multilabel:
        per_label = report["confusion"]["per_label"]
        assert [d["both"] for d in per_label] == want["confusion"][:, 1, 1].tolist()
        assert [d["shadow_only"] for d in per_label] == want["confusion"][:, 0, 1].tolist()
    else:
        assert report["confusion"]["matrix"] == want["confusion"].tolist()
    assert report["latency_s"]["shadow"]["mean"] == pytest.approx(0.01)  # the fake's loop time per call


def test_a_full_shadow_queue_drops_and_counts_and_the_primary_answers_on():
    runners = FakeFeatureRunner()
    observer = Recorder()
    reqs = requests(10)

    async def main():
        core, canary = make(runners, shadow=V2, queue_size=4, timeout_s=60.0, observer=observer)
        runners.gate = asyncio.Event()  # the shadow's first call hangs until released
        answers = [await core.predict(r) for r in reqs]  # one at a time: the queue fills, then overflows
        held = (canary.pairs[(V1, V2)].dropped, canary.pairs[(V1, V2)].requests)
        runners.gate.set()
        await canary.drain()
        return answers, held, canary.pairs[(V1, V2)]

    answers, (dropped_while_held, compared_while_held), stats = run(main())
    want = direct_figures(reqs)
    np.testing.assert_array_equal(np.concatenate([a.probs for a in answers]), want["p"])
    # The first request's shadow call is in flight, four wait, the other five find the queue full.
    assert (dropped_while_held, compared_while_held) == (5, 0)
    assert (stats.dropped, stats.requests, stats.failed) == (5, 5, 0)
    assert observer.outcomes == {"dropped": 5, "compared": 5}


def test_a_failing_shadow_leaves_the_primarys_breakers_closed():
    runners = FakeFeatureRunner()
    runners.failing.add(V2)
    reqs = requests(12)

    async def main():
        core, canary = make(runners, shadow=V2, failures=2)  # two failures would open a primary breaker
        answers = [await core.predict(r) for r in reqs]
        await canary.drain()
        return core, canary, answers

    core, canary, answers = run(main())
    stats = canary.pairs[(V1, V2)]
    assert stats.failed == 12 and stats.requests == 0 and "failed" in stats.last_error
    for breaker in (core.feature_breaker, core.model_breaker):
        assert breaker.state is BreakerState.CLOSED and breaker.consecutive_failures == 0
    assert canary.breaker.state is BreakerState.OPEN  # its own: after 3 failures it stops calling
    assert len(runners.calls["shadow"]) == 3
    np.testing.assert_array_equal(np.concatenate([a.probs for a in answers]), direct_figures(reqs)["p"])


def test_a_share_scores_that_share_and_no_shadow_scores_none():
    runners = FakeFeatureRunner()

    async def main():
        core, canary = make(runners, shadow=V2, share=0.25)
        await asyncio.gather(*(core.predict(r) for r in requests(400)))
        await canary.drain()
        none_core, none_canary = make(runners, shadow=None)
        await none_core.predict(requests(1)[0])
        await none_canary.drain()
        return canary.pairs[(V1, V2)].requests, none_canary.pairs

    scored, none = run(main())
    assert 60 <= scored <= 140 and none == {}  # 100 expected, sd ~8.7


def test_histogram_quantiles_and_merge():
    h = LogHistogram(DIFF_EDGES)
    assert h.quantile(0.99) is None
    h.add(np.zeros(99))
    h.add(np.array([0.5]))
    assert h.quantile(0.99) == 0.0 and h.quantile(1.0) == pytest.approx(0.5, rel=P99_BIN - 1)
    other = LogHistogram.from_json(DIFF_EDGES, json.loads(json.dumps(h.to_json())))
    h.merge(other)
    assert h.n == 200 and h.total == pytest.approx(1.0) and h.quantile(0.99) == 0.0
    values = np.random.default_rng(0).uniform(1e-4, 0.2, 1000)
    g = LogHistogram(DIFF_EDGES)
    g.add(values)
    exact = np.sort(values)[989]
    assert exact <= g.quantile(0.99) <= exact * P99_BIN


def figures(agreed: int, predictions: int, primary: str = V1, shadow: str = V2) -> dict:
    p = np.eye(CLASSES, dtype=np.float32)[np.zeros(predictions, int)]
    q = p.copy()
    q[agreed:] = np.eye(CLASSES, dtype=np.float32)[1]
    stats = PairStats()
    stats.add(compare(p, q, multilabel=False), np.array([0.001]), 0.001)
    return {(primary, shadow): stats}


def test_require_agreement_refuses_under_the_bar_with_the_figures():
    bar = PromotionBar(min_agreement=0.98, min_compared=500)
    assert require_agreement(figures(590, 600), V2, bar).agreement == 590 / 600  # above: the figures
    with pytest.raises(PromotionRefused) as few:
        require_agreement(figures(400, 400), V2, bar)
    assert "agreement 1.0000 over 400 predictions" in few.value.message and ">= 500" in few.value.message
    with pytest.raises(PromotionRefused) as under:
        require_agreement(figures(570, 600), V2, bar)
    assert under.value.status == 409
    assert "agreement 0.9500 over 600 predictions compared (570 agreed)" in under.value.message
    assert "agreement >= 0.98 over >= 500" in under.value.message
    with pytest.raises(PromotionRefused):  # figures against a version it would not replace
        require_agreement(figures(600, 600, primary="graphsage:v0"), V2, bar, primaries=[V1])
    with pytest.raises(PromotionRefused):  # no figures at all
        require_agreement({}, V2, bar)


def test_routing_table_shadow_is_persisted_and_old_tables_load(tmp_path):
    old = {"default_model": "graphsage", "models": {"graphsage": {"routes": [{"version": V1, "weight": 1}]}}}
    assert parse_table(old).models["graphsage"].shadow is None
    path = str(tmp_path / "routes.json")
    with open(path, "w") as f:
        json.dump(old, f)
    table, worker = RoutingTable(path), RoutingTable(path)
    assert table.to_json() == parse_table(old).to_json() and "shadow" not in table.to_json()["models"]["graphsage"]
    table.set_shadow("graphsage", "v2", 0.5)
    assert worker.reload_if_changed(force=True)
    assert worker.shadow("graphsage") == Shadow(V2, 0.5) and worker.shadow_for(V1) == Shadow(V2, 0.5)
    assert worker.versions_in_use() == {V1, V2}
    table.set_weights("graphsage", {V1: 90, "graphsage:v3": 10})
    table.rollback("graphsage")
    assert RoutingTable(path).shadow("graphsage") == Shadow(V2, 0.5)  # routes changes keep the shadow
    for bad in (1.5, -0.1, "x", True):
        with pytest.raises(InvalidShadow):
            table.set_shadow("graphsage", V2, bad)
    table.promote("graphsage", V2)  # the shadow became the primary: nothing left to compare
    assert RoutingTable(path).shadow("graphsage") is None
    table.set_shadow("graphsage", V1)
    table.clear_shadow("graphsage")
    assert RoutingTable(path).shadow("graphsage") is None and RoutingTable(path).shadow_for(V2) is None


def test_cli_promote_refuses_under_the_bar_and_succeeds_above(tmp_path, capsys):
    path = str(tmp_path / "routes.json")
    assert main(["--file", path, "--default-version", V1, "set-shadow", "graphsage", V2, "--share", "1"]) == 0
    stats_dir = path + ".shadow"

    def worker_file(agreed: int, predictions: int) -> None:
        async def flush() -> None:
            canary = ShadowCanary(lambda tag: None, None, stats_path=worker_stats_path(stats_dir))
            canary.pairs = figures(agreed, predictions)
            canary._dirty = True
            canary.flush()

        run(flush())

    worker_file(300, 300)  # two gateway workers' figures: 590 of 600 agree (0.9833)
    worker_file(290, 300)
    assert len(load_stats(stats_dir)) == 2
    assert merge_stats(load_stats(stats_dir))[(V1, V2)].agreed == 590
    capsys.readouterr()
    bar = ["--min-agreement", "0.99", "--min-compared", "500"]
    assert main(["--file", path, "promote", "graphsage", V2, *bar]) == 1
    assert "agreement 0.9833 over 600 predictions compared (590 agreed)" in capsys.readouterr().err
    assert RoutingTable(path).routes_in_use("graphsage") == (V1,)
    assert main(["--file", path, "shadow"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["shadows"] == {"graphsage": {"version": V2, "share": 1.0}} and shown["workers_reporting"] == 2
    assert [(p["primary"], p["shadow"], p["predictions"]) for p in shown["pairs"]] == [(V1, V2, 600)]
    assert main(["--file", path, "promote", "graphsage", "v2", "--min-agreement", "0.98", "--min-compared", "500"]) == 0
    assert RoutingTable(path).routes_in_use("graphsage") == (V2,) and RoutingTable(path).shadow("graphsage") is None
    assert os.path.isdir(stats_dir)
