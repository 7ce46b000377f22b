"""Routing: pins, sticky weighted routing, minimal movement, promote/rollback, persistence."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from services.routing import (
    InvalidVersion,
    InvalidWeights,
    NoHistory,
    Route,
    RoutingError,
    RoutingTable,
    UnknownModel,
    hash_point,
)
from services.routing_cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = [f"user-{i}" for i in range(20_000)]
V1, V2, V3 = "graphsage:v1", "graphsage:v2", "graphsage:v3"


def table(weights: dict[str, float] | None = None, **kwargs) -> RoutingTable:
    t = RoutingTable.in_memory(V1, rng=random.Random(0), **kwargs)
    if weights:
        t.set_weights("graphsage", weights)
    return t


def assign(t: RoutingTable, keys=KEYS) -> dict[str, str]:
    return {k: t.choose("graphsage", None, k) for k in keys}


def test_default_table_routes_everything_to_the_default_version():
    t = RoutingTable.in_memory("graphsage:latest")
    assert t.models() == ["graphsage"] and t.default_model == "graphsage"
    assert t.choose("graphsage", None, None) == "graphsage:latest"
    assert t.choose(None, None, "k") == "graphsage:latest"  # no model: the default one
    assert t.versions_in_use() == {"graphsage:latest"}


def test_explicit_version_pin_wins():
    t = table({V1: 90, V2: 10})
    assert all(t.choose("graphsage", "v2", k) == V2 for k in KEYS[:100])
    assert t.choose("graphsage", "graphsage:v1", "user-1") == V1
    assert t.choose("GraphSAGE", "V2", None) == V2  # BentoML tags are lower case
    # Not routed, but a valid tag: returned; the model runner answers 404 if it has no such model.
    assert t.choose("graphsage", "v9", None) == "graphsage:v9"
    for bad in ("other:v1", "v 1", "-v1", "v1/../x", "x" * 64):
        with pytest.raises(InvalidVersion):
            t.choose("graphsage", bad, None)


def test_routing_key_is_sticky_and_independent_of_the_instance():
    t1, t2 = table({V1: 50, V2: 50}), table({V1: 50, V2: 50})
    first = assign(t1, KEYS[:2000])
    assert assign(t1, KEYS[:2000]) == first
    assert assign(t2, KEYS[:2000]) == first  # a hash, not per-process state
    assert 0 <= hash_point("graphsage", "k") < 1
    assert hash_point("graphsage", "k") != hash_point("other", "k")


def test_weights_are_honoured_with_and_without_a_key():
    t = table({V1: 90, V2: 10})
    by_key = Counter(assign(t).values())
    assert by_key[V2] / len(KEYS) == pytest.approx(0.10, abs=0.01)
    by_random = Counter(t.choose("graphsage", None, None) for _ in range(20_000))
    assert by_random[V2] / 20_000 == pytest.approx(0.10, abs=0.01)
    t3 = table({V1: 50, V2: 30, V3: 20})
    counts = Counter(assign(t3).values())
    for v, share in ((V1, 0.5), (V2, 0.3), (V3, 0.2)):
        assert counts[v] / len(KEYS) == pytest.approx(share, abs=0.015)
    zero = table({V1: 100, V2: 0})
    assert set(assign(zero, KEYS[:2000]).values()) == {V1}
    assert zero.versions_in_use() == {V1}


def test_raising_the_canary_moves_only_the_minimal_share_of_keys():
    t = table({V1: 90, V2: 10})
    before = assign(t)
    t.set_weights("graphsage", {V1: 80, V2: 20})
    after = assign(t)
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(before[k] == V1 and after[k] == V2 for k in moved)  # only towards the canary
    assert len(moved) / len(KEYS) == pytest.approx(0.10, abs=0.01)
    # And back down: exactly those keys return.
    t.set_weights("graphsage", {V1: 90, V2: 10})
    assert assign(t) == before


def test_set_weights_keeps_route_order_whatever_the_argument_order():
    t = table({V1: 90, V2: 10})
    t.set_weights("graphsage", {V2: 20, V1: 80})
    assert [r.version for r in t.routes("graphsage")] == [V1, V2]
    assert t.routes("graphsage") == [Route(V1, 0.8), Route(V2, 0.2)]
    t.set_weights("graphsage", {"v3": 1, "v1": 1, "v2": 2})  # short versions, new one appended
    assert [r.version for r in t.routes("graphsage")] == [V1, V2, V3]
    assert [r.weight for r in t.routes("graphsage")] == [0.25, 0.5, 0.25]
    # weights near the float maximum: their sum would overflow (a 500 found by the fuzzer)
    t.set_weights("graphsage", {V1: 1.6397000559726396e308, V2: 9.667194229306633e307})
    w1, w2 = (r.weight for r in t.routes("graphsage"))
    assert w1 + w2 == pytest.approx(1.0) and w1 / w2 == pytest.approx(1.6397000559726396 / 0.9667194229306633)


def test_promote_and_rollback():
    t = table({V1: 90, V2: 10})
    t.promote("graphsage", V2)
    assert t.routes("graphsage") == [Route(V2, 1.0)]
    assert t.versions_in_use() == {V2}
    assert {t.choose("graphsage", None, k) for k in KEYS[:500]} == {V2}
    t.rollback("graphsage")
    assert t.routes("graphsage") == [Route(V1, 0.9), Route(V2, 0.1)]
    assert t.versions_in_use() == {V1, V2}
    t.rollback("graphsage")
    assert t.routes("graphsage") == [Route(V1, 1.0)]  # the initial default
    with pytest.raises(NoHistory):
        t.rollback("graphsage")
    with pytest.raises(UnknownModel):
        t.rollback("nope")


def test_unknown_model_is_a_404():
    t = table()
    for model in ("nope", "graphsage2"):
        with pytest.raises(UnknownModel) as info:
            t.choose(model, None, "k")
        assert info.value.status_code == 404 and "graphsage" in str(info.value)
    with pytest.raises(UnknownModel):
        t.choose("nope", "v1", None)  # a pin does not make a model exist


def test_bad_weights_are_rejected_with_a_clear_error():
    t = table({V1: 90, V2: 10})
    cases = [
        ({V1: -1, V2: 2}, ">= 0"),
        ({V1: 0, V2: 0}, "sum to 0"),
        ({}, "at least one"),
        ({V1: float("nan")}, "finite"),
        ({V1: float("inf")}, "finite"),
        ({V1: "90"}, "number"),
        ({"other:v1": 1}, "not a version of model"),
    ]
    for weights, fragment in cases:
        with pytest.raises(RoutingError) as info:
            t.set_weights("graphsage", weights)
        assert fragment in str(info.value) and info.value.status_code == 400
    with pytest.raises(InvalidWeights):
        t.set_weights("graphsage", {V1: 1, "v1": 2})  # the same version twice
    assert t.routes("graphsage") == [Route(V1, 0.9), Route(V2, 0.1)]  # unchanged


def test_file_persistence_and_reload_by_a_second_instance(tmp_path):
    path = str(tmp_path / "routes.json")
    admin = RoutingTable(path, default_version=V1)
    worker = RoutingTable(path, default_version=V1, poll_interval_s=0)
    assert not os.path.exists(path) and worker.choose("graphsage", None, "k") == V1

    admin.set_weights("graphsage", {V1: 90, V2: 10})
    doc = json.load(open(path))
    assert doc["models"]["graphsage"]["routes"] == [{"version": V1, "weight": 0.9}, {"version": V2, "weight": 0.1}]
    assert doc["models"]["graphsage"]["history"] == [[{"version": V1, "weight": 1.0}]]
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # no temp file left

    assert worker.reload_if_changed()
    assert worker.routes("graphsage") == admin.routes("graphsage")
    assert assign(worker, KEYS[:1000]) == assign(admin, KEYS[:1000])
    assert not worker.reload_if_changed()  # nothing changed since

    # A third instance (e.g. the CLI in another process) builds on the file, not on stale state.
    RoutingTable(path).promote("graphsage", V2)
    assert worker.reload_if_changed()
    assert worker.choose("graphsage", None, "k") == V2
    admin.rollback("graphsage")  # admin's memory predates the promote: the file wins
    assert worker.reload_if_changed()
    assert worker.routes("graphsage") == [Route(V1, 0.9), Route(V2, 0.1)]

    # A broken hand edit keeps the last good table.
    with open(path, "w") as f:
        f.write("{not json")
    assert not worker.reload_if_changed()
    assert worker.routes("graphsage") == [Route(V1, 0.9), Route(V2, 0.1)]
    with pytest.raises(RoutingError):
        admin.set_weights("graphsage", {V1: 1})  # refuses to overwrite what it cannot read

    # A hand-written file with percentages is normalised.
    with open(path, "w") as f:
        json.dump(
            {"models": {"graphsage": {"routes": [{"version": V1, "weight": 75}, {"version": V3, "weight": 25}]}}}, f
        )
    assert worker.reload_if_changed()
    assert worker.routes("graphsage") == [Route(V1, 0.75), Route(V3, 0.25)]
    assert worker.versions_in_use() == {V1, V3}


def test_reload_is_rate_limited_by_poll_interval(tmp_path):
    now = [0.0]
    path = str(tmp_path / "routes.json")
    worker = RoutingTable(path, default_version=V1, poll_interval_s=1.0, clock=lambda: now[0])
    RoutingTable(path, default_version=V1).set_weights("graphsage", {V1: 1, V2: 1})
    assert not worker.reload_if_changed()  # polled too recently
    now[0] = 1.0
    assert worker.reload_if_changed()
    assert worker.versions_in_use() == {V1, V2}


def test_cli(tmp_path):
    path = str(tmp_path / "routes.json")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.routing_cli", "--file", path, *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=30,
            env={**os.environ, "PYTHONPATH": ROOT},
        )

    out = run("--default-version", V1, "set-weights", "graphsage", f"{V1}=90", f"{V2}=10")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{V1}\t90.00%", f"{V2}\t10.00%"]
    # The rest in-process: the same main(), without interpreter start-ups.
    assert main(["--file", path, "promote", "graphsage", V2]) == 0
    assert RoutingTable(path).routes("graphsage") == [Route(V2, 1.0)]
    assert main(["--file", path, "rollback", "graphsage"]) == 0
    assert RoutingTable(path).routes("graphsage") == [Route(V1, 0.9), Route(V2, 0.1)]
    assert main(["--file", path, "set-weights", "graphsage", f"{V1}=-5"]) == 1
    assert main(["--file", path, "set-weights", "graphsage", "v1"]) == 1
    shown = run("show")
    assert shown.returncode == 0
    assert json.loads(shown.stdout)["models"]["graphsage"]["routes"][1] == {"version": V2, "weight": 0.1}
