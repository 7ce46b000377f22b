"""The update log: the ordered, durable record of graph-update batches that every FeatureRunner
worker applies. A batch is acknowledged to its client only once ``append`` has returned.

One interface (``UpdateLog``), two implementations:

* ``FileUpdateLog(directory)``, the embedded default, no server. Several processes of one machine
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
  rolls once it would pass ``SEGMENT_BYTES``. ``trim`` deletes whole segments; when it removes the
  last one it first creates the (empty) segment of the next sequence, so the head is always
  derivable from the segment names and never goes back. Readers keep a cursor (segment, offset,
  next sequence), so reading the new entries costs only the new bytes; ``wait`` polls the last
  segment's size every ``POLL_S``.

* ``RedisUpdateLog(client)``: a Redis Stream (standalone or Cluster; the keys share a hash tag,
  hence one slot)::

      {<key>}:stream    entries with id "<sequence>-1", one field b"p" = the payload JSON above
      {<key>}:head      the last sequence (kept by trims, which only shorten the stream)
      {<key>}:workers   hash: worker -> status JSON

  ``append`` is one Lua script (``APPEND_SCRIPT``: compare the head, XADD, SET the head), so the
  compare-and-append is atomic. It is as durable as the server is configured to be: run Redis
  with ``appendonly yes`` and ``appendfsync always`` (and replicas with ``WAIT`` if wanted) for
  "acknowledged means kept"; a Redis that restarts empty starts the log again from 0. Nor may
  the server evict: the keys have no TTL, so ``noeviction`` or a ``volatile-*`` policy keeps
  them, and a full server then refuses appends (``LogUnavailable``) instead of dropping entries.
  ``check_durability`` (the FeatureRunner calls it at start) reads these settings from the server,
  every master of a Cluster, and logs a warning for each one that can lose acknowledged entries.

Guarantees, both implementations: sequences are 1, 2, 3, ... with no gap or duplicate; ``append``
with a stale ``expected_head`` raises ``SequenceConflict`` and writes nothing; ``read`` returns
entries in order and never silently skips one (``LogTrimmed`` instead); the head never goes back
(a trim keeps it). Every failure of the backing store is ``LogUnavailable``. When an append fails
*after* its write may have landed (a Redis timeout after the script ran, a failed ``fsync``), the
outcome is unknown: the caller must not acknowledge, and must catch up (``read``) before deciding;
a retry with the same ``expected_head`` then gets ``SequenceConflict``, never a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol, TypeVar, runtime_checkable

import orjson

from common.files import atomic_write_json

T = TypeVar("T")

log = logging.getLogger("graphsage.graph")

SEGMENT_BYTES = 64 << 20  # a segment rolls once the next record would take it past this
POLL_S = 0.01  # FileUpdateLog.wait: how often the last segment's size is looked at
LOCK_POLL_S = 0.01  # FileUpdateLog: longest sleep between two non-blocking tries of the lock
MAGIC = b"GSL1"
HEADER = struct.Struct("<4sQII")  # magic, sequence, payload length, crc32(payload)
_SEGMENT_RE = re.compile(r"seg-(\d{20})\.log")
_WORKER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

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


def update_log_from(kind: str, directory: str, redis_url: str, ca_file: str = "",
                    key: str = "gsage-updates") -> UpdateLog:
    """``kind`` "file": a FileUpdateLog in ``directory``; "redis": a RedisUpdateLog at ``redis_url``."""
    if kind == "file":
        return FileUpdateLog(directory)
    if kind == "redis":
        return RedisUpdateLog.from_url(redis_url, ca_file=ca_file, key=key)
    raise ValueError(f"update log kind must be 'file' or 'redis', not {kind!r}")


# -- shared helpers ----------------------------------------------------------------------------


def _encode_ops(ops: list[dict]) -> bytes:
    """The ops as JSON, checked before anything is locked or written (TypeError if not JSON)."""
    if not isinstance(ops, list):
        raise TypeError(f"ops must be a list, not {type(ops).__name__}")
    return orjson.dumps(ops)


def _payload(ops_json: bytes, acked_at: float) -> bytes:
    return b'{"ops":%b,"acked_at":%b}' % (ops_json, orjson.dumps(acked_at))


def _entry(sequence: int, payload: bytes) -> LogEntry:
    doc = orjson.loads(payload)
    return LogEntry(sequence, doc["ops"], float(doc["acked_at"]))


def _check_after(after: int) -> None:
    if after < 0:
        raise ValueError(f"after must be >= 0, not {after}")


def _check_worker(worker: str) -> None:
    # A worker name becomes a file name: no separators, no dot files, nothing odd.
    if not _WORKER_RE.fullmatch(worker):
        raise ValueError(f"worker name must match {_WORKER_RE.pattern}: {worker!r}")


def _fresh(docs: dict[str, dict], max_age_s: float) -> dict[str, dict]:
    oldest = wall_clock() - max_age_s
    return {w: d for w, d in docs.items()
            if isinstance(d.get("updated_at"), (int, float)) and d["updated_at"] >= oldest}


# -- the file log ------------------------------------------------------------------------------


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


def _records(f: Any, offset: int, expected: int, size: int,
             limit: int | None = None) -> Iterator[tuple[int, bytes, int]]:
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

    def __init__(self, directory: str, lock_timeout_s: float = 30.0):
        self.directory = os.path.abspath(directory)
        self.lock_timeout_s = lock_timeout_s
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
            for head, _, end in _records(f, offset, head + 1, st.st_size):
                pass
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
                        t = (self._scan_tail(segments[-1], 0, segments[-1] - 1) if segments
                             else _Tail(0, 0, 0, 0))
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
            acked_at = wall_clock()
            payload = _payload(ops_json, acked_at)
            if len(payload) >= 1 << 32:
                raise ValueError(f"a batch of {len(payload)} bytes does not fit a record")
            record = HEADER.pack(MAGIC, seq, len(payload), zlib.crc32(payload)) + payload
            fd = -1
            try:
                if t.first:
                    fd = os.open(self._path(t.first), os.O_WRONLY)
                    if os.fstat(fd).st_size != t.end:
                        os.ftruncate(fd, t.end)  # a torn tail of a crashed writer goes first
                new_segment = not t.first or (t.end > 0 and t.end + len(record) > SEGMENT_BYTES)
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
                            out.append(_entry(seq, payload))
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
            for first, successor in zip(segments, segments[1:]):
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
                if ext != ".json" or not _WORKER_RE.fullmatch(worker):
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
                            raise LogUnavailable(f"{self.directory}/.lock: held for over "
                                                 f"{self.lock_timeout_s}s by another writer") from None
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
        ops_json = _encode_ops(ops)
        async with self.writer_lock():
            return await self._io_to_the_end(self._append_sync, ops_json, expected_head)

    async def read(self, after: int, limit: int = 1000) -> list[LogEntry]:
        _check_after(after)
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
                        changed = os.path.exists(self._path(t.head + 1))
                    else:
                        changed = (os.stat(self._path(t.first)).st_size != t.end
                                   or os.path.exists(self._path(t.head + 1)) and t.head + 1 != t.first)
                except OSError:
                    changed = True
                if changed:
                    break

    async def trim(self, upto: int) -> int:
        async with self.writer_lock():
            return await self._io_to_the_end(self._trim_sync, upto)

    async def publish_status(self, worker: str, status: dict) -> None:
        _check_worker(worker)
        await self._io(self._publish_sync, worker, {**status, "updated_at": wall_clock()})

    async def statuses(self, max_age_s: float = 30.0) -> dict[str, dict]:
        return _fresh(await self._io(self._statuses_sync), max_age_s)

    async def close(self) -> None:
        """Nothing stays open between calls."""


# -- the Redis log -----------------------------------------------------------------------------

# KEYS: stream, head. ARGV: expected head, payload. {1, seq} appended, {0, head} a conflict.
# string.format('%d'): Lua 5.1's tostring of a number switches to exponent notation at 1e14.
APPEND_SCRIPT = """
local head = tonumber(redis.call('GET', KEYS[2]) or 0)
if head ~= tonumber(ARGV[1]) then
  return {0, head}
end
local seq = head + 1
redis.call('XADD', KEYS[1], string.format('%d-1', seq), 'p', ARGV[2])
redis.call('SET', KEYS[2], string.format('%d', seq))
return {1, seq}
"""
# KEYS: stream, head. ARGV: first id, count. The head and the entries from one moment, so that
# "nothing returned although head > after" reliably means trimmed (not appended in between).
READ_SCRIPT = """#!lua flags=no-writes
local head = tonumber(redis.call('GET', KEYS[2]) or 0)
return {head, redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])}
"""


def _redis_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisClusterException, RedisError

    # RedisClusterException (no node reachable at all) is not a RedisError; OSError covers a
    # socket error redis-py did not wrap (and TimeoutError, an OSError).
    return (RedisError, RedisClusterException, OSError)


# What a Redis server must be configured with for "acknowledged means kept" (see durability_problems).
DURABILITY_SETTINGS = ("appendonly", "appendfsync", "maxmemory-policy")
LOSS = "acknowledged graph updates can be lost"


def durability_problems(server: str, config: dict[str, str | None]) -> list[str]:
    """Why ``server``, configured as ``config`` (``DURABILITY_SETTINGS`` -> value, None where the
    server did not say), can lose acknowledged log entries; [] when it cannot."""
    problems = []
    policy = config.get("maxmemory-policy")
    if policy is None:
        problems.append(f"Redis {server}: maxmemory-policy could not be read; if it is not noeviction, {LOSS} "
                        "when the server is full")
    elif policy != "noeviction" and not policy.startswith("volatile-"):
        # volatile-* policies evict only keys with a TTL, and the log's keys have none.
        problems.append(f"Redis {server}: maxmemory-policy {policy} evicts keys without a TTL when the server is "
                        f"full, the update log's among them: {LOSS} (use noeviction)")
    appendonly, appendfsync = config.get("appendonly"), config.get("appendfsync")
    if appendonly is None:
        problems.append(f"Redis {server}: appendonly could not be read; without it, {LOSS} when the server restarts")
    elif appendonly != "yes":
        problems.append(f"Redis {server}: appendonly {appendonly}: the update log is not written to disk before an "
                        f"update is acknowledged, so {LOSS} when the server restarts (use appendonly yes, "
                        "appendfsync always)")
    elif appendfsync is None:
        problems.append(f"Redis {server}: appendfsync could not be read; unless it is always, {LOSS} when the host "
                        "fails")
    elif appendfsync != "always":
        problems.append(f"Redis {server}: appendfsync {appendfsync}: the append-only file is not fsynced before an "
                        f"update is acknowledged, so {LOSS} when the host fails (use appendfsync always)")
    return problems


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _seq_of(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


class RedisUpdateLog:
    """The update log as a Redis Stream (see the module docstring). The log owns ``client``
    (``close`` closes it). ``wait`` blocks in slices of ``max_block_s``, which must stay below
    the client's socket timeout (a blocked read is a silent socket)."""

    def __init__(self, client: Any, key: str = "gsage-updates", max_block_s: float = 1.0):
        if not key or any(c in key for c in "{} \t\r\n"):
            raise ValueError(f"key must be non-empty, without braces or whitespace: {key!r}")
        self.client = client
        self.key = key
        self.max_block_s = max_block_s
        # One hash tag: a Cluster keeps the three keys in one slot, so the scripts may touch them.
        self.stream_key = f"{{{key}}}:stream"
        self.head_key = f"{{{key}}}:head"
        self.workers_key = f"{{{key}}}:workers"
        self._append = client.register_script(APPEND_SCRIPT)
        self._read = client.register_script(READ_SCRIPT)
        self._errors = _redis_errors()

    @classmethod
    def from_url(cls, url: str, *, ca_file: str = "", key: str = "gsage-updates",
                 timeout_s: float = 2.0, socket_timeout_s: float = 5.0) -> RedisUpdateLog:
        from common.redis_client import make_client

        client = make_client(url, timeout_s=timeout_s, socket_timeout_s=socket_timeout_s, ca_file=ca_file)
        return cls(client, key, max_block_s=socket_timeout_s / 2)

    @contextlib.contextmanager
    def _unavailable(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._errors as exc:
            raise LogUnavailable(f"redis {what} ({self.key}): {type(exc).__name__}: {exc}") from exc

    async def head(self) -> int:
        with self._unavailable("head"):
            value = await self.client.get(self.head_key)
        return int(value or 0)

    async def append(self, ops: list[dict], expected_head: int) -> LogEntry:
        """Raises LogUnavailable when Redis did not answer; after a timeout the script may have
        run (outcome unknown): a retry with the same expected_head then gets SequenceConflict."""
        ops_json = _encode_ops(ops)
        acked_at = wall_clock()
        with self._unavailable("append"):
            ok, seq = await self._append(keys=[self.stream_key, self.head_key],
                                         args=[expected_head, _payload(ops_json, acked_at)])
        if not ok:
            raise SequenceConflict(expected_head, int(seq))
        return LogEntry(int(seq), orjson.loads(ops_json), acked_at)

    async def read(self, after: int, limit: int = 1000) -> list[LogEntry]:
        _check_after(after)
        if limit < 1:
            return []
        with self._unavailable("read"):
            head, raw = await self._read(keys=[self.stream_key, self.head_key],
                                         args=[f"{after + 1}-0", limit])
        entries = []
        for entry_id, fields in raw:
            values = dict(zip(fields[::2], fields[1::2]))  # a script returns the flat field list
            entries.append(_entry(_seq_of(entry_id), values[b"p"]))
        # Sequences are contiguous: a first entry past after + 1, or none although the head is
        # past after, means the wanted ones were trimmed.
        if (entries and entries[0].sequence != after + 1) or (not entries and int(head) > after):
            raise LogTrimmed(f"entry {after + 1} was trimmed from {self.stream_key}")
        return entries

    async def wait(self, after: int, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if await self.head() > after:  # also true when those entries were trimmed since
            return True
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            block_ms = max(1, int(min(remaining, self.max_block_s) * 1000))
            with self._unavailable("wait"):
                # XREAD returns ids greater than the one given: "<after>-1" -> sequences > after.
                got = await self.client.xread({self.stream_key: f"{after}-1"}, count=1, block=block_ms)
            if got:
                return True

    async def trim(self, upto: int) -> int:
        with self._unavailable("trim"):
            return int(await self.client.xtrim(self.stream_key, minid=f"{upto + 1}-0", approximate=False))

    def writer_lock(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """Nothing to take: append's compare-and-append serialises writers of every machine."""
        return contextlib.nullcontext()

    async def publish_status(self, worker: str, status: dict) -> None:
        _check_worker(worker)
        doc = orjson.dumps({**status, "updated_at": wall_clock()})
        with self._unavailable("publish_status"):
            await self.client.hset(self.workers_key, worker, doc)

    async def statuses(self, max_age_s: float = 30.0) -> dict[str, dict]:
        with self._unavailable("statuses"):
            raw = await self.client.hgetall(self.workers_key)
        docs = {}
        for worker, value in raw.items():
            with contextlib.suppress(ValueError):
                doc = orjson.loads(value)
                if isinstance(doc, dict):
                    docs[worker.decode() if isinstance(worker, bytes) else worker] = doc
        return _fresh(docs, max_age_s)

    async def check_durability(self, timeout_s: float = 10.0) -> list[str]:
        """Read ``DURABILITY_SETTINGS`` from the server (from every master of a Cluster) and log a
        WARNING for each way it can lose acknowledged entries, or that they could not be read
        (CONFIG disabled or renamed, as on some managed services; the server down). Returns the
        warnings. Warns, never refuses: a test's throwaway server keeps nothing on purpose."""
        try:
            configs = await asyncio.wait_for(self._server_configs(), timeout_s)
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not stop a start (a timeout included)
            configs = {self._describe(): exc}
        warnings = []
        for server, config in configs.items():
            if isinstance(config, BaseException):
                warnings.append(f"Redis {server}: the update log's durability could not be checked "
                                f"({type(config).__name__}: {config}); unless it runs with appendonly yes, "
                                f"appendfsync always and maxmemory-policy noeviction, {LOSS}")
            else:
                warnings.extend(durability_problems(server, config))
        for warning in warnings:
            log.warning("%s", warning)
        return warnings

    def _describe(self) -> str:
        kwargs = getattr(getattr(self.client, "connection_pool", None), "connection_kwargs", None) or {}
        if "path" in kwargs:
            return f"unix:{kwargs['path']}"
        if "host" in kwargs:
            return f"{kwargs['host']}:{kwargs.get('port', 6379)}"
        nodes = getattr(getattr(self.client, "nodes_manager", None), "startup_nodes", None) or {}
        return ",".join(nodes) or "(unknown)"

    async def _server_configs(self) -> dict[str, dict[str, str | None] | BaseException]:
        """Server -> its durability settings, or the error that kept them from being read."""
        from redis.asyncio import RedisCluster

        async def read(**target: Any) -> dict[str, str | None] | BaseException:
            config: dict[str, str | None] = {}
            try:
                for name in DURABILITY_SETTINGS:  # one by one: CONFIG GET takes one pattern before Redis 7
                    reply = await self.client.config_get(name, **target)
                    config[name] = _text({_text(k): v for k, v in reply.items()}.get(name))
            except self._errors as exc:
                return exc
            return config

        if isinstance(self.client, RedisCluster):
            await self.client.initialize()
            # Every master holds a share of the slots; the log's slot may move to any of them.
            return {node.name: await read(target_nodes=node) for node in self.client.get_primaries()}
        return {self._describe(): await read()}

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.aclose()
