"""Containers for tests: the release image run with podman, one container per service, started
from the Kubernetes manifests' own container specs (arguments, environment, mounts, security
context) with only what a single host needs changed (ports, loopback addresses, Redis, the host
directories that stand in for the volumes).

How a container runs on this kind of machine (docs/release.md, "Run the image"):

- ``--runtime runc``: podman's default runtime, crun, fails here ("cgroups in hybrid mode not
  supported");
- ``--network host``: every service on its own loopback port, as the processes of
  ``bentos.local_split`` are (no bridge networking, no port publishing);
- ulimits at the machine's own (this process's soft:hard): podman's defaults are above the hard
  limits and the runtime's setrlimit fails with EPERM.

Every container is created with ``--cidfile``, so its ID is known even when ``podman run`` fails
halfway, and removed by that ID (``podman rm -f``) when its ``Containers`` set closes; every podman call
has a timeout.

    with Containers(workdir) as cs:
        c = cs.run(ContainerSpec(name="x", image=IMG, args=[...], env={...}))
        c.wait_ready("http://127.0.0.1:3010", timeout_s=120)
        c.kill(); c.start()
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import resource
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PODMAN = "podman"
CALL_TIMEOUT_S = 120.0


def podman_available() -> bool:
    return shutil.which(PODMAN) is not None


# At most this many: the runtime could not set nproc at this machine's own 96362 (EPERM) but
# set 32768; RLIMIT_NPROC counts every thread of the user (uid 1034, all the containers together).
ULIMIT_CAPS = {"nofile": 1 << 20, "nproc": 16384}


def machine_ulimits() -> list[str]:
    """``--ulimit`` flags at this process's own limits (never above the hard limit)."""
    flags = []
    for name, res in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = resource.getrlimit(res)
        cap = ULIMIT_CAPS[name]
        soft = cap if soft == resource.RLIM_INFINITY else min(soft, cap)
        hard = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        flags += ["--ulimit", f"{name}={soft}:{hard}"]
    return flags


def run_options() -> list[str]:
    return ["--runtime", "runc", "--network", "host", *machine_ulimits()]


def podman(*args: str, timeout: float = CALL_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} ... failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return out


@dataclass
class Mount:
    """A bind mount (``source`` a host path) or a tmpfs (``source`` None)."""

    target: str
    source: str | None = None
    read_only: bool = False
    tmpfs_size: str = "512m"

    def flags(self) -> list[str]:
        if self.source is None:
            return ["--tmpfs", f"{self.target}:rw,size={self.tmpfs_size},mode=1777"]
        return ["--volume", f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"]


@dataclass
class ContainerSpec:
    name: str
    image: str
    args: list[str] = field(default_factory=list)
    command: list[str] | None = None  # replaces the image's entrypoint (Kubernetes `command`)
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    user: str | None = None
    read_only: bool = False
    cap_drop_all: bool = False
    no_new_privileges: bool = False

    def run_args(self, cidfile: str) -> list[str]:
        out = ["run", "--detach", "--cidfile", cidfile, "--name", self.name, *run_options()]
        if self.user:
            out += ["--user", self.user]
        if self.read_only:
            out += ["--read-only", "--read-only-tmpfs=false"]
        if self.cap_drop_all:
            out += ["--cap-drop", "ALL"]
        if self.no_new_privileges:
            out += ["--security-opt", "no-new-privileges"]
        # Parents before children (a tmpfs home, then the volumes inside it).
        for m in sorted(self.mounts, key=lambda m: m.target.count("/")):
            out += m.flags()
        for k, v in self.env.items():
            out += ["--env", f"{k}={v}"]
        if self.command:
            out += ["--entrypoint", self.command[0]]
        out.append(self.image)
        out += [*(self.command[1:] if self.command else []), *self.args]
        return out


class Container:
    def __init__(self, spec: ContainerSpec, workdir: Path) -> None:
        self.spec = spec
        self.cidfile = workdir / f"{spec.name}.cid"
        self.id = ""
        self.started_at = 0.0  # monotonic, the last (re)start
        self.ready_after_s: float | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def create_and_start(self) -> Container:
        with contextlib.suppress(FileNotFoundError):
            self.cidfile.unlink()
        self.started_at = time.monotonic()
        try:
            out = podman(*self.spec.run_args(str(self.cidfile)), check=False)
        finally:
            with contextlib.suppress(OSError):
                self.id = self.cidfile.read_text().strip()
        if out.returncode != 0:
            raise RuntimeError(
                f"podman run {self.name} failed ({out.returncode}): {out.stderr.strip()[-2000:]}\n{self.logs()}"
            )
        self.id = self.id or out.stdout.strip().splitlines()[-1]
        return self

    def start(self) -> Container:
        """Start the stopped container again: same arguments, environment and mounts (what the
        kubelet does when a container of a pod dies)."""
        self.started_at = time.monotonic()
        podman("start", self.id)
        return self

    def kill(self) -> None:
        podman("kill", "--signal", "KILL", self.id, check=False, timeout=30)
        podman("wait", self.id, check=False, timeout=60)

    def remove(self) -> None:
        if self.id:
            podman("rm", "--force", "--time", "5", self.id, check=False, timeout=60)

    def state(self) -> dict[str, Any]:
        out = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", self.id, check=False, timeout=30)
        status, _, code = out.stdout.strip().partition(" ")
        return {"status": status or "unknown", "exit_code": int(code) if code.lstrip("-").isdigit() else None}

    def running(self) -> bool:
        return self.state()["status"] == "running"

    def logs(self, tail: int = 60) -> str:
        if not self.id:
            return ""
        out = podman("logs", "--tail", str(tail), self.id, check=False, timeout=30)
        return (out.stdout + out.stderr)[-6000:]

    def exec(self, *args: str, timeout: float = CALL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.id, *args, check=False, timeout=timeout)

    def wait_ready(self, url: str, timeout_s: float = 180.0, path: str = "/readyz") -> float:
        """Seconds from the (re)start to ``url + path`` answering 200; raises with the logs when
        the container exits or the time is up."""
        deadline = self.started_at + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(url + path, timeout=2.0) as r:
                    if r.status == 200:
                        self.ready_after_s = time.monotonic() - self.started_at
                        return self.ready_after_s
            if not self.running():
                raise RuntimeError(f"container {self.name} stopped ({self.state()}):\n{self.logs()}")
            time.sleep(0.25)
        raise TimeoutError(f"container {self.name} not ready at {url}{path} after {timeout_s:.0f}s:\n{self.logs()}")

    def wait_exit(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.state()
            if state["status"] in ("exited", "stopped"):
                return state
            time.sleep(0.5)
        raise TimeoutError(f"container {self.name} still running after {timeout_s:.0f}s:\n{self.logs()}")


class Containers:
    """The containers one test starts; all removed by ID on close, whatever happened."""

    def __init__(self, workdir: str | Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.started: list[Container] = []

    def run(self, spec: ContainerSpec) -> Container:
        c = Container(spec, self.workdir)
        self.started.append(c)  # before the start: a half-made container is removed too
        return c.create_and_start()

    def close(self) -> None:
        for c in reversed(self.started):
            with contextlib.suppress(Exception):
                c.remove()

    def __enter__(self) -> Containers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- Kubernetes manifests -> container specs ------------------------------------------------


def k8s_docs(k8s_dir: str | Path) -> list[dict]:
    docs = []
    for path in sorted(Path(k8s_dir).rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def k8s_object(docs: list[dict], kind: str, name: str) -> dict:
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return copy.deepcopy(d)
    raise KeyError(f"no {kind} {name} in the manifests")


def k8s_env(docs: list[dict], container: dict) -> dict[str, str]:
    """``envFrom`` ConfigMaps, then ``env`` values (Kubernetes' precedence)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        ref = source.get("configMapRef")
        if ref:
            env.update({k: str(v) for k, v in (k8s_object(docs, "ConfigMap", ref["name"])["data"] or {}).items()})
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
    return env


def spec_from_k8s(
    docs: list[dict],
    workload: str,
    *,
    name: str,
    image: str,
    volumes: dict[str, str | None],
    init: str | None = None,
    kind: str = "Deployment",
) -> ContainerSpec:
    """The container (or init container ``init``) of ``workload`` as a podman run: its args or
    command, its environment, its mounts (``volumes`` maps each volume name to a host directory,
    or None for a tmpfs; ``subPath`` is a directory under it; a volume not given is not mounted,
    as an optional Secret that does not exist), its user and security context."""
    obj = k8s_object(docs, kind, workload)
    pod = obj["spec"]["template"]["spec"]
    containers = pod.get("initContainers") if init else pod["containers"]
    container = next(c for c in containers if init is None or c["name"] == init)
    sizes = {v["name"]: (v.get("emptyDir") or {}).get("sizeLimit") for v in pod.get("volumes") or []}
    mounts = []
    for m in container.get("volumeMounts") or []:
        if m["name"] not in volumes:
            continue
        source = volumes[m["name"]]
        if source is not None and m.get("subPath"):
            source = os.path.join(source, m["subPath"])
            os.makedirs(source, exist_ok=True)
        size = sizes.get(m["name"]) or "512Mi"
        mounts.append(Mount(m["mountPath"], source, bool(m.get("readOnly")), tmpfs_size=_tmpfs_size(size)))
    psc, sc = pod.get("securityContext") or {}, container.get("securityContext") or {}
    uid, gid = sc.get("runAsUser", psc.get("runAsUser")), sc.get("runAsGroup", psc.get("runAsGroup"))
    return ContainerSpec(
        name=name,
        image=image,
        args=[str(a) for a in container.get("args") or []],
        command=[str(a) for a in container["command"]] if container.get("command") else None,
        env=k8s_env(docs, container),
        mounts=mounts,
        user=f"{uid}:{gid}" if uid is not None else None,
        read_only=bool(sc.get("readOnlyRootFilesystem")),
        cap_drop_all="ALL" in ((sc.get("capabilities") or {}).get("drop") or []),
        no_new_privileges=sc.get("allowPrivilegeEscalation") is False,
    )


def _tmpfs_size(k8s_quantity: str) -> str:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", str(k8s_quantity))
    if not m:
        return "512m"
    return m.group(1) + {"Ki": "k", "Mi": "m", "Gi": "g", None: ""}[m.group(2)]


def replace_arg(args: list[str], flag: str, value: str) -> list[str]:
    """``--flag X`` -> ``--flag value`` (the flag must be there)."""
    i = args.index(flag)
    return [*args[: i + 1], value, *args[i + 2 :]]


def rewrite_depends(args: list[str], urls: dict[str, str]) -> list[str]:
    """``--depends Svc=http://svc:3000`` -> ``--depends Svc=<urls[Svc]>``."""
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a == "--depends":
            service = out[i + 1].split("=", 1)[0]
            out[i + 1] = f"{service}={urls[service]}"
    return out
