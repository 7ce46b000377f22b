"""Throw-away Redis servers for tests and benchmarks: standalone and a 3-master Cluster.

Every server is a ``redis-server`` child process on a free loopback port, without persistence,
stopped by PID when the helper closes. Nothing relies on a server that was already running (the
shared one on 6379 is never touched). Every wait is bounded and fails with the server's log tail.

    with RedisServer(tmp_dir) as server:          # server.url == "redis://127.0.0.1:<port>/0"
        server.kill(); server.start()              # same port, empty data

    with RedisCluster3(tmp_dir) as cluster:        # cluster.url == "redis+cluster://127.0.0.1:<p>"
        cluster.nodes[1].kill(); cluster.nodes[1].start(); cluster.wait_state("ok")
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence

from harness.ports import free_port
from harness.tls import Certificate

STARTUP_TIMEOUT_S = 10.0
CLUSTER_TIMEOUT_S = 20.0
HOST = "127.0.0.1"


def redis_available() -> bool:
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


def _resp(*args: str) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def raw_command(port: int, *args: str, timeout: float = 1.0) -> bytes:
    """Send one command over a fresh socket and return the raw reply (enough for PING/INFO)."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(_resp(*args))
        reply = sock.recv(65536)
        if reply.startswith(b"$"):  # bulk string: read until the announced length is in
            header, _, body = reply.partition(b"\r\n")
            need = int(header[1:]) + 2
            while len(body) < need:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
            return body[:-2]
        return reply


class RedisServer:
    """One ``redis-server`` process; ``start`` / ``kill`` / ``stop`` can be repeated."""

    def __init__(
        self, workdir: str, port: int | None = None, extra_args: Sequence[str] = (), tls: Certificate | None = None
    ):
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        # TLS on a second port (``tls_url``); the plain port stays for the helpers' PING and INFO.
        self.tls = tls
        self.tls_port = free_port() if tls is not None else None
        if tls is not None:
            self.extra_args += [
                "--tls-port",
                str(self.tls_port),
                "--tls-cert-file",
                tls.cert_file,
                "--tls-key-file",
                tls.key_file,
                "--tls-ca-cert-file",
                tls.ca_file,
                "--tls-auth-clients",
                "no",
            ]
        self.log_path = os.path.join(workdir, f"redis-{self.port}.log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def tls_url(self) -> str:
        if self.tls_port is None:
            raise ValueError("this server was started without TLS")
        return f"rediss://{HOST}:{self.tls_port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> RedisServer:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        cmd = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            self.workdir,
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if raw_command(self.port, "PING", timeout=0.5).startswith(b"+PONG"):
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"redis-server on port {self.port} did not answer PING in {timeout}s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: the abrupt death of a server (its data is gone; no persistence)."""
        self._signal_and_reap(signal.SIGKILL)

    def stop(self) -> None:
        self._signal_and_reap(signal.SIGTERM)

    def pause(self) -> None:
        """SIGSTOP: the server hangs (connections open, no replies), like a stalled host."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self, timeout: float = STARTUP_TIMEOUT_S) -> RedisServer:
        self.kill()
        return self.start(timeout)

    def _signal_and_reap(self, sig: signal.Signals) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
        os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def info(self, section: str = "") -> dict[str, str]:
        text = raw_command(self.port, "INFO", *([section] if section else [])).decode()
        pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
        return {k: v for k, v in pairs}

    def dbsize(self) -> int:
        reply = raw_command(self.port, "DBSIZE")
        return int(reply[1:].strip())

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode(errors="replace")
        except OSError:
            return "<no log>"

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisCluster3:
    """Three masters (and ``replicas`` replicas each, default none), each node with its own free
    client and cluster-bus port."""

    def __init__(self, workdir: str, masters: int = 3, node_timeout_ms: int = 1000, replicas: int = 0):
        self.workdir = workdir
        self.replicas = replicas
        self.nodes: list[RedisServer] = []
        for i in range(masters * (1 + replicas)):
            port, bus = free_port(), free_port()
            args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                os.path.join(workdir, f"nodes-{i}.conf"),
                "--cluster-port",
                str(bus),
                "--cluster-node-timeout",
                str(node_timeout_ms),
            ]
            self.nodes.append(RedisServer(workdir, port=port, extra_args=args))

    @property
    def url(self) -> str:
        return f"redis+cluster://{HOST}:{self.nodes[0].port}"

    def start(self, timeout: float = CLUSTER_TIMEOUT_S) -> RedisCluster3:
        try:
            for node in self.nodes:
                node.start()
            addrs = [f"{HOST}:{node.port}" for node in self.nodes]
            result = subprocess.run(
                ["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            if result.returncode != 0:
                raise RuntimeError(
                    "redis-cli --cluster create failed:\n"
                    + result.stdout.decode(errors="replace")[-2000:]
                    + result.stderr.decode(errors="replace")[-2000:]
                )
            self.wait_state("ok", timeout)
            if self.replicas:
                self.wait_replicas_synced(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def state(self, node: RedisServer) -> str:
        text = raw_command(node.port, "CLUSTER", "INFO").decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("cluster_state:"):
                return line.split(":", 1)[1].strip()
        return "unknown"

    def wait_state(
        self, want: str, timeout: float = CLUSTER_TIMEOUT_S, nodes: Sequence[RedisServer] | None = None
    ) -> None:
        """Wait until every (running) node reports ``cluster_state:<want>``."""
        nodes = list(nodes or [n for n in self.nodes if n.proc is not None])
        deadline = time.monotonic() + timeout
        seen: dict[int, str] = {}
        while time.monotonic() < deadline:
            for node in nodes:
                try:
                    seen[node.port] = self.state(node)
                except OSError as exc:
                    seen[node.port] = f"unreachable ({exc})"
            if all(s == want for s in seen.values()):
                return
            time.sleep(0.05)
        raise TimeoutError(f"cluster not {want!r} after {timeout}s: {seen}")

    def wait_replicas_synced(self, timeout: float = CLUSTER_TIMEOUT_S) -> None:
        """Wait until every running replica's link to its master is up (its first full sync
        done): before that, a ``WAIT`` for one replica cannot succeed."""
        deadline = time.monotonic() + timeout
        pending: list[int] = []
        while time.monotonic() < deadline:
            pending = []
            for node in self.nodes:
                if node.proc is None:
                    continue
                with contextlib.suppress(OSError):
                    info = raw_command(node.port, "INFO", "replication").decode(errors="replace")
                    if "role:slave" in info and "master_link_status:up" not in info:
                        pending.append(node.port)
            if not pending:
                return
            time.sleep(0.05)
        raise TimeoutError(f"replicas on ports {pending} not synced with their masters after {timeout}s")

    def master_of_slot(self, slot: int) -> RedisServer:
        """The running node that serves ``slot`` now (it changes with a failover)."""
        for node in self.nodes:
            if node.proc is None:
                continue
            with contextlib.suppress(OSError):
                for line in raw_command(node.port, "CLUSTER", "NODES").decode(errors="replace").splitlines():
                    fields = line.split()
                    if len(fields) < 8 or "master" not in fields[2] or "fail" in fields[2] or "myself" not in fields[2]:
                        continue
                    for part in fields[8:]:
                        lo, _, hi = part.partition("-")
                        if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                            return node
        raise LookupError(f"no running master serves slot {slot}")

    def roles(self) -> dict[int, str]:
        """Port -> "master" or "slave", as the running nodes report themselves."""
        out = {}
        for node in self.nodes:
            if node.proc is None:
                continue
            with contextlib.suppress(OSError):
                info = raw_command(node.port, "INFO", "replication").decode(errors="replace")
                out[node.port] = next(
                    line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("role:")
                )
        return out

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisCluster3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
