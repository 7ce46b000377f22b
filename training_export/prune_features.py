"""Delete the row versions no FeatureRunner can read any more: ``python -m training_export
prune-features`` (or ``python -m training_export.prune_features``, runnable in the serving image).

In cluster mode every update leaves its rows under versioned keys (``gsf:<feature set>:<id>.<s>``,
``runners.feature.authority``), and the older versions stay for workers that have not applied the
update yet. Once every live worker serves a compacted snapshot that folded the log up to ``L``,
the only version of a row at or before ``L`` anyone reads is the one the snapshot's
``row_sequence`` names: a worker on that snapshot (or a later one) reads that version or one an
update after ``L`` set. Every other version ``<= L`` (a row set twice before the compaction, the
loaded row of a row set since, the rows of a writer that lost the race for a sequence) is garbage.

The job checks that claim before it deletes: the update log's worker statuses must all report a
snapshot at ``L`` or later (``--force`` skips the check; a worker on an older snapshot would then
answer 503 ``FeaturesMissing`` for the rows it lost, never wrong rows). It scans each master
(``SCAN MATCH``, so the masters keep serving), deletes the superseded keys with one ``EVAL`` of
``UNLINK`` per master and batch, and reports what it scanned, deleted and kept, and the masters'
memory before and after. It is idempotent: stopped halfway, run it again. A prune that finished
records its sequence in the feature set's manifest (``pruned_to``), so a scheduled run (the
cluster-mode CronJob) with no compaction since costs one read, not a scan of every key; the garbage
it would miss (rows a writer left at a sequence it lost) waits for the next compaction's prune, or
``--rescan``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from runners.feature.authority import FeatureAuthority
from runners.feature.snapshot import GraphSnapshot
from training_export.load_features import cluster_settings, job_main, log_line, redacted

SCAN_COUNT = 1000
# ARGV = keys, all owned by the master it runs on (as l2_redis's scripts)
UNLINK_SCRIPT = """#!lua flags=allow-cross-slot-keys
for i = 1, #ARGV do redis.call('UNLINK', ARGV[i]) end
return #ARGV
"""


class WorkersBehind(RuntimeError):
    """A live worker serves a snapshot older than the one pruned to: it may still read the
    versions the prune would delete."""


@dataclasses.dataclass
class PruneReport:
    snapshot: str
    feature_set: str
    log_sequence: int
    workers: dict[str, int]
    keys_scanned: int = 0
    versions_deleted: int = 0
    versions_kept: int = 0
    seconds: float = 0.0
    keys_per_s: float = 0.0
    memory_before: int = 0
    memory_after: int = 0
    dry_run: bool = False
    skipped: bool = False  # the cluster was pruned to this sequence (or a later one) before


def superseded(names: list[bytes], row_sequence: np.ndarray | None, num_nodes: int, upto: int) -> tuple[list[int], int]:
    """Positions in ``names`` (key names after the feature set's prefix: ``<id>`` or
    ``<id>.<version>``) of the row versions no reader of a snapshot folded up to ``upto`` asks for
    (a version ``<= upto`` other than the row's ``row_sequence``, 0 when the snapshot has none),
    and how many names are rows at all. Names that are not rows (the manifest), ids outside the
    snapshot and versions after ``upto`` are kept."""
    dead, rows = [], 0
    for pos, raw in enumerate(names):
        node, _, version = raw.decode("ascii", "replace").partition(".")
        if not node.isdigit() or (version and not version.isdigit()):
            continue
        rows += 1
        v, i = int(version or 0), int(node)
        if v <= upto and i < num_nodes and v != (0 if row_sequence is None else int(row_sequence[i])):
            dead.append(pos)
    return dead, rows


def check_workers(statuses: dict[str, dict[str, Any]], upto: int) -> dict[str, int]:
    """Each live worker's snapshot sequence; ``WorkersBehind`` unless all are ``>= upto``."""
    sequences = {w: int(s.get("snapshot_sequence", 0)) for w, s in statuses.items()}
    if not sequences:
        raise WorkersBehind(
            "no live FeatureRunner reports its snapshot in the update log, so none can vouch that the old "
            "versions are unread (start the runners, or pass --force)"
        )
    behind = {w: s for w, s in sequences.items() if s < upto}
    if behind:
        listed = ", ".join(f"{w} (snapshot at {s})" for w, s in sorted(behind.items()))
        raise WorkersBehind(
            f"{len(behind)} live worker(s) serve a snapshot before sequence {upto}: {listed}; wait until they have "
            "switched to the compacted snapshot (or pass --force)"
        )
    return sequences


async def _masters(authority: FeatureAuthority) -> list[Any]:
    """The nodes to scan: a Cluster's primaries, or None for the one standalone server."""
    rows = authority.rows
    if not rows.cluster:
        return [None]
    await rows.client.initialize()
    return list(rows.client.get_primaries())  # type: ignore[union-attr]


async def _scan(authority: FeatureAuthority, node: Any, count: int) -> AsyncIterator[list[bytes]]:
    """Batches of this feature set's keys on ``node``."""
    client, pattern = authority.rows.client, authority.rows.key("*")
    route = {} if node is None else {"target_nodes": node}
    cursor: Any = 0
    while True:
        cursor, keys = await client.scan(cursor, match=pattern, count=count, **route)
        if isinstance(cursor, dict):  # a Cluster client answers {node: cursor}
            cursor = next(iter(cursor.values()))
        if keys:
            yield [k if isinstance(k, bytes) else k.encode() for k in keys]
        if int(cursor) == 0:
            return


async def _used_memory(authority: FeatureAuthority, masters: list[Any]) -> int:
    total = 0
    for node in masters:
        route = {} if node is None else {"target_nodes": node}
        info = await authority.rows.client.info("memory", **route)
        total += int(info["used_memory"])
    return total


async def prune_features(
    snapshot: GraphSnapshot,
    authority: FeatureAuthority,
    statuses: dict[str, dict[str, Any]] | None,
    *,
    dry_run: bool = False,
    rescan: bool = False,
    progress: bool = True,
    scan_count: int = SCAN_COUNT,
) -> PruneReport:
    """Delete the versions of ``snapshot``'s feature set that no reader of ``snapshot`` (or of a
    later one) asks for. ``statuses``: the update log's live workers (None: not checked).
    ``rescan``: scan even when the manifest says the cluster was pruned this far already."""
    upto = int(snapshot.log_sequence)
    workers = {} if statuses is None else check_workers(statuses, upto)
    report = PruneReport(snapshot.tag, authority.feature_set, upto, workers, dry_run=dry_run)
    manifest = await authority.manifest() or {}
    if not rescan and int(manifest.get("pruned_to", -1)) >= upto:
        report.skipped = True
        return report
    prefix = len(authority.rows.key(""))
    masters = await _masters(authority)
    report.memory_before = await _used_memory(authority, masters)
    started = time.perf_counter()
    bar = tqdm(desc="prune-features", unit="key", unit_scale=True, disable=not progress)
    for node in masters:
        route = {} if node is None else {"target_nodes": node}
        async for keys in _scan(authority, node, scan_count):
            dead, rows = superseded([k[prefix:] for k in keys], snapshot.row_sequence, snapshot.num_nodes, upto)
            report.keys_scanned += len(keys)
            report.versions_deleted += len(dead)
            report.versions_kept += rows - len(dead)
            if dead and not dry_run:
                await authority.rows.client.execute_command("EVAL", UNLINK_SCRIPT, 0, *[keys[p] for p in dead], **route)
            bar.update(len(keys))
    bar.close()
    report.seconds = round(time.perf_counter() - started, 3)
    report.keys_per_s = round(report.keys_scanned / report.seconds, 1) if report.seconds > 0 else 0.0
    report.memory_after = await _used_memory(authority, masters)
    if not dry_run:  # re-read: the manifest is the loader's too
        await authority.set_manifest(
            {**(await authority.manifest() or {}), "pruned_to": upto, "pruned_by": snapshot.tag}
        )
    return report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--snapshot",
        default="",
        help="the compacted snapshot to prune to (default: the oldest one a live worker serves)",
    )
    p.add_argument("--redis-url", default="", help="default: GSAGE_FEATURE_REDIS_URL, else GSAGE_REDIS_URL")
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
    p.add_argument("--force", action="store_true", help="prune without the live workers' statuses vouching for it")
    p.add_argument("--rescan", action="store_true", help="scan even if the cluster was pruned to this snapshot before")


def _oldest_served(statuses: dict[str, dict[str, Any]]) -> str:
    if not statuses:
        raise SystemExit("no live FeatureRunner reports its snapshot in the update log: pass --snapshot")
    oldest = min(statuses.values(), key=lambda s: int(s.get("snapshot_sequence", 0)))
    return str(oldest["snapshot"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Check, prune, report (a dict, ``passed``)."""
    from runners.feature.authority import authority_for, load_without_rows
    from runners.feature.update_log import update_log_of

    cfg = cluster_settings(args.redis_url, "prune-features")

    async def prune() -> PruneReport:
        log_ = update_log_of(cfg)
        try:
            statuses = await log_.statuses()
        finally:
            await log_.close()
        snapshot = load_without_rows(args.snapshot or _oldest_served(statuses))
        authority = authority_for(cfg, snapshot.feature_set, snapshot.feature_dim)
        log_line(
            f"pruning feature set {snapshot.feature_set!r} to {snapshot.tag} (log sequence {snapshot.log_sequence}) "
            f"in {redacted(cfg.feature_cluster_url)}" + (" (dry run)" if args.dry_run else "")
        )
        try:
            statuses_ = None if args.force else statuses
            return await prune_features(snapshot, authority, statuses_, dry_run=args.dry_run, rescan=args.rescan)
        finally:
            await authority.close()

    try:
        report = asyncio.run(prune())
    except WorkersBehind as exc:
        log_line(f"  refused: {exc}")
        return {"passed": False, "refused": str(exc)}
    if report.skipped:
        log_line(
            f"  nothing to do: the cluster was pruned to sequence {report.log_sequence} before (--rescan scans anyway)"
        )
        return {**dataclasses.asdict(report), "passed": True}
    freed = report.memory_before - report.memory_after
    log_line(
        f"  {report.keys_scanned:,} keys scanned at {report.keys_per_s:,.0f} keys/s: {report.versions_deleted:,} "
        f"versions {'to delete' if report.dry_run else 'deleted'}, {report.versions_kept:,} kept; "
        f"masters' memory {report.memory_before / 2**20:,.1f} -> {report.memory_after / 2**20:,.1f} MiB "
        f"({freed / 2**20:,.1f} MiB freed)"
    )
    return {**dataclasses.asdict(report), "passed": True}


def main(argv: list[str] | None = None) -> int:
    return job_main("python -m training_export.prune_features", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
