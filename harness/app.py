"""Start the composed app for integration tests: a model store, then the three services as
separate processes on free loopback ports (BentoML's split ``start-http-server`` mode, as the
container runs them), each stopped by PID."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil

from bentos.local_split import stop_process_tree
from common.bento.launch import START_HTTP_SERVER
from common.service_auth import ServiceTokens, ensure_shared_token
from common.settings import load_settings
from harness.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
SERVICE = "services.gateway:Gateway"
START = START_HTTP_SERVER  # one service of the bento, as the image's entrypoint starts it


def run_export(home: str, *args: str) -> dict:
    """Run ``python -m training_export ...`` against ``home``; returns its JSON result."""
    env = {**os.environ, "BENTOML_HOME": home, "BENTOML_DO_NOT_TRACK": "true"}
    out = subprocess.run([sys.executable, "-m", "training_export", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"training_export {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def build_demo_store(home: str) -> tuple[str, str]:
    """A small graph and two model versions (mean, then pool): (v1 tag, v2 tag)."""
    small = ["--nodes", "4000", "--edges", "40000", "--epochs", "1", "--hidden", "32"]
    v1 = run_export(home, "demo", *small)["graphsage"]
    v2 = run_export(home, "train", "--aggregator", "pool", "--epochs", "1", "--hidden", "32")["graphsage"]
    return v1, v2


def private_home(home: str, name: str) -> str:
    """A BentoML home of one's own that shares ``home``'s model store. Each arbiter wipes
    ``$BENTOML_HOME/prometheus_multiproc_dir`` at start, so services on one machine (as in a
    container each) need separate homes or the last one started erases the others' metrics."""
    own = os.path.join(os.path.dirname(home.rstrip("/")), f".home-{name}")
    os.makedirs(own, exist_ok=True)
    link = os.path.join(own, "models")
    if not os.path.islink(link):
        os.symlink(os.path.join(home, "models"), link)
    return own


def service_headers(env: dict[str, str]) -> dict[str, str]:
    """The header a call to a runner started with ``env`` needs (its service token)."""
    return ServiceTokens.from_settings(load_settings({k: v for k, v in env.items() if k.startswith("GSAGE_")})).header()


class Service:
    """One BentoML service in its own process group."""

    def __init__(self, name: str, port: int, env: dict[str, str], depends: dict[str, str] | None = None,
                 workers: int = 1, log_dir: str | None = None) -> None:
        self.name, self.port, self.env, self.workers = name, port, env, workers
        self.depends = depends or {}
        self.log_path = os.path.join(log_dir or "/tmp", f"{name}-{port}.log")
        self.proc: subprocess.Popen | None = None
        # The gateway serves HTTPS when given a certificate; its CA verifies it (self-signed).
        self.tls_ca = env.get("GSAGE_TLS_CERT_FILE") if name == "Gateway" else None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_ca else 'http'}://127.0.0.1:{self.port}"

    def start(self, wait_s: float = 90.0) -> "Service":
        env = {**self.env, "BENTOML_HOME": private_home(self.env["BENTOML_HOME"], f"{self.name}-{self.port}")}
        cmd = [*START, SERVICE, "--service-name", self.name, "--port", str(self.port), "--host", "127.0.0.1",
               "--api-workers", str(self.workers)]
        for dep, url in self.depends.items():
            cmd += ["--depends", f"{dep}={url}"]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=1.0, verify=self.tls_ca or True).status_code == 200:
                    return self
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {wait_s}s:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            stop_process_tree(psutil.Process(self.proc.pid), sig, timeout_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def log_tail(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return Path(self.log_path).read_text(errors="replace")[-chars:]
        return ""


class SplitApp:
    """Gateway -> FeatureRunner -> GraphSAGERunner as separate processes."""

    def __init__(self, home: str, env: dict[str, str] | None = None, model_workers: int = 1,
                 log_dir: str | None = None) -> None:
        ensure_shared_token()  # one service token for the three processes, as a Secret gives them
        self.env = {**os.environ, "BENTOML_HOME": home, "BENTOML_DO_NOT_TRACK": "true", **(env or {})}
        feature_env = dict(self.env)
        self.env["GSAGE_MODEL_WORKERS"] = str(model_workers)
        self.model = Service("GraphSAGERunner", free_port(), self.env, workers=model_workers, log_dir=log_dir)
        self.feature = Service("FeatureRunner", free_port(), feature_env, depends={"GraphSAGERunner": self.model.url},
                               log_dir=log_dir)
        self.gateway = self.gateway_for(self.env)
        self.grpc_port = int(self.env.get("GSAGE_GRPC_PORT", "0"))

    @property
    def service_headers(self) -> dict[str, str]:
        """What a call to a runner needs: the service token the three processes share."""
        return service_headers(self.env)

    def gateway_for(self, env: dict[str, str]) -> Service:
        deps = {"FeatureRunner": self.feature.url, "GraphSAGERunner": self.model.url}
        return Service("Gateway", free_port(), env, depends=deps, log_dir=None)

    def start(self) -> "SplitApp":
        """Start the three services; when one fails to start, stop those already started."""
        try:
            for svc in (self.model, self.feature, self.gateway):
                svc.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for svc in (self.gateway, self.model, self.feature):
            svc.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {s.name}\n{s.log_tail(2000)}" for s in (self.gateway, self.feature, self.model))


class Outcomes(Counter):
    """Outcome counts of a load run, with the first message seen for each outcome that is not a
    full answer (the error body, the degraded reason): a failed assertion then says why."""

    def __init__(self) -> None:
        super().__init__()
        self.first_message: dict[str, str] = {}

    def add(self, outcome: str | int, message: str | None = None) -> None:
        self[outcome] += 1
        if message is not None:
            self.first_message.setdefault(str(outcome), message[:300])

    def __repr__(self) -> str:
        return f"{super().__repr__()}, first messages: {self.first_message}"


async def closed_loop(url: str, headers: dict[str, str], seconds: float, concurrency: int,
                      body_fn: Callable[[int, int], dict]) -> Outcomes:
    """Closed-loop load for a bounded time. Outcomes: the answering model tag (full answers),
    ``"degraded"``, an HTTP status, or an exception name."""
    outcomes = Outcomes()
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=concurrency)) as client:
        async def worker(w: int) -> None:
            n = 0
            while time.monotonic() < deadline:
                try:
                    r = await client.post(url, json=body_fn(w, n), headers=headers)
                    if r.status_code != 200:
                        outcomes.add(r.status_code, r.text)
                    else:
                        body = r.json()
                        if body["degraded"]:
                            outcomes.add("degraded", body.get("degraded_reason") or "")
                        else:
                            outcomes.add(body["model"])
                except httpx.HTTPError as exc:
                    outcomes.add(type(exc).__name__, repr(exc))
                n += 1

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return outcomes


@contextlib.contextmanager
def running(app: SplitApp) -> Iterator[SplitApp]:
    app.start()
    try:
        yield app
    finally:
        app.stop()
