"""Shared fixtures."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator

import pytest


@contextlib.contextmanager
def bentoml_home(home: str) -> Iterator[str]:
    """Point this process's BentoML model and bento stores at ``home`` while the block runs.

    Setting ``BENTOML_HOME`` alone is not enough: BentoML resolves the home and the stores once
    per process and caches them (simple_di singletons), so the providers are overridden too and
    reset afterwards.
    """
    from bentoml._internal.bento import BentoStore
    from bentoml._internal.configuration.containers import BentoMLContainer
    from bentoml._internal.models import ModelStore

    dirs = {name: os.path.join(home, name) for name in ("models", "bentos", "envs", "tmp")}
    for path in dirs.values():
        os.makedirs(path, exist_ok=True)
    c = BentoMLContainer
    overrides = [
        (c.bentoml_home, home),
        (c.model_store_dir, dirs["models"]),
        (c.model_store, ModelStore(dirs["models"])),
        (c.bento_store_dir, dirs["bentos"]),
        (c.bento_store, BentoStore(dirs["bentos"])),
        (c.tmp_bento_store_dir, dirs["tmp"]),
        (c.tmp_bento_store, BentoStore(dirs["tmp"])),
        (c.env_store_dir, dirs["envs"]),
    ]
    # patch() restores whatever override was there before, so these can nest.
    with contextlib.ExitStack() as stack:
        for provider, value in overrides:
            stack.enter_context(provider.patch(value))
        yield home


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


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory) -> DemoStore:
    """One small trained model store (a 4,000-node graph, two versions) for every integration
    module: read by the services, never written by a test."""
    from harness.app import build_demo_store

    home = str(tmp_path_factory.mktemp("demo-store") / "bentoml")
    return DemoStore(home, *build_demo_store(home))


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
