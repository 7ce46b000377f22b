"""A lean pipelined Redis connection for the L2 read path: an asyncio Protocol and hiredis.

Why not redis-py here: the L2 read is one ``MGET`` per feature batch, on the request's critical
path, and the same command written to a transport and parsed by hiredis took a fraction of the
time it takes through redis-py's asyncio client (``python bench/bench_cache.py --ids 140 --iters
2000``: "L2 MGET", redis-py against the lean connection). redis-py packs each argument in Python,
takes a connection from its pool under a lock and reads through a StreamReader; here the command
is one ``bytes`` and replies are parsed as they arrive. Everything else (writes, Cluster, TLS,
unix sockets) stays on redis-py.

One connection, pipelined: concurrent callers write their commands back to back and their
futures wait in arrival order, which is the order Redis answers in. A caller that gives up
(deadline, cancellation) closes the connection, so a late reply can never reach the wrong
caller; the next call reconnects.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import hiredis


class RespError(Exception):
    """Redis answered with an error reply."""


def pack_command(*args: bytes) -> bytes:
    """One RESP array of bulk strings."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._reader = hiredis.Reader()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        try:
            while (reply := self._reader.gets()) is not False:
                future = self.waiting.popleft()
                if future.done():
                    continue
                if isinstance(reply, hiredis.ReplyError):
                    future.set_exception(RespError(str(reply)))
                else:
                    future.set_result(reply)
        except (hiredis.ProtocolError, IndexError) as exc:  # garbage, or a reply nobody asked for
            self.abort(ConnectionError(f"Redis protocol error: {exc!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.abort(ConnectionError(f"Redis connection lost: {exc!r}" if exc else "Redis connection closed"))

    def abort(self, error: Exception) -> None:
        transport, self.transport = self.transport, None
        if transport is not None:
            transport.abort()
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)


class RespConnection:
    """``await execute(packed)`` -> the reply. Connects on first use and after any failure."""

    def __init__(
        self, host: str, port: int, *, username: str | None = None, password: str | None = None, db: int = 0
    ) -> None:
        self.host, self.port = host, port
        self._hello = [pack_command(b"AUTH", *[s.encode() for s in (username, password) if s])] if password else []
        if db:
            self._hello.append(pack_command(b"SELECT", str(db).encode()))
        self._protocol: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None

    @classmethod
    def like(cls, client: Any) -> RespConnection | None:
        """A connection to the server a standalone redis-py client talks to, or None when that
        client uses something this class does not speak (TLS, a unix socket, a custom class)."""
        from redis.asyncio.connection import Connection

        pool = getattr(client, "connection_pool", None)
        if pool is None or pool.connection_class is not Connection:
            return None
        kw = pool.connection_kwargs
        return cls(
            kw.get("host", "localhost"),
            int(kw.get("port", 6379)),
            username=kw.get("username"),
            password=kw.get("password"),
            db=int(kw.get("db") or 0),
        )

    async def execute(self, packed: bytes) -> Any:
        loop = asyncio.get_running_loop()
        protocol = self._protocol
        if protocol is None or protocol.transport is None or self._loop is not loop:
            protocol = await self._connect(loop)
        future = loop.create_future()
        protocol.waiting.append(future)
        protocol.transport.write(packed)  # type: ignore[union-attr]
        try:
            return await future
        except asyncio.CancelledError:
            protocol.abort(ConnectionError("a caller gave up on its reply"))
            raise

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Protocol:
        if self._loop is not loop:  # first use, or used from another event loop (tests, tools)
            self.close()
            self._loop, self._connecting = loop, asyncio.Lock()
        async with self._connecting:  # type: ignore[union-attr]
            protocol = self._protocol
            if protocol is not None and protocol.transport is not None:
                return protocol  # another caller connected meanwhile
            _, protocol = await loop.create_connection(_Protocol, self.host, self.port)
            try:
                for command in self._hello:
                    future = loop.create_future()
                    protocol.waiting.append(future)
                    protocol.transport.write(command)  # type: ignore[union-attr]
                    await future
            except BaseException:
                protocol.abort(ConnectionError("AUTH/SELECT failed"))
                raise
            self._protocol = protocol
            return protocol

    def close(self) -> None:
        if self._protocol is not None:
            self._protocol.abort(ConnectionError("connection closed"))
            self._protocol = None
