"""training_export.importer: user graph files -> GraphSnapshot."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training_export.importer import GraphImportError, import_graph, main

N, F = 6, 3
# Row 3 is a self-loop, row 4 repeats row 0; rows are deliberately unsorted.
EDGES = np.array([[0, 2], [5, 3], [2, 0], [1, 1], [0, 2], [0, 1], [4, 5]], dtype=np.int64)
# Expected CSR: row src holds dst, sorted; self-loop and duplicate gone.
INDPTR = np.array([0, 2, 2, 3, 3, 4, 5])
INDICES = np.array([1, 2, 0, 5, 3])
FEATURES = np.arange(N * F, dtype=np.float32).reshape(N, F) / 10


def write_csv(path, header: str, rows) -> str:
    with open(path, "w") as f:
        f.write(header + "\n")
        f.writelines(",".join(str(v) for v in row) + "\n" for row in rows)
    return str(path)


def write_parquet(path, columns: dict) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


def write_npy(path, arr) -> str:
    np.save(path, arr)
    return str(path)


@pytest.fixture
def files(tmp_path):
    """Default edge (.csv) and feature (.npy) files of the small graph."""
    return {
        "edges": write_csv(tmp_path / "edges.csv", "src,dst", EDGES),
        "features": write_npy(tmp_path / "feats.npy", FEATURES),
    }


# --- happy paths -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "parquet", "npy"])
def test_edge_formats_build_the_same_csr(tmp_path, files, fmt):
    edges = {
        "csv": lambda: files["edges"],
        "parquet": lambda: write_parquet(tmp_path / "e.parquet", {"src": EDGES[:, 0], "dst": EDGES[:, 1]}),
        "npy": lambda: write_npy(tmp_path / "e.npy", EDGES.astype(np.int32)),
    }[fmt]()
    snap = import_graph(edges, files["features"])
    assert snap.indptr.dtype == np.int64 and snap.indices.dtype == np.int32
    np.testing.assert_array_equal(snap.indptr, INDPTR)
    np.testing.assert_array_equal(snap.indices, INDICES)
    np.testing.assert_array_equal(snap.features, FEATURES)
    assert snap.features.dtype == np.float32
    assert snap.source == f"import(edges={os.path.basename(edges)})"
    assert snap.extra["edges_in_file"] == 7
    assert snap.extra["self_loops_dropped"] == 1
    assert snap.extra["duplicate_edges_dropped"] == 1
    assert snap.extra["input_files"] == {"edges": os.path.basename(edges), "features": "feats.npy"}


def test_without_labels_and_splits_gives_placeholder_labels_and_seeded_split(files):
    snap = import_graph(files["edges"], files["features"], split_seed=3)
    assert snap.task == "multiclass" and snap.num_classes == 1
    np.testing.assert_array_equal(snap.labels, np.zeros(N, dtype=np.int64))
    assert snap.extra["labels_placeholder"] is True
    parts = [snap.train, snap.val, snap.test]
    assert [p.size for p in parts] == [3, 1, 2]
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(N))
    again = import_graph(files["edges"], files["features"], split_seed=3)
    np.testing.assert_array_equal(again.train, snap.train)


def test_symmetrize_adds_reverse_edges_and_counts_existing_ones_as_duplicates(files):
    snap = import_graph(files["edges"], files["features"], symmetrize=True)
    rows = np.repeat(np.arange(N), np.diff(snap.indptr))
    pairs = set(zip(rows.tolist(), snap.indices.tolist()))
    assert pairs == {(0, 1), (1, 0), (0, 2), (2, 0), (4, 5), (5, 4), (5, 3), (3, 5)}
    assert snap.num_edges == 8
    # 6 non-loop rows doubled = 12; 8 distinct, so 4 dropped (the repeat twice, 0->2/2->0 twice).
    assert snap.extra["duplicate_edges_dropped"] == 4
    assert snap.extra["symmetrized"] is True


def test_parquet_features_list_column(tmp_path, files):
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(FEATURES.ravel()), F)
    path = write_parquet(tmp_path / "f.parquet", {"features": fixed})
    np.testing.assert_array_equal(import_graph(files["edges"], path).features, FEATURES)
    variable_list = write_parquet(tmp_path / "g.parquet", {"features": pa.array(FEATURES.astype(np.float64).tolist())})
    np.testing.assert_array_equal(import_graph(files["edges"], variable_list).features, FEATURES)


def test_parquet_features_numeric_columns_ordered_by_node_id(tmp_path, files):
    order = np.array([3, 0, 5, 1, 4, 2])
    cols = {"node_id": order, **{f"f{j}": FEATURES[order, j].astype(np.float64) for j in range(F)}}
    cols["f1"] = (FEATURES[order, 1] * 10).astype(np.int64)  # an int column is cast too
    snap = import_graph(files["edges"], write_parquet(tmp_path / "f.parquet", cols))
    expected = FEATURES.copy()
    expected[:, 1] = (FEATURES[:, 1] * 10).astype(np.int64)
    np.testing.assert_array_equal(snap.features, expected)
    assert snap.features.dtype == np.float32


def test_labels_files(tmp_path, files):
    labels = np.array([2, 0, 1, 2, 0, 1])
    from_npy = import_graph(files["edges"], files["features"], write_npy(tmp_path / "l.npy", labels))
    np.testing.assert_array_equal(from_npy.labels, labels)
    assert from_npy.labels.dtype == np.int64 and from_npy.extra["labels_placeholder"] is False
    order = np.array([5, 1, 3, 0, 2, 4])
    csv = write_csv(tmp_path / "l.csv", "node_id,label", zip(order, labels[order]))
    np.testing.assert_array_equal(import_graph(files["edges"], files["features"], csv).labels, labels)


def test_multilabel_labels_npy_and_long_table(tmp_path, files):
    dense = np.array([[1, 0, 0], [0, 0, 0], [1, 1, 0], [0, 0, 1], [0, 1, 0], [1, 0, 1]], dtype=np.int64)
    npy = write_npy(tmp_path / "l.npy", dense)
    snap = import_graph(files["edges"], files["features"], npy, task="multilabel")
    assert snap.labels.dtype == np.uint8 and snap.num_classes == 3
    np.testing.assert_array_equal(snap.labels, dense)
    nodes, classes = np.nonzero(dense)
    table = write_parquet(tmp_path / "l.parquet", {"node_id": nodes, "label": classes})
    np.testing.assert_array_equal(
        import_graph(files["edges"], files["features"], table, task="multilabel").labels, dense
    )


def test_splits_files(tmp_path, files):
    npz = tmp_path / "s.npz"
    np.savez(npz, train=np.array([4, 0, 1]), val=np.array([2]), test=np.array([5]))
    snap = import_graph(files["edges"], files["features"], splits=str(npz))
    assert (snap.train.tolist(), snap.val.tolist(), snap.test.tolist()) == ([0, 1, 4], [2], [5])
    assert snap.extra["split_origin"] == "file" and snap.extra["input_files"]["splits"] == "s.npz"
    rows = [(0, "train"), (3, "test"), (1, "val"), (2, "train")]
    csv = write_csv(tmp_path / "s.csv", "node_id,split", rows)
    snap = import_graph(files["edges"], files["features"], splits=csv)
    assert (snap.train.tolist(), snap.val.tolist(), snap.test.tolist()) == ([0, 2], [1], [3])
    assert snap.train.dtype == np.int64


def test_round_trip_through_the_model_store(tmp_path, files, model_store):
    from runners.feature.snapshot import load_snapshot, save_snapshot

    labels = write_npy(tmp_path / "l.npy", np.array([2, 0, 1, 2, 0, 1]))
    snap = import_graph(files["edges"], files["features"], labels)
    tag = save_snapshot(snap)
    assert os.listdir(os.path.join(model_store, "models", "graph-snapshot"))  # stored in the tmp home
    loaded = load_snapshot(tag)
    assert loaded.tag == tag and loaded.source == snap.source
    assert loaded.extra["self_loops_dropped"] == 1
    for name in ("indptr", "indices", "features", "labels", "train", "val", "test"):
        arr = getattr(loaded, name)
        # memory-mapped (read-only, on the file's pages), handed out as a plain ndarray view
        assert isinstance(arr.base, np.memmap) and not arr.flags.writeable, name
        assert arr.dtype == getattr(snap, name).dtype, name
        np.testing.assert_array_equal(arr, getattr(snap, name))


def test_cli_prints_summary_and_saves(files, model_store, capsys):
    assert main(["--edges", files["edges"], "--features", files["features"], "--symmetrize", "--save"]) == 0
    out = capsys.readouterr().out
    assert '"num_edges": 8' in out and "saved graph-snapshot:" in out
    assert main(["--edges", files["edges"] + ".missing", "--features", files["features"]]) == 2
    assert "file not found" in capsys.readouterr().err


# --- bad files ---------------------------------------------------------------------------------


def _bad(tmp_path, files, case):
    """Returns (import_graph kwargs, offending file name, expected problem text)."""
    t = tmp_path
    cases = {
        "missing file": lambda: ({"edges": str(t / "nope.csv")}, "nope.csv", "file not found"),
        "unknown extension": lambda: (
            {"edges": write_csv(t / "e.txt", "src,dst", [[0, 1]])},
            "e.txt",
            "unsupported extension '.txt'",
        ),
        "missing column": lambda: (
            {"edges": write_csv(t / "e.csv", "src,target", [[0, 1]])},
            "e.csv",
            "missing columns ['dst']",
        ),
        "non-integer ids": lambda: (
            {"edges": write_csv(t / "e.csv", "src,dst", [[0, 1.5]])},
            "e.csv",
            "'dst' must hold integer ids",
        ),
        "id above range": lambda: (
            {"edges": write_csv(t / "e.csv", "src,dst", [[0, 1], [9, 2]])},
            "e.csv",
            "max 9, but node ids must be in [0, N=6)",
        ),
        "negative id": lambda: ({"edges": write_npy(t / "e.npy", np.array([[0, -1]]))}, "e.npy", "min -1"),
        "edge npy shape": lambda: (
            {"edges": write_npy(t / "e.npy", np.zeros((2, 3), np.int64))},
            "e.npy",
            "shape [E, 2], got (2, 3)",
        ),
        "float edge npy": lambda: (
            {"edges": write_npy(t / "e.npy", np.zeros((2, 2)))},
            "e.npy",
            "must hold integers, found dtype float64",
        ),
        "features not 2-D": lambda: (
            {"features": write_npy(t / "f.npy", np.zeros(N, np.float32))},
            "f.npy",
            "2-D array",
        ),
        "features rows vs num_nodes": lambda: ({"num_nodes": 7}, "feats.npy", "has 6 rows but num_nodes=7"),
        "nan features": lambda: (
            {"features": write_npy(t / "f.npy", np.where(np.arange(N * F).reshape(N, F) % 7 == 4, np.nan, 1.0))},
            "f.npy",
            "2 NaN or infinite values (first in row 1)",
        ),
        "inf features": lambda: (
            {"features": write_npy(t / "f.npy", np.array([[1.0], [1.0], [1.0], [1.0], [np.inf], [1.0]]))},
            "f.npy",
            "1 NaN or infinite values (first in row 4)",
        ),
        "duplicate node_id": lambda: (
            {"features": write_parquet(t / "f.parquet", {"node_id": [0, 1, 2, 2, 4, 5], "x": [1.0] * 6})},
            "f.parquet",
            "duplicate node_id values (1 ids, first: 2)",
        ),
        "node_id gap": lambda: (
            {"features": write_parquet(t / "f.parquet", {"node_id": [0, 1, 2, 3, 4, 6], "x": [1.0] * 6})},
            "f.parquet",
            "max 6, but node ids must be in [0, N=6)",
        ),
        "non-numeric feature column": lambda: (
            {"features": write_parquet(t / "f.parquet", {"x": [1.0] * 6, "name": list("abcdef")})},
            "f.parquet",
            "non-numeric feature columns ['name']",
        ),
        "labels wrong length": lambda: (
            {"labels": write_npy(t / "l.npy", np.zeros(5, np.int64))},
            "l.npy",
            "has 5 rows but the graph has N=6",
        ),
        "multiclass labels 2-D": lambda: (
            {"labels": write_npy(t / "l.npy", np.zeros((N, 2), np.int64))},
            "l.npy",
            "must have shape [N], got (6, 2)",
        ),
        "labels table missing column": lambda: (
            {"labels": write_csv(t / "l.csv", "node_id,class", [[0, 1]])},
            "l.csv",
            "missing columns ['label']",
        ),
        "labels table incomplete": lambda: (
            {"labels": write_csv(t / "l.csv", "node_id,label", [[0, 1], [1, 0]])},
            "l.csv",
            "covers 2 of N=6 nodes",
        ),
        "unknown split name": lambda: (
            {"splits": write_csv(t / "s.csv", "node_id,split", [[0, "train"], [1, "training"], [2, "dev"]])},
            "s.csv",
            "unknown split names ['dev', 'training']",
        ),
        "npz missing split": lambda: (
            {"splits": _npz(t / "s.npz", train=np.array([0]), val=np.array([1]))},
            "s.npz",
            "missing arrays ['test']",
        ),
        "split overlap": lambda: (
            {"splits": _npz(t / "s.npz", train=np.array([0, 1]), val=np.array([1]), test=np.array([2]))},
            "s.npz",
            "listed more than once (first: 1)",
        ),
        "split out of range": lambda: (
            {"splits": _npz(t / "s.npz", train=np.array([0]), val=np.array([1]), test=np.array([6]))},
            "s.npz",
            "test node ids out of range",
        ),
    }
    return cases[case]()


def _npz(path, **arrays) -> str:
    np.savez(path, **arrays)
    return str(path)


BAD_CASES = [
    "missing file",
    "unknown extension",
    "missing column",
    "non-integer ids",
    "id above range",
    "negative id",
    "edge npy shape",
    "float edge npy",
    "features not 2-D",
    "features rows vs num_nodes",
    "nan features",
    "inf features",
    "duplicate node_id",
    "node_id gap",
    "non-numeric feature column",
    "labels wrong length",
    "multiclass labels 2-D",
    "labels table missing column",
    "labels table incomplete",
    "unknown split name",
    "npz missing split",
    "split overlap",
    "split out of range",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_files_name_the_file_and_the_problem(tmp_path, files, case):
    overrides, filename, problem = _bad(tmp_path, files, case)
    kwargs = {**files, **overrides}
    with pytest.raises(GraphImportError) as info:
        import_graph(kwargs.pop("edges"), kwargs.pop("features"), **kwargs)
    message = str(info.value)
    assert filename in message and problem in message, message
    assert isinstance(info.value, ValueError)
