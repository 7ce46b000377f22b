"""The graph a FeatureRunner worker serves: the memory-mapped snapshot (the base) plus the updates
applied since (the overlay), and the rules a batch of updates must follow against the graph (the
ops and their fields: ``common.graph_ops``, the one definition).

Edges follow the snapshot's convention (``GraphSnapshot.directed``): in an undirected graph an
edge is stored in both endpoints' lists. Ids are the caller's, in ``[0, capacity)``; a node is
*present* from its ``add_node`` (or from the snapshot) until its ``remove_node``.

The overlay keeps, for every node an update touched, its whole neighbour list in the canonical
order: the base list minus removed neighbours (order kept), then added neighbours in order of
addition. A compacted snapshot stores exactly these lists (``materialize``), and the sampler
draws from a list by position, so the same seed gives the same neighbourhood before and after a
compaction. A touched node's list is copied once into the overlay (a hub's too: at update time,
never while sampling), each list in a segment of an arena with room to grow (doubling).

Features: rows set by ``add_node`` / ``set_features`` live in an overlay of rows (the snapshot's
rows are read-only); ``feature_versions`` gives, per node, the sequence of the update that last
set its row, so that a cache (and the feature cluster) can key a row by (node, version) and never
answer an older copy; every worker applies the same log and so names a row alike. Where the rows
live in the feature cluster, ``key_versions`` is that version for any node (a compacted snapshot's
``row_sequence`` for rows no update since has set).

``validate`` checks a whole batch against the current state with the batch's own earlier ops
applied (an ``add_node`` then an ``add_edge`` to it is valid), without changing anything; ``apply``
applies a batch that validated. Both run on the worker's event loop between batches of sampling,
so a prediction sees a batch entirely or not at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from common.graph_ops import BY_NAME, NODE_FIELDS, OP_NAMES, BatchRejected
from runners.feature.sampling import AdjacencyOverlay
from runners.feature.snapshot import AbsentFeatures, GraphSnapshot

MIN_SEGMENT = 4
FLOAT32_MAX = 3.4e38  # a feature value past this does not fit the float32 rows
_NUMBER_TYPES = {int, float}  # exactly: bool is an int subclass and is refused


@dataclasses.dataclass
class OverlayStats:
    nodes: int  # nodes whose neighbour list the overlay holds
    added_nodes: int
    removed_nodes: int
    edges: int  # list entries the overlay holds
    feature_rows: int
    bytes: int


def _grow(a: np.ndarray, size: int, fill: Any = 0) -> np.ndarray:
    """``a`` with room for at least ``size`` entries (doubling), new entries ``fill``."""
    if a.shape[0] >= size:
        return a
    out = np.full((max(size, 2 * a.shape[0]), *a.shape[1:]), fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


class LiveGraph:
    def __init__(self, snapshot: GraphSnapshot, capacity: int = 0) -> None:
        """``capacity``: the largest node id + 1 an update may use (0: twice the snapshot's)."""
        self.base = snapshot
        n = snapshot.num_nodes
        self.capacity = capacity or 2 * n
        if self.capacity < n:
            raise ValueError(f"graph capacity {self.capacity} is below the snapshot's {n} nodes")
        self.directed = snapshot.directed
        self.feature_dim = snapshot.feature_dim
        self._num_classes = snapshot.num_classes  # a scan of the labels: once, not per labelled op
        self.sequence = snapshot.log_sequence  # the last update applied
        self.present = np.zeros(self.capacity, dtype=bool)
        self.present[:n] = snapshot.present_mask()
        # Neighbour lists (allocated at the first topology change: until then sampling reads the
        # base alone, through empty arrays).
        self._offset = np.empty(0, np.int64)
        self._degree = np.empty(0, np.int64)
        self._room = np.empty(0, np.int64)
        self._arena = np.empty(0, snapshot.indices.dtype)
        self._arena_used = 0
        self._reverse: tuple[np.ndarray, np.ndarray] | None = None  # the base's in-edges, built when first needed
        self._added_src = np.empty(0, np.int64)  # list entries added since (src's list holds dst)
        self._added_dst = np.empty(0, np.int64)
        self._added_used = 0
        # Feature rows (allocated at the first feature change).
        self._row_slot = np.empty(0, np.int64)
        self._rows = np.empty((0, self.feature_dim), np.float32)
        self._rows_used = 0
        self._version = np.empty(0, np.int64)
        self.labels: dict[int, Any] = {}  # labels given by add_node (for compaction and training)
        self.added_nodes = 0
        self.removed_nodes = 0

    # -- reading ---------------------------------------------------------------------------------

    @property
    def overlay(self) -> AdjacencyOverlay | None:
        """What the sampler reads beside the base CSR (None before any topology change)."""
        if self._offset.size == 0:
            return None
        return AdjacencyOverlay(self._offset, self._degree, self._arena)

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Which ``ids`` are present nodes (False for ids outside ``[0, capacity)``)."""
        ids = np.asarray(ids, dtype=np.int64)
        ok = (ids >= 0) & (ids < self.capacity)
        out = np.zeros(ids.shape, dtype=bool)
        out[ok] = self.present[ids[ok]]
        return out

    def neighbours(self, v: int) -> np.ndarray:
        """Node ``v``'s neighbour list in canonical order."""
        if v < self._offset.size and self._offset[v] >= 0:
            start = int(self._offset[v])
            return self._arena[start : start + int(self._degree[v])]
        if v < self.base.num_nodes:
            return self.base.indices[self.base.indptr[v] : self.base.indptr[v + 1]]
        return self._arena[:0]

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Feature rows of present ``ids`` (float32, a fresh array): the updated row where there is one."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self._row_slot.size == 0:
            return np.asarray(np.take(self.base.features, ids, axis=0), dtype=np.float32)
        slots = self._row_slot[ids]
        over = slots >= 0
        out = np.empty((ids.size, self.feature_dim), dtype=np.float32)
        if over.any():
            out[over] = self._rows[slots[over]]
        if not over.all():
            out[~over] = np.take(self.base.features, ids[~over], axis=0)
        return out

    def feature_versions(self, ids: np.ndarray) -> np.ndarray | None:
        """The update that last set each id's row since the snapshot, 0 for none (None: no row
        changed at all)."""
        if self._version.size == 0:
            return None
        return self._version[np.asarray(ids, dtype=np.int64)]

    def overlay_rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which ``ids`` have a row set by an update since the snapshot, and those rows."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self._row_slot.size == 0:
            return np.zeros(ids.size, dtype=bool), np.empty((0, self.feature_dim), np.float32)
        slots = self._row_slot[ids]
        over = slots >= 0
        return over, self._rows[slots[over]]

    def key_versions(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row version in the feature cluster: the update that last set it, else the
        snapshot's ``row_sequence`` (0: the row as loaded)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.zeros(ids.size, np.int64)
        base = self.base.row_sequence
        if base is not None:
            inside = ids < base.shape[0]
            out[inside] = base[ids[inside]]
        if self._version.size:
            changed = self._version[ids]
            out = np.where(changed > 0, changed, out)
        return out

    def changed_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every present node whose row an update set since the snapshot: ids, rows, versions."""
        if self._row_slot.size == 0:
            return np.empty(0, np.int64), np.empty((0, self.feature_dim), np.float32), np.empty(0, np.int64)
        ids = np.flatnonzero((self._row_slot >= 0) & self.present)
        return ids, self._rows[self._row_slot[ids]], self._version[ids]

    def stats(self) -> OverlayStats:
        touched = int((self._offset >= 0).sum()) if self._offset.size else 0
        edges = int(self._degree[self._offset >= 0].sum()) if touched else 0
        nbytes = (
            self._offset.nbytes
            + self._degree.nbytes
            + self._room.nbytes
            + self._arena.nbytes
            + self._row_slot.nbytes
            + self._rows.nbytes
            + self._version.nbytes
            + self._added_src.nbytes
            + self._added_dst.nbytes
        )
        return OverlayStats(touched, self.added_nodes, self.removed_nodes, edges, self._rows_used, int(nbytes))

    # -- validating ------------------------------------------------------------------------------

    def validate(self, ops: Sequence[Any]) -> None:
        """Raise ``BatchRejected`` for the first op that cannot be applied after the ones before it."""
        added: set[int] = set()
        removed: set[int] = set()
        fresh: set[int] = set()  # added or removed in this batch: their lists start empty
        edges: dict[tuple[int, int], int] = {}  # copies of an edge after the batch's ops so far

        def present(v: int) -> bool:
            return v not in removed and (v in added or bool(self.present[v]))

        def count(src: int, dst: int) -> int:
            if (src, dst) not in edges:
                fresh_edge = src in fresh or dst in fresh
                edges[src, dst] = 0 if fresh_edge else int(np.count_nonzero(self.neighbours(src) == dst))
            return edges[src, dst]

        def forget(v: int) -> None:
            fresh.add(v)
            for key in [k for k in edges if v in k]:
                edges[key] = 0

        for i, op in enumerate(ops):
            if not isinstance(op, dict) or op.get("op") not in BY_NAME:
                kind = str(op.get("op") if isinstance(op, dict) else op)
                raise BatchRejected(i, kind, "op", f"must be one of {list(OP_NAMES)}")
            kind = op["op"]
            for name in BY_NAME[kind].required:
                if name not in op:
                    raise BatchRejected(i, kind, name, "missing")
            for name in NODE_FIELDS:
                if name in op:
                    v = op[name]
                    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < self.capacity:
                        raise BatchRejected(
                            i, kind, name, f"must be a node id in [0, {self.capacity}) (GSAGE_GRAPH_CAPACITY)"
                        )
            if "features" in op:
                self._check_features(i, kind, op["features"])
            if kind == "add_node":
                v = op["id"]
                if present(v):
                    raise BatchRejected(i, kind, "id", f"node {v} exists already")
                self._check_label(i, op.get("label"))
                added.add(v)
                removed.discard(v)
                forget(v)
            elif kind == "set_features":
                if not present(op["id"]):
                    raise BatchRejected(i, kind, "id", f"node {op['id']} is not in the graph")
            elif kind == "remove_node":
                v = op["id"]
                if not present(v):
                    raise BatchRejected(i, kind, "id", f"node {v} is not in the graph")
                removed.add(v)
                added.discard(v)
                forget(v)
            else:
                src, dst = op["src"], op["dst"]
                for name, v in (("src", src), ("dst", dst)):
                    if not present(v):
                        raise BatchRejected(i, kind, name, f"node {v} is not in the graph")
                if src == dst:
                    raise BatchRejected(i, kind, "dst", "an edge needs two different nodes")
                pairs = [(src, dst)] if self.directed else [(src, dst), (dst, src)]
                if kind == "add_edge":
                    for pair in pairs:
                        edges[pair] = count(*pair) + 1
                elif count(src, dst) <= 0:
                    raise BatchRejected(i, kind, "dst", f"there is no edge {src} -> {dst}")
                else:
                    for pair in pairs:  # every copy of the edge goes
                        count(*pair)
                        edges[pair] = 0

    def _check_features(self, i: int, kind: str, features: Any) -> None:
        if not isinstance(features, (list, tuple)) or len(features) != self.feature_dim:
            got = len(features) if isinstance(features, (list, tuple)) else type(features).__name__
            raise BatchRejected(i, kind, "features", f"must be {self.feature_dim} numbers, got {got}")
        # The common case in one pass over the types and one vectorised range check; the loop
        # below, which names the first bad value, runs only for a batch that is refused.
        if set(map(type, features)) <= _NUMBER_TYPES:
            with contextlib.suppress(OverflowError):  # an int past float64: the loop names it
                values = np.asarray(features, dtype=np.float64)
                if np.isfinite(values).all() and not (np.abs(values) > FLOAT32_MAX).any():
                    return
        for x in features:
            if (
                not isinstance(x, (int, float))
                or isinstance(x, bool)
                or (isinstance(x, float) and not math.isfinite(x))
            ):
                raise BatchRejected(i, kind, "features", f"must be finite numbers, got {x!r}")
            if abs(x) > FLOAT32_MAX:  # an int of any size compares exactly
                raise BatchRejected(i, kind, "features", f"{x!r} does not fit a float32")

    def _check_label(self, i: int, label: Any) -> None:
        if label is None:
            return
        classes = self._num_classes
        if self.base.task == "multilabel":
            ok = isinstance(label, list) and all(
                isinstance(c, int) and not isinstance(c, bool) and 0 <= c < classes for c in label
            )
            want = f"a list of class indices in [0, {classes})"
        else:
            ok = isinstance(label, int) and not isinstance(label, bool) and 0 <= label < classes
            want = f"a class index in [0, {classes})"
        if not ok:
            raise BatchRejected(i, "add_node", "label", f"must be {want}")

    # -- applying --------------------------------------------------------------------------------

    def apply(self, ops: Iterable[dict], sequence: int) -> set[int]:
        """Apply a batch that validated; returns the nodes whose feature row changed."""
        changed: set[int] = set()
        for op in ops:
            kind = op["op"]
            if kind == "add_node":
                v = int(op["id"])
                self.present[v] = True
                self._set_list(v, [])
                self._set_row(v, op["features"], sequence)
                if op.get("label") is not None:
                    self.labels[v] = op["label"]
                self.added_nodes += 1
                changed.add(v)
            elif kind == "set_features":
                self._set_row(int(op["id"]), op["features"], sequence)
                changed.add(int(op["id"]))
            elif kind == "add_edge":
                self._add_edge(int(op["src"]), int(op["dst"]))
            elif kind == "remove_edge":
                self._remove_edge(int(op["src"]), int(op["dst"]))
            elif kind == "remove_node":
                self._remove_node(int(op["id"]))
                changed.add(int(op["id"]))
        self.sequence = sequence
        return changed

    def _add_edge(self, src: int, dst: int) -> None:
        self._append(src, dst)
        if not self.directed:
            self._append(dst, src)

    def _remove_edge(self, src: int, dst: int) -> None:
        self._drop(src, dst)
        if not self.directed:
            self._drop(dst, src)

    def _remove_node(self, v: int) -> None:
        # Every list that holds v: of an undirected graph that is v's neighbours' (and, for a base
        # that is not exactly symmetric, anyone else's with an edge to v).
        for u in self._in_neighbours(v):
            self._drop(u, v)
        self._set_list(v, [])
        self.present[v] = False
        self.labels.pop(v, None)
        self.removed_nodes += 1

    def _in_neighbours(self, v: int) -> list[int]:
        """Nodes whose list holds ``v``: the base's reverse CSR (built at the first remove_node)
        plus the list entries added since; lists that no longer hold ``v`` are skipped."""
        if self._reverse is None:
            b = self.base
            src = np.repeat(np.arange(b.num_nodes, dtype=np.int64), np.diff(b.indptr))
            order = np.argsort(b.indices, kind="stable")
            counts = np.bincount(b.indices, minlength=b.num_nodes)
            self._reverse = (np.concatenate([[0], np.cumsum(counts)]), src[order])
        indptr, sources = self._reverse
        base = sources[indptr[v] : indptr[v + 1]] if v < self.base.num_nodes else sources[:0]
        added = self._added_src[: self._added_used][self._added_dst[: self._added_used] == v]
        return [
            u for u in np.unique(np.concatenate([base, added])).tolist() if u != v and np.any(self.neighbours(u) == v)
        ]

    # -- neighbour list storage ------------------------------------------------------------------

    def _ensure_lists(self) -> None:
        if self._offset.size == 0:
            self._offset = np.full(self.capacity, -1, np.int64)
            self._degree = np.zeros(self.capacity, np.int64)
            self._room = np.zeros(self.capacity, np.int64)
            self._arena = np.empty(1024, self.base.indices.dtype)

    def _segment(self, size: int) -> int:
        """A free segment of ``size`` entries at the arena's end; returns its offset."""
        start = self._arena_used
        self._arena = _grow(self._arena, start + size)
        self._arena_used = start + size
        return start

    def _set_list(self, v: int, values: Sequence[int] | np.ndarray) -> None:
        self._ensure_lists()
        values = np.asarray(values, dtype=self._arena.dtype)
        if self._offset[v] < 0 or self._room[v] < values.size:
            room = max(MIN_SEGMENT, 2 * values.size)
            self._offset[v], self._room[v] = self._segment(room), room
        start = int(self._offset[v])
        self._arena[start : start + values.size] = values
        self._degree[v] = values.size

    def _append(self, v: int, u: int) -> None:
        self._ensure_lists()
        if self._offset[v] < 0:
            self._set_list(v, np.array(self.neighbours(v)))  # copied once, then owned by the overlay
        deg = int(self._degree[v])
        if deg == self._room[v]:  # full: the list moves to a segment twice the size
            current = self.neighbours(v).copy()
            room = max(MIN_SEGMENT, 2 * deg)
            self._offset[v], self._room[v] = self._segment(room), room
            self._arena[int(self._offset[v]) : int(self._offset[v]) + deg] = current
        self._arena[int(self._offset[v]) + deg] = u
        self._degree[v] = deg + 1
        k = self._added_used
        self._added_src, self._added_dst = _grow(self._added_src, k + 1), _grow(self._added_dst, k + 1)
        self._added_src[k], self._added_dst[k] = v, u
        self._added_used = k + 1

    def _drop(self, v: int, u: int) -> None:
        current = self.neighbours(v)
        if not np.any(current == u):
            return
        self._set_list(v, current[current != u].copy())

    # -- feature row storage ---------------------------------------------------------------------

    def _set_row(self, v: int, features: Sequence[float], sequence: int) -> None:
        if self._row_slot.size == 0:
            self._row_slot = np.full(self.capacity, -1, np.int64)
            self._version = np.zeros(self.capacity, np.int64)
        slot = int(self._row_slot[v])
        if slot < 0:
            slot = self._rows_used
            self._rows = _grow(self._rows, slot + 1)
            self._rows_used += 1
            self._row_slot[v] = slot
        self._rows[slot] = np.asarray(features, dtype=np.float32)
        self._version[v] = sequence

    # -- compaction ------------------------------------------------------------------------------

    def materialize(self) -> GraphSnapshot:
        """The graph as a snapshot of its own (arrays in memory): what a compaction saves. Node ids
        stay; the id range ends after the largest present node."""
        present_ids = np.flatnonzero(self.present)
        n = int(present_ids[-1]) + 1 if present_ids.size else 0
        n = max(n, self.base.num_nodes)
        degrees = np.zeros(n, np.int64)
        touched = np.flatnonzero(self._offset[:n] >= 0) if self._offset.size else np.empty(0, np.int64)
        base_n = self.base.num_nodes
        degrees[:base_n] = np.diff(self.base.indptr)
        if touched.size:
            degrees[touched] = self._degree[touched]
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(degrees, out=indptr[1:])
        indices = np.empty(int(indptr[-1]), self.base.indices.dtype)
        untouched = np.zeros(n, dtype=bool)
        untouched[:base_n] = True
        untouched[touched] = False
        # The base's lists that no update touched, in one vectorised copy.
        keep = np.repeat(untouched[:base_n], np.diff(self.base.indptr))
        dest = np.zeros(indices.size, dtype=bool)
        dest[: indptr[base_n]] = np.repeat(untouched[:base_n], degrees[:base_n])
        indices[dest] = self.base.indices[keep]
        for v in touched.tolist():
            indices[indptr[v] : indptr[v + 1]] = self.neighbours(v)
        present_ids = present_ids[present_ids < n]
        extra = dict(self.base.extra)
        row_sequence = None
        features: np.ndarray | AbsentFeatures
        if self.base.features_here:
            features = np.zeros((n, self.feature_dim), np.float32)
            features[present_ids] = self.rows(present_ids)
        else:  # the rows stay in the feature cluster, keyed by the version each one has now
            features = AbsentFeatures(n, self.feature_dim)
            row_sequence = self.key_versions(np.arange(n, dtype=np.int64))
            extra["feature_set"] = self.base.feature_set
        labels = self._labels(n)
        present = self.present[:n].copy()
        splits = {s: getattr(self.base, s)[present[getattr(self.base, s)]] for s in ("train", "val", "test")}
        return GraphSnapshot(
            indptr,
            indices,
            features,
            labels,
            splits["train"],
            splits["val"],
            splits["test"],
            task=self.base.task,
            source=self.base.source,
            directed=self.directed,
            present=None if present.all() else present,
            log_sequence=self.sequence,
            extra=extra,
            row_sequence=row_sequence,
        )

    def _labels(self, n: int) -> np.ndarray:
        base = np.asarray(self.base.labels)
        if self.base.task == "multilabel":
            out = np.zeros((n, base.shape[1]), dtype=base.dtype)
            out[: base.shape[0]] = base
            for v, classes in self.labels.items():
                if v < n:
                    out[v] = 0
                    out[v, classes] = 1
        else:
            out = np.full(n, -1, dtype=base.dtype)  # -1: no label (a node added without one)
            out[: base.shape[0]] = base
            for v, label in self.labels.items():
                if v < n:
                    out[v] = label
        return out
