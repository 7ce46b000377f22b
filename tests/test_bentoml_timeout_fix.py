"""BentoML's TimeoutMiddleware, patched: no timer outlives its request, the timeout still 504s."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.bento import timeout_fix as bentoml_timeout_fix

ROOT = Path(__file__).resolve().parent.parent


def _middleware(app, timeout):
    assert bentoml_timeout_fix.install()
    return bentoml_timeout_fix.middleware_class()(app, timeout=timeout)


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
        return [h for h in loop._scheduled if not h.cancelled()]  # asyncio's own loop: its timer heap

    return asyncio.run(go()), sent


def test_no_timer_outlives_its_request():
    live, sent = _run(_middleware(_fast_app, timeout=30), 200)
    assert live == []
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [200] * 200


def test_a_request_that_does_not_answer_in_time_gets_504():
    live, sent = _run(_middleware(_silent_app, timeout=0.01), 1)
    assert live == []
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [504]


@pytest.mark.parametrize("module", ["services.gateway", "runners.feature.service", "runners.graphsage.service",
                                    "bench.suite.trivial_services"])
def test_every_service_module_installs_the_fix(module):
    """Importing a service module (what a BentoML worker does first) patches the middleware."""
    code = (f"import {module}; from common.bento.timeout_fix import middleware_class; "
            "print(middleware_class().__call__.__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "BENTOML_DO_NOT_TRACK": "true"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "common.bento.timeout_fix"
