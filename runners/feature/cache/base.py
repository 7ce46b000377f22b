"""What the feature-cache levels share: the id and row dtypes, and their "all missed" answer.

A level maps unique int64 node ids to float32 rows of a fixed width ``F``. L1 and the origin are
synchronous (``get_many`` / ``put_many``: no I/O on the hot path); L2 (Redis) is asynchronous and
never raises for a backend fault: it answers "all missed", so the next level down always gets its
chance. ``runners.feature.cache.tiered`` composes them.
"""

from __future__ import annotations

import numpy as np

ID_DTYPE = np.int64
ROW_DTYPE = np.float32


def as_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` as a flat int64 array (no copy when it already is one)."""
    return np.asarray(ids, dtype=ID_DTYPE).reshape(-1)


def all_missed(n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(n, dtype=bool), np.empty((0, dim), dtype=ROW_DTYPE)
