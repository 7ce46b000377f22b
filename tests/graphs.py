"""Small graphs shared by the tests."""

from __future__ import annotations

import functools

from runners.feature.snapshot import GraphSnapshot
from training_export.synthetic import SyntheticGraphSpec, generate


@functools.lru_cache(maxsize=4)
def small_graph(num_nodes: int = 3000, num_edges: int = 30_000, seed: int = 0, task: str = "multiclass") -> GraphSnapshot:
    return generate(SyntheticGraphSpec(num_nodes=num_nodes, num_edges=num_edges, seed=seed, task=task), progress=False)
