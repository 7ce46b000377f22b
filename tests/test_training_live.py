"""``python -m training_export compact`` and ``train --live``: the living graph (snapshot + update
log) folded into a new snapshot, and a model trained on it, from the command line."""

from __future__ import annotations

import asyncio

import pytest

from harness.app import run_export
from runners.feature.update_log import FileUpdateLog
from tests.conftest import bentoml_home, private_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_compact_and_train_on_the_living_graph(demo_store, tmp_path, monkeypatch):
    home = private_store(demo_store, tmp_path)
    log_dir = str(tmp_path / "log")
    monkeypatch.setenv("GSAGE_GRAPH_LOG_DIR", log_dir)
    monkeypatch.setenv("GSAGE_GRAPH_LOG", "file")
    with bentoml_home(home):
        from runners.feature.snapshot import load_snapshot

        base = load_snapshot()
    new = base.num_nodes + 3
    ops = [
        {"op": "add_node", "id": new, "features": [0.5] * base.feature_dim, "label": 2},
        {"op": "add_edge", "src": new, "dst": 1},
        {"op": "remove_edge", "src": 1, "dst": int(base.indices[base.indptr[1]])},
    ]

    async def write() -> None:
        log = FileUpdateLog(log_dir)
        await log.append(ops, expected_head=0)
        await log.close()

    asyncio.run(write())
    trained = run_export(home, "train", "--live", "--epochs", "1", "--hidden", "16")
    assert trained["passed"] and "log sequence 1" in trained["graph_snapshot"], trained
    compacted = run_export(home, "compact")
    assert compacted["log_sequence"] == 1 and compacted["updates_folded"] == 1 and compacted["announced_at"] == 2
    with bentoml_home(home):
        snap = load_snapshot(compacted["snapshot"])
    assert snap.log_sequence == 1 and snap.num_nodes == new + 1 and snap.labels[new] == 2
    assert 1 in snap.indices[snap.indptr[new] : snap.indptr[new + 1]].tolist()
    assert snap.extra["compacted_from"] == base.tag
