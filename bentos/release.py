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
    python -m bentos.release image [TAG] [-t IMAGE ...] [--backend auto] [--find-links DIR]
        # `bentoml containerize` with buildah or podman where no daemon runs (bentos/image.py);
        # prints the image, its size and the build time

``build --base-image IMAGE`` sets the bentofile's ``docker.base_image`` (a local base made by
``make base-image`` where no registry is reachable); ``build --torch`` builds the torch image
(``bentos/bentofile.torch.yaml`` over ``bentofile.yaml``: training and the torch reference backend;
the serving image has no torch); ``--no-extra-index`` drops the bentofile's extra package indexes
(the PyTorch index, where it is unreachable and the wheels come from ``image --find-links``).

Model pinning: the bentofile lists ``graph-snapshot:latest`` and ``graphsage:latest``. ``build``
resolves each to the concrete tag in the local model store (``$BENTOML_HOME/models``), so the
bento and the image carry exactly those versions, and sets ``GSAGE_SNAPSHOT_TAG`` /
``GSAGE_MODEL_TAGS`` to them (unless the bentofile sets them). ``--model NAME:V`` replaces the
bentofile's entries of that name; repeat it to pack several versions (a canary), the first of
a name being the default version: ``--model graphsage:v1 --model graphsage:v2``. An unpinned
``graph-snapshot`` is the one the default version was trained on (its ``graph_snapshot``
metadata) when that is in the store, not the newest (a compacted one needs its update log).
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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BENTOFILE = ROOT / "bentofile.yaml"
GPU_BENTOFILE = ROOT / "bentos" / "bentofile.gpu.yaml"
TORCH_BENTOFILE = ROOT / "bentos" / "bentofile.torch.yaml"
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
        raise ReleaseError(
            f"model {tag!r} is not in the model store ({_store_dir()}); train one first: python -m training_export demo"
        ) from exc


def _store_dir() -> str:
    from common.bento.store import model_store_dir

    return model_store_dir()


def _unpinned(tag: str) -> bool:
    return ":" not in tag or tag.endswith(":latest")


def _training_snapshot(specs: list[Any]) -> str | None:
    """The snapshot the default ``graphsage`` version (the first listed) was trained on, from its
    metadata (``graph_snapshot``), when that snapshot is in the store. A newer snapshot (one
    ``training_export compact`` folded from an update log) is not what that version serves with
    in a fresh deployment; ``--model graph-snapshot:<v>`` still packs any one."""
    import bentoml
    from bentoml.exceptions import NotFound

    first = next((_spec_tag(s) for s in specs if _model_name(_spec_tag(s)) == GRAPHSAGE_MODEL), None)
    if first is None:
        return None
    try:
        snapshot = bentoml.models.get(first).info.metadata.get("graph_snapshot")
        if isinstance(snapshot, str) and snapshot:
            return str(bentoml.models.get(snapshot).tag)
    except NotFound:
        pass
    return None


def resolve_config(config: dict[str, Any], models: list[str] | None = None) -> dict[str, Any]:
    """The bentofile with every model tag concrete, ``--model`` overrides applied, and the
    runners' GSAGE_SNAPSHOT_TAG / GSAGE_MODEL_TAGS pinned to the packed versions."""
    cfg = dict(config)
    overrides = list(models or [])
    override_names = {_model_name(t) for t in overrides}
    kept = [s for s in cfg.get("models") or [] if _model_name(_spec_tag(s)) not in override_names]
    specs = [*kept, *overrides]
    trained_on = _training_snapshot(specs)
    resolved: list[Any] = []
    seen: set[str] = set()
    for spec in specs:
        tag = _spec_tag(spec)
        if trained_on and _model_name(tag) == SNAPSHOT_MODEL and _unpinned(tag):
            tag = trained_on  # the graph the default version was trained on, not the newest one
        tag = resolve_model(tag)
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
    cfg["labels"] = {
        **cfg["labels"],
        "graph-snapshot": snapshots[0].split(":")[1],
        "graphsage": "_".join(t.split(":")[1] for t in graphsage),
    }
    return cfg


def load_bentofile(path: Path) -> dict[str, Any]:
    """A bentofile; one with ``extends: <bentofile>`` (bentos/bentofile.torch.yaml) is laid over
    the one it names: mappings merged key by key, ``python.packages`` and
    ``python.extra_index_url`` appended, ``envs`` replaced by name, anything else replaced."""
    config = yaml.safe_load(path.read_text()) or {}
    base_name = config.pop("extends", None)
    if base_name is None:
        return config
    base = load_bentofile((path.parent / base_name).resolve())
    merged = dict(base)
    for key, value in config.items():
        if key == "python":
            python = dict(base.get("python") or {})
            for k, v in value.items():
                python[k] = [*(python.get(k) or []), *v] if k in ("packages", "extra_index_url") else v
            merged["python"] = python
        elif key == "envs":
            names = {e["name"] for e in value}
            merged["envs"] = [e for e in base.get("envs") or [] if e["name"] not in names] + list(value)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = {**base[key], **value}
        else:
            merged[key] = value
    return merged


def set_image_options(
    config: dict[str, Any],
    base_image: str | None = None,
    no_extra_index: bool = False,
    extra_indexes: Sequence[str] = (),
) -> dict[str, Any]:
    """``docker.base_image`` (BentoML then ignores ``distro``; dropped) and the extra indexes:
    the bentofile's dropped (``no_extra_index``), ``extra_indexes`` appended (named by the one
    who builds, never by a project file)."""
    cfg = dict(config)
    if base_image:
        docker = {k: v for k, v in (cfg.get("docker") or {}).items() if k not in ("distro", "system_packages")}
        cfg["docker"] = {**docker, "base_image": base_image}
    if no_extra_index and (cfg.get("python") or {}).get("extra_index_url"):
        cfg["python"] = {k: v for k, v in cfg["python"].items() if k != "extra_index_url"}
    if extra_indexes:
        python = dict(cfg.get("python") or {})
        python["extra_index_url"] = [*(python.get("extra_index_url") or []), *extra_indexes]
        cfg["python"] = python
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


def build(
    bentofile: Path = BENTOFILE,
    models: list[str] | None = None,
    version: str | None = None,
    codegen: bool = True,
    base_image: str | None = None,
    no_extra_index: bool = False,
    extra_indexes: Sequence[str] = (),
) -> str:
    """Codegen, resolve, ``bentoml build``; returns the bento tag."""
    if codegen:
        run_codegen()
    config = set_image_options(load_bentofile(bentofile), base_image, no_extra_index, extra_indexes)
    resolved = resolve_config(config, models)
    BUILD_DIR.mkdir(exist_ok=True)
    out_file = BUILD_DIR / (bentofile.stem + ".resolved.yaml")
    out_file.write_text(
        "# Generated by `python -m bentos.release build` from "
        f"{bentofile.relative_to(ROOT)}; do not edit.\n" + yaml.safe_dump(resolved, sort_keys=False)
    )
    variant = "".join(f".{v}" for v in ("gpu", "torch") if v in bentofile.stem)
    write_requirements_in(resolved, BUILD_DIR / f"requirements{variant}.in")
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
    from common.bento.release import containerfile as bento_containerfile
    from common.bento.release import load_bento

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
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="TAG",
        help="pack this model (replaces the bentofile's entries of its name); repeatable",
    )
    p.add_argument(
        "--torch",
        action="store_true",
        help=f"use {TORCH_BENTOFILE.relative_to(ROOT)} (training, the torch reference backend)",
    )
    p.add_argument("--version", default=None)
    p.add_argument("--no-codegen", action="store_true")
    p.add_argument(
        "--base-image",
        default=None,
        metavar="IMAGE",
        help="docker.base_image (e.g. the local base of `make base-image`)",
    )
    p.add_argument(
        "--no-extra-index",
        action="store_true",
        help="drop the bentofile's extra indexes (unreachable; wheels from `image --find-links`)",
    )
    p.add_argument(
        "--extra-index",
        action="append",
        default=[],
        metavar="URL",
        help="an extra package index for the image (e.g. PyTorch's CPU wheels for --torch); repeatable",
    )
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
    p = sub.add_parser("image", help="bentoml containerize with buildah/podman (or docker where a daemon answers)")
    p.add_argument("bento", nargs="?", default=None, help="tag or bento directory (default: latest)")
    p.add_argument(
        "-t", "--image", action="append", default=[], help="image name, repeatable (default graphsage-serving:release)"
    )
    p.add_argument(
        "--backend",
        default="auto",
        help="auto (docker with a daemon, else buildah, else podman), docker, buildah, podman",
    )
    p.add_argument(
        "--ca-bundle", default=None, help="CA bundle mounted for the build (default: this machine's; '' for none)"
    )
    p.add_argument("--find-links", default=None, metavar="DIR", help="a local wheel directory for uv (mounted)")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            if args.gpu and args.torch:
                raise ReleaseError("--gpu and --torch: one variant at a time")
            bentofile = args.bentofile or (GPU_BENTOFILE if args.gpu else TORCH_BENTOFILE if args.torch else BENTOFILE)
            tag = build(
                bentofile.resolve(),
                args.model,
                args.version,
                codegen=not args.no_codegen,
                base_image=args.base_image,
                no_extra_index=args.no_extra_index,
                extra_indexes=args.extra_index,
            )
            print(tag)
        elif args.cmd == "image":
            from bentos.image import build as build_image

            try:
                built = build_image(
                    args.bento or "graphsage-serving:latest",
                    tuple(args.image),
                    args.backend,
                    args.ca_bundle,
                    args.find_links,
                )
            except RuntimeError as exc:
                raise ReleaseError(str(exc)) from exc
            _say(built.line())
            print(built.images[0])
        elif args.cmd == "context":
            ctx = make_context(args.bento, args.out, enable_buildkit=not args.no_buildkit, force=args.force)
            print(ctx)
            _say(
                f"Dockerfile: {ctx / DOCKERFILE}\nbuild it with any OCI builder:\n  "
                + "\n  ".join(builder_commands(ctx, "graphsage-serving:<version>"))
            )
        else:
            return containerize(args.bento, args.image, args.backend, args.out)
    except ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
