"""Import a user's own graph (edge list, node features, optional labels and splits) as a snapshot.

Inputs (the format is chosen by the file extension):

- Edges: ``.csv`` with a header and columns ``src,dst``; ``.parquet`` with columns ``src``,
  ``dst``; or ``.npy``, an integer array of shape ``[E, 2]``. A row ``src,dst`` makes ``dst`` a
  neighbour of ``src``: it lands in CSR row ``src`` (``indices[indptr[src]:indptr[src+1]]``), so
  it is ``dst``'s features that get aggregated into ``src``. Pass ``symmetrize=True`` for an
  undirected graph given one direction per pair. Self-loops and duplicate edges are dropped
  (GraphSAGE adds the node's own features separately) and counted in ``extra``.
- Features: ``.npy`` ``[N, F]`` numeric array, or ``.parquet`` with either one list (or
  fixed-size list) column named ``features`` or numeric feature columns (every column but an
  optional ``node_id``). With ``node_id`` the rows are reordered by it and must cover ``0..N-1``
  exactly once. Always cast to float32; NaN or infinite values are rejected.
- Labels (optional): ``.npy`` ``[N]`` integer class ids (multiclass) or ``[N, C]`` 0/1
  (multilabel); or ``.csv``/``.parquet`` with columns ``node_id,label``. For multiclass every
  node appears exactly once; for multilabel the table is long format, one row per (node,
  positive label), and nodes without a row have no positive label. Without labels every node
  gets class 0 of 1: such a snapshot can be served (embeddings, scores of a model trained
  elsewhere) but not trained meaningfully (``extra["labels_placeholder"]`` is True).
- Splits (optional): ``.npz`` with arrays ``train``, ``val``, ``test`` of node ids, or
  ``.csv``/``.parquet`` with columns ``node_id,split`` (``split`` in train/val/test; unlisted
  nodes are in no split). Without a splits file, a seeded random split of all nodes.

N is ``num_nodes`` if given, else the number of feature rows (the two must agree). Any problem
with a file raises :class:`GraphImportError` naming the file and the problem.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from runners.feature.snapshot import TASKS, GraphSnapshot

SPLITS = ("train", "val", "test")
_TABLE_EXTS = (".csv", ".parquet", ".pq")
_MAX_NODES = np.iinfo(np.int32).max  # CSR indices are int32
_CHUNK_ROWS = 262_144  # bounds the temporary of the NaN scan over large feature matrices


class GraphImportError(ValueError):
    """A user-supplied graph file is missing, unreadable or inconsistent."""

    def __init__(self, role: str, path: str, problem: str) -> None:
        super().__init__(f"{role} file {path}: {problem}")
        self.role, self.path, self.problem = role, path, problem


def import_graph(
    edges: str,
    features: str,
    labels: str | None = None,
    splits: str | None = None,
    *,
    num_nodes: int | None = None,
    task: str = "multiclass",
    symmetrize: bool = False,
    split_seed: int = 0,
    train_fraction: float = 0.6,
    val_fraction: float = 0.2,
) -> GraphSnapshot:
    """Read the files, check them against each other and build a validated :class:`GraphSnapshot`."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if labels is None and task == "multilabel":
        raise ValueError("task='multilabel' needs a labels file; without one labels are a single class")
    if not (train_fraction >= 0.0 and val_fraction >= 0.0 and train_fraction + val_fraction <= 1.0):
        raise ValueError("train_fraction and val_fraction must be >= 0 and sum to at most 1")

    feats = read_features(features)
    n = feats.shape[0] if num_nodes is None else int(num_nodes)
    if feats.shape[0] != n:
        raise GraphImportError("features", features, f"has {feats.shape[0]} rows but num_nodes={n}")
    if n < 1 or n > _MAX_NODES:
        raise GraphImportError("features", features, f"node count {n} must be in [1, {_MAX_NODES}]")

    src, dst = read_edges(edges, n)
    indptr, indices, counts = build_csr(src, dst, n, symmetrize=symmetrize)

    if labels is None:
        label_array = np.zeros(n, dtype=np.int64)
    else:
        label_array = read_labels(labels, n, task)

    if splits is None:
        train, val, test = random_split(n, split_seed, train_fraction, val_fraction)
        split_origin = f"random(seed={split_seed}, train={train_fraction}, val={val_fraction})"
    else:
        train, val, test = read_splits(splits, n)
        split_origin = "file"

    inputs = {"edges": os.path.basename(edges), "features": os.path.basename(features)}
    if labels is not None:
        inputs["labels"] = os.path.basename(labels)
    if splits is not None:
        inputs["splits"] = os.path.basename(splits)
    snapshot = GraphSnapshot(
        indptr=indptr,
        indices=indices,
        features=feats,
        labels=label_array,
        train=train,
        val=val,
        test=test,
        task=task,
        source=f"import(edges={inputs['edges']})",
        directed=not symmetrize,
        extra={
            "input_files": inputs,
            "symmetrized": bool(symmetrize),
            **counts,
            "labels_placeholder": labels is None,
            "split_origin": split_origin,
        },
    )
    snapshot.validate()
    return snapshot


# --- edges -------------------------------------------------------------------------------------


def read_edges(path: str, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` as int64, checked to lie in ``[0, num_nodes)``."""
    ext = _extension("edges", path, (".csv", ".parquet", ".pq", ".npy"))
    if ext == ".npy":
        arr = _load_npy("edges", path)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise GraphImportError("edges", path, f"expected an array of shape [E, 2], got {arr.shape}")
        _require_integer("edges", path, "edge array", arr.dtype)
        src, dst = arr[:, 0], arr[:, 1]
    else:
        table = _read_table("edges", path, ("src", "dst"))
        src = _int_column("edges", path, table, "src")
        dst = _int_column("edges", path, table, "dst")
    for name, ids in (("src", src), ("dst", dst)):
        _check_range("edges", path, f"{name} node ids", ids, num_nodes)
    # Range-checked first, so unsigned or narrow ids convert to int64 without wrapping.
    return src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)


def build_csr(
    src: np.ndarray, dst: np.ndarray, num_nodes: int, *, symmetrize: bool = False
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """CSR (indptr int64, indices int32) with rows sorted by neighbour id.

    Self-loops are dropped before symmetrizing (so each counts once); duplicates are dropped after
    it, so ``duplicate_edges_dropped`` includes reverse edges that the file already held.
    """
    edges_in_file = int(src.shape[0])
    loops = src == dst
    self_loops = int(loops.sum())
    if self_loops:
        src, dst = src[~loops], dst[~loops]
    if symmetrize:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    # One int64 key per edge (N < 2^31, so N^2 fits): a single sort orders by src then dst, and
    # duplicates end up adjacent.
    keys = src * np.int64(num_nodes) + dst
    keys.sort()
    if keys.size:
        keep = np.empty(keys.size, dtype=bool)
        keep[0] = True
        np.not_equal(keys[1:], keys[:-1], out=keep[1:])
        total = keys.size
        keys = keys[keep]
        duplicates = total - int(keys.size)
    else:
        duplicates = 0
    rows = keys // num_nodes
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=num_nodes), out=indptr[1:])
    indices = (keys - rows * num_nodes).astype(np.int32)
    counts = {
        "edges_in_file": edges_in_file,
        "self_loops_dropped": self_loops,
        "duplicate_edges_dropped": duplicates,
    }
    return indptr, indices, counts


# --- features ----------------------------------------------------------------------------------


def read_features(path: str) -> np.ndarray:
    """``[N, F]`` float32, C-contiguous, all finite."""
    ext = _extension("features", path, (".npy", ".parquet", ".pq"))
    if ext == ".npy":
        arr = _load_npy("features", path)
        if arr.ndim != 2:
            raise GraphImportError("features", path, f"expected a 2-D array [N, F], got shape {arr.shape}")
        if arr.dtype.kind not in "biuf":
            raise GraphImportError("features", path, f"expected a numeric array, got dtype {arr.dtype}")
        feats = np.ascontiguousarray(arr, dtype=np.float32)
    else:
        feats = _features_from_parquet(path)
    if feats.shape[1] < 1:
        raise GraphImportError("features", path, "has no feature columns (F = 0)")
    _check_finite(path, feats)
    return feats


def _features_from_parquet(path: str) -> np.ndarray:
    table = _read_table("features", path, ())
    names = table.column_names
    if "features" in names and _is_list(table.schema.field("features").type):
        feats = _list_column_matrix(path, table.column("features"))
    else:
        columns = [c for c in names if c != "node_id"]
        bad = [c for c in columns if not _is_numeric(table.schema.field(c).type)]
        if bad:
            raise GraphImportError(
                "features",
                path,
                f"non-numeric feature columns {bad}; expected a list column 'features' or numeric columns",
            )
        if not columns:
            raise GraphImportError("features", path, "has no feature columns")
        feats = np.empty((table.num_rows, len(columns)), dtype=np.float32)
        for j, name in enumerate(columns):
            # zero_copy_only=False turns nulls into NaN, which the finiteness check then reports.
            feats[:, j] = table.column(name).to_numpy(zero_copy_only=False)
    if "node_id" in names:
        ids = _int_column("features", path, table, "node_id")
        ordered = np.empty_like(feats)
        ordered[_permutation("features", path, ids, table.num_rows)] = feats  # row i is node ids[i]
        feats = ordered
    return feats


def _list_column_matrix(path: str, column: pa.ChunkedArray) -> np.ndarray:
    arr = column.combine_chunks()
    if arr.null_count:
        raise GraphImportError("features", path, f"column 'features' has {arr.null_count} null rows")
    if not _is_numeric(arr.type.value_type):
        raise GraphImportError("features", path, f"column 'features' holds {arr.type.value_type}, expected numbers")
    n = len(arr)
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    if n and (lengths != lengths[0]).any():
        row = int(np.argmax(lengths != lengths[0]))
        raise GraphImportError(
            "features",
            path,
            f"column 'features' has rows of different lengths ({lengths[0]} vs {lengths[row]} in row {row})",
        )
    width = int(lengths[0]) if n else 0
    values = arr.flatten().to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(values, dtype=np.float32).reshape(n, width)


def _check_finite(path: str, feats: np.ndarray) -> None:
    bad_total, first_row = 0, -1
    for lo in range(0, feats.shape[0], _CHUNK_ROWS):
        bad_rows = ~np.isfinite(feats[lo : lo + _CHUNK_ROWS])
        count = int(bad_rows.sum())
        if count and first_row < 0:
            first_row = lo + int(np.argmax(bad_rows.any(axis=1)))
        bad_total += count
    if bad_total:
        raise GraphImportError("features", path, f"{bad_total} NaN or infinite values (first in row {first_row})")


# --- labels ------------------------------------------------------------------------------------


def read_labels(path: str, num_nodes: int, task: str) -> np.ndarray:
    """int64 ``[N]`` for multiclass, uint8 ``[N, C]`` for multilabel."""
    ext = _extension("labels", path, (".npy",) + _TABLE_EXTS)
    if ext == ".npy":
        return _labels_from_npy(path, _load_npy("labels", path), num_nodes, task)
    table = _read_table("labels", path, ("node_id", "label"))
    ids = _int_column("labels", path, table, "node_id")
    values = _int_column("labels", path, table, "label")
    _check_range("labels", path, "node_id values", ids, num_nodes)
    if values.size and values.min() < 0:
        raise GraphImportError("labels", path, f"labels must be >= 0, found min {values.min()}")
    if task == "multiclass":
        order = _permutation("labels", path, ids, num_nodes)
        out = np.empty(num_nodes, dtype=np.int64)
        out[order] = values
        return out
    # Long format: one row per (node, positive label).
    num_classes = int(values.max()) + 1 if values.size else 1
    out = np.zeros((num_nodes, num_classes), dtype=np.uint8)
    out[ids.astype(np.int64), values.astype(np.int64)] = 1
    return out


def _labels_from_npy(path: str, arr: np.ndarray, num_nodes: int, task: str) -> np.ndarray:
    expected_ndim = 1 if task == "multiclass" else 2
    if arr.ndim != expected_ndim:
        shape = "[N]" if task == "multiclass" else "[N, C]"
        raise GraphImportError("labels", path, f"{task} labels must have shape {shape}, got {arr.shape}")
    if arr.shape[0] != num_nodes:
        raise GraphImportError("labels", path, f"has {arr.shape[0]} rows but the graph has N={num_nodes} nodes")
    if task == "multiclass":
        _require_integer("labels", path, "labels", arr.dtype)
        if arr.size and arr.min() < 0:
            raise GraphImportError("labels", path, f"class ids must be >= 0, found min {arr.min()}")
        return arr.astype(np.int64)
    if arr.dtype.kind not in "biuf" or not np.isin(arr, (0, 1)).all():
        raise GraphImportError("labels", path, "multilabel labels must hold only 0 and 1")
    return arr.astype(np.uint8)


# --- splits ------------------------------------------------------------------------------------


def read_splits(path: str, num_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted int64 node ids of train, val and test; a node may be in at most one split."""
    ext = _extension("splits", path, (".npz",) + _TABLE_EXTS)
    if ext == ".npz":
        parts = _splits_from_npz(path)
    else:
        parts = _splits_from_table(path)
    for name, ids in zip(SPLITS, parts):
        _check_range("splits", path, f"{name} node ids", ids, num_nodes)
    out = tuple(np.sort(ids.astype(np.int64)) for ids in parts)
    everything = np.sort(np.concatenate(out))
    repeated = everything[1:][everything[1:] == everything[:-1]]
    if repeated.size:
        raise GraphImportError(
            "splits", path, f"{repeated.size} node ids are listed more than once (first: {repeated[0]})"
        )
    return out  # type: ignore[return-value]


def _splits_from_npz(path: str) -> list[np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError) as exc:
        raise GraphImportError("splits", path, f"cannot read .npz: {exc}") from exc
    missing = [s for s in SPLITS if s not in arrays]
    if missing:
        raise GraphImportError("splits", path, f"missing arrays {missing} (has {sorted(arrays)})")
    parts = [arrays[s] for s in SPLITS]
    for name, ids in zip(SPLITS, parts):
        if ids.ndim != 1:
            raise GraphImportError("splits", path, f"array {name!r} must be 1-D, got shape {ids.shape}")
        _require_integer("splits", path, f"array {name!r}", ids.dtype)
    return parts


def _splits_from_table(path: str) -> list[np.ndarray]:
    table = _read_table("splits", path, ("node_id", "split"))
    ids = _int_column("splits", path, table, "node_id")
    column = table.column("split")
    if pa.types.is_dictionary(column.type):
        column = column.cast(pa.string())
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise GraphImportError("splits", path, f"column 'split' must hold strings, found {column.type}")
    if column.null_count:
        raise GraphImportError("splits", path, f"column 'split' has {column.null_count} missing values")
    known = pc.is_in(column, value_set=pa.array(SPLITS))
    unknown = pc.unique(pc.filter(column, pc.invert(known))).to_pylist()
    if unknown:
        raise GraphImportError(
            "splits", path, f"unknown split names {sorted(unknown)[:5]}; expected one of {list(SPLITS)}"
        )
    return [ids[pc.equal(column, s).to_numpy(zero_copy_only=False)] for s in SPLITS]


def random_split(
    num_nodes: int, seed: int, train_fraction: float, val_fraction: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    perm = np.random.default_rng(seed).permutation(num_nodes)
    a = int(num_nodes * train_fraction)
    b = a + int(num_nodes * val_fraction)
    return np.sort(perm[:a]), np.sort(perm[a:b]), np.sort(perm[b:])


# --- shared readers and checks -----------------------------------------------------------------


def _extension(role: str, path: str, allowed: tuple[str, ...]) -> str:
    if not os.path.isfile(path):
        raise GraphImportError(role, path, "file not found")
    ext = os.path.splitext(path)[1].lower()
    if ext not in allowed:
        raise GraphImportError(role, path, f"unsupported extension {ext!r} (expected one of {', '.join(allowed)})")
    return ext


def _load_npy(role: str, path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise GraphImportError(role, path, f"cannot read .npy: {exc}") from exc


def _read_table(role: str, path: str, required: Sequence[str]) -> pa.Table:
    try:
        if path.lower().endswith(".csv"):
            table = pa_csv.read_csv(path)
        else:
            table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise GraphImportError(role, path, f"cannot read: {exc}") from exc
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise GraphImportError(role, path, f"missing columns {missing} (found {table.column_names})")
    return table


def _int_column(role: str, path: str, table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name)
    if not pa.types.is_integer(column.type):
        raise GraphImportError(role, path, f"column {name!r} must hold integer ids, found {column.type}")
    if column.null_count:
        raise GraphImportError(role, path, f"column {name!r} has {column.null_count} missing values")
    return column.to_numpy()


def _require_integer(role: str, path: str, what: str, dtype: np.dtype) -> None:
    if dtype.kind not in "iu":
        raise GraphImportError(role, path, f"{what} must hold integers, found dtype {dtype}")


def _check_range(role: str, path: str, what: str, ids: np.ndarray, num_nodes: int) -> None:
    if not ids.size:
        return
    lo, hi = ids.min(), ids.max()
    if lo < 0 or hi >= num_nodes:
        raise GraphImportError(
            role, path, f"{what} out of range: min {lo}, max {hi}, but node ids must be in [0, N={num_nodes})"
        )


def _permutation(role: str, path: str, ids: np.ndarray, num_nodes: int) -> np.ndarray:
    """Checks that ``ids`` lists each of ``0..num_nodes-1`` exactly once; returns them as int64."""
    _check_range(role, path, "node_id values", ids, num_nodes)
    ids = ids.astype(np.int64, copy=False)
    seen = np.bincount(ids, minlength=num_nodes)
    if (seen > 1).any():
        first = int(np.argmax(seen > 1))
        raise GraphImportError(role, path, f"duplicate node_id values ({int((seen > 1).sum())} ids, first: {first})")
    if ids.size != num_nodes:
        first = int(np.argmax(seen == 0))
        raise GraphImportError(role, path, f"covers {ids.size} of N={num_nodes} nodes (first missing node_id: {first})")
    return ids


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


# --- command line ------------------------------------------------------------------------------


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Adds the import flags to ``parser`` (e.g. a subcommand's) or to a new parser."""
    parser = parser or argparse.ArgumentParser(
        prog="graph-import", description="Import an edge list and node features as a graph snapshot."
    )
    parser.add_argument("--edges", required=True, help="edge list: .csv (src,dst), .parquet or .npy [E,2]")
    parser.add_argument("--features", required=True, help="node features: .npy [N,F] or .parquet")
    parser.add_argument("--labels", help="labels: .npy, or .csv/.parquet with node_id,label")
    parser.add_argument("--splits", help="splits: .npz (train,val,test) or .csv/.parquet with node_id,split")
    parser.add_argument("--num-nodes", type=int, help="node count N (default: feature rows)")
    parser.add_argument("--task", choices=TASKS, default="multiclass")
    parser.add_argument("--symmetrize", action="store_true", help="add the reverse of every edge")
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the random split (no --splits)")
    parser.add_argument("--train-fraction", type=float, default=0.6)
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument("--save", action="store_true", help="save to the BentoML model store")
    return parser


def run(args: argparse.Namespace) -> int:
    """Runs an import from parsed flags; returns the exit code."""
    try:
        snapshot = import_graph(
            args.edges,
            args.features,
            args.labels,
            args.splits,
            num_nodes=args.num_nodes,
            task=args.task,
            symmetrize=args.symmetrize,
            split_seed=args.split_seed,
            train_fraction=args.train_fraction,
            val_fraction=args.val_fraction,
        )
    except ValueError as exc:  # GraphImportError included
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(snapshot.metadata(), indent=2))
    if args.save:
        from runners.feature.snapshot import save_snapshot

        print(f"saved {save_snapshot(snapshot)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
