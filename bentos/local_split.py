"""Split deployment on one machine: the three services of a built bento as separate processes on
their own ports, each started by the image's own entrypoint (``env/docker/entrypoint.sh
start-http-server --service-name X [--depends Dep=url]``, which appends ``$BENTO_PATH``), with
cwd ``$BENTO_PATH/src``, each scaled on its own (``--model-workers``), and stopped by PID.

::

    python -m bentos.local_split up   --bento graphsage-serving:latest [--state-dir build/split]
        [--host 127.0.0.1] [--gateway-port 3000] [--feature-port 3010] [--model-port 3020]
        [--grpc-port 50051] [--feature-workers 1] [--model-workers 2] [--env GSAGE_X=V ...]
    python -m bentos.local_split status [--state-dir build/split]
    python -m bentos.local_split down   [--state-dir build/split]

``--bento`` is a tag in the bento store or a directory. A directory that holds ``models/`` (the
image's ``$BENTO_PATH``, e.g. from ``python -m bentos.release context``) is used as it is; a tag
or a store directory is first laid out like the image (bento + its models) under
``<state-dir>/bento``. The runners then read the models packed in the bento, as in the image.

Each service gets a BentoML home of its own (``<state-dir>/home-<service>``): each arbiter wipes
``$BENTOML_HOME/prometheus_multiproc_dir`` at start, so services sharing one home would erase
each other's metrics. The environment of each process is the image's (the bento's ``envs``),
then this process's, then ``--env``: the same precedence as image ENV < Kubernetes env.

The state (PIDs with their start times, ports, logs) is ``<state-dir>/split.json``; ``down`` stops
exactly those processes and their workers (BentoML workers run in sessions of their own, so a
process-group kill would miss them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import yaml

from common.bento.launch import START_HTTP_SERVER
from common.service_auth import TOKENS_ENV, ensure_shared_token
from harness.processes import stop_process_tree

ROOT = Path(__file__).resolve().parent.parent
STATE_FILE = "split.json"
CONFIG_OVERRIDES = "BENTOML_CONFIG_OVERRIDES"
START = START_HTTP_SERVER  # one service of the bento, as the image's entrypoint starts it


@dataclass
class Proc:
    name: str
    port: int
    workers: int
    depends: dict[str, str] = field(default_factory=dict)
    pid: int = 0
    create_time: float = 0.0
    log: str = ""

    @property
    def url(self) -> str:
        return f"http://{_client_host(self.host)}:{self.port}"

    host: str = "127.0.0.1"


def workers_override(current: str | None, service: str, workers: int) -> dict:
    """``BENTOML_CONFIG_OVERRIDES`` with ``services.<service>.workers`` set. The worker count of
    a new-style service comes from its service config; ``start-http-server --api-workers`` is
    ignored for them (BentoML 1.4.40), so this is how one service is scaled within a process."""
    overrides = json.loads(current) if current else {}
    overrides.setdefault("services", {}).setdefault(service, {})["workers"] = workers
    return overrides


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def bento_envs(bento_path: Path) -> dict[str, str]:
    """The environment the image sets (``docker.env`` of a v1 bento / ``envs``)."""
    info = yaml.safe_load((bento_path / "bento.yaml").read_text())
    env: dict[str, str] = {}
    for item in info.get("envs") or []:
        env[item["name"]] = str(item.get("value", ""))
    docker_env = (info.get("docker") or {}).get("env") or {}
    if isinstance(docker_env, dict):
        env.update({k: str(v) for k, v in docker_env.items()})
    return env


def layout(bento: str, state_dir: Path) -> Path:
    """A directory laid out like the image's ``$BENTO_PATH`` (with ``models/``)."""
    path = Path(bento)
    if path.is_dir() and (path / "bento.yaml").exists() and (path / "models").is_dir():
        return path.resolve()
    from bentos.release import make_context

    return make_context(bento, state_dir / "bento", force=True)


def _ready(url: str) -> bool:
    with contextlib.suppress(OSError, urllib.error.URLError):
        with urllib.request.urlopen(url + "/readyz", timeout=1.0) as r:
            return r.status == 200
    return False


def _alive(p: Proc) -> psutil.Process | None:
    """The recorded process if it still runs (same PID *and* start time: never a reused PID)."""
    if not p.pid:
        return None
    try:
        proc = psutil.Process(p.pid)
        if abs(proc.create_time() - p.create_time) > 0.5 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.NoSuchProcess:
        return None


def stop_proc(p: Proc, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> None:
    root = _alive(p)
    if root is not None:
        stop_process_tree(root, sig, timeout_s)


class SplitDeployment:
    """Gateway + FeatureRunner + GraphSAGERunner from one bento directory."""

    def __init__(
        self,
        bento_path: Path,
        state_dir: Path,
        host: str = "127.0.0.1",
        gateway_port: int = 3000,
        feature_port: int = 3010,
        model_port: int = 3020,
        feature_workers: int = 1,
        model_workers: int = 2,
        env: dict[str, str] | None = None,
        base_env: dict[str, str] | None = None,
    ) -> None:
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.bento_path, self.state_dir, self.host = Path(bento_path).resolve(), Path(state_dir).resolve(), host
        self.extra_env = dict(env or {})
        if not any(k in {**self.base_env, **self.extra_env} for k in (TOKENS_ENV, TOKENS_ENV + "_FILE")):
            ensure_shared_token()  # none configured: the three processes share a fresh one
            self.extra_env[TOKENS_ENV] = os.environ[TOKENS_ENV]
        self.model = Proc("GraphSAGERunner", model_port, model_workers, host=host)
        self.feature = Proc(
            "FeatureRunner", feature_port, feature_workers, host=host, depends={"GraphSAGERunner": self.model.url}
        )
        self.gateway = Proc(
            "Gateway",
            gateway_port,
            1,
            host=host,
            depends={"FeatureRunner": self.feature.url, "GraphSAGERunner": self.model.url},
        )

    @property
    def procs(self) -> list[Proc]:
        return [self.model, self.feature, self.gateway]

    # -- state ------------------------------------------------------------------------------
    def save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        state = {"bento_path": str(self.bento_path), "host": self.host, "procs": [asdict(p) for p in self.procs]}
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_dir / STATE_FILE)

    @classmethod
    def load(cls, state_dir: Path) -> SplitDeployment:
        state = json.loads((Path(state_dir) / STATE_FILE).read_text())
        dep = cls(Path(state["bento_path"]), Path(state_dir), host=state["host"])
        procs = {p["name"]: Proc(**p) for p in state["procs"]}
        dep.feature, dep.model, dep.gateway = procs["FeatureRunner"], procs["GraphSAGERunner"], procs["Gateway"]
        return dep

    # -- lifecycle --------------------------------------------------------------------------
    def env_for(self, p: Proc) -> dict[str, str]:
        home = self.state_dir / f"home-{p.name}"
        home.mkdir(parents=True, exist_ok=True)
        env = {
            **bento_envs(self.bento_path),
            **self.base_env,
            **self.extra_env,
            "BENTOML_HOME": str(home),
            "BENTO_PATH": str(self.bento_path),
            "BENTOML_DO_NOT_TRACK": "true",
        }
        # `python` of the entrypoint = this interpreter (the image puts /app/.venv/bin first).
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
        env.pop("PORT", None)  # the entrypoint would turn it into BENTOML_PORT
        env[CONFIG_OVERRIDES] = json.dumps(workers_override(env.get(CONFIG_OVERRIDES), p.name, p.workers))
        return env

    def command(self, p: Proc) -> list[str]:
        """The image's own entrypoint with the arguments a container gets; it appends
        ``$BENTO_PATH`` and execs BentoML's ``start-http-server`` (``common.bento.launch``)
        (same PID). ``--api-workers`` is passed as the container would, though BentoML 1.4.40
        ignores it for new-style services (``workers`` comes from BENTOML_CONFIG_OVERRIDES)."""
        args = [
            "start-http-server",
            "--service-name",
            p.name,
            "--host",
            self.host,
            "--port",
            str(p.port),
            "--api-workers",
            str(p.workers),
        ]
        for dep, url in p.depends.items():
            args += ["--depends", f"{dep}={url}"]
        entrypoint = self.bento_path / "env" / "docker" / "entrypoint.sh"
        if entrypoint.is_file():
            return ["bash", str(entrypoint), *args]
        return [*START, *args[1:], str(self.bento_path)]

    def start_one(self, p: Proc, wait_s: float) -> None:
        p.log = str(self.state_dir / f"{p.name}.log")
        with open(p.log, "ab") as log:
            proc = subprocess.Popen(
                self.command(p),
                cwd=self.bento_path / "src",
                env=self.env_for(p),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        p.pid, p.create_time = proc.pid, psutil.Process(proc.pid).create_time()
        self.save()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {proc.returncode}:\n{tail(p.log)}")
            if _ready(p.url):
                return
            time.sleep(0.3)
        raise TimeoutError(f"{p.name} not ready after {wait_s:.0f}s:\n{tail(p.log)}")

    def up(self, wait_s: float = 120.0) -> SplitDeployment:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            for p in self.procs:
                self.start_one(p, wait_s)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        for p in reversed(self.procs):
            stop_proc(p)

    def status(self) -> dict[str, dict]:
        return {
            p.name: {
                "pid": p.pid,
                "url": p.url,
                "running": _alive(p) is not None,
                "ready": _ready(p.url),
                "workers": p.workers,
                "log": p.log,
            }
            for p in self.procs
        }

    def __enter__(self) -> SplitDeployment:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def tail(path: str, chars: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text(errors="replace")[-chars:]
    return ""


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--env {pair!r}: expected NAME=VALUE")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bentos.local_split", description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", type=Path, default=ROOT / "build" / "split")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the three services")
    up.add_argument("--bento", default="graphsage-serving:latest", help="tag or bento directory")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--gateway-port", type=int, default=3000)
    up.add_argument("--feature-port", type=int, default=3010)
    up.add_argument("--model-port", type=int, default=3020)
    up.add_argument("--grpc-port", type=int, default=None, help="GSAGE_GRPC_PORT (0 = no gRPC)")
    up.add_argument("--feature-workers", type=int, default=1)
    up.add_argument("--model-workers", type=int, default=2)
    up.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    up.add_argument("--wait", type=float, default=120.0)
    sub.add_parser("status", help="PIDs, URLs, readiness")
    sub.add_parser("down", help="stop the processes started by `up`")
    args = parser.parse_args(argv)
    state_dir = args.state_dir.resolve()

    if args.cmd == "up":
        if (state_dir / STATE_FILE).exists():
            old = SplitDeployment.load(state_dir)
            if any(_alive(p) for p in old.procs):
                print(f"already running (state in {state_dir}); run `down` first", file=sys.stderr)
                return 1
        env = _env_pairs(args.env)
        if args.grpc_port is not None:
            env["GSAGE_GRPC_PORT"] = str(args.grpc_port)
        dep = SplitDeployment(
            layout(args.bento, state_dir),
            state_dir,
            args.host,
            args.gateway_port,
            args.feature_port,
            args.model_port,
            args.feature_workers,
            args.model_workers,
            env,
        )
        dep.up(args.wait)
        print(json.dumps(dep.status(), indent=2))
        return 0
    if not (state_dir / STATE_FILE).exists():
        print(f"nothing started from {state_dir}", file=sys.stderr)
        return 0 if args.cmd == "down" else 1
    dep = SplitDeployment.load(state_dir)
    if args.cmd == "status":
        print(json.dumps(dep.status(), indent=2))
        return 0
    dep.down()
    print(json.dumps({p.name: {"pid": p.pid, "running": _alive(p) is not None} for p in dep.procs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
