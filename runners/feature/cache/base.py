"""The one interface every feature-cache level implements.

A level maps unique int64 node ids to float32 feature rows of a fixed width ``F``:

* ``get(ids)`` answers ``(found [n] bool, rows [found.sum(), F] float32)``; ``rows`` follow the
  order of ``ids[found]`` and may be a read-only view (copy before mutating). A level that
  cannot answer (Redis down) says "all missed"; it never raises, so the next level down always
  gets its chance.
* ``put(ids, rows)`` stores rows; best effort, never raises for a backend fault.
* ``stats()`` returns the level's monotonically increasing counters (hits, misses, errors,
  evictions, ... whichever apply) as a flat ``dict[str, int]`` for metrics export.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

ID_DTYPE = np.int64
ROW_DTYPE = np.float32


@runtime_checkable
class FeatureLevel(Protocol):
    name: str

    async def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    async def put(self, ids: np.ndarray, rows: np.ndarray) -> None: ...

    def stats(self) -> dict[str, int]: ...


def as_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` as a flat int64 array (no copy when it already is one)."""
    return np.asarray(ids, dtype=ID_DTYPE).reshape(-1)


def all_missed(n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(n, dtype=bool), np.empty((0, dim), dtype=ROW_DTYPE)
