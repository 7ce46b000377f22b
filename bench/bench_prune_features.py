"""The prune of superseded row versions in the feature cluster (prints numbers, never asserts).

    python bench/bench_prune_features.py [--rows 200000] [--dim 128] [--updated 0.2] [--versions 2]

A Redis Cluster of 3 masters + 3 replicas on loopback (``harness.redis_servers``), ``--rows`` rows
loaded as the loader writes them (``FeatureAuthority.write``: each master's share in one EVAL, then
WAIT for its replica), then ``--versions`` versions of an ``--updated`` share of the rows, as
updates 1..k would leave them. A compacted snapshot folded up to the last update names each row's
newest version (``row_sequence``); ``training_export.prune_features`` then deletes the rest. Side by
side in one run: the masters' memory after the load, after the updates and after the prune (bytes
per row version), the prune's keys scanned per second and the versions it deleted, and a dry run's
scan rate (the cost of the scan alone). Writes bench/results/prune_features.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "prune_features.json"

from harness.redis_servers import RedisCluster3  # noqa: E402
from runners.feature.authority import AuthorityPolicy, FeatureAuthority  # noqa: E402
from runners.feature.snapshot import GraphSnapshot  # noqa: E402
from training_export.prune_features import prune_features  # noqa: E402

BATCH = 4096


def masters_memory(cluster: RedisCluster3) -> int:
    return sum(int(n.info("memory")["used_memory"]) for n in cluster.nodes if n.info("replication")["role"] == "master")


def folded_snapshot(rows: int, dim: int, row_sequence: np.ndarray, upto: int) -> GraphSnapshot:
    """A compacted snapshot's shape (one edge; the prune reads only its row versions)."""
    return GraphSnapshot(
        tag="graph-snapshot:bench-pruned",
        indptr=np.zeros(rows + 1, np.int64),
        indices=np.zeros(0, np.int64),
        features=np.zeros((0, dim), np.float32),
        labels=np.zeros(rows, np.int64),
        train=np.zeros(0, np.int64),
        val=np.zeros(0, np.int64),
        test=np.zeros(0, np.int64),
        log_sequence=upto,
        row_sequence=row_sequence,
        extra={"feature_set": "bench-prune"},
    )


async def run(args: argparse.Namespace, cluster: RedisCluster3) -> dict[str, Any]:
    authority = FeatureAuthority.connect(cluster.url, "bench-prune", args.dim, AuthorityPolicy())
    out: dict[str, Any] = {"rows": args.rows, "dim": args.dim}
    rng = np.random.default_rng(0)
    try:
        t0 = time.perf_counter()
        for first in range(0, args.rows, BATCH):
            ids = np.arange(first, min(first + BATCH, args.rows), dtype=np.int64)
            await authority.write(ids, rng.standard_normal((ids.size, args.dim), dtype=np.float32))
        out["load_rows_per_s"] = round(args.rows / (time.perf_counter() - t0), 1)
        loaded = masters_memory(cluster)
        out["memory_loaded_mb"] = round(loaded / 2**20, 1)
        updated = rng.choice(args.rows, int(args.rows * args.updated), replace=False)
        row_sequence = np.zeros(args.rows, np.int64)
        for version in range(1, args.versions + 1):
            for first in range(0, updated.size, BATCH):
                ids = np.sort(updated[first : first + BATCH])
                rows = rng.standard_normal((ids.size, args.dim), dtype=np.float32)
                await authority.write(ids, rows, np.full(ids.size, version, np.int64))
            row_sequence[updated] = version
        out["row_versions_written"] = int(updated.size * args.versions)
        before = masters_memory(cluster)
        out["memory_updated_mb"] = round(before / 2**20, 1)
        snap = folded_snapshot(args.rows, args.dim, row_sequence, args.versions)
        dry = await prune_features(snap, authority, None, dry_run=True, progress=False)
        out["dry_run"] = {"keys_per_s": dry.keys_per_s, "seconds": dry.seconds, "would_delete": dry.versions_deleted}
        report = await prune_features(snap, authority, None, progress=False)
        after = masters_memory(cluster)
        out["prune"] = {
            "keys_scanned": report.keys_scanned,
            "versions_deleted": report.versions_deleted,
            "versions_kept": report.versions_kept,
            "seconds": report.seconds,
            "keys_per_s": report.keys_per_s,
        }
        out["memory_pruned_mb"] = round(after / 2**20, 1)
        out["bytes_freed_per_version"] = round((before - after) / max(1, report.versions_deleted), 1)
        out["memory_pruned_vs_loaded"] = round(after / loaded, 3)
        # The next scheduled run with no compaction since: the manifest says it was pruned this far.
        started = time.perf_counter()
        idle = await prune_features(snap, authority, None, progress=False)
        out["scheduled_rerun"] = {"skipped": idle.skipped, "ms": round(1e3 * (time.perf_counter() - started), 2)}
    finally:
        await authority.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--updated", type=float, default=0.2, help="the share of rows the updates set")
    ap.add_argument("--versions", type=int, default=2, help="how many times each of them was set")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as redis_dir, RedisCluster3(redis_dir, replicas=1) as cluster:
        out = asyncio.run(run(args, cluster))
    out["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    print(
        f"{args.rows:,} rows loaded ({out['memory_loaded_mb']} MB on the masters), {out['row_versions_written']:,} "
        f"versions written ({out['memory_updated_mb']} MB); dry run {out['dry_run']['keys_per_s']:,.0f} keys/s; "
        f"prune {out['prune']['keys_per_s']:,.0f} keys/s, {out['prune']['versions_deleted']:,} deleted in "
        f"{out['prune']['seconds']} s, {out['memory_pruned_mb']} MB after ({out['bytes_freed_per_version']} B freed per "
        f"version; {out['memory_pruned_vs_loaded']}x the loaded size); the next run with no compaction since: "
        f"{'skipped' if out['scheduled_rerun']['skipped'] else 'scanned'} in {out['scheduled_rerun']['ms']} ms"
    )
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
