"""Start the composed app for integration tests: a model store, then the three services as
separate processes on free loopback ports (BentoML's split ``start-http-server`` mode, as the
container runs them), each stopped by PID."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

from common.service_auth import ServiceTokens, ensure_shared_token
from common.settings import load_settings
from harness.load import Outcomes, answer_outcome, closed_loop
from harness.ports import free_port
from harness.processes import ROOT, ServiceProcess

AppT = TypeVar("AppT", "SplitApp", "ColocatedApp")


def run_export(home: str, *args: str, env: dict[str, str] | None = None) -> dict:
    """Run ``python -m training_export ...`` against ``home`` (with ``env`` added to this
    process's environment); returns its JSON result."""
    env = {**os.environ, **(env or {}), "BENTOML_HOME": home, "BENTOML_DO_NOT_TRACK": "true"}
    out = subprocess.run(
        [sys.executable, "-m", "training_export", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise RuntimeError(f"training_export {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def build_demo_store(home: str) -> tuple[str, str]:
    """A small graph and two model versions (mean, then pool): (v1 tag, v2 tag)."""
    small = ["--nodes", "4000", "--edges", "40000", "--epochs", "1", "--hidden", "32"]
    v1 = run_export(home, "demo", *small)["graphsage"]
    v2 = run_export(home, "train", "--aggregator", "pool", "--epochs", "1", "--hidden", "32")["graphsage"]
    return v1, v2


def service_headers(env: dict[str, str]) -> dict[str, str]:
    """The header a call to a runner started with ``env`` needs (its service token)."""
    return ServiceTokens.from_settings(
        load_settings({k: v for k, v in env.items() if k.startswith("GSAGE_")}).security
    ).header()


class Service(ServiceProcess):
    """One service of the app for a test: logs in ``log_dir`` (default /tmp)."""

    def __init__(
        self,
        name: str,
        port: int,
        env: dict[str, str],
        depends: dict[str, str] | None = None,
        workers: int = 1,
        log_dir: str | None = None,
    ) -> None:
        # The gateway serves HTTPS when given a certificate; its CA verifies it (self-signed).
        super().__init__(
            name,
            port,
            env,
            os.path.join(log_dir or "/tmp", f"{name}-{port}.log"),
            depends=depends,
            workers=workers,
            tls_ca=env.get("GSAGE_TLS_CERT_FILE") if name == "Gateway" else None,
        )

    def start(self, wait_s: float = 90.0) -> Service:
        super().start(wait_s)
        return self


class SplitApp:
    """Gateway -> FeatureRunner -> GraphSAGERunner as separate processes."""

    def __init__(
        self, home: str, env: dict[str, str] | None = None, model_workers: int = 1, log_dir: str | None = None
    ) -> None:
        ensure_shared_token()  # one service token for the three processes, as a Secret gives them
        self.env = {**os.environ, "BENTOML_HOME": home, "BENTOML_DO_NOT_TRACK": "true", **(env or {})}
        feature_env = dict(self.env)
        self.env["GSAGE_MODEL_WORKERS"] = str(model_workers)
        self.model = Service("GraphSAGERunner", free_port(), self.env, workers=model_workers, log_dir=log_dir)
        self.feature = Service(
            "FeatureRunner", free_port(), feature_env, depends={"GraphSAGERunner": self.model.url}, log_dir=log_dir
        )
        self.gateway = self.gateway_for(self.env)
        self.grpc_port = int(self.env.get("GSAGE_GRPC_PORT", "0"))

    @property
    def service_headers(self) -> dict[str, str]:
        """What a call to a runner needs: the service token the three processes share."""
        return service_headers(self.env)

    def gateway_for(self, env: dict[str, str]) -> Service:
        deps = {"FeatureRunner": self.feature.url, "GraphSAGERunner": self.model.url}
        return Service("Gateway", free_port(), env, depends=deps, log_dir=None)

    def cpu_seconds(self) -> dict[str, float]:
        """Each service's process tree's user + system seconds so far (benchmarks divide the
        difference over a window by the requests answered in it)."""
        return {
            "gateway": self.gateway.cpu_seconds(),
            "feature": self.feature.cpu_seconds(),
            "model": self.model.cpu_seconds(),
        }

    def start(self) -> SplitApp:
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


class ColocatedApp:
    """The three services in one process: the gateway started with no ``--depends`` runs the
    FeatureRunner and the GraphSAGERunner in its own worker (``common.bento.dependencies``)."""

    def __init__(self, home: str, env: dict[str, str] | None = None, log_dir: str | None = None) -> None:
        self.env = {**os.environ, "BENTOML_HOME": home, "BENTOML_DO_NOT_TRACK": "true", **(env or {})}
        self.gateway = Service("Gateway", free_port(), self.env, log_dir=log_dir)

    def start(self) -> ColocatedApp:
        self.gateway.start()
        return self

    def stop(self) -> None:
        self.gateway.stop()

    def logs(self) -> str:
        return self.gateway.log_tail(4000)


async def answers_under_load(
    url: str,
    headers: dict[str, str],
    seconds: float,
    concurrency: int,
    body_fn: Callable[[int, int], dict],
    bodies_per_worker: int = 200,
) -> Outcomes:
    """Closed-loop load on ``url`` for a bounded time (``harness.load``), counting each answer's
    outcome: the model version that answered in full, ``degraded``, or the error."""
    bodies = [json.dumps(body_fn(w, n)).encode() for n in range(bodies_per_worker) for w in range(concurrency)]
    result = await closed_loop(url, bodies, concurrency, seconds, headers=headers, classify=answer_outcome)
    assert result.outcomes is not None
    return result.outcomes


@contextlib.contextmanager
def running(app: AppT) -> Iterator[AppT]:
    app.start()
    try:
        yield app
    finally:
        app.stop()
