"""Small graphs shared by the tests."""

from __future__ import annotations

import functools
from typing import Any

from runners.feature.snapshot import GraphSnapshot
from training_export.synthetic import SyntheticGraphSpec, generate


@functools.lru_cache(maxsize=4)
def small_graph(
    num_nodes: int = 3000, num_edges: int = 30_000, seed: int = 0, task: str = "multiclass"
) -> GraphSnapshot:
    return generate(SyntheticGraphSpec(num_nodes=num_nodes, num_edges=num_edges, seed=seed, task=task), progress=False)


def feature_store(settings: Any, features: Any, version: str, graph: Any = None) -> Any:
    """The tiered feature store of ``settings``' cache and Redis sections (as the FeatureRunner builds it)."""
    from runners.feature.cache.tiered import build_feature_store

    return build_feature_store(settings.feature_cache, settings.redis, features, version, graph)
