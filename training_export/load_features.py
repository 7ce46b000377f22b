"""Fill the feature cluster from a snapshot: ``python -m training_export load-features`` (or
``python -m training_export.load_features``, which the serving image runs: it needs none of the
training packages).

The rows go in batches, each master's share in one ``EVAL`` followed by ``WAIT`` for its replicas
(``runners.feature.authority.FeatureAuthority.write``), so a loaded row survives a failover. The
manifest in the cluster (``gsf:<feature set>:_manifest``) records how far the load got after every
batch: a load that stopped (a crash, a failover past its retry window, Ctrl-C) starts again where
it stopped (``--restart``: from row 0). A verification pass then reads every row back and compares
the count and a SHA-256 of the rows, in id order, with the snapshot's; only a verified load lets a
FeatureRunner in cluster mode start. Which snapshot the cluster holds is recorded in the model
store too: a ``graph-features:<v>`` entry (labels: the snapshot and feature set; metadata: the
cluster, rows, width, checksum).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from tqdm.auto import tqdm

from common.bento.store import create_entry
from runners.feature.authority import FeatureAuthority
from runners.feature.cache.l2_redis import WIRE_DTYPE
from runners.feature.snapshot import GraphSnapshot

FEATURES_ENTRY = "graph-features"
BATCH_ROWS = 4096


@dataclasses.dataclass
class LoadReport:
    snapshot: str
    feature_set: str
    rows: int
    dim: int
    resumed_from: int
    rows_written: int
    load_seconds: float
    rows_per_s: float
    verified: bool
    rows_found: int
    rows_differing: int
    sha256: str
    verify_seconds: float
    store_entry: str = ""

    @property
    def passed(self) -> bool:
        return self.verified


def redacted(url: str) -> str:
    """``url`` without its password (what the model store records)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _checksum_update(digest: Any, rows: np.ndarray) -> None:
    digest.update(np.ascontiguousarray(rows, dtype=WIRE_DTYPE).tobytes())


async def load_features(
    snapshot: GraphSnapshot,
    authority: FeatureAuthority,
    *,
    batch_rows: int = BATCH_ROWS,
    restart: bool = False,
    verify: bool = True,
    progress: bool = True,
    stop_after_batches: int | None = None,
) -> LoadReport:
    """Write ``snapshot``'s rows into the cluster (resuming a load that stopped), then verify.
    ``stop_after_batches``: stop as a crash would, after that many batches (tests)."""
    features = snapshot.feature_rows()
    n, dim = features.shape
    if dim != authority.dim:
        raise ValueError(f"the authority holds rows of {authority.dim} values, the snapshot {dim}")
    doc = await authority.manifest()
    held = (int(doc.get("dim") or dim), int(doc.get("rows") or n)) if doc is not None else (dim, n)
    if not restart and held != (dim, n):
        raise ValueError(
            f"the cluster's feature set {authority.feature_set!r} holds {held[1]} rows of "
            f"{held[0]} values, the snapshot {n} of {dim}: pass --restart to load it again"
        )
    start = 0 if doc is None or restart else min(int(doc.get("next_row") or 0), n)
    doc = {
        "snapshot": snapshot.tag,
        "feature_set": authority.feature_set,
        "rows": int(n),
        "dim": int(dim),
        "next_row": start,
        "complete": start >= n,
        "verified": False,
        "started_at": time.time(),
    }
    await authority.set_manifest(doc)
    started = time.perf_counter()
    bar = tqdm(total=n, initial=start, desc="load-features", unit="row", unit_scale=True, disable=not progress)
    for batches, first in enumerate(range(start, n, batch_rows)):
        if stop_after_batches is not None and batches >= stop_after_batches:
            bar.close()
            raise InterruptedError(f"stopped after {batches} batches at row {first} (as a crash would)")
        last = min(first + batch_rows, n)
        await authority.write(np.arange(first, last, dtype=np.int64), np.asarray(features[first:last]))
        doc["next_row"] = last
        await authority.set_manifest(doc)
        bar.update(last - first)
    bar.close()
    load_seconds = time.perf_counter() - started
    doc["complete"] = True
    written = n - start
    report = LoadReport(
        snapshot=snapshot.tag,
        feature_set=authority.feature_set,
        rows=int(n),
        dim=int(dim),
        resumed_from=start,
        rows_written=int(written),
        load_seconds=round(load_seconds, 3),
        rows_per_s=round(written / load_seconds, 1) if load_seconds > 0 else 0.0,
        verified=False,
        rows_found=0,
        rows_differing=0,
        sha256="",
        verify_seconds=0.0,
    )
    if verify:
        await _verify(features, authority, batch_rows, report, progress)
        doc.update(verified=report.verified, sha256=report.sha256, verified_at=time.time())
    await authority.set_manifest(doc)
    return report


async def _verify(
    features: np.ndarray, authority: FeatureAuthority, batch_rows: int, report: LoadReport, progress: bool
) -> None:
    """Read every row back: the count found, the rows that differ, and both checksums."""
    n = features.shape[0]
    expected, actual = hashlib.sha256(), hashlib.sha256()
    started = time.perf_counter()
    bar = tqdm(total=n, desc="verify", unit="row", unit_scale=True, disable=not progress)
    for first in range(0, n, batch_rows):
        last = min(first + batch_rows, n)
        ids = np.arange(first, last, dtype=np.int64)
        want = np.asarray(features[first:last], dtype=np.float32)
        found, rows = await authority.rows.read_rows(ids, timeout_s=authority.policy.write_timeout_s)
        report.rows_found += int(found.sum())
        got = np.zeros_like(want)
        got[found] = rows
        report.rows_differing += int((~found).sum()) + int(np.any(got[found] != want[found], axis=1).sum())
        _checksum_update(expected, want)
        _checksum_update(actual, got)
        bar.update(last - first)
    bar.close()
    report.verify_seconds = round(time.perf_counter() - started, 3)
    report.sha256 = expected.hexdigest()
    report.verified = report.rows_found == n and report.rows_differing == 0 and expected.digest() == actual.digest()


def record_in_store(report: LoadReport, cluster_url: str) -> str:
    """A ``graph-features:<v>`` entry saying which snapshot the cluster holds; returns its tag."""
    metadata = {**dataclasses.asdict(report), "cluster": redacted(cluster_url)}
    metadata.pop("store_entry", None)
    labels = {"snapshot": report.snapshot.rpartition(":")[2], "feature_set": report.feature_set}
    with create_entry(FEATURES_ENTRY, labels, metadata) as entry:
        with open(f"{entry.path}/manifest.txt", "w") as out:
            out.write(f"{report.snapshot} -> {redacted(cluster_url)} ({report.rows} rows, sha256 {report.sha256})\n")
    return entry.tag


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--snapshot", default="graph-snapshot:latest")
    p.add_argument("--redis-url", default="", help="default: GSAGE_FEATURE_REDIS_URL, else GSAGE_REDIS_URL")
    p.add_argument(
        "--batch-rows", type=int, default=BATCH_ROWS, help="rows per write (each master's share in one EVAL)"
    )
    p.add_argument("--restart", action="store_true", help="load from row 0, not from where a stopped load stopped")
    p.add_argument("--no-verify", action="store_true", help="skip reading every row back (the runners then refuse it)")


def log_line(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cluster_settings(redis_url: str, command: str) -> Any:
    """The settings, with ``--redis-url`` (when given) as the feature cluster's; a clear exit when
    none names a cluster."""
    from common.settings import load_settings

    cfg = load_settings({**os.environ, **({"GSAGE_FEATURE_REDIS_URL": redis_url} if redis_url else {})})
    if not cfg.feature_cluster_url:
        raise SystemExit(f"{command} needs --redis-url, GSAGE_FEATURE_REDIS_URL or GSAGE_REDIS_URL")
    return cfg


def job_main(
    prog: str,
    doc: str | None,
    add: Callable[[argparse.ArgumentParser], None],
    run_job: Callable[[argparse.Namespace], dict[str, Any]],
    argv: list[str] | None = None,
) -> int:
    """A job's own entry point: its report as JSON on stdout, exit 1 unless it ``passed``."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    add(parser)
    result = run_job(parser.parse_args(argv))
    print(json.dumps(result, indent=2, default=str))
    return 0 if result["passed"] else 1


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load, verify, record in the store (when verified); the report as a dict (``passed``)."""
    from runners.feature.authority import authority_for
    from runners.feature.snapshot import load_snapshot

    cfg = cluster_settings(args.redis_url, "load-features")
    snapshot = load_snapshot(args.snapshot)

    async def load() -> LoadReport:
        authority = authority_for(cfg, snapshot.feature_set, snapshot.feature_dim)
        try:
            return await load_features(
                snapshot, authority, batch_rows=args.batch_rows, restart=args.restart, verify=not args.no_verify
            )
        finally:
            await authority.close()

    log_line(
        f"loading {snapshot.tag} ({snapshot.num_nodes:,} rows of {snapshot.feature_dim}) into "
        f"{redacted(cfg.feature_cluster_url)} as feature set {snapshot.feature_set!r}"
    )
    report = asyncio.run(load())
    if report.verified:
        report.store_entry = record_in_store(report, cfg.feature_cluster_url)
    log_line(
        f"  {report.rows_written:,} rows written from row {report.resumed_from:,} at {report.rows_per_s:,.0f} rows/s; "
        f"verified: {report.verified} ({report.rows_found:,} found, {report.rows_differing} differing)"
    )
    return {**dataclasses.asdict(report), "passed": report.verified or args.no_verify}


def main(argv: list[str] | None = None) -> int:
    return job_main("python -m training_export.load_features", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
