"""Graph snapshots: CSR + features + labels + splits, versioned as ``graph-snapshot:<version>``.

Layout inside the model-store directory (plain ``.npy`` files so that every reader can memory-map
them without copying)::

    indptr.npy    int64  [N+1]   CSR row pointers (neighbours of v: indices[indptr[v]:indptr[v+1]])
    indices.npy   int32  [E]     neighbour ids
    features.npy  float32 [N, F]
    labels.npy    int64 [N] (multiclass) or uint8 [N, C] (multilabel)
    train.npy / val.npy / test.npy   int64 node ids of each split
    present.npy   bool [N]       optional: which ids are nodes (a compaction after remove_node)
    row_sequence.npy int64 [N]   optional: the update that last set each row (0: the loaded row);
                                 the key version of a row in the feature cluster

Features kept in a Redis Cluster (``GSAGE_FEATURE_SOURCE=redis``, ``runners.feature.authority``):
a FeatureRunner loads the snapshot with ``features=False`` and never maps ``features.npy``; a
snapshot compacted in that mode has no ``features.npy`` at all (``AbsentFeatures`` stands in: the
shape, no rows) and names in ``feature_set`` the loaded snapshot whose keys hold its rows.

Metadata (``bentoml models get``) holds counts, dims, degree statistics, task and source, whether
the graph is ``directed`` (an undirected graph stores each edge in both endpoints' lists, and an
added edge goes in both), and ``log_sequence``: the last graph update a compaction folded in
(0 for a snapshot built from files), from which a FeatureRunner replays the update log.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Literal

import numpy as np

from common.bento.store import create_entry, get_entry

SNAPSHOT_MODEL_NAME = "graph-snapshot"
ARRAYS = ("indptr", "indices", "features", "labels", "train", "val", "test")
OPTIONAL_ARRAYS = ("present", "row_sequence")
TASKS = ("multiclass", "multilabel")
# Metadata recomputed from the arrays on every save; everything else in metadata is ``extra``.
DERIVED_METADATA = frozenset(
    {
        "num_nodes",
        "num_edges",
        "feature_dim",
        "num_classes",
        "degree_mean",
        "degree_p50",
        "degree_p99",
        "degree_max",
        "isolated_nodes",
        "split_sizes",
        "directed",
        "log_sequence",
        "removed_nodes",
    }
)


class FeaturesElsewhere(RuntimeError):
    """A row of a snapshot whose features live in the feature cluster was read from the snapshot."""


class AbsentFeatures:
    """The ``[N, F]`` shape of a feature matrix that is not in this process (it lives in the
    feature cluster): every use of its rows raises, so that no code path reads zeros instead."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, num_nodes: int, dim: int) -> None:
        self.shape = (int(num_nodes), int(dim))

    def _refuse(self, *_: object, **__: object) -> Any:
        raise FeaturesElsewhere(
            "this snapshot's feature rows are in the feature cluster (GSAGE_FEATURE_SOURCE=redis), "
            "not in this process: read them through the feature store"
        )

    __getitem__ = __array__ = _refuse

    @property
    def nbytes(self) -> int:
        return 0


@dataclasses.dataclass
class GraphSnapshot:
    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray | AbsentFeatures
    labels: np.ndarray
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    task: str = "multiclass"
    source: str = "unknown"
    tag: str = ""  # filled when loaded from / saved to the store
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    directed: bool = False
    present: np.ndarray | None = None  # None: every id in [0, N) is a node
    log_sequence: int = 0  # the last graph update folded in (runners.feature.graph)
    row_sequence: np.ndarray | None = None  # None: every row as loaded (key version 0)

    @property
    def features_here(self) -> bool:
        return not isinstance(self.features, AbsentFeatures)

    def feature_rows(self) -> np.ndarray:
        """The feature matrix; ``FeaturesElsewhere`` for a snapshot whose rows are in the cluster."""
        if isinstance(self.features, AbsentFeatures):
            return self.features._refuse()
        return self.features

    @property
    def feature_set(self) -> str:
        """The name of this snapshot's rows in the feature cluster: the snapshot that was loaded
        there (a compaction in cluster mode keeps its base's), by default this one's version."""
        return str(self.extra.get("feature_set") or self.tag.rpartition(":")[2])

    def present_mask(self) -> np.ndarray:
        return np.ones(self.num_nodes, dtype=bool) if self.present is None else np.asarray(self.present, dtype=bool)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def num_classes(self) -> int:
        if self.task == "multilabel":
            return int(self.labels.shape[1])
        return int(self.labels.max()) + 1

    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    def validate(self) -> None:
        """Raise ValueError if the arrays do not form a consistent snapshot."""
        n = self.num_nodes
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.indptr[0] != 0 or self.indptr[-1] != self.num_edges:
            raise ValueError("indptr must start at 0 and end at len(indices)")
        if np.any(np.diff(self.indptr) < 0):
            raise ValueError("indptr must be non-decreasing")
        if self.num_edges and (self.indices.min() < 0 or self.indices.max() >= n):
            raise ValueError("indices hold node ids outside [0, num_nodes)")
        if self.features.shape[0] != n or self.features.ndim != 2:
            raise ValueError(f"features must be [num_nodes={n}, F], got {self.features.shape}")
        if self.labels.shape[0] != n:
            raise ValueError(f"labels must have {n} rows, got {self.labels.shape[0]}")
        for name in ("train", "val", "test"):
            split = getattr(self, name)
            if split.size and (split.min() < 0 or split.max() >= n):
                raise ValueError(f"split {name!r} holds node ids outside [0, {n})")
        if self.row_sequence is not None and self.row_sequence.shape != (n,):
            raise ValueError(f"row_sequence must be [num_nodes={n}] ints, got {self.row_sequence.shape}")
        if self.present is not None and self.present.shape != (n,):
            raise ValueError(f"present must be [num_nodes={n}] booleans, got {self.present.shape}")

    def metadata(self) -> dict[str, Any]:
        deg = self.degrees()
        return {
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "feature_dim": self.feature_dim,
            "num_classes": self.num_classes,
            "task": self.task,
            "source": self.source,
            "degree_mean": float(deg.mean()) if deg.size else 0.0,
            "degree_p50": float(np.percentile(deg, 50)) if deg.size else 0.0,
            "degree_p99": float(np.percentile(deg, 99)) if deg.size else 0.0,
            "degree_max": int(deg.max()) if deg.size else 0,
            "isolated_nodes": int((deg == 0).sum()),
            "split_sizes": {s: int(getattr(self, s).size) for s in ("train", "val", "test")},
            "directed": bool(self.directed),
            "log_sequence": int(self.log_sequence),
            "removed_nodes": 0 if self.present is None else int((~self.present_mask()).sum()),
            **self.extra,
        }


def write_arrays(snapshot: GraphSnapshot, directory: str) -> None:
    for name in ARRAYS:
        if name == "features" and not snapshot.features_here:
            continue  # in the feature cluster
        np.save(os.path.join(directory, f"{name}.npy"), getattr(snapshot, name))
    for name in OPTIONAL_ARRAYS:
        if getattr(snapshot, name) is not None:
            np.save(os.path.join(directory, f"{name}.npy"), getattr(snapshot, name))


def read_arrays(directory: str, mmap: bool = True, features: bool = True) -> dict[str, np.ndarray]:
    """The snapshot's arrays, memory-mapped read-only with ``mmap``. Each is handed out as a plain
    ndarray view of its mapping (which it keeps open): slicing an ``np.memmap`` builds a memmap
    object per slice, several times the cost of an ndarray slice over the same pages, and the
    overlay and the validation of updates slice one neighbour list per op."""
    mode: Literal["r"] | None = "r" if mmap else None
    names = [*ARRAYS, *(n for n in OPTIONAL_ARRAYS if os.path.exists(os.path.join(directory, f"{n}.npy")))]
    if not features:
        names.remove("features")
    return {name: np.asarray(np.load(os.path.join(directory, f"{name}.npy"), mmap_mode=mode)) for name in names}


def save_snapshot(snapshot: GraphSnapshot, labels: dict[str, str] | None = None) -> str:
    """Save to the BentoML model store as ``graph-snapshot:<auto version>``; returns the tag."""
    snapshot.validate()
    with create_entry(
        SNAPSHOT_MODEL_NAME,
        {"task": snapshot.task, "source": snapshot.source[:60], **(labels or {})},
        snapshot.metadata(),
    ) as entry:
        write_arrays(snapshot, entry.path)
    snapshot.tag = entry.tag
    return snapshot.tag


def load_snapshot(
    tag: str = f"{SNAPSHOT_MODEL_NAME}:latest", mmap: bool = True, features: bool = True
) -> GraphSnapshot:
    """Load a snapshot from the model store; arrays are memory-mapped (no copy) by default.
    ``features=False``: the rows stay where they are (the feature cluster); ``AbsentFeatures``
    stands in. A snapshot saved without ``features.npy`` always loads that way."""
    entry = get_entry(tag)
    meta = entry.metadata
    features = features and os.path.exists(os.path.join(entry.path, "features.npy"))
    arrays: dict[str, Any] = read_arrays(entry.path, mmap=mmap, features=features)
    if not features:
        arrays["features"] = AbsentFeatures(int(meta["num_nodes"]), int(meta["feature_dim"]))
    known = {"task", "source"}
    extra = {k: v for k, v in meta.items() if k not in known | DERIVED_METADATA}
    source = meta.get("source", "unknown")
    return GraphSnapshot(
        **arrays,
        task=meta.get("task", "multiclass"),
        source=source,
        tag=entry.tag,
        extra=extra,
        directed=bool(meta.get("directed", _directed_by_origin(source, extra))),
        log_sequence=int(meta.get("log_sequence", 0)),
    )


def _directed_by_origin(source: str, extra: dict[str, Any]) -> bool:
    """For snapshots saved before ``directed`` was recorded: the generator's social graphs are
    undirected, an import is undirected when it was symmetrized."""
    if "symmetrized" in extra:
        return not extra["symmetrized"]
    return not source.startswith("synthetic")
