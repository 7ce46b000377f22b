"""Processes of the suite: BentoML services started split (one ``start-http-server`` per
service, as tests/app_harness.SplitApp and the container run them), a throw-away Redis, and
per-service CPU / memory accounting with psutil. Everything is stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from harness.ports import free_port
from harness.processes import HOST, ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
# Where the services run from (their cwd, so their imports): the checkout, or a snapshot of it
# taken at the start of the run (``snapshot_code``) so that edits made while the suite runs do
# not change the code under test half-way. The default of every Proc; one may run other code
# (``Proc(code_dir=...)``, ``snapshot_ref``: an older commit beside the working tree).
CODE_DIR = ROOT
PRODUCT_DIRS = ("common", "services", "runners", "training_export")
SNAPSHOT_DIRS = (*PRODUCT_DIRS, "harness", "bench", "tests")


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return out.stdout if out.returncode == 0 else ""


def snapshot_code(dest: str, mode: str = "worktree") -> dict:
    """Copy the code the services import into ``dest``: ``worktree`` = the files on disk now
    (tracked and untracked, ignored ones skipped except generated gRPC stubs), ``head`` = the
    last commit for the product code (``PRODUCT_DIRS``; harness/, bench/ and tests/ from disk). Returns
    the provenance recorded in the results."""
    global CODE_DIR
    _fresh(dest)
    files = _git("ls-files", "-co", "--exclude-standard", "--", *SNAPSHOT_DIRS).split("\n")
    files = [f for f in files if f and not f.startswith("bench/results/")]
    if mode == "head":
        archive = subprocess.run(
            ["git", "archive", "HEAD", *PRODUCT_DIRS], cwd=ROOT, capture_output=True, timeout=60, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True, timeout=60)
        files = [f for f in files if f.startswith(("harness/", "bench/", "tests/"))]
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))
    _copy_grpc_stubs(dest)
    CODE_DIR = Path(dest)
    dirty = [ln[3:] for ln in _git("status", "--porcelain", "--", *PRODUCT_DIRS).splitlines() if ln.strip()]
    return {
        "mode": mode,
        "git_head": _git("rev-parse", "HEAD").strip(),
        "git_head_subject": _git("log", "-1", "--format=%s").strip(),
        "uncommitted_in_code": dirty if mode == "worktree" else [],
        "uncommitted_ignored": dirty if mode == "head" else [],
        "dir": dest,
    }


def snapshot_ref(ref: str, dest: str) -> dict:
    """The product code of commit ``ref`` in ``dest``, for a Proc's ``code_dir`` (CODE_DIR is left
    alone): ``git archive`` of those of ``PRODUCT_DIRS`` that ``ref`` has (the layout changed over
    time), plus the generated gRPC stubs of the checkout (gitignored). Raises ValueError on an
    unknown ref. Returns its provenance."""
    commit = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    if not commit:
        raise ValueError(f"not a commit: {ref!r}")
    present = set(_git("ls-tree", "--name-only", commit).split())
    dirs = [d for d in PRODUCT_DIRS if d in present]
    if not dirs:
        raise ValueError(f"{ref} has none of {PRODUCT_DIRS}")
    _fresh(dest)
    archive = subprocess.run(
        ["git", "archive", commit, *dirs], cwd=ROOT, capture_output=True, timeout=60, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True, timeout=60)
    _copy_grpc_stubs(dest)
    return {
        "ref": ref,
        "commit": commit,
        "subject": _git("log", "-1", "--format=%s", commit).strip(),
        "dirs": dirs,
        "dir": dest,
    }


def _fresh(dest: str) -> None:
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)


def _copy_grpc_stubs(dest: str) -> None:
    grpc = ROOT / "services" / "grpc_gen"
    if grpc.is_dir() and not os.path.exists(os.path.join(dest, "services", "grpc_gen")):
        shutil.copytree(grpc, os.path.join(dest, "services", "grpc_gen"), ignore=shutil.ignore_patterns("__pycache__"))


APP = "services.gateway:Gateway"
TRIVIAL = "bench.suite.trivial_services:TrivialGateway"
TRIVIAL_SINGLE = "bench.suite.trivial_services:TrivialSingle"
ONE_PROCESS = "bench.suite.one_process:app"


class Proc(ServiceProcess):
    """One BentoML service of the suite (arbiter + workers) on a free loopback port, run from the
    suite's code snapshot (``code_dir``, default ``CODE_DIR`` at launch), its home removed at stop."""

    def __init__(
        self,
        target: str,
        name: str,
        home: str,
        env: dict[str, str],
        log_dir: str,
        depends: dict[str, str] | None = None,
        workers: int = 1,
        label: str | None = None,
        code_dir: Path | None = None,
    ) -> None:
        self.label = label or name
        port = free_port()
        super().__init__(
            name,
            port,
            {**env, "BENTOML_HOME": home},
            os.path.join(log_dir, f"{self.label}-{port}.log"),
            target=target,
            depends=depends,
            workers=workers,
            home_name=f"bench-{self.label}-{port}",
        )
        self.home = home
        self.code_dir = code_dir

    def launch(self) -> None:
        self.cwd = self.code_dir or CODE_DIR
        super().launch()

    def wait_ready(self, wait_s: float = 120.0) -> None:
        super().wait_ready(wait_s)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> None:
        super().stop(sig, timeout_s)
        if self.own_home and os.path.basename(self.own_home).startswith(".home-bench-"):
            shutil.rmtree(self.own_home, ignore_errors=True)


class Topology:
    """A set of services started together (in parallel: they do not wait on each other; the
    composed gateway only connects to its dependencies on the first call)."""

    def __init__(self, name: str, services: dict[str, Proc], entry: str, shared: frozenset[str] = frozenset()) -> None:
        self.name = name
        self.services = services
        self.entry = entry
        self.shared = shared  # services owned (started, stopped) by another topology; scraped here too

    def own(self) -> list[Proc]:
        return [s for k, s in self.services.items() if k not in self.shared]

    @property
    def url(self) -> str:
        return self.services[self.entry].url + "/predict"

    def start(self, wait_s: float = 150.0) -> Topology:
        try:
            for s in self.own():
                s.launch()
            for s in self.own():
                s.wait_ready(wait_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        threads = [threading.Thread(target=s.stop) for s in self.own()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)

    def cpu_seconds(self) -> dict[str, float]:
        return {k: s.cpu_seconds() for k, s in self.services.items()}

    def memory(self) -> dict[str, dict[str, float]]:
        return {k: s.memory() for k, s in self.services.items()}


def real_app(
    name: str, home: str, env: dict[str, str], log_dir: str, model: Proc | None = None, code_dir: Path | None = None
) -> Topology:
    """Gateway -> FeatureRunner -> GraphSAGERunner (the gateway also calls the model runner for
    its admin calls). A given ``model`` is shared with (and owned by) another topology: a second
    FeatureRunner + gateway try another configuration in front of one model runner. ``code_dir``:
    the code the services it starts run (default CODE_DIR)."""
    shared = frozenset({"model"}) if model is not None else frozenset()
    if model is None:
        model = Proc(APP, "GraphSAGERunner", home, env, log_dir, label=f"{name}-model", code_dir=code_dir)
    feature = Proc(
        APP,
        "FeatureRunner",
        home,
        env,
        log_dir,
        label=f"{name}-feature",
        depends={"GraphSAGERunner": model.url},
        code_dir=code_dir,
    )
    gateway = Proc(
        APP,
        "Gateway",
        home,
        env,
        log_dir,
        label=f"{name}-gateway",
        depends={"FeatureRunner": feature.url, "GraphSAGERunner": model.url},
        code_dir=code_dir,
    )
    return Topology(name, {"feature": feature, "model": model, "gateway": gateway}, "gateway", shared)


def colocated_app(name: str, home: str, env: dict[str, str], log_dir: str, code_dir: Path | None = None) -> Topology:
    """The three services in one process: the gateway started with no ``--depends`` runs the
    runners in its own worker (``common.bento.dependencies``, the co-located deployment).
    ``code_dir``: the code it runs (default CODE_DIR)."""
    gateway = Proc(APP, "Gateway", home, env, log_dir, label=f"{name}-gateway", code_dir=code_dir)
    return Topology(name, {"gateway": gateway}, "gateway")


def trivial_app(home: str, log_dir: str) -> Topology:
    model = Proc(TRIVIAL, "TrivialModel", home, {}, log_dir, label="b1-model")
    feature = Proc(
        TRIVIAL, "TrivialFeature", home, {}, log_dir, label="b1-feature", depends={"TrivialModel": model.url}
    )
    gateway = Proc(
        TRIVIAL,
        "TrivialGateway",
        home,
        {},
        log_dir,
        label="b1-gateway",
        depends={"TrivialFeature": feature.url, "TrivialModel": model.url},
    )
    return Topology("B1", {"feature": feature, "model": model, "gateway": gateway}, "gateway")


def trivial_single(home: str, log_dir: str) -> Topology:
    return Topology(
        "B2", {"single": Proc(TRIVIAL_SINGLE, "TrivialSingle", home, {}, log_dir, label="b2-single")}, "single"
    )


class AsgiProc(Proc):
    """A plain ASGI app under uvicorn (B5), started, scraped and stopped as the services are. It
    logs a line per request, as uvicorn does by default and as every BentoML side of the suite
    does (the gateway's access log, B1, B2): the same features on both sides of a ratio."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "uvicorn", self.target, "--host", HOST, "--port", str(self.port)]


def one_process(home: str, env: dict[str, str], log_dir: str) -> Topology:
    """B5: the app's work in one process (``bench.suite.one_process``), with the app's settings."""
    return Topology("B5", {"one": AsgiProc(ONE_PROCESS, "OneProcess", home, env, log_dir, label="b5")}, "one")
