"""BentoML's per-request metrics middleware, patched to keep its labelled children and to count
through the metric tally: the same samples as BentoML's own ``__call__`` on the same requests once
the tally is applied, nothing asked twice, and a ``/metrics`` request applies it first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from common.bento import request_metrics
from common.metric_tally import TALLY

ANSWERS = {"/predict": 200, "/missing": 404, "/healthz": 200, "/fails": 500, "/metrics": 200}


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    status = ANSWERS[scope["path"]]
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"a", "more_body": True})  # not the last: not counted yet
    await send({"type": "http.response.body", "body": b"b"})


@pytest.fixture(scope="module")
def middleware() -> Any:
    assert request_metrics.install()
    mw = request_metrics.middleware_class()(_app)
    assert type(mw).__call__ is request_metrics._call
    return mw


def _requests(mw: Any, call: Any, paths: list[str]) -> list[int]:
    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def go() -> None:
        for path in paths:
            await call(mw, {"type": "http", "path": path, "method": "POST"}, receive, send)

    asyncio.run(go())
    return statuses


def _samples(mw: Any, flush: bool = True) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every counted sample (no durations' sums or buckets, no creation times, no timestamps),
    with the tally applied first as a scrape of ``/metrics`` applies it (unless ``flush`` is off)."""
    if flush:
        TALLY.flush()
    out = {}
    for metric in (mw.metrics_request_total, mw.metrics_request_duration, mw.metrics_request_in_progress):
        for family in metric.collect():
            for s in family.samples:
                if s.name.endswith(("_created", "_sum", "_bucket")):
                    continue
                out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


PATHS = ["/predict"] * 5 + ["/missing"] * 3 + ["/healthz"] * 2 + ["/fails"]


def test_the_patched_call_counts_what_bentomls_own_counts(middleware):
    _requests(middleware, request_metrics.original_call(), ["/predict"])  # BentoML sets its metrics up
    before = _samples(middleware)
    own = _requests(middleware, request_metrics.original_call(), PATHS)
    between = _samples(middleware)
    patched = _requests(middleware, request_metrics._call, PATHS)
    after = _samples(middleware)
    assert own == patched == [ANSWERS[p] for p in PATHS]
    by_bentoml, by_patch = _delta(between, before), _delta(after, between)
    assert by_patch == by_bentoml
    counted = {
        (dict(k[1])["endpoint"], dict(k[1])["http_response_code"]): v
        for k, v in by_patch.items()
        if k[0].endswith("request_total")
    }
    assert counted == {("/predict", "200"): 5, ("/missing", "404"): 3, ("/healthz", "200"): 2, ("/fails", "500"): 1}
    in_progress = [v for k, v in after.items() if "in_progress" in k[0]]
    assert in_progress and all(v == 0 for v in in_progress)


def test_each_child_is_made_once_and_a_request_is_in_progress_while_it_runs(middleware):
    seen = []

    async def watching(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(
            [v for k, v in _samples(middleware).items() if "in_progress" in k[0] and ("endpoint", "/watch") in k[1]]
        )
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    inner, middleware.app = middleware.app, watching
    try:
        _requests(middleware, request_metrics._call, ["/watch"] * 3)
    finally:
        middleware.app = inner
    assert seen == [[1.0]] * 3
    kept = [key for key in middleware.__dict__["_gsage_children"] if key[0] == "/watch"]
    assert len(kept) == 1


def test_a_skipped_path_leaves_the_last_request_time_alone(middleware):
    gauge = middleware.metrics_last_request_timestamp

    def stamps() -> list[float]:
        return [s.value for family in gauge.collect() for s in family.samples]

    _requests(middleware, request_metrics._call, ["/predict"])
    before = stamps()
    _requests(middleware, request_metrics._call, ["/healthz"] * 3)
    assert stamps() == before
    _requests(middleware, request_metrics._call, ["/predict"])
    assert stamps() != before


def test_a_metrics_request_applies_the_pending_counts_first(middleware):
    before = _samples(middleware)
    counted = ("request_total", "/predict")

    async def go() -> tuple[dict, dict]:  # one loop: the tally's timer cannot fire in between
        for _ in range(4):
            await request_metrics._call(
                middleware, {"type": "http", "path": "/predict", "method": "POST"}, _receive, _ignore
            )
        pending = _samples(middleware, flush=False)
        await request_metrics._call(
            middleware, {"type": "http", "path": "/metrics", "method": "GET"}, _receive, _ignore
        )
        return pending, _samples(middleware, flush=False)

    pending, scraped = asyncio.run(go())

    def predict_total(samples: dict) -> float:
        return sum(v for k, v in samples.items() if k[0].endswith(counted[0]) and ("endpoint", counted[1]) in k[1])

    assert predict_total(pending) == predict_total(before)
    assert predict_total(scraped) == predict_total(before) + 4


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _ignore(message: dict[str, Any]) -> None:
    pass
