"""The origin level: where a row comes from when no cache holds it. It always hits. (In cluster
mode the feature cluster is the origin instead: ``runners.feature.authority.ClusterOrigin``.)

By default the snapshot's memory-mapped feature matrix; for a live graph, ``rows`` of its
``runners.feature.graph.LiveGraph`` (the updated row where an update changed one, else the
snapshot's). A fetch is one fancy-index gather; pages the OS has not cached yet are read from
disk there, which is exactly the cost L1 and L2 exist to hide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .base import ROW_DTYPE, as_ids


class OriginLevel:
    name = "origin"

    def __init__(
        self, features: np.ndarray, rows: Callable[[np.ndarray], np.ndarray] | None = None, num_nodes: int | None = None
    ) -> None:
        """``rows``/``num_nodes``: a live graph's row source and id range (default: ``features``')."""
        if features.ndim != 2:
            raise ValueError(f"features must be [N, F], got shape {features.shape}")
        self.features = features
        self._rows = rows
        self.num_nodes = int(features.shape[0]) if num_nodes is None else num_nodes
        self.dim = int(features.shape[1])
        self.hits = 0

    def get_many(self, ids: np.ndarray) -> np.ndarray:
        """Rows of ``ids`` as a fresh float32 array; IndexError for ids outside [0, N)."""
        ids = as_ids(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
            raise IndexError(f"node ids must be in [0, {self.num_nodes})")
        self.hits += int(ids.size)
        if self._rows is not None:
            return self._rows(ids)
        # np.take on a memmap returns a plain in-memory ndarray (a copy), never a file view.
        return np.asarray(np.take(self.features, ids, axis=0), dtype=ROW_DTYPE)

    async def fetch(self, ids: np.ndarray) -> np.ndarray:
        """``get_many`` as the tiered store awaits every origin (the feature cluster's is I/O)."""
        return self.get_many(ids)

    async def start(self) -> None:
        return None

    def rebound(self, graph: Any) -> OriginLevel:
        """The origin of ``graph`` (a live graph a compaction made)."""
        return OriginLevel(graph.base.features, rows=graph.rows, num_nodes=graph.capacity)

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits}

    async def close(self) -> None:
        return None
