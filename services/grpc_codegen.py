"""Generate the Python gRPC stubs of ``services/proto`` into ``services/grpc_gen`` (not committed).

Run at install time (``make install``)::

    python -m services.grpc_codegen          # generate when missing or older than the .proto
    python -m services.grpc_codegen --force  # always regenerate

``services.grpc_server`` calls ``ensure_stubs()`` before importing them, so a fresh checkout
works even when that step was skipped (it then needs ``grpcio-tools`` and a writable tree).

Layout (the proto is compiled as ``graphsage/v1/predict.proto``, its canonical name, which is
also the file name that server reflection reports)::

    services/grpc_gen/__init__.py
    services/grpc_gen/graphsage/__init__.py
    services/grpc_gen/graphsage/v1/{__init__,predict_pb2,predict_pb2_grpc}.py (+ predict_pb2.pyi)

Import paths: protoc writes ``from graphsage.v1 import predict_pb2`` into ``predict_pb2_grpc.py``,
an absolute import that only works with ``services/grpc_gen`` on ``sys.path``. That would make a
top-level package named ``graphsage`` visible to the whole gateway process (BentoML workers,
whatever else is installed), where any other ``graphsage`` distribution or module shadows it
or is shadowed by it. Instead, each generated import of a module generated here is rewritten to
a relative one (``from . import predict_pb2``), and the rewrite is verified: if a future protoc
writes an import this does not recognise, generation fails loudly instead of producing stubs
that break at import time. ``sys.path`` is never touched.

Concurrency: several gateway workers may call ``ensure_stubs()`` at once on a fresh checkout;
an ``flock`` serialises them, stubs are generated in a temporary directory and moved in with
``os.replace`` (pb2 before pb2_grpc), so no process ever imports a half-written file.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

SERVICES_DIR = Path(__file__).resolve().parent
PROTO_ROOT = SERVICES_DIR / "proto"
GEN_DIR = SERVICES_DIR / "grpc_gen"
GEN_PACKAGE = "services.grpc_gen"
# Relative to PROTO_ROOT: the proto's canonical name (package graphsage.v1).
PROTOS = ("graphsage/v1/predict.proto",)
_LOCK_NAME = ".codegen.lock"


class StubGenerationError(ImportError):
    """The stubs are missing and cannot be generated. An ImportError, so that a caller that
    treats the gRPC front end as optional (the gateway) keeps serving HTTP."""


def _show(path: Path) -> str:
    try:
        return str(path.relative_to(SERVICES_DIR.parent))
    except ValueError:
        return str(path)


def _outputs(proto: str) -> list[Path]:
    stem = GEN_DIR / proto[: -len(".proto")]
    return [stem.with_name(stem.name + "_pb2.py"), stem.with_name(stem.name + "_pb2_grpc.py")]


def _packages(proto: str) -> list[Path]:
    """Directories that need an ``__init__.py``: GEN_DIR and every directory of the proto."""
    dirs = [GEN_DIR]
    for part in Path(proto).parent.parts:
        dirs.append(dirs[-1] / part)
    return dirs


def stale_reasons() -> list[str]:
    """Why the stubs must be (re)generated; empty when they are up to date."""
    reasons = []
    for proto in PROTOS:
        src = PROTO_ROOT / proto
        for out in _outputs(proto):
            if not out.exists():
                reasons.append(f"{_show(out)} is missing")
            elif src.exists() and out.stat().st_mtime < src.stat().st_mtime:
                reasons.append(f"{_show(out)} is older than {proto}")
        for pkg in _packages(proto):
            if not (pkg / "__init__.py").exists():
                reasons.append(f"{_show(pkg / '__init__.py')} is missing")
    return reasons


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    GEN_DIR.mkdir(parents=True, exist_ok=True)
    with open(GEN_DIR / _LOCK_NAME, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _module_names() -> dict[str, str]:
    """Generated modules by dotted name as protoc imports them: ``graphsage.v1.predict_pb2``."""
    names = {}
    for proto in PROTOS:
        dotted = proto[: -len(".proto")].replace("/", ".")
        names[dotted + "_pb2"] = dotted.rpartition(".")[0]
    return names


def _relativise(path: Path, proto: str) -> None:
    """Rewrite ``from graphsage.v1 import predict_pb2 as x`` / ``import graphsage.v1.predict_pb2``
    (modules generated here) to imports relative to the importing module's package."""
    here_pkg = proto[: -len(".proto")].replace("/", ".").rpartition(".")[0]
    text = path.read_text(encoding="utf-8")

    def rel(target_pkg: str) -> str:
        here, there = here_pkg.split("."), target_pkg.split(".")
        common = 0
        while common < min(len(here), len(there)) and here[common] == there[common]:
            common += 1
        dots = "." * (len(here) - common + 1)
        return dots + ".".join(there[common:])

    for module, pkg in _module_names().items():
        leaf = module.rpartition(".")[2]
        text = re.sub(rf"^from {re.escape(pkg)} import {leaf}\b", f"from {rel(pkg)} import {leaf}", text, flags=re.M)
        text = re.sub(
            rf"^import {re.escape(module)} as (\w+)$", rf"from {rel(pkg)} import {leaf} as \1", text, flags=re.M
        )
    top_levels = {m.split(".")[0] for m in _module_names()}
    for top in top_levels:
        left = re.search(rf"^\s*(from|import) {re.escape(top)}(\.|\s)", text, flags=re.M)
        if left:
            raise StubGenerationError(
                f"{path.name}: unrecognised generated import {left.group(0).strip()!r}; "
                "services/grpc_codegen.py must learn to rewrite it"
            )
    path.write_text(text, encoding="utf-8")


def _run_protoc(out_dir: Path) -> None:
    try:
        from importlib import resources

        from grpc_tools import protoc
    except ImportError as exc:
        raise StubGenerationError(
            "gRPC stubs are missing and grpcio-tools is not installed: "
            "pip install grpcio-tools, then python -m services.grpc_codegen"
        ) from exc
    google_protos = resources.files("grpc_tools") / "_proto"
    with resources.as_file(google_protos) as include:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            *PROTOS,
        ]
        rc = protoc.main(args)
    if rc != 0:
        raise StubGenerationError(f"protoc failed (exit {rc}) on {', '.join(PROTOS)}; see stderr")


def generate() -> list[Path]:
    """Generate unconditionally (callers hold the lock). Returns the files written."""
    missing = [p for p in PROTOS if not (PROTO_ROOT / p).exists()]
    if missing:
        raise StubGenerationError(f"proto file(s) not found under {PROTO_ROOT}: {missing}")
    written = []
    tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=GEN_DIR))
    try:
        _run_protoc(tmp)
        for proto in PROTOS:
            for pkg in _packages(proto):
                pkg.mkdir(parents=True, exist_ok=True)
                init = pkg / "__init__.py"
                if not init.exists():
                    init.write_text('"""Generated by services.grpc_codegen; do not edit."""\n')
                    written.append(init)
            stem = proto[: -len(".proto")]
            # pb2 before pb2_grpc: a reader that sees the new pb2_grpc also sees its pb2.
            for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
                src = tmp / (stem + suffix)
                if not src.exists():
                    continue
                if suffix == "_pb2_grpc.py" or suffix == "_pb2.py":
                    _relativise(src, proto)
                dst = GEN_DIR / (stem + suffix)
                os.replace(src, dst)
                written.append(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written


def ensure_stubs(force: bool = False) -> None:
    """Generate the stubs when missing or older than their .proto (or always with ``force``).

    Stubs that exist but look stale are kept, with a warning, when they cannot be regenerated
    (no grpcio-tools, read-only tree): an installed bento may ship stubs without the .proto.
    Raises ``StubGenerationError`` (an ImportError) only when there are no usable stubs."""
    if not force and not stale_reasons():
        return
    try:
        with _locked():
            reasons = stale_reasons()  # another process may have generated them meanwhile
            if not force and not reasons:
                return
            written = generate()
            log.info(
                "gRPC stubs generated (%s): %s", "; ".join(reasons) or "forced", ", ".join(_show(p) for p in written)
            )
    except (OSError, StubGenerationError) as exc:
        usable = all(out.exists() for proto in PROTOS for out in _outputs(proto)) and all(
            (pkg / "__init__.py").exists() for proto in PROTOS for pkg in _packages(proto)
        )
        if usable and not force:
            log.warning("gRPC stubs look stale but could not be regenerated (%s); using them", exc)
            return
        if isinstance(exc, StubGenerationError):
            raise
        raise StubGenerationError(f"cannot generate gRPC stubs into {GEN_DIR}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.grpc_codegen", description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="regenerate even when up to date")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        ensure_stubs(force=args.force)
    except StubGenerationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    reasons = stale_reasons()
    print("gRPC stubs up to date in services/grpc_gen" if not reasons else f"stubs stale: {reasons}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
