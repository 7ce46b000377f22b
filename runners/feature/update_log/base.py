"""The update log's contract, shared by its two implementations (``file_log``, ``redis_log``).

Guarantees, both implementations: sequences are 1, 2, 3, ... with no gap or duplicate; ``append``
with a stale ``expected_head`` raises ``SequenceConflict`` and writes nothing; ``read`` returns
entries in order and never silently skips one (``LogTrimmed`` instead); the head never goes back
(a trim keeps it). Every failure of the backing store is ``LogUnavailable``. When an append fails
*after* its write may have landed (a Redis timeout after the script ran, a failed ``fsync``), the
outcome is unknown: the caller must not acknowledge, and must catch up (``read``) before deciding;
a retry with the same ``expected_head`` then gets ``SequenceConflict``, never a duplicate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import orjson

T = TypeVar("T")

log = logging.getLogger("graphsage.graph")

WORKER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

# The wall clock of acked_at and of the statuses' updated_at (tests move it).
wall_clock: Callable[[], float] = time.time


@dataclasses.dataclass(frozen=True)
class LogEntry:
    sequence: int  # 1, 2, 3, ... contiguous, assigned by the log
    ops: list[dict]  # as appended (JSON round trip)
    acked_at: float  # wall clock when appended (staleness: acknowledged -> applied)


class LogUnavailable(Exception):
    """The log cannot be read or written now (Redis down, disk error); nothing was appended,
    unless the failure came after the write may have landed (see the module docstring)."""


class SequenceConflict(Exception):
    """append(expected_head=...) found another head: the caller catches up and retries."""

    def __init__(self, expected: int, head: int):
        super().__init__(f"expected head {expected}, the log's head is {head}")
        self.expected = expected
        self.head = head


class LogTrimmed(Exception):
    """read(after=...) asked for entries already removed by a trim."""


@runtime_checkable
class UpdateLog(Protocol):
    async def head(self) -> int:
        """The last sequence, 0 when nothing was ever appended (a trim does not lower it)."""

    async def append(self, ops: list[dict], expected_head: int) -> LogEntry:
        """Durable when it returns; SequenceConflict (nothing written) if head != expected_head."""

    async def read(self, after: int, limit: int = 1000) -> list[LogEntry]:
        """Entries with sequence > after, in order, at most limit; [] when none; LogTrimmed if
        the first one wanted is gone."""

    async def wait(self, after: int, timeout_s: float) -> bool:
        """True as soon as an entry > after exists (or may exist), False at the timeout."""

    async def trim(self, upto: int) -> int:
        """Remove entries with sequence <= upto (the file log: whole segments only); how many went."""

    def writer_lock(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """Serialises the writers of this machine (around head -> validate -> append)."""

    async def publish_status(self, worker: str, status: dict) -> None:
        """A worker's state (applied sequence, lag, ...) for GET /graph/status and trimming."""

    async def statuses(self, max_age_s: float = 30.0) -> dict[str, dict]:
        """Each worker's last status newer than max_age_s, with "updated_at" added."""

    async def close(self) -> None: ...


# -- shared helpers ----------------------------------------------------------------------------


def encode_ops(ops: list[dict]) -> bytes:
    """The ops as JSON, checked before anything is locked or written (TypeError if not JSON)."""
    if not isinstance(ops, list):
        raise TypeError(f"ops must be a list, not {type(ops).__name__}")
    return orjson.dumps(ops)


def payload_of(ops_json: bytes, acked_at: float) -> bytes:
    return b'{"ops":%b,"acked_at":%b}' % (ops_json, orjson.dumps(acked_at))


def entry_of(sequence: int, payload: bytes) -> LogEntry:
    doc = orjson.loads(payload)
    return LogEntry(sequence, doc["ops"], float(doc["acked_at"]))


def check_after(after: int) -> None:
    if after < 0:
        raise ValueError(f"after must be >= 0, not {after}")


def check_worker(worker: str) -> None:
    # A worker name becomes a file name: no separators, no dot files, nothing odd.
    if not WORKER_RE.fullmatch(worker):
        raise ValueError(f"worker name must match {WORKER_RE.pattern}: {worker!r}")


def fresh_statuses(docs: dict[str, dict], max_age_s: float) -> dict[str, dict]:
    oldest = wall_clock() - max_age_s
    return {
        w: d for w, d in docs.items() if isinstance(d.get("updated_at"), (int, float)) and d["updated_at"] >= oldest
    }
