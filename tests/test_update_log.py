"""The update log (runners/feature/update_log/): one set of behavioural tests run against the
file log (in tmp_path), the Redis log on a standalone server and, for a subset, on a 3-master
Cluster; then what only one implementation has (the file format, torn tails, fsync, segment rolls,
several processes; the Redis layout and a dead server).

Every test runs its async body with ``asyncio.run``; Redis tests use a key of their own (the
cluster is shared by the session). Nothing sleeps to order events: tasks and ``asyncio.wait``
with a bound do; only ``wait``'s own timeouts are short (0.05 s), and only booleans are asserted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import stat
import struct
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from runners.feature import update_log
from runners.feature.update_log import (
    FileUpdateLog,
    LogEntry,
    LogTrimmed,
    LogUnavailable,
    RedisUpdateLog,
    SequenceConflict,
    UpdateLog,
    base,
    file_log,
    update_log_from,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ops(i: int) -> list[dict]:
    return [{"op": "add_edge", "src": i, "dst": i + 1}, {"op": "set_feature", "node": i, "values": [0.5, -1.0]}]


def seqs(entries: list[LogEntry]) -> list[int]:
    return [e.sequence for e in entries]


@dataclasses.dataclass
class Backend:
    kind: str  # "file", "redis" (standalone) or "cluster"
    directory: str = ""
    url: str = ""
    key: str = ""
    server: Any = None

    def open(self) -> UpdateLog:
        """A fresh log object on the same storage (another worker's view of the log)."""
        if self.kind == "file":
            return FileUpdateLog(self.directory)
        # A fresh Cluster client discovers the topology inside its first call: generous timeouts.
        return RedisUpdateLog.from_url(self.url, key=self.key, timeout_s=5.0, socket_timeout_s=5.0)


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.integration)])
def backend(request, tmp_path) -> Backend:
    if request.param == "file":
        return Backend("file", directory=str(tmp_path / "log"))
    server = request.getfixturevalue("redis_standalone" if request.param == "redis" else "redis_cluster")
    return Backend(request.param, url=server.url, key=f"t-{uuid.uuid4().hex[:12]}", server=server)


with_cluster = pytest.mark.parametrize(
    "backend",
    [
        "file",
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("cluster", marks=pytest.mark.integration),
    ],
    indirect=True,
)


def run(backend: Backend, body: Callable[..., Awaitable[Any]], n: int = 1) -> Any:
    """Run ``body(log_1, ..., log_n)``: n independent log objects on the backend's storage."""

    async def main():
        logs = [backend.open() for _ in range(n)]
        try:
            return await body(*logs)
        finally:
            for log in logs:
                await log.close()

    return asyncio.run(main())


# -- behaviour, both implementations -----------------------------------------------------------


@with_cluster
def test_sequences_are_contiguous_from_one_and_ops_round_trip(backend):
    async def body(log):
        assert await log.head() == 0
        assert await log.read(0) == []
        before = time.time()
        appended = [await log.append(ops(i), expected_head=i) for i in range(5)]
        after = time.time()
        assert seqs(appended) == [1, 2, 3, 4, 5]
        assert await log.head() == 5
        read = await log.read(0)
        assert read == appended  # sequence, ops (JSON round trip) and acked_at alike
        assert [e.ops for e in read] == [ops(i) for i in range(5)]
        assert all(before <= e.acked_at <= after for e in read)
        assert all(isinstance(e, LogEntry) for e in read)

    run(backend, body)


@with_cluster
def test_compare_and_append(backend):
    async def body(log, other):
        await log.append(ops(0), 0)
        for stale in (0, 5):  # behind, ahead
            with pytest.raises(SequenceConflict) as info:
                await other.append(ops(9), stale)
            assert (info.value.expected, info.value.head) == (stale, 1)
        assert await other.head() == 1 and seqs(await other.read(0)) == [1]

        # Two writers with the same expected head: exactly one wins, nothing is duplicated.
        results = await asyncio.gather(log.append(ops(1), 1), other.append(ops(2), 1), return_exceptions=True)
        assert sorted(type(r).__name__ for r in results) == ["LogEntry", "SequenceConflict"]
        winner = next(r for r in results if isinstance(r, LogEntry))
        assert winner.sequence == 2 and seqs(await log.read(0)) == [1, 2]

        # The writer lock around head -> append (re-entrant for the file log, a no-op for Redis).
        async with log.writer_lock():
            head = await log.head()
            assert (await log.append(ops(3), head)).sequence == head + 1
        assert await other.head() == 3

    run(backend, body, n=2)


def test_read_after_and_limit(backend):
    async def body(log):
        for i in range(10):
            await log.append(ops(i), i)
        assert seqs(await log.read(0, limit=4)) == [1, 2, 3, 4]
        assert seqs(await log.read(4, limit=4)) == [5, 6, 7, 8]
        assert seqs(await log.read(8)) == [9, 10]
        assert await log.read(10) == []
        assert seqs(await log.read(2, limit=2)) == [3, 4]  # back again
        assert seqs(await log.read(9, limit=1000)) == [10]
        assert await log.read(50) == []
        assert await log.read(0, limit=0) == []
        assert (await log.read(6, limit=1))[0].ops == ops(6)

    run(backend, body)


@with_cluster
def test_another_instance_reads_and_appends(backend):
    async def body(a, b):
        for i in range(3):
            await a.append(ops(i), i)
        assert await b.head() == 3
        assert seqs(await b.read(0)) == [1, 2, 3]
        await b.append(ops(3), 3)
        assert seqs(await a.read(3)) == [4]  # a's position after its own appends is no obstacle
        assert await a.head() == 4
        assert seqs(await a.read(0, limit=2)) == [1, 2]

    run(backend, body, n=2)


@with_cluster
def test_wait(backend):
    async def body(log, other):
        assert await log.wait(0, 0.05) is False  # empty log: the timeout
        waiter = asyncio.create_task(log.wait(0, 30.0))
        done, _ = await asyncio.wait({waiter}, timeout=0.05)
        assert not done  # nothing to wake it yet
        appender = asyncio.create_task(other.append(ops(0), 0))
        assert await asyncio.wait_for(waiter, 10.0) is True
        await appender
        assert await log.wait(0, 0.05) is True  # already there
        assert await log.wait(1, 0.05) is False
        assert seqs(await log.read(0)) == [1]

    run(backend, body, n=2)


def test_a_read_after_own_appends_scans_only_the_new_records(tmp_path, monkeypatch):
    """A worker applies its own appends without reading them back: its next read must not
    rescan the segment from its start (which grows to SEGMENT_BYTES)."""
    log = update_log.FileUpdateLog(str(tmp_path))
    scanned = []
    real = file_log._records

    def counting(*args, **kwargs):
        for record in real(*args, **kwargs):
            scanned.append(record[0])
            yield record

    async def body():
        for i in range(200):
            await log.append(ops(i), i)
        assert seqs(await log.read(0, limit=1000)) == list(range(1, 201))  # the cursor at the end
        for i in range(200, 203):
            await log.append(ops(i), i)  # applied by the writer itself: the cursor stays at 201
        monkeypatch.setattr(file_log, "_records", counting)
        assert seqs(await log.read(202)) == [203]

    asyncio.run(body())
    assert scanned == [201, 202, 203], scanned[:10]


def test_an_idle_wait_on_an_empty_file_log_does_not_list_the_directory_every_poll(tmp_path, monkeypatch):
    """The poll is two stats on the loop; the directory is listed when something may have changed."""
    log = update_log.FileUpdateLog(str(tmp_path))
    listings = []
    real = log._segments
    monkeypatch.setattr(log, "_segments", lambda: listings.append(1) or real())
    polls = []
    real_sleep = asyncio.sleep

    async def counted_sleep(delay, *args):
        polls.append(delay)
        await real_sleep(0)

    async def body():
        monkeypatch.setattr(file_log.asyncio, "sleep", counted_sleep)
        try:
            assert await log.wait(0, 0.0) is False
            # polls until the deadline: bounded by the number of polls, not by time
            waiter = asyncio.ensure_future(log.wait(0, 3600.0))
            while len(polls) < 50:
                await real_sleep(0)
            other = update_log.FileUpdateLog(str(tmp_path))
            await other.append(ops(0), 0)
            assert await asyncio.wait_for(waiter, 10.0) is True
        finally:
            monkeypatch.setattr(file_log.asyncio, "sleep", real_sleep)

    asyncio.run(body())
    assert len(polls) >= 50 and len(listings) <= 4, (len(polls), len(listings))


@with_cluster
def test_trim_and_log_trimmed(backend):
    async def body(log, reader):
        for i in range(10):
            await log.append(ops(i), i)
        assert seqs(await reader.read(0, limit=3)) == [1, 2, 3]  # a reader positioned early on

        removed = await log.trim(4)  # the file log only frees whole segments: 0 here
        assert 0 <= removed <= 4
        assert seqs(await reader.read(4)) == list(range(5, 11))
        if removed:
            with pytest.raises(LogTrimmed):
                await reader.read(0)

        assert await log.trim(10) == 10 - removed
        assert await log.trim(10) == 0
        for after in (0, 3, 9):
            with pytest.raises(LogTrimmed):
                await reader.read(after)
        assert await reader.read(10) == []
        assert await log.head() == 10 and await reader.head() == 10
        assert await reader.wait(3, 0.05) is True  # entries > 3 existed: read() says they are gone

        assert (await log.append(ops(10), 10)).sequence == 11
        assert seqs(await reader.read(10)) == [11]
        with pytest.raises(LogTrimmed):
            await reader.read(9)

    run(backend, body, n=2)


def test_head_never_goes_back_after_a_trim(backend):
    async def body(log):
        for i in range(3):
            await log.append(ops(i), i)
        await log.trim(3)
        assert await log.head() == 3
        fresh = backend.open()
        try:
            assert await fresh.head() == 3
            with pytest.raises(SequenceConflict):
                await fresh.append(ops(0), 0)
            assert (await fresh.append(ops(3), 3)).sequence == 4
            await fresh.trim(100)  # past the head: trims what there is
            assert await fresh.head() == 4
        finally:
            await fresh.close()
        assert (await log.append(ops(4), 4)).sequence == 5

    run(backend, body)


def test_statuses_with_max_age(backend, monkeypatch):
    async def body(log, other):
        assert await log.statuses() == {}
        monkeypatch.setattr(base, "wall_clock", lambda: time.time() - 100.0)
        await log.publish_status("worker-old", {"applied": 1})
        monkeypatch.setattr(base, "wall_clock", time.time)
        await log.publish_status("worker-1", {"applied": 3, "lag_s": 0.25, "overlay": {"edges": 2}})
        await other.publish_status("worker-2", {"applied": 2})

        fresh = await other.statuses()
        assert set(fresh) == {"worker-1", "worker-2"}
        assert fresh["worker-1"]["applied"] == 3 and fresh["worker-1"]["overlay"] == {"edges": 2}
        assert abs(fresh["worker-1"]["updated_at"] - time.time()) < 30
        assert set(await log.statuses(max_age_s=1000.0)) == {"worker-old", "worker-1", "worker-2"}

        await log.publish_status("worker-1", {"applied": 4})  # replaces the last one
        assert (await other.statuses())["worker-1"]["applied"] == 4
        for bad in ("../x", "", ".hidden", "a/b"):
            with pytest.raises(ValueError):
                await log.publish_status(bad, {})

    run(backend, body, n=2)


def test_ops_that_are_not_json_are_refused_before_anything_is_written(backend):
    async def body(log):
        with pytest.raises(TypeError):
            await log.append([{"op": "x", "value": object()}], 0)
        with pytest.raises(TypeError):
            await log.append({"op": "not a list"}, 0)  # type: ignore[arg-type]
        assert await log.head() == 0

    run(backend, body)


def test_update_log_from(tmp_path):
    log = update_log_from("file", str(tmp_path / "log"), "")
    assert isinstance(log, FileUpdateLog) and isinstance(log, UpdateLog)
    remote = update_log_from("redis", "", "redis://127.0.0.1:1/0", key="k")  # connects lazily
    assert isinstance(remote, RedisUpdateLog) and isinstance(remote, UpdateLog)
    assert remote.stream_key == "{k}:stream"
    asyncio.run(remote.close())
    with pytest.raises(ValueError):
        update_log_from("kafka", "", "")
    with pytest.raises(ValueError):
        RedisUpdateLog.from_url("redis://127.0.0.1:1/0", key="a{b}")


# -- the file log ------------------------------------------------------------------------------


def segments(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("seg-"))


def parse_segment(path: str) -> list[int]:
    """The record sequences of one segment, by the documented format (independent of the code)."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset < len(data):
        magic, seq, length, crc = struct.unpack_from("<4sQII", data, offset)
        payload = data[offset + 20 : offset + 20 + length]
        assert magic == b"GSL1" and len(payload) == length and zlib.crc32(payload) == crc
        doc = orjson.loads(payload)
        assert set(doc) == {"ops", "acked_at"}
        out.append(seq)
        offset += 20 + length
    return out


CHILD = r"""
import asyncio, json, sys
from runners.feature.update_log import FileUpdateLog, SequenceConflict

async def main(directory, mode, name, n):
    log = FileUpdateLog(directory)
    if mode == "read":
        print(json.dumps([[e.sequence, e.ops] for e in await log.read(int(name))]))
        return
    done = conflicts = 0
    while done < n:
        if mode == "lock":  # head -> append under the writer lock: never a conflict
            async with log.writer_lock():
                await log.append([{"op": "mark", "writer": name, "i": done}], await log.head())
            done += 1
        else:
            try:
                await log.append([{"op": "mark", "writer": name, "i": done}], await log.head())
                done += 1
            except SequenceConflict:
                conflicts += 1
    print(json.dumps({"conflicts": conflicts}))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


def child(*args: str | int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> Any:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return orjson.loads(out)


def test_file_log_between_processes(tmp_path):
    directory = str(tmp_path / "log")

    async def main():
        log = FileUpdateLog(directory)
        assert finish(child(directory, "retry", "child", 3)) == {"conflicts": 0}
        assert seqs(await log.read(0)) == [1, 2, 3]
        assert await log.head() == 3
        await log.append(ops(3), 3)
        assert finish(child(directory, "read", 2, 0)) == [[3, [{"op": "mark", "writer": "child", "i": 2}]], [4, ops(3)]]

    asyncio.run(main())


def test_file_log_concurrent_writer_processes(tmp_path):
    directory = str(tmp_path / "log")
    n = 15
    procs = {
        name: child(directory, mode, name, n)
        for name, mode in (("l1", "lock"), ("l2", "lock"), ("r1", "retry"), ("r2", "retry"))
    }
    results = {name: finish(proc) for name, proc in procs.items()}
    assert results["l1"]["conflicts"] == results["l2"]["conflicts"] == 0

    async def main():
        entries = await FileUpdateLog(directory).read(0)
        assert seqs(entries) == list(range(1, 4 * n + 1))
        for name in procs:  # each writer's batches once each, in its order
            assert [e.ops[0]["i"] for e in entries if e.ops[0]["writer"] == name] == list(range(n))

    asyncio.run(main())
    assert [s for seg in segments(directory) for s in parse_segment(os.path.join(directory, seg))] == list(
        range(1, 4 * n + 1)
    )


def torn_record(seq: int, tamper: str) -> bytes:
    payload = orjson.dumps({"ops": [{"op": "torn"}], "acked_at": 1.0})
    record = struct.pack("<4sQII", b"GSL1", seq, len(payload), zlib.crc32(payload)) + payload
    return {
        "garbage": b"\x00\xff\x13junk",
        "short_header": record[:11],
        "short_payload": record[:-5],
        "bad_crc": record[:-1] + bytes([record[-1] ^ 1]),
        "wrong_magic": b"XXXX" + record[4:],
        # complete, with a good crc, but not the next sequence
        "wrong_sequence": struct.pack("<4sQII", b"GSL1", seq + 5, len(payload), zlib.crc32(payload)) + payload,
    }[tamper]


@pytest.mark.parametrize(
    "tamper", ["garbage", "short_header", "short_payload", "bad_crc", "wrong_magic", "wrong_sequence"]
)
def test_file_torn_tail_is_ignored_then_repaired(tmp_path, tamper):
    directory = str(tmp_path / "log")

    async def main():
        writer = FileUpdateLog(directory)
        for i in range(3):
            await writer.append(ops(i), i)
        [segment] = [os.path.join(directory, s) for s in segments(directory)]
        clean = os.path.getsize(segment)
        with open(segment, "ab") as f:  # a writer that died mid-record
            f.write(torn_record(4, tamper))

        reader = FileUpdateLog(directory)
        assert await reader.head() == 3
        assert seqs(await reader.read(0)) == [1, 2, 3]
        assert await reader.read(3) == []
        assert await reader.wait(3, 0.05) is False

        entry = await writer.append([{"op": "after"}], 3)  # truncates the tail, then appends
        assert entry.sequence == 4
        assert parse_segment(segment) == [1, 2, 3, 4]  # the junk is gone, the file is clean again
        assert os.path.getsize(segment) > clean
        assert await reader.wait(3, 5.0) is True
        assert [(e.sequence, e.ops) for e in await reader.read(3)] == [(4, [{"op": "after"}])]
        assert seqs(await FileUpdateLog(directory).read(0)) == [1, 2, 3, 4]
        assert (await reader.append(ops(5), 4)).sequence == 5

    asyncio.run(main())


def test_file_torn_tail_is_truncated_before_a_roll(tmp_path, monkeypatch):
    roll = 150  # bytes: small segments, so that a few appends roll them
    directory = str(tmp_path / "log")

    async def main():
        log = FileUpdateLog(directory, segment_bytes=roll)
        await log.append(ops(0), 0)
        [segment] = [os.path.join(directory, s) for s in segments(directory)]
        with open(segment, "ab") as f:
            f.write(torn_record(2, "short_payload"))
        await log.append(ops(1), 1)  # too big for the first segment: a roll
        assert segments(directory) == [f"seg-{1:020d}.log", f"seg-{2:020d}.log"]
        assert parse_segment(segment) == [1]  # no junk left behind in the finished segment
        assert seqs(await FileUpdateLog(directory).read(0)) == [1, 2]

    asyncio.run(main())


def test_file_cancelled_append_finishes_before_the_lock_is_released(tmp_path, monkeypatch):
    import threading

    entered, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        entered.set()
        release.wait(10)
        real_fsync(fd)

    async def main():
        log, other = FileUpdateLog(str(tmp_path / "log")), FileUpdateLog(str(tmp_path / "log"))
        monkeypatch.setattr(os, "fsync", slow_fsync)
        task = asyncio.create_task(log.append(ops(0), 0))
        assert await asyncio.to_thread(entered.wait, 10)
        task.cancel()
        competitor = asyncio.create_task(other.append(ops(9), 0))
        done, _ = await asyncio.wait({task, competitor}, timeout=0.1)
        assert not done  # the cancelled append still holds the lock, its write under way
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(SequenceConflict):  # the cancelled batch did land, as sequence 1
            await competitor
        assert [(e.sequence, e.ops) for e in await other.read(0)] == [(1, ops(0))]

    asyncio.run(main())


def test_file_append_fsyncs_file_and_new_segment_directory(tmp_path, monkeypatch):
    calls: list[str] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)

    async def main():
        log = FileUpdateLog(str(tmp_path / "log"))
        await log.append(ops(0), 0)
        assert calls == ["file", "dir"]  # a new segment: its name is made durable too
        await log.append(ops(1), 1)
        assert calls == ["file", "dir", "file"]
        with pytest.raises(SequenceConflict):
            await log.append(ops(1), 1)
        assert len(calls) == 3  # a conflict writes nothing

    asyncio.run(main())


def test_file_failed_write_appends_nothing(tmp_path, monkeypatch):
    real_pwrite = os.pwrite

    def half_then_enospc(fd: int, data: bytes, offset: int) -> int:
        real_pwrite(fd, data[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    async def main():
        log = FileUpdateLog(str(tmp_path / "log"))
        await log.append(ops(0), 0)
        monkeypatch.setattr(os, "pwrite", half_then_enospc)
        with pytest.raises(LogUnavailable) as info:
            await log.append(ops(1), 1)
        assert isinstance(info.value.__cause__, OSError)
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        assert await log.head() == 1
        assert seqs(await FileUpdateLog(log.directory).read(0)) == [1]
        assert (await log.append(ops(1), 1)).sequence == 2
        assert parse_segment(os.path.join(log.directory, segments(log.directory)[0])) == [1, 2]

    asyncio.run(main())


def test_file_segment_roll_and_whole_segment_trim(tmp_path, monkeypatch):
    roll = 400  # bytes: small segments, so that a few appends roll them
    directory = str(tmp_path / "log")

    async def main():
        writer, tailer, late = (FileUpdateLog(directory, segment_bytes=roll) for _ in range(3))
        for i in range(20):
            await writer.append(ops(i), i)
            assert seqs(await tailer.read(i)) == [i + 1]  # tails across every roll

        names = segments(directory)
        firsts = [int(n[4:-4]) for n in names]
        assert len(names) >= 4 and firsts[0] == 1
        for name, first in zip(names, firsts):
            path = os.path.join(directory, name)
            records = parse_segment(path)
            assert records[0] == first  # named after its first sequence
            assert os.path.getsize(path) <= 400 or len(records) == 1
        assert [s for n in names for s in parse_segment(os.path.join(directory, n))] == list(range(1, 21))
        assert seqs(await late.read(0)) == list(range(1, 21))
        assert seqs(await late.read(0, limit=7)) + seqs(await late.read(7, limit=7)) == list(range(1, 15))

        # Whole segments only: the one holding 10 stays, with everything after it.
        kept = max(f for f in firsts if f <= 10)
        assert await writer.trim(9) == kept - 1
        assert segments(directory) == names[firsts.index(kept) :]
        with pytest.raises(LogTrimmed):
            await late.read(kept - 2)  # its cursor's segment is gone
        assert seqs(await late.read(kept - 1)) == list(range(kept, 21))

        # Everything: an empty segment of the next sequence keeps the head.
        assert await writer.trim(20) == 20 - kept + 1
        assert segments(directory) == [f"seg-{21:020d}.log"]
        assert os.path.getsize(os.path.join(directory, segments(directory)[0])) == 0
        fresh = FileUpdateLog(directory)
        assert await fresh.head() == 20 and await fresh.read(20) == []
        assert await tailer.read(20) == [] and await tailer.wait(20, 0.05) is False
        assert (await fresh.append(ops(20), 20)).sequence == 21
        assert parse_segment(os.path.join(directory, f"seg-{21:020d}.log")) == [21]
        assert seqs(await tailer.read(20)) == [21]

    asyncio.run(main())


def test_file_writer_lock_excludes_other_writers_until_released(tmp_path):
    directory = str(tmp_path / "log")

    async def main():
        holder, other = FileUpdateLog(directory), FileUpdateLog(directory)
        async with holder.writer_lock():
            head = await holder.head()
            blocked = asyncio.create_task(other.append(ops(0), 0))
            done, _ = await asyncio.wait({blocked}, timeout=0.1)
            assert not done  # waits on the file lock, with the loop free
            await holder.append(ops(1), head)  # re-entrant for the task holding it
        with pytest.raises(SequenceConflict):  # it ran after the holder's append, as it must
            await blocked
        assert seqs(await other.read(0)) == [1]

    asyncio.run(main())


def test_file_writer_lock_times_out_as_unavailable(tmp_path):
    import fcntl

    directory = str(tmp_path / "log")
    log = FileUpdateLog(directory, lock_timeout_s=0.05)
    with open(os.path.join(directory, ".lock"), "a") as f:  # another process's writer, stuck
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        with pytest.raises(LogUnavailable):
            asyncio.run(log.append(ops(0), 0))
    assert asyncio.run(log.append(ops(0), 0)).sequence == 1


# -- the Redis log -----------------------------------------------------------------------------


@pytest.mark.integration
def test_redis_layout_and_exact_trim(redis_standalone):
    import redis

    async def main():
        log = RedisUpdateLog.from_url(redis_standalone.url, key="layout")
        try:
            for i in range(10):
                await log.append(ops(i), i)
            await log.publish_status("w1", {"applied": 10})
            with redis.Redis(port=redis_standalone.port) as r:
                assert r.get("{layout}:head") == b"10"
                stream = r.xrange("{layout}:stream")
                assert [entry_id for entry_id, _ in stream] == [f"{s}-1".encode() for s in range(1, 11)]
                doc = orjson.loads(stream[0][1][b"p"])
                assert doc["ops"] == ops(0) and isinstance(doc["acked_at"], float)
                assert orjson.loads(r.hget("{layout}:workers", "w1"))["applied"] == 10
            assert await log.trim(4) == 4  # a stream trims exactly
            with pytest.raises(LogTrimmed):
                await log.read(3)
            assert seqs(await log.read(4)) == list(range(5, 11))
        finally:
            await log.close()

    asyncio.run(main())


@pytest.mark.integration
def test_redis_cluster_keys_share_a_slot(redis_cluster):
    from redis.crc import key_slot

    log = RedisUpdateLog.from_url(redis_cluster.url, key="slots")
    assert len({key_slot(k.encode()) for k in (log.stream_key, log.head_key, log.workers_key)}) == 1
    asyncio.run(log.close())


@pytest.mark.integration
def test_redis_down_is_log_unavailable_then_it_recovers(redis_standalone):
    async def main():
        log = RedisUpdateLog.from_url(redis_standalone.url, key="down", timeout_s=1.0, socket_timeout_s=1.0)
        try:
            await log.append(ops(0), 0)
            redis_standalone.kill()
            calls = [
                lambda: log.head(),
                lambda: log.append(ops(1), 1),
                lambda: log.read(0),
                lambda: log.wait(0, 0.05),
                lambda: log.trim(1),
                lambda: log.publish_status("w", {}),
                lambda: log.statuses(),
            ]
            for call in calls:
                with pytest.raises(LogUnavailable) as info:
                    await call()
                assert info.value.__cause__ is not None
            redis_standalone.start()
            assert await log.head() == 0  # this test server keeps nothing: it came back empty
            assert (await log.append(ops(0), 0)).sequence == 1
            assert seqs(await log.read(0)) == [1]
            assert await log.wait(0, 0.05) is True
        finally:
            await log.close()

    asyncio.run(main())


# -- the Redis log's durability check ------------------------------------------------------------

# A server configured as the cache of bentos/k8s/redis-cluster.yaml, and one as redis-log.yaml.
CACHE_ARGS = ["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]  # + the harness's appendonly no
DURABLE_ARGS = ["--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"]


@pytest.fixture
def redis_server(tmp_path):
    """``redis_server(*extra_args)``: a fresh redis-server so configured, stopped after the test."""
    from harness.redis_servers import RedisServer, redis_available

    if not redis_available():
        pytest.skip("redis-server / redis-cli not installed")
    servers = []

    def start(*extra_args: str):
        server = RedisServer(str(tmp_path / f"redis-{len(servers)}"), extra_args=list(extra_args))
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


def check_durability(url: str) -> list[str]:
    async def main():
        log = RedisUpdateLog.from_url(url, key="durability", timeout_s=5.0, socket_timeout_s=5.0)
        try:
            return await log.check_durability()
        finally:
            await log.close()

    return asyncio.run(main())


def warned(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "graphsage.graph" and r.levelname == "WARNING"]


@pytest.mark.parametrize(
    "config, wanted",
    [
        ({"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"}, []),
        # volatile-* evicts only keys with a TTL, and the log's keys have none.
        ({"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "volatile-lru"}, []),
        (
            {"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "allkeys-lfu"},
            ["maxmemory-policy allkeys-lfu"],
        ),
        ({"appendonly": "no", "appendfsync": "always", "maxmemory-policy": "noeviction"}, ["appendonly no"]),
        ({"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"}, ["appendfsync everysec"]),
        (
            {"appendonly": "no", "appendfsync": "everysec", "maxmemory-policy": "allkeys-lru"},
            ["maxmemory-policy allkeys-lru", "appendonly no"],
        ),
        (
            {"appendonly": None, "appendfsync": None, "maxmemory-policy": None},
            ["maxmemory-policy could not be read", "appendonly could not be read"],
        ),
        (
            {"appendonly": "yes", "appendfsync": None, "maxmemory-policy": "noeviction"},
            ["appendfsync could not be read"],
        ),
    ],
)
def test_durability_problems_name_the_server_the_setting_and_the_loss(config, wanted):
    problems = update_log.durability_problems("10.0.0.7:6379", config)
    assert len(problems) == len(wanted), problems
    for problem, setting in zip(problems, wanted):
        assert problem.startswith("Redis 10.0.0.7:6379: " + setting), problem
        assert "acknowledged graph updates can be lost" in problem


@pytest.mark.integration
def test_redis_durability_check_warns_about_a_cache_not_about_a_durable_server(redis_server, caplog):
    cache, durable = redis_server(*CACHE_ARGS), redis_server(*DURABLE_ARGS)
    caplog.set_level("WARNING", logger="graphsage.graph")
    warnings = check_durability(cache.url)
    assert warned(caplog) == warnings and len(warnings) == 2, warnings
    for warning, setting in zip(warnings, ("maxmemory-policy allkeys-lru", "appendonly no")):
        assert warning.startswith(f"Redis 127.0.0.1:{cache.port}: {setting}"), warning
        assert "acknowledged graph updates can be lost" in warning
    caplog.clear()
    assert check_durability(durable.url) == [] and warned(caplog) == []

    # A warning, not a refusal: the log works on the cache all the same.
    async def append_on_cache():
        log = RedisUpdateLog.from_url(cache.url, key="durability")
        try:
            return (await log.append(ops(0), 0)).sequence
        finally:
            await log.close()

    assert asyncio.run(append_on_cache()) == 1


@pytest.mark.integration
def test_redis_durability_check_says_when_it_cannot_check(redis_server, caplog):
    """CONFIG renamed away (as some managed services do), or no server at all."""
    hidden = redis_server(*DURABLE_ARGS, "--rename-command", "CONFIG", "")
    caplog.set_level("WARNING", logger="graphsage.graph")
    [warning] = check_durability(hidden.url)
    assert warning.startswith(f"Redis 127.0.0.1:{hidden.port}: the update log's durability could not be checked")
    assert "ResponseError" in warning and "acknowledged graph updates can be lost" in warning
    assert warned(caplog) == [warning]
    hidden.kill()
    [down] = check_durability(hidden.url)
    assert "could not be checked" in down and "ConnectionError" in down


@pytest.mark.integration
def test_redis_durability_check_reads_every_cluster_master(redis_cluster, caplog):
    caplog.set_level("WARNING", logger="graphsage.graph")
    warnings = check_durability(redis_cluster.url)
    # The session's cluster keeps nothing on disk: one warning per master, each naming it.
    masters = {f"127.0.0.1:{port}" for port, role in redis_cluster.roles().items() if role == "master"}
    assert len(masters) == 3 and len(warnings) == 3, warnings
    assert {w.split(": ", 1)[0].removeprefix("Redis ") for w in warnings} == masters
    assert all(": appendonly no:" in w for w in warnings)
