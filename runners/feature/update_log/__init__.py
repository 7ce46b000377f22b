"""The update log: the ordered, durable record of graph-update batches that every FeatureRunner
worker applies. A batch is acknowledged to its client only once ``append`` has returned.

One interface (``base.UpdateLog``), two implementations: ``file_log.FileUpdateLog`` (the embedded
default, no server) and ``redis_log.RedisUpdateLog`` (a Redis Stream). ``base`` says what both
guarantee.
"""

from __future__ import annotations

from typing import Any

from runners.feature.update_log.base import (
    LogEntry,
    LogTrimmed,
    LogUnavailable,
    SequenceConflict,
    UpdateLog,
    wall_clock,
)
from runners.feature.update_log.file_log import SEGMENT_BYTES, FileUpdateLog
from runners.feature.update_log.redis_log import DURABILITY_SETTINGS, RedisUpdateLog, durability_problems

__all__ = [
    "DURABILITY_SETTINGS",
    "SEGMENT_BYTES",
    "FileUpdateLog",
    "LogEntry",
    "LogTrimmed",
    "LogUnavailable",
    "RedisUpdateLog",
    "SequenceConflict",
    "UpdateLog",
    "durability_problems",
    "update_log_from",
    "update_log_of",
    "wall_clock",
]


def update_log_from(
    kind: str,
    directory: str,
    redis_url: str,
    ca_file: str = "",
    key: str = "gsage-updates",
    *,
    segment_bytes: int = SEGMENT_BYTES,
    lock_timeout_s: float = 30.0,
) -> UpdateLog:
    """``kind`` "file": a FileUpdateLog in ``directory``; "redis": a RedisUpdateLog at ``redis_url``."""
    if kind == "file":
        return FileUpdateLog(directory, lock_timeout_s=lock_timeout_s, segment_bytes=segment_bytes)
    if kind == "redis":
        return RedisUpdateLog.from_url(redis_url, ca_file=ca_file, key=key)
    raise ValueError(f"update log kind must be 'file' or 'redis', not {kind!r}")


def update_log_of(cfg: Any) -> UpdateLog:
    """The update log ``cfg`` (``common.settings.Settings``) names, as a command-line job opens it
    (the services add their segment size and lock timeout)."""
    return update_log_from(
        cfg.graph_log_kind, cfg.graph_log_path, cfg.graph_log_url, cfg.redis_ca_file, cfg.graph_log_key
    )
