"""A memory limit for a process tree, as a container's limit holds it: a cgroup (v1) with
``memory.limit_in_bytes``; its members' anonymous memory and the page cache of the files they read
first are charged to it. Used by tests and benchmarks to run a service under a limit; where no
cgroup can be made (no writable memory controller), ``available`` says why.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")  # cgroup v1's memory controller


class MemoryLimit:
    """A cgroup (v1) whose ``memory.limit_in_bytes`` a child runs under, as a container's limit
    would hold it: its anonymous memory and the page cache of the files it reads are charged."""

    def __init__(self, limit_bytes: int) -> None:
        self.path = CGROUP_ROOT / f"gsage-limit-{os.getpid()}-{time.monotonic_ns()}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        self.limit_bytes = limit_bytes

    @staticmethod
    def available() -> str:
        """Empty when a cgroup can be made here, else why not."""
        try:
            probe = CGROUP_ROOT / f"gsage-probe-{os.getpid()}"
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return f"no writable cgroup v1 memory controller at {CGROUP_ROOT} ({exc})"
        return ""

    def enter(self, pid: int) -> None:
        """Put ``pid`` under the limit (the children it forks from now on follow it)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def figures(self) -> dict[str, Any]:
        read = lambda name: int((self.path / name).read_text())  # noqa: E731
        return {
            "limit_mb": round(self.limit_bytes / 2**20, 1),
            "max_usage_mb": round(read("memory.max_usage_in_bytes") / 2**20, 1),
            "limit_hit": read("memory.failcnt"),
        }

    def __enter__(self) -> MemoryLimit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
