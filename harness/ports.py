"""Free loopback ports for the servers that tests and benchmarks start.

``bind(0)`` alone is not enough: the port is released before the server binds it, and the kernel
may hand it out again, to the next ``bind(0)`` in this process or as the source port of any
outgoing connection, because ``bind(0)`` draws from the ephemeral range. Two servers sharing a
port fail in confusing ways (a gRPC client reaching an HTTP/1 server, a cluster node that never
started). So ports come from below the ephemeral range, each at most once per process, and each
is checked bindable first.
"""

from __future__ import annotations

import random
import socket
import threading

HOST = "127.0.0.1"
_LOWEST = 10000
_given: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()  # processes started together must not draw the same sequence


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux default


def _candidates() -> range:
    low, high = _ephemeral_range()
    if low - _LOWEST >= 2000:
        return range(_LOWEST, low)
    return range(max(high + 1, _LOWEST), 65536) if 65536 - high > 2000 else range(_LOWEST, 65536)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on, never returned before in this process."""
    pool = _candidates()
    with _lock:
        for _ in range(1000):
            port = _random.choice(pool)
            if port not in _given and _bindable(port):
                _given.add(port)
                return port
    raise RuntimeError(f"no free loopback port in {pool.start}-{pool.stop - 1}")
