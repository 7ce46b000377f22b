"""Release commands: build the bento, produce the image build context, containerize.

::

    python -m bentos.release build [--gpu] [--model TAG ...] [--version V]
        # stubs (services.grpc_codegen) -> model tags resolved to concrete versions
        # -> build/bentofile[.gpu].resolved.yaml -> `bentoml build`; prints the bento tag (stdout)
    python -m bentos.release context [TAG] --out build/context [--no-buildkit]
        # the complete OCI build context (Dockerfile, bento, models) via BentoML's own
        # construct_containerfile; build it with kaniko / buildah / docker buildx
    python -m bentos.release containerize [TAG] [-t IMAGE] [--backend docker]
        # `bentoml containerize` where a Docker/BuildKit daemon answers; else the context

Model pinning: the bentofile lists ``graph-snapshot:latest`` and ``graphsage:latest``. ``build``
resolves each to the concrete tag in the local model store (``$BENTOML_HOME/models``), so the
bento and the image carry exactly those versions, and sets ``GSAGE_SNAPSHOT_TAG`` /
``GSAGE_MODEL_TAGS`` to them (unless the bentofile sets them). ``--model NAME:V`` replaces the
bentofile's entries of that name; repeat it to pack several versions (a canary), the first of
a name being the default version: ``--model graphsage:v1 --model graphsage:v2``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BENTOFILE = ROOT / "bentofile.yaml"
GPU_BENTOFILE = ROOT / "bentos" / "bentofile.gpu.yaml"
BUILD_DIR = ROOT / "build"
SNAPSHOT_MODEL, GRAPHSAGE_MODEL = "graph-snapshot", "graphsage"
DOCKERFILE = "env/docker/Dockerfile"
_BUILT = re.compile(r'Successfully built Bento\(tag="([^"]+)"\)')


class ReleaseError(RuntimeError):
    pass


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _model_name(tag: str) -> str:
    return tag.split(":", 1)[0]


def _spec_tag(spec: Any) -> str:
    return spec if isinstance(spec, str) else str(spec["tag"])


def resolve_model(tag: str) -> str:
    """``name[:latest]`` -> ``name:<concrete version>`` in the local model store."""
    import bentoml
    from bentoml.exceptions import NotFound

    try:
        return str(bentoml.models.get(tag).tag)
    except NotFound as exc:
        raise ReleaseError(f"model {tag!r} is not in the model store ({_store_dir()}); "
                           "train one first: python -m training_export demo") from exc


def _store_dir() -> str:
    from common.bento.store import model_store_dir

    return model_store_dir()


def resolve_config(config: dict[str, Any], models: list[str] | None = None) -> dict[str, Any]:
    """The bentofile with every model tag concrete, ``--model`` overrides applied, and the
    runners' GSAGE_SNAPSHOT_TAG / GSAGE_MODEL_TAGS pinned to the packed versions."""
    cfg = dict(config)
    overrides = list(models or [])
    override_names = {_model_name(t) for t in overrides}
    kept = [s for s in cfg.get("models") or [] if _model_name(_spec_tag(s)) not in override_names]
    resolved: list[Any] = []
    seen: set[str] = set()
    for spec in [*kept, *overrides]:
        tag = resolve_model(_spec_tag(spec))
        if tag in seen:
            continue
        seen.add(tag)
        resolved.append(tag if isinstance(spec, str) else {**spec, "tag": tag})
    cfg["models"] = resolved
    tags = [_spec_tag(s) for s in resolved]
    snapshots = [t for t in tags if _model_name(t) == SNAPSHOT_MODEL]
    graphsage = [t for t in tags if _model_name(t) == GRAPHSAGE_MODEL]
    if len(snapshots) != 1:
        raise ReleaseError(f"exactly one {SNAPSHOT_MODEL} model must be packed, got {snapshots}")
    if not graphsage:
        raise ReleaseError(f"no {GRAPHSAGE_MODEL} model to pack")
    envs = [dict(e) for e in cfg.get("envs") or []]
    names = {e["name"] for e in envs}
    for name, value in (("GSAGE_SNAPSHOT_TAG", snapshots[0]), ("GSAGE_MODEL_TAGS", ",".join(graphsage))):
        if name not in names:
            envs.append({"name": name, "value": value})
    cfg["envs"] = envs
    cfg.setdefault("labels", {})
    cfg["labels"] = {**cfg["labels"], "graph-snapshot": snapshots[0].split(":")[1],
                     "graphsage": "_".join(t.split(":")[1] for t in graphsage)}
    return cfg


def write_requirements_in(config: dict[str, Any], path: Path) -> None:
    """The bentofile's packages and indexes as a requirements file, the input of
    ``uv pip compile`` for a locked image (docs/release.md, "Package locking")."""
    python = config.get("python") or {}
    lines = [f"--extra-index-url {url}" for url in python.get("extra_index_url") or []]
    if python.get("index_url"):
        lines.insert(0, f"--index-url {python['index_url']}")
    lines += list(python.get("packages") or [])
    path.write_text("\n".join(lines) + "\n")


def run_codegen() -> None:
    out = subprocess.run([sys.executable, "-m", "services.grpc_codegen"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise ReleaseError(f"gRPC stub generation failed:\n{out.stderr}{out.stdout}")
    _say(out.stdout.strip() or "gRPC stubs generated")


def build(bentofile: Path = BENTOFILE, models: list[str] | None = None, version: str | None = None,
          codegen: bool = True) -> str:
    """Codegen, resolve, ``bentoml build``; returns the bento tag."""
    if codegen:
        run_codegen()
    config = yaml.safe_load(bentofile.read_text())
    resolved = resolve_config(config, models)
    BUILD_DIR.mkdir(exist_ok=True)
    out_file = BUILD_DIR / (bentofile.stem + ".resolved.yaml")
    out_file.write_text("# Generated by `python -m bentos.release build` from "
                        f"{bentofile.relative_to(ROOT)}; do not edit.\n"
                        + yaml.safe_dump(resolved, sort_keys=False))
    write_requirements_in(resolved, BUILD_DIR / ("requirements" + (".gpu" if "gpu" in bentofile.stem else "") + ".in"))
    _say(f"models: {', '.join(_spec_tag(s) for s in resolved['models'])}")
    cmd = [sys.executable, "-m", "bentoml", "build", "-f", str(out_file)]
    if version:
        cmd += ["--version", version]
    cmd.append(str(ROOT))
    _say("$ " + " ".join(cmd))
    env = {**os.environ, "BENTOML_DO_NOT_TRACK": "true"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    sys.stderr.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise ReleaseError(f"bentoml build failed (exit {proc.returncode})")
    found = _BUILT.search(proc.stdout + proc.stderr)
    if not found:
        raise ReleaseError("bentoml build succeeded but printed no bento tag")
    return found.group(1)


@contextlib.contextmanager
def containerfile(tag_or_path: str | None, enable_buildkit: bool = True) -> Iterator[tuple[str, str]]:
    """BentoML's own build context for a bento (``common.bento.release.containerfile``)."""
    from common.bento.release import containerfile as bento_containerfile, load_bento

    with bento_containerfile(load_bento(tag_or_path), enable_buildkit) as built:
        yield built


def make_context(tag_or_path: str | None, out: Path, enable_buildkit: bool = True, force: bool = False) -> Path:
    """Write the complete build context to ``out``; returns ``out``. Its layout is the image's
    ``$BENTO_PATH`` (/home/bentoml/bento): ``bento.yaml``, ``src/``, ``models/``, ``env/``."""
    out = out.resolve()
    if out.exists():
        if not force and any(out.iterdir()):
            raise ReleaseError(f"{out} exists and is not empty (use --force)")
        shutil.rmtree(out)
    with containerfile(tag_or_path, enable_buildkit) as (ctx, _):
        shutil.copytree(ctx, out, symlinks=True)
    return out


def builder_commands(ctx: Path, image: str) -> list[str]:
    return [
        f"docker buildx build -f {ctx}/{DOCKERFILE} -t {image} {ctx}",
        f"buildah bud --layers -f {ctx}/{DOCKERFILE} -t {image} {ctx}",
        f"/kaniko/executor --context dir://{ctx} --dockerfile {DOCKERFILE} --destination {image}",
    ]


def containerize(tag: str | None, image: str | None, backend: str, out: Path) -> int:
    """``bentoml containerize`` when the backend's daemon answers; otherwise the context."""
    from common.bento.release import backend_available, load_bento

    bento = load_bento(tag)
    image = image or str(bento.tag)
    if backend_available(backend):
        # From the temp dir's parent: see containerfile() for the dockerfile_template check.
        cmd = [sys.executable, "-m", "bentoml", "containerize", str(bento.tag), "--backend", backend, "-t", image]
        _say("$ " + " ".join(cmd))
        return subprocess.call(cmd, cwd=tempfile.gettempdir())
    _say(f"no {backend} daemon here: writing the build context instead")
    ctx = make_context(str(bento.tag), out, force=True)
    print(ctx)
    _say("build it with any OCI builder:\n  " + "\n  ".join(builder_commands(ctx, image)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bentos.release", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build", help="codegen + pinned models + bentoml build; prints the tag")
    p.add_argument("--gpu", action="store_true", help=f"use {GPU_BENTOFILE.relative_to(ROOT)}")
    p.add_argument("-f", "--bentofile", type=Path, default=None)
    p.add_argument("--model", action="append", default=[], metavar="TAG",
                   help="pack this model (replaces the bentofile's entries of its name); repeatable")
    p.add_argument("--version", default=None)
    p.add_argument("--no-codegen", action="store_true")
    p = sub.add_parser("context", help="write the OCI build context (Dockerfile, bento, models)")
    p.add_argument("bento", nargs="?", default=None, help="tag or bento directory (default: latest)")
    p.add_argument("--out", type=Path, default=BUILD_DIR / "context")
    p.add_argument("--no-buildkit", action="store_true", help="no RUN --mount cache (classic builders)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p = sub.add_parser("containerize", help="bentoml containerize, or the context without a daemon")
    p.add_argument("bento", nargs="?", default=None)
    p.add_argument("-t", "--image", default=None)
    p.add_argument("--backend", default="docker")
    p.add_argument("--out", type=Path, default=BUILD_DIR / "context")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            bentofile = args.bentofile or (GPU_BENTOFILE if args.gpu else BENTOFILE)
            tag = build(bentofile.resolve(), args.model, args.version, codegen=not args.no_codegen)
            print(tag)
        elif args.cmd == "context":
            ctx = make_context(args.bento, args.out, enable_buildkit=not args.no_buildkit, force=args.force)
            print(ctx)
            _say(f"Dockerfile: {ctx / DOCKERFILE}\nbuild it with any OCI builder:\n  "
                 + "\n  ".join(builder_commands(ctx, "graphsage-serving:<version>")))
        else:
            return containerize(args.bento, args.image, args.backend, args.out)
    except ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
