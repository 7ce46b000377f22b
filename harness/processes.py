"""One BentoML service as a process of its own, for tests, benchmarks and the local split deploy:
started with the image's command (``start-http-server --service-name X``) on a loopback port, in
a session of its own, ready when ``/readyz`` answers, stopped by PID with its whole tree (BentoML
workers run in sessions of their own, so a process-group kill would leave them serving), also
when a start fails halfway.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil

from common.bento.launch import START_HTTP_SERVER
from common.service_auth import ensure_shared_token

ROOT = Path(__file__).resolve().parent.parent
APP = "services.gateway:Gateway"
HOST = "127.0.0.1"


def stop_process_tree(root: psutil.Process, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> None:
    """Signal a BentoML arbiter and every worker, then SIGKILL what is left."""
    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = [root]
    for proc in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)
    _, alive = psutil.wait_procs(tree, timeout=timeout_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


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


class ServiceProcess:
    """One service of ``target`` (a bento's import path), its home private but sharing ``env``'s
    model store. ``tls_ca``: it serves HTTPS verified by this CA (the gateway with a certificate)."""

    def __init__(
        self,
        name: str,
        port: int,
        env: dict[str, str],
        log_path: str,
        *,
        target: str = APP,
        depends: dict[str, str] | None = None,
        workers: int = 1,
        cwd: Path | str = ROOT,
        home_name: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.name, self.port, self.env, self.target, self.workers = name, port, env, target, workers
        self.depends = depends or {}
        self.log_path = log_path
        self.cwd = cwd
        self.home_name = home_name or f"{name}-{port}"
        self.tls_ca = tls_ca
        self.proc: subprocess.Popen | None = None
        self.own_home: str | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_ca else 'http'}://{HOST}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            *START_HTTP_SERVER,
            self.target,
            "--service-name",
            self.name,
            "--port",
            str(self.port),
            "--host",
            HOST,
            "--api-workers",
            str(self.workers),
        ]
        for dep, url in self.depends.items():
            cmd += ["--depends", f"{dep}={url}"]
        return cmd

    def launch(self) -> None:
        """Start the process; ``wait_ready`` waits for it."""
        ensure_shared_token()  # the services of one run share a service token, as a Secret gives them
        self.own_home = private_home(self.env["BENTOML_HOME"], self.home_name)
        env = {**os.environ, "BENTOML_DO_NOT_TRACK": "true", **self.env, "BENTOML_HOME": self.own_home}
        # Never the user's own update log: one beside the model store the services serve.
        env.setdefault(
            "GSAGE_GRAPH_LOG_DIR", os.path.join(os.path.dirname(self.env["BENTOML_HOME"].rstrip("/")), "update-log")
        )
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, wait_s: float = 90.0) -> None:
        """Until ``/readyz`` answers; the process is stopped when it does not in time."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"{self.name} exited with {code}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=1.0, verify=self.tls_ca or True).status_code == 200:
                    return
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {wait_s}s:\n{self.log_tail()}")

    def start(self, wait_s: float = 90.0) -> ServiceProcess:
        self.launch()
        self.wait_ready(wait_s)
        return self

    def tree(self) -> list[psutil.Process]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        return []

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def memory(self) -> dict[str, float]:
        """RSS and PSS (MiB) summed over the service's processes, and of its largest one (the
        worker). RSS counts shared pages (the memory-mapped snapshot) in every process that
        touched them; PSS divides them."""
        rss = pss = top = 0.0
        procs = 0
        for p in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                m = p.memory_full_info()
                rss += m.rss
                pss += getattr(m, "pss", m.rss)
                top = max(top, m.rss)
                procs += 1
        mib = 2.0**20
        return {"rss_mib": rss / mib, "pss_mib": pss / mib, "worker_rss_mib": top / mib, "processes": procs}

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
