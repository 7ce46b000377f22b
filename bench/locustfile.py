"""Locust scenarios matching ``python -m bench.suite`` (locust is optional, not a dependency).

    pip install locust
    locust -f bench/locustfile.py --host http://127.0.0.1:3000                  # web UI
    locust -f bench/locustfile.py --host http://127.0.0.1:3000 --headless \
        -u 32 -r 32 -t 60s SingleZipf                                            # c=32 single node
    GSAGE_BENCH_NODES=1000000 locust -f bench/locustfile.py ... Bulk256          # the 1M graph

User classes (pick on the command line; each user is one closed-loop client with no think time,
so ``-u N`` is the suite's concurrency N):

    SingleZipf     one node per request, Zipf(1.0) ids          (suite: "single zipf c=N")
    SingleUniform  one node per request, uniform ids            (suite: "single uniform c=N")
    Bulk64 / Bulk256 / Bulk1024   that many Zipf ids per request (suite: "bulk N zipf c=1")
    OpenLoop       constant arrival rate per user (``constant_throughput``): with -u U the rate is
                   U * GSAGE_BENCH_RATE_PER_USER req/s (suite: "open loop")

Environment: ``GSAGE_BENCH_NODES`` (graph size, default 100000), ``GSAGE_BENCH_SEED``,
``GSAGE_BENCH_RATE_PER_USER`` (default 5). Degraded answers (feature runner unavailable) are
reported as failures, like errors. Locust's own client (requests/gevent) costs far more CPU per
request than the suite's aiohttp loop; on a 2-core machine prefer ``harness.load`` (the load loop
of the tests and the suite) for
numbers, and use this file for exploration and for load from other machines.
"""

from __future__ import annotations

import os
import sys

from locust import HttpUser, constant, constant_throughput, task

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness.workload import make_dist

NUM_NODES = int(os.environ.get("GSAGE_BENCH_NODES", "100000"))
SEED = int(os.environ.get("GSAGE_BENCH_SEED", "0"))
RATE_PER_USER = float(os.environ.get("GSAGE_BENCH_RATE_PER_USER", "5"))


_DISTS: dict[str, object] = {}


def draw(kind: str, k: int) -> list[int]:
    """``k`` target ids from the suite's distributions (``harness.workload``), one per kind."""
    if kind not in _DISTS:
        _DISTS[kind] = make_dist(kind, NUM_NODES, SEED)
    return _DISTS[kind].draw(k).tolist()


class _Predict(HttpUser):
    abstract = True
    wait_time = constant(0)
    nodes = 1
    uniform = False

    def ids(self) -> list[int]:
        return draw("uniform" if self.uniform else "zipf", self.nodes)

    @task
    def predict(self) -> None:
        name = f"/predict [{self.nodes} {'uniform' if self.uniform else 'zipf'}]"
        with self.client.post("/predict", json={"node_ids": self.ids()}, name=name, catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}")
            elif b'"degraded":true' in resp.content[:200]:
                resp.failure("degraded")
            else:
                resp.success()


class SingleZipf(_Predict):
    pass


class SingleUniform(_Predict):
    uniform = True


class Bulk64(_Predict):
    nodes = 64


class Bulk256(_Predict):
    nodes = 256


class Bulk1024(_Predict):
    nodes = 1024


class OpenLoop(_Predict):
    wait_time = constant_throughput(RATE_PER_USER)
