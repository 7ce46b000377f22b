"""Target-id distributions and pre-serialised request bodies."""

from __future__ import annotations

import json
import time

import numpy as np


class Zipf:
    """Node ids with P(rank r) ~ 1/r^s, rank -> node through a random permutation (hot nodes
    are not simply low ids). Shared by the suite and bench/bench_features.py."""

    def __init__(self, num_nodes: int, seed: int = 0, exponent: float = 1.0) -> None:
        self.rng = np.random.default_rng(seed)
        weights = 1.0 / np.arange(1, num_nodes + 1, dtype=np.float64) ** exponent
        self.cdf = np.cumsum(weights) / weights.sum()
        self.perm = self.rng.permutation(num_nodes).astype(np.int64)

    def draw(self, n: int) -> np.ndarray:
        ranks = np.minimum(np.searchsorted(self.cdf, self.rng.random(n), side="right"), self.cdf.size - 1)
        return self.perm[ranks]


class Uniform:
    def __init__(self, num_nodes: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.num_nodes = num_nodes

    def draw(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.num_nodes, size=n, dtype=np.int64)


def make_dist(name: str, num_nodes: int, seed: int = 0):
    if name == "zipf":
        return Zipf(num_nodes, seed)
    if name == "uniform":
        return Uniform(num_nodes, seed)
    raise ValueError(f"unknown distribution {name!r}")


def bodies(dist, nodes_per_request: int, count: int) -> list[bytes]:
    """``count`` JSON bodies for ``POST /predict`` (the load loop cycles through them)."""
    ids = dist.draw(nodes_per_request * count).reshape(count, nodes_per_request)
    return [json.dumps({"node_ids": row.tolist()}).encode() for row in ids]


def time_calls(
    fn, inputs: list, budget_s: float, min_calls: int, max_calls: int = 5000, warmup: int = 1, idle_s: float = 0.0
) -> list[float]:
    """Seconds per call of ``fn`` over ``inputs`` round-robin (``warmup`` untimed calls first),
    at least ``min_calls``, then until the budget is spent. ``idle_s``: sleep that long before
    each call (untimed), as a service idles between requests at low load."""
    for x in inputs[:warmup]:
        fn(x)
    out: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(out) < max_calls and (len(out) < min_calls or time.perf_counter() < deadline):
        x = inputs[len(out) % len(inputs)]
        if idle_s:
            time.sleep(idle_s)
        t = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t)
    return out
