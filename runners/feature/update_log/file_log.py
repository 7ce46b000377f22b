"""``FileUpdateLog(directory)``: the update log, the embedded default, no server. Several processes of one machine
(gateway-side writers, FeatureRunner workers) share one directory::

    directory/
      seg-00000000000000000001.log   append-only segments, named after their first sequence
      seg-00000000000000004711.log   (20 digits); the last one is the one written to
      .lock                          fcntl lock file: writers (append, trim) serialise on it
      status/<worker>.json           each worker's last status (atomic replace)

A segment is a run of records, one per entry, sequences contiguous from its name on::

    b"GSL1" | u64 sequence | u32 payload length | u32 crc32(payload)    (little-endian, 20 bytes)
    payload: JSON {"ops": [...], "acked_at": <unix time>}

``append`` takes the lock, re-derives the head (the last complete record of the last segment;
cached, re-scanned only from where the file grew), truncates a torn tail left by a crashed
writer, writes the record, ``fsync``\\ s the file (and the directory when it created the
segment) and only then returns. Readers ignore a torn tail (a short header or payload, a bad
magic, sequence or crc at the end), so they never see a record that is not complete. A segment
rolls once it would pass ``segment_bytes`` (``GSAGE_GRAPH_LOG_SEGMENT_BYTES``). ``trim`` deletes whole segments; when it removes the
last one it first creates the (empty) segment of the next sequence, so the head is always
derivable from the segment names and never goes back. Readers keep a cursor (segment, offset,
next sequence), so reading the new entries costs only the new bytes; ``wait`` polls the last
segment's size every ``POLL_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import itertools
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import orjson

from common.files import atomic_write_json
from runners.feature.update_log import base
from runners.feature.update_log.base import (
    WORKER_RE,
    LogEntry,
    LogTrimmed,
    LogUnavailable,
    SequenceConflict,
    check_after,
    check_worker,
    encode_ops,
    entry_of,
    fresh_statuses,
    payload_of,
)

SEGMENT_BYTES = 64 << 20  # the default: a segment rolls once the next record would take it past this
POLL_S = 0.01  # FileUpdateLog.wait: how often the last segment's size is looked at
LOCK_POLL_S = 0.01  # FileUpdateLog: longest sleep between two non-blocking tries of the lock
MAGIC = b"GSL1"
HEADER = struct.Struct("<4sQII")  # magic, sequence, payload length, crc32(payload)
_SEGMENT_RE = re.compile(r"seg-(\d{20})\.log")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class _Tail:
    """What a scan found at the end of the log: replaced whole, never mutated, so a poller may
    look at it without a lock."""

    first: int  # first sequence of the last segment; 0: there is no segment yet
    ino: int
    end: int  # offset just past the last complete record
    head: int


@dataclasses.dataclass(frozen=True)
class _Cursor:
    first: int  # the segment being read
    offset: int  # where the record ``next_seq`` starts (or will)
    next_seq: int


def _records(
    f: Any, offset: int, expected: int, size: int, limit: int | None = None
) -> Iterator[tuple[int, bytes, int]]:
    """Yield ``(sequence, payload, end offset)`` of the complete records from ``offset`` on;
    stop quietly at the first incomplete or bad one (a torn tail, or the writer mid-record)."""
    f.seek(offset)
    count = 0
    while limit is None or count < limit:
        header = f.read(HEADER.size)
        if len(header) != HEADER.size or offset + HEADER.size > size:
            return  # (shorter than size said: a writer truncated a torn tail meanwhile)
        magic, seq, length, crc = HEADER.unpack(header)
        if magic != MAGIC or seq != expected or offset + HEADER.size + length > size:
            return
        payload = f.read(length)
        if len(payload) != length or zlib.crc32(payload) != crc:
            return
        offset += HEADER.size + length
        expected += 1
        count += 1
        yield seq, payload, offset


class FileUpdateLog:
    """The update log as segment files in one directory (see the module docstring)."""

    def __init__(self, directory: str, lock_timeout_s: float = 30.0, segment_bytes: int = SEGMENT_BYTES):
        self.directory = os.path.abspath(directory)
        self.lock_timeout_s = lock_timeout_s
        self.segment_bytes = segment_bytes
        os.makedirs(self.directory, exist_ok=True)
        self._status_dir = os.path.join(self.directory, "status")
        self._tail: _Tail | None = None
        self._tail_lock = threading.RLock()  # _tail is re-derived in worker threads
        self._cursor: _Cursor | None = None
        self._read_lock = threading.Lock()
        self._writers = asyncio.Lock()  # this instance's coroutines queue here, not on the flock
        self._lock_owner: asyncio.Task[Any] | None = None

    # -- paths and scans (blocking; called in threads) -------------------------------------------

    def _path(self, first: int) -> str:
        return os.path.join(self.directory, f"seg-{first:020d}.log")

    def _segments(self) -> list[int]:
        return sorted(int(m.group(1)) for m in map(_SEGMENT_RE.fullmatch, os.listdir(self.directory)) if m)

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _scan_tail(self, first: int, offset: int, head: int) -> _Tail:
        with open(self._path(first), "rb") as f:
            st = os.fstat(f.fileno())
            end = offset
            for sequence, _, stop in _records(f, offset, head + 1, st.st_size):
                head, end = sequence, stop
        return _Tail(first, st.st_ino, end, head)

    def _sync_tail(self) -> _Tail:
        """The head now. Cheap when nothing changed: one stat of the last segment and one of the
        name its successor would have (a roll, or a trim that emptied the log)."""
        with self._tail_lock:
            for _ in range(100):  # a segment may vanish between listing and opening (a trim)
                try:
                    t = self._tail
                    if t is not None and t.first:
                        st = os.stat(self._path(t.first))
                        if st.st_ino != t.ino or st.st_size < t.end:
                            t = None  # replaced or shrunk below what was complete: start over
                        elif st.st_size != t.end:  # grew (or holds a torn tail): scan just that
                            t = self._scan_tail(t.first, t.end, t.head)
                    else:
                        t = None
                    if t is not None and t.head + 1 != t.first and os.path.exists(self._path(t.head + 1)):
                        t = None  # rolled, or trimmed to an empty successor
                    if t is None:
                        segments = self._segments()
                        t = self._scan_tail(segments[-1], 0, segments[-1] - 1) if segments else _Tail(0, 0, 0, 0)
                    self._tail = t
                    return t
                except FileNotFoundError:
                    self._tail = None
            raise LogUnavailable(f"{self.directory}: segments keep vanishing")

    def _append_sync(self, ops_json: bytes, expected_head: int) -> LogEntry:
        """Under the writer lock, in a thread."""
        with self._tail_lock:
            t = self._sync_tail()
            if t.head != expected_head:
                raise SequenceConflict(expected_head, t.head)
            seq = t.head + 1
            acked_at = base.wall_clock()
            payload = payload_of(ops_json, acked_at)
            if len(payload) >= 1 << 32:
                raise ValueError(f"a batch of {len(payload)} bytes does not fit a record")
            record = HEADER.pack(MAGIC, seq, len(payload), zlib.crc32(payload)) + payload
            fd = -1
            try:
                if t.first:
                    fd = os.open(self._path(t.first), os.O_WRONLY)
                    if os.fstat(fd).st_size != t.end:
                        os.ftruncate(fd, t.end)  # a torn tail of a crashed writer goes first
                new_segment = not t.first or (t.end > 0 and t.end + len(record) > self.segment_bytes)
                if new_segment:
                    if fd >= 0:
                        os.close(fd)
                        fd = -1
                    first, end = seq, 0
                    fd = os.open(self._path(first), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                else:
                    first, end = t.first, t.end
                try:
                    written = 0
                    while written < len(record):
                        written += os.pwrite(fd, record[written:], end + written)
                except OSError:
                    # Nothing was appended: a partial record is a torn tail to every reader, and
                    # it goes now if it can (otherwise the next writer truncates it).
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, end)
                    self._tail = None
                    raise
                try:
                    os.fsync(fd)
                    if new_segment:
                        self._fsync_dir()
                except OSError:
                    # The record is complete and readers may have applied it already: it stays
                    # (truncating it would hand its sequence to another batch). Outcome unknown.
                    self._tail = None
                    raise
                self._tail = _Tail(first, os.fstat(fd).st_ino, end + len(record), seq)
            finally:
                if fd >= 0:
                    os.close(fd)
        return LogEntry(seq, orjson.loads(ops_json), acked_at)

    def _read_sync(self, after: int, limit: int) -> list[LogEntry]:
        want = after + 1
        out: list[LogEntry] = []
        with self._read_lock:
            c = self._cursor
            for _ in range(100):
                if c is None or c.next_seq != want:
                    c = self._seek(want, c)
                    if c is None or c.next_seq != want:  # nothing that far yet
                        self._cursor = c
                        return out
                try:
                    with open(self._path(c.first), "rb") as f:
                        size = os.fstat(f.fileno()).st_size
                        for seq, payload, end in _records(f, c.offset, c.next_seq, size, limit - len(out)):
                            out.append(entry_of(seq, payload))
                            c = _Cursor(c.first, end, seq + 1)
                except FileNotFoundError:  # trimmed under us: what was read stands, seek again
                    c = None
                    if out:
                        break
                    continue
                want = c.next_seq
                # At the end of a finished segment the next one is named after the next sequence.
                if len(out) < limit and c.next_seq != c.first and os.path.exists(self._path(c.next_seq)):
                    c = _Cursor(c.next_seq, 0, c.next_seq)
                    continue
                break
            self._cursor = c
        return out

    def _seek(self, want: int, near: _Cursor | None = None) -> _Cursor | None:
        """A cursor at the record ``want`` (or at the end of the log when it is further). From
        ``near`` when it is in the same segment before ``want`` (a worker whose own appends
        moved it past its last read): the records in between, not the segment from its start,
        which would make every read after an own append cost the whole segment."""
        segments = self._segments()
        if not segments:
            return None
        if want < segments[0]:
            raise LogTrimmed(f"entry {want} was trimmed; the oldest kept is {segments[0]}")
        first = max(s for s in segments if s <= want)
        c = near if near is not None and near.first == first and near.next_seq <= want else _Cursor(first, 0, first)
        with open(self._path(first), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            for seq, _, end in _records(f, c.offset, c.next_seq, size, want - c.next_seq):
                c = _Cursor(first, end, seq + 1)
        return c

    def _trim_sync(self, upto: int) -> int:
        """Under the writer lock, in a thread."""
        with self._tail_lock:
            t = self._sync_tail()
            if not t.first:
                return 0
            upto = min(upto, t.head)
            segments = self._segments()
            removed = 0
            for first, successor in itertools.pairwise(segments):
                if successor - 1 <= upto:
                    os.unlink(self._path(first))
                    removed += successor - first
            if t.first <= t.head <= upto:
                # The last segment holds only trimmed entries: it goes too, and the empty segment
                # of the next sequence (where the next append lands) keeps the head.
                successor = t.head + 1
                fd = os.open(self._path(successor), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    ino = os.fstat(fd).st_ino
                finally:
                    os.close(fd)
                self._fsync_dir()  # the successor is durable before the head's segment goes
                os.unlink(self._path(t.first))
                removed += t.head - t.first + 1
                self._tail = _Tail(successor, ino, 0, t.head)
            if removed:
                self._fsync_dir()
            return removed

    def _statuses_sync(self) -> dict[str, dict]:
        docs: dict[str, dict] = {}
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self._status_dir):
                worker, ext = os.path.splitext(name)
                if ext != ".json" or not WORKER_RE.fullmatch(worker):
                    continue  # atomic_write_json's temporary files start with a dot
                with contextlib.suppress(FileNotFoundError, ValueError):
                    with open(os.path.join(self._status_dir, name), "rb") as f:
                        doc = orjson.loads(f.read())
                    if isinstance(doc, dict):
                        docs[worker] = doc
        return docs

    def _publish_sync(self, worker: str, doc: dict) -> None:
        os.makedirs(self._status_dir, exist_ok=True)
        atomic_write_json(os.path.join(self._status_dir, worker + ".json"), doc)

    # -- the interface -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def writer_lock(self) -> AsyncIterator[None]:
        """The fcntl lock on ``directory/.lock``, taken without blocking the loop (non-blocking
        tries between short sleeps). Re-entrant in the task that holds it, so the caller may
        hold it around head -> validate -> append (through this same object: another object, or
        another task, waits for it like another process); LogUnavailable after ``lock_timeout_s``."""
        task = asyncio.current_task()
        if task is not None and self._lock_owner is task:
            yield
            return
        async with self._writers:
            fd = self._open_lock_file()  # open(2) of a local file: no need for a thread
            try:
                deadline = time.monotonic() + self.lock_timeout_s
                pause = 0.0005
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise LogUnavailable(
                                f"{self.directory}/.lock: held for over {self.lock_timeout_s}s by another writer"
                            ) from None
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, LOCK_POLL_S)
                self._lock_owner = task
                try:
                    yield
                finally:
                    self._lock_owner = None
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def _open_lock_file(self) -> int:
        try:
            return os.open(os.path.join(self.directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LogUnavailable(f"{self.directory}/.lock: {exc}") from exc

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except OSError as exc:
            raise LogUnavailable(f"{self.directory}: {exc}") from exc

    async def _io_to_the_end(self, fn: Callable[..., T], *args: Any) -> T:
        """Like ``_io``, but a cancelled caller still waits for the thread: the writer lock must
        not be released while a write is under way. The cancellation is raised afterwards."""
        future = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        cancelled = False
        while not future.done():
            try:
                await asyncio.wait({future})
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            future.exception()  # retrieved, so that it is not logged as never retrieved
            raise asyncio.CancelledError
        try:
            return future.result()
        except OSError as exc:
            raise LogUnavailable(f"{self.directory}: {exc}") from exc

    async def head(self) -> int:
        return (await self._io(self._sync_tail)).head

    async def append(self, ops: list[dict], expected_head: int) -> LogEntry:
        ops_json = encode_ops(ops)
        async with self.writer_lock():
            return await self._io_to_the_end(self._append_sync, ops_json, expected_head)

    async def read(self, after: int, limit: int = 1000) -> list[LogEntry]:
        check_after(after)
        if limit < 1:
            return []
        return await self._io(self._read_sync, after, limit)

    async def wait(self, after: int, timeout_s: float) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            t = await self._io(self._sync_tail)
            if t.head > after:
                return True
            # Poll with two stats on the loop (microseconds): the last segment's size and the
            # name of the segment a roll or a trim would create.
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return False
                await asyncio.sleep(min(POLL_S, remaining))
                try:
                    if not t.first:  # no segment yet: the first append creates the head's successor
                        changed = os.path.exists(self._path(t.head + 1))  # noqa: ASYNC240 - one stat a poll
                    else:
                        changed = os.stat(self._path(t.first)).st_size != t.end or (
                            os.path.exists(self._path(t.head + 1)) and t.head + 1 != t.first  # noqa: ASYNC240
                        )
                except OSError:
                    changed = True
                if changed:
                    break

    async def trim(self, upto: int) -> int:
        async with self.writer_lock():
            return await self._io_to_the_end(self._trim_sync, upto)

    async def publish_status(self, worker: str, status: dict) -> None:
        check_worker(worker)
        await self._io(self._publish_sync, worker, {**status, "updated_at": base.wall_clock()})

    async def statuses(self, max_age_s: float = 30.0) -> dict[str, dict]:
        return fresh_statuses(await self._io(self._statuses_sync), max_age_s)

    async def close(self) -> None:
        """Nothing stays open between calls."""
