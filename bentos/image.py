"""The release image: BentoML's ``containerize`` with a daemonless backend (buildah or podman)
where no Docker daemon runs, docker where one does; the image's size; the local base image.

::

    python -m bentos.release image [TAG] [-t IMAGE ...] [--backend auto|docker|buildah|podman]
        [--ca-bundle PEM] [--find-links DIR]
        # TAG: a bento in the store (default graphsage-serving:latest); prints the image, its
        # size and the build time

What a build here needs, and gets without changing the image:

- **the package index's CA**: the index is reached through a proxy whose CA is in this machine's
  bundle, not in the image's; the bundle is mounted read-only over the image's
  ``/etc/ssl/certs/ca-certificates.crt`` for the build's ``RUN`` steps only (Debian's pip reads
  it; uv, which installs the packages, reads it through ``SSL_CERT_FILE``, set in the local base
  image, bentos/base_image.sh). ``--ca-bundle ''`` mounts nothing.
- **a local wheel directory** (``--find-links``): mounted with a ``/etc/uv/uv.toml`` that adds it
  as uv's ``find-links``, e.g. the CPU torch wheel where the PyTorch index is unreachable (the
  torch image, ``make image-torch TORCH_WHEELS=DIR``).
- buildah and podman build with ``--isolation chroot`` (their default OCI runtime cannot run here:
  "cgroups in hybrid mode not supported") and ``--layers`` (a rebuild reuses the package layer
  while the requirements and the ``ENV`` lines before it are unchanged).
- no ``--opt pull=never``: BentoML passes it to buildah in a form buildah rejects; the default
  pull policy ("missing") uses the local base image.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_IMAGE = "graphsage-serving:release"
BASE_IMAGE = "localhost/graphsage-base:bookworm"
IMAGE_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # where Debian's pip and SSL_CERT_FILE look
DAEMONLESS = ("buildah", "podman")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def docker_daemon() -> bool:
    """Does a Docker daemon answer (not just a ``docker`` binary)?"""
    if shutil.which("docker") is None:
        return False
    try:
        return (
            subprocess.run(
                ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, timeout=15
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def pick_backend(backend: str = "auto") -> str:
    """``auto``: docker where its daemon answers, else buildah, else podman."""
    if backend != "auto":
        return backend
    if docker_daemon():
        return "docker"
    for name in DAEMONLESS:
        if shutil.which(name):
            return name
    raise RuntimeError(
        "no image builder: no Docker daemon answers and neither buildah nor podman is installed "
        "(apt-get install buildah podman runc)"
    )


def host_ca_bundle() -> str:
    """This machine's CA bundle (the one its own pip and curl trust)."""
    for candidate in (
        os.environ.get("SSL_CERT_FILE"),
        os.environ.get("PIP_CERT"),
        ssl.get_default_verify_paths().cafile,
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and os.path.isfile(candidate):
            return candidate
    return ""


@contextlib.contextmanager
def build_mounts(ca_bundle: str, find_links: str | None) -> Iterator[list[str]]:
    """The ``--volume`` specs of a build: the CA bundle and a wheel directory (with the uv.toml
    that points uv at it), read-only, none of it in the image."""
    volumes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gsage-image-") as tmp:
        if ca_bundle:
            volumes.append(f"{os.path.realpath(ca_bundle)}:{IMAGE_CA_BUNDLE}:ro")
        if find_links:
            wheels = os.path.realpath(find_links)
            if not os.path.isdir(wheels):
                raise RuntimeError(f"--find-links {find_links}: not a directory")
            conf = Path(tmp) / "uv"
            conf.mkdir()
            (conf / "uv.toml").write_text('find-links = ["/build-wheels"]\n')
            volumes += [f"{wheels}:/build-wheels:ro", f"{conf}:/etc/uv:ro"]
        yield volumes


def image_size(image: str, runtime: str = "podman") -> int:
    """The image's size in bytes (uncompressed layers, as ``podman images`` shows it)."""
    out = subprocess.run(
        [runtime, "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        raise RuntimeError(f"{runtime} image inspect {image}: {out.stderr.strip()}")
    return int(out.stdout.strip())


def image_exists(image: str, runtime: str = "podman") -> bool:
    if shutil.which(runtime) is None:
        return False
    return subprocess.run([runtime, "image", "exists", image], capture_output=True, timeout=60).returncode == 0


def image_env(image: str, runtime: str = "podman") -> dict[str, str]:
    """The image's ``ENV`` (the bentofile's envs, the pinned model tags among them)."""
    out = subprocess.run(
        [runtime, "image", "inspect", "--format", "{{json .Config.Env}}", image],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(item.partition("=")[::2] for item in json.loads(out.stdout) or [])


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


@dataclass
class Built:
    images: tuple[str, ...]
    backend: str
    seconds: float
    size: int | None

    def line(self) -> str:
        size = "size unknown" if self.size is None else f"{human(self.size)} ({self.size} bytes)"
        return f"image {', '.join(self.images)}: built in {self.seconds:.0f} s with {self.backend}, {size}"


def build(
    bento_tag: str,
    images: tuple[str, ...],
    backend: str = "auto",
    ca_bundle: str | None = None,
    find_links: str | None = None,
) -> Built:
    """``bentoml containerize`` of ``bento_tag`` into ``images``; raises when the build fails."""
    from common.bento.release import containerize, load_bento

    bento = load_bento(bento_tag)
    tag = str(bento.tag)
    images = images or (DEFAULT_IMAGE,)
    backend = pick_backend(backend)
    ca_bundle = host_ca_bundle() if ca_bundle is None else ca_bundle
    options: dict = {}
    start = time.monotonic()
    if backend in DAEMONLESS:
        options.update(isolation="chroot", layers=True)
        with build_mounts(ca_bundle, find_links) as volumes:
            if volumes:
                options["volume"] = volumes  # a list: one --volume each (a tuple would be joined)
            _say(
                f"containerize (bentoml.container.build) {tag} --backend {backend} "
                + " ".join(f"-t {i}" for i in images)
                + " isolation=chroot layers"
                + "".join(f" volume={v}" for v in volumes)
            )
            ok = containerize(tag, backend, images, **options)
    else:
        if find_links:
            raise RuntimeError("--find-links needs buildah or podman (a docker build takes no volumes)")
        _say(f"containerize (bentoml.container.build) {tag} --backend {backend} " + " ".join(f"-t {i}" for i in images))
        ok = containerize(tag, backend, images)
    seconds = time.monotonic() - start
    if not ok:
        raise RuntimeError(f"bentoml containerize {tag} --backend {backend} failed (its output above)")
    runtime = "docker" if backend in ("docker", "buildx") else "podman"
    size = None
    with contextlib.suppress(RuntimeError, OSError, ValueError, subprocess.TimeoutExpired):
        size = image_size(images[0], runtime)
    return Built(tuple(images), backend, seconds, size)
