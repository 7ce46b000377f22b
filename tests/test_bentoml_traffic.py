"""BentoML's traffic middlewares, patched: nothing outlives its request, the timeout still 504s,
an overload is a 503 with Retry-After; both refusals in the one error shape."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import deadline
from common.bento import traffic
from common.errors import ErrorBody

ROOT = Path(__file__).resolve().parent.parent


def _middleware(app, timeout):
    assert traffic.install()
    return traffic.middleware_classes()[0](app, timeout=timeout)


async def _fast_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _silent_app(scope, receive, send):
    await asyncio.Event().wait()  # never answers: only the timeout can end the request


def _run(mw, n):
    sent = []

    async def send(message):
        sent.append(message)

    async def go():
        for _ in range(n):
            await mw({"type": "http", "path": "/x"}, None, send)
        await asyncio.sleep(0)  # a cancelled app task unwinds (its own sleep's timer goes)
        loop = asyncio.get_running_loop()
        timers = [h for h in loop._scheduled if not h.cancelled()]  # asyncio's own loop: its timer heap
        return timers, deadline.pending(loop)

    return asyncio.run(go()), sent


def test_nothing_outlives_its_request():
    """BentoML's leaves a timer per request for the timeout's length; the patched one leaves no
    deadline registered, and at most the loop's one shared timer (the first request's, armed once)."""
    (timers, pending), sent = _run(_middleware(_fast_app, timeout=30), 200)
    assert pending == 0
    assert len(timers) <= 1
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [200] * 200


def test_a_request_that_does_not_answer_in_time_gets_504():
    (timers, pending), sent = _run(_middleware(_silent_app, timeout=0.01), 1)
    assert (timers, pending) == ([], 0)
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [504]
    body = ErrorBody.model_validate_json(sent[-1]["body"])
    assert (body.status, body.type) == (504, "timeout")


def test_a_request_over_the_concurrency_limit_gets_503_with_retry_after():
    assert traffic.install()
    limiter = traffic.middleware_classes()[1](_silent_app, max_concurrency=1)
    sent = []

    async def send(message):
        sent.append(message)

    async def go():
        first = asyncio.ensure_future(limiter({"type": "http", "path": "/x"}, None, send))
        await asyncio.sleep(0)  # the first holds the only slot
        await limiter({"type": "http", "path": "/x"}, None, send)
        first.cancel()

    asyncio.run(go())
    start, body = sent
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
    assert json.loads(body["body"])["type"] == "overloaded"


@pytest.mark.parametrize(
    "module",
    ["services.gateway", "runners.feature.service", "runners.graphsage.service", "bench.suite.trivial_services"],
)
def test_every_service_module_installs_the_patches(module):
    """Importing a service module (what a BentoML worker does first) patches the middleware."""
    code = (
        f"import {module}; from common.bento.traffic import middleware_classes; "
        "print(*(c.__call__.__module__ for c in middleware_classes()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "BENTOML_DO_NOT_TRACK": "true"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "common.bento.traffic common.bento.traffic"


def test_the_app_runs_in_the_requests_own_task_and_a_started_response_has_no_deadline():
    """No task per request; once the response has started the timeout no longer applies (on
    virtual time: the app's pause is longer than the timeout and takes no real time)."""
    from tests.virtual_time import run

    tasks = []

    async def slow_body(scope, receive, send):
        tasks.append(asyncio.current_task())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(5.0)  # past the 1 s timeout
        await send({"type": "http.response.body", "body": b"late but whole"})

    sent = []

    async def send(message):
        sent.append(message)

    async def go():
        await _middleware(slow_body, timeout=1.0)({"type": "http", "path": "/x"}, None, send)
        return asyncio.current_task()

    assert tasks == [run(go())]
    assert [m.get("status") or m.get("body") for m in sent] == [200, b"late but whole"]


def test_the_apps_own_timeout_error_is_not_taken_for_the_deadline():
    async def own_timeout(scope, receive, send):
        raise TimeoutError("a dependency's deadline")

    with pytest.raises(TimeoutError, match="a dependency's deadline"):
        _run(_middleware(own_timeout, timeout=30), 1)


def _traced_middleware(app, monkeypatch, tracing_on):
    """OpenTelemetry's ASGI middleware as BentoML builds it (tracing off: every URL excluded, as
    common.bento.config sets it), after ``traffic.install``, with spans kept in memory."""
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from common import request_context

    assert traffic.install()
    monkeypatch.setitem(request_context._tracing, "on", tracing_on)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    excluded = None if tracing_on else ".*"
    return OpenTelemetryMiddleware(app, excluded_urls=excluded, tracer_provider=provider), exporter


HTTP_SCOPE = {"type": "http", "method": "POST", "scheme": "http", "path": "/predict", "query_string": b""}
HTTP_SCOPE.update(headers=[(b"host", b"127.0.0.1:3000")], server=("127.0.0.1", 3000), client=("127.0.0.1", 40000))


def test_with_tracing_off_the_tracing_middleware_hands_each_request_on_as_it_came(monkeypatch):
    """No span, the same scope, receive and send, and none of the URL work the middleware does
    for a traced request (its URL builder fails this test if called)."""
    from opentelemetry.instrumentation import asgi

    handed = []

    async def app(scope, receive, send):
        handed.append((scope, receive, send))

    mw, exporter = _traced_middleware(app, monkeypatch, tracing_on=False)

    def url_work(*_):
        raise AssertionError("the URL of an untraced request was built")

    monkeypatch.setattr(asgi, "get_host_port_url_tuple", url_work)
    scope, receive, send = dict(HTTP_SCOPE), object(), object()
    asyncio.run(mw(scope, receive, send))
    assert handed == [(scope, receive, send)] and exporter.get_finished_spans() == ()


def test_with_tracing_on_the_tracing_middleware_makes_the_requests_span(monkeypatch):
    mw, exporter = _traced_middleware(_fast_app, monkeypatch, tracing_on=True)
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(mw(dict(HTTP_SCOPE), receive, send))
    server = [s for s in exporter.get_finished_spans() if s.kind.name == "SERVER"]
    assert len(server) == 1 and [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
