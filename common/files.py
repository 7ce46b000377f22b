"""Small file primitives shared by the key file and the routing table, both edited by CLIs and
admin calls while every gateway worker polls them."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any


def atomic_write_json(path: str, doc: Any, mode: int = 0o644) -> None:
    """Write JSON so that readers see the old file or the new one, never a partial one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)
            json.dump(doc, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Serialise read-modify-write cycles of ``path`` between processes (``path.lock``)."""
    with open(os.path.abspath(path) + ".lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def file_signature(path: str) -> tuple[int, int, int] | None:
    """(mtime, size, inode), or None when missing: cheap change detection for polling."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
