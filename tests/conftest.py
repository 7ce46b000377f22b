"""Shared fixtures."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Iterator

import pytest


def wait_for(predicate, timeout_s: float = 15.0, interval_s: float = 0.25):
    """Poll ``predicate`` until it returns something truthy or ``timeout_s`` passes; its last value.
    For integration tests that wait on another process (a container, a reloaded routing file)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def bentoml_home(home: str):
    """This process's model and bento stores under ``home`` while the block runs."""
    from common.bento.store import use_home

    return use_home(home)


@pytest.fixture
def model_store(tmp_path, monkeypatch) -> Iterator[str]:
    """An empty BentoML home (model store under ``<path>/models``) for one test; yields its path.
    The env var is set too, for any subprocess a test starts."""
    home = str(tmp_path / "bentoml")
    monkeypatch.setenv("BENTOML_HOME", home)
    with bentoml_home(home):
        yield home


@dataclasses.dataclass(frozen=True)
class DemoStore:
    home: str
    v1: str  # mean aggregator, the demo's first version
    v2: str  # pool aggregator, trained on the same snapshot


_demo_built: list[tuple[str, list[str]]] = []  # (home, its files as built): checked after each module


def _store_listing(home: str) -> list[str]:
    models = os.path.join(home, "models")
    return sorted(os.path.relpath(os.path.join(d, f), models) for d, _, files in os.walk(models) for f in files)


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory) -> DemoStore:
    """One small trained model store (a 4,000-node graph, two versions) for every integration
    module: read by the services, never written. A module whose services may write a store (a
    compaction saves a snapshot, and the fuzzers reach the compaction routes) serves a
    ``private_store`` copy: a snapshot folded from one module's update log makes every later
    FeatureRunner on a fresh log refuse to start."""
    from harness.app import build_demo_store

    home = str(tmp_path_factory.mktemp("demo-store") / "bentoml")
    store = DemoStore(home, *build_demo_store(home))
    _demo_built.append((home, _store_listing(home)))
    return store


def private_store(demo_store: DemoStore, root) -> str:
    """A copy of the demo store's models under ``root`` (its BentoML home): for services that may
    write the store."""
    home = os.path.join(str(root), "bentoml")
    shutil.copytree(os.path.join(demo_store.home, "models"), os.path.join(home, "models"))
    return home


@pytest.fixture(scope="module", autouse=True)
def demo_store_stays_as_built(request) -> Iterator[None]:
    """Fails the module whose run changed the shared demo store (it must use ``private_store``)."""
    before = _store_listing(_demo_built[0][0]) if _demo_built else None
    yield
    if _demo_built:
        home, as_built = _demo_built[0]
        after, baseline = _store_listing(home), as_built if before is None else before
        if after != baseline:
            changed = sorted(set(after) ^ set(baseline))[:5]
            pytest.fail(f"{request.module.__name__} changed the shared demo store ({changed}): serve a private_store")


@pytest.fixture
def redis_standalone(tmp_path):
    """A fresh standalone ``redis-server`` on a free loopback port, stopped after the test."""
    from harness.redis_servers import RedisServer, redis_available

    if not redis_available():
        pytest.skip("redis-server / redis-cli not installed")
    with RedisServer(str(tmp_path / "redis")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A 3-master Redis Cluster (no replicas) shared by the session; a test that kills a node
    must restart it and wait for ``cluster_state:ok`` before it returns."""
    from harness.redis_servers import RedisCluster3, redis_available

    if not redis_available():
        pytest.skip("redis-server / redis-cli not installed")
    with RedisCluster3(str(tmp_path_factory.mktemp("redis-cluster"))) as cluster:
        yield cluster
