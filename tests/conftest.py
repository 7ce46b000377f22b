"""Shared fixtures."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator

import pytest


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
