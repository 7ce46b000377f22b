"""The release image, run: its three services as three containers of the one image (podman,
runc, host networking on loopback ports), each started from its Kubernetes manifest (the same
arguments, environment, mounts and security context: read-only root, a writable /tmp and
BENTOML_HOME per container, the service token from a mounted file, the model store as a volume
seeded by the manifests' init container), Redis Cluster beside them. HTTP and gRPC predictions; a new model
version trained here, imported into the store the way docs/release.md says (the model-admin
Job), and canary weights moved onto it through the routing file (the ConfigMap flow); the
FeatureRunner container killed (degraded answers) and started again (full answers); a pickled body
sent to every route of the three containers every way that once got one past a guard (nothing
runs it, every answer is a 4xx); the serving
image refuses the torch backend. Prints the image's size and each container's cold start.

Needs the image (``make image``; another with GRAPHSAGE_TEST_IMAGE=NAME) and podman + runc;
skipped, saying which is missing, otherwise. ``.ci/run`` builds the image, then ``make test``.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bentos.image import DEFAULT_IMAGE, human, image_env, image_exists, image_size
from harness.app import ROOT, free_port, run_export
from harness.attacks import app_targets, marker_exists, send_pickles
from harness.containers import (
    Containers,
    ContainerSpec,
    k8s_docs,
    k8s_object,
    podman_available,
    replace_arg,
    rewrite_depends,
    spec_from_k8s,
)
from tests.conftest import wait_for

IMAGE = os.environ.get("GRAPHSAGE_TEST_IMAGE", DEFAULT_IMAGE)
K8S_DIR = ROOT / "bentos" / "k8s"
BENTO_UID = 1034  # the image's user (bentoml), as the manifests' runAsUser
LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 240.0
TOKEN_FILE = "tokens"


@pytest.fixture(scope="module")
def image():
    if not podman_available() or shutil.which("runc") is None:
        pytest.skip("podman and runc not installed (apt-get install podman runc buildah)")
    if not image_exists(IMAGE):
        pytest.skip(f"image {IMAGE} not built here (make image)")
    env = image_env(IMAGE)
    tags = [t for t in env.get("GSAGE_MODEL_TAGS", "").split(",") if t]
    assert tags and env.get("GSAGE_SNAPSHOT_TAG"), f"{IMAGE} pins no models: {env}"
    return {"name": IMAGE, "size": image_size(IMAGE), "v1": tags[0], "snapshot": env["GSAGE_SNAPSHOT_TAG"]}


def _own(path: Path, mode: int) -> Path:
    """A host directory or file the container user reads (and, for directories, writes)."""
    if os.geteuid() == 0:
        os.chown(path, BENTO_UID, BENTO_UID)
        os.chmod(path, mode)
    else:
        os.chmod(path, mode | 0o077 if path.is_dir() else mode | 0o044)
    return path


def _dir(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    return _own(d, 0o750)


def _loopback(spec: ContainerSpec, port: int, depends: dict[str, str]) -> ContainerSpec:
    """The manifest's args on one host: its own loopback port, dependencies by loopback URL."""
    args = replace_arg(spec.args, "--host", LOOPBACK)
    spec.args = rewrite_depends(replace_arg(args, "--port", str(port)), depends)
    return spec


def _unmounted_files(spec: ContainerSpec) -> list[str]:
    """The file settings (``GSAGE_*_FILE``, each validated at the service's start) that name a
    path no volume of the container mounts: such a pod would stop at start ("... is not a
    readable file")."""
    mounted = [m.target.rstrip("/") + "/" for m in spec.mounts]
    return [
        f"{spec.name}: {k}={v}"
        for k, v in spec.env.items()
        if k.startswith("GSAGE_") and k.endswith("_FILE") and v and not any(v.startswith(m) for m in mounted)
    ]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.image
def test_three_containers_from_the_release_image(image, tmp_path, capsys):
    from harness.redis_servers import RedisCluster3, redis_available
    from services.auth import KeyEntry, generate_key, hash_key, write_entries
    from services.grpc_client import predict as grpc_predict

    if not redis_available():
        pytest.skip("redis-server / redis-cli not installed")
    t0 = time.monotonic()
    docs = k8s_docs(K8S_DIR)
    v1, snapshot = image["v1"], image["snapshot"]
    report: dict = {"image": IMAGE, "image_size": human(image["size"]), "image_bytes": image["size"]}

    # The manifests' volumes as host directories (the emptyDirs per container, below).
    store = _dir(tmp_path, "models")  # the graphsage-models PVC
    seed = _dir(tmp_path, "seed-script")  # the graphsage-seed-models ConfigMap
    seed_cm = k8s_object(docs, "ConfigMap", "graphsage-seed-models")["data"]
    for name, text in seed_cm.items():
        (seed / name).write_text(text)
        _own(seed / name, 0o444)
    token_dir = _dir(tmp_path, "service-token")  # the graphsage-service-token Secret
    (token_dir / TOKEN_FILE).write_text("gst_" + os.urandom(18).hex() + "\n")
    _own(token_dir / TOKEN_FILE, 0o440)
    keys_dir = _dir(tmp_path, "api-keys")  # the graphsage-api-keys Secret
    key = generate_key()
    write_entries(str(keys_dir / "keys.json"), [KeyEntry("ops", hash_key(key), frozenset({"predict", "admin"}))])
    _own(keys_dir / "keys.json", 0o440)
    routing = _dir(tmp_path, "routing")  # the graphsage-routing ConfigMap, the stable version filled in
    routes = routing / "routes.json"
    routes_cm = k8s_object(docs, "ConfigMap", "graphsage-routing")["data"]["routes.json"]
    routes.write_text(routes_cm.replace("graphsage:REPLACE_WITH_STABLE_VERSION", v1))
    _own(routes, 0o444)
    incoming = _dir(tmp_path, "incoming")  # the model-admin Job's upload directory
    headers = {"Authorization": f"Bearer {key}"}

    with RedisCluster3(str(tmp_path / "redis")) as redis, Containers(tmp_path / "containers") as pods:
        # 1. The store seeded from the image by the runners' init container (model-store.yaml).
        seeder = pods.run(
            spec_from_k8s(
                docs,
                "feature-runner",
                name=f"gsage-seed-{os.getpid()}",
                image=IMAGE,
                init="seed-models",
                volumes={"models": str(store), "seed-script": str(seed)},
            )
        )
        state = seeder.wait_exit(120)
        assert state["exit_code"] == 0, seeder.logs()
        assert f"seeded {v1}" in seeder.logs(), seeder.logs()
        packed = {f"{p.parent.name}:{p.name}" for p in (store / "models").glob("*/*") if p.is_dir()}
        assert {v1, snapshot} <= packed, packed

        # 2. The three services, each as its manifest starts it, on loopback ports.
        ports = {"model": free_port(), "feature": free_port(), "gateway": free_port(), "grpc": free_port()}
        urls = {
            "GraphSAGERunner": f"http://{LOOPBACK}:{ports['model']}",
            "FeatureRunner": f"http://{LOOPBACK}:{ports['feature']}",
        }
        gateway_url = f"http://{LOOPBACK}:{ports['gateway']}"
        # The update log on this test's cluster (empty: GSAGE_REDIS_URL's): the manifests' redis-log
        # is not started here (the FeatureRunner warns that this cluster keeps nothing).
        here = {"GSAGE_REDIS_URL": redis.url, "GSAGE_GRAPH_LOG_REDIS_URL": "", "GSAGE_GRPC_PORT": str(ports["grpc"])}
        shared = {
            "models": str(store),
            "service-token": str(token_dir),
            "routing": str(routing),
            "api-keys": str(keys_dir),
        }

        def volumes(pod: str) -> dict[str, str | None]:
            """The shared volumes and the pod's own emptyDirs (directories on the node's disk, as
            emptyDirs are: kept across a restart of the container)."""
            return {
                **shared,
                "tmp": str(_dir(tmp_path / pod, "tmp")),
                "bentoml-home": str(_dir(tmp_path / pod, "bentoml-home")),
            }

        model = spec_from_k8s(
            docs, "graphsage-runner", name=f"gsage-model-{os.getpid()}", image=IMAGE, volumes=volumes("model")
        )
        assert model.env["GSAGE_BACKEND"] == "onnx-cuda"
        # The manifest's CPU-cluster form (its header): the CPU image, ONNX Runtime on the CPU.
        model.env.update(here, GSAGE_BACKEND="onnx")
        feature = spec_from_k8s(
            docs, "feature-runner", name=f"gsage-feature-{os.getpid()}", image=IMAGE, volumes=volumes("feature")
        )
        feature.env.update(here)
        gateway = spec_from_k8s(
            docs, "gateway", name=f"gsage-gateway-{os.getpid()}", image=IMAGE, volumes=volumes("gateway")
        )
        # Auth is on, so the gateway would bind every interface: loopback only here.
        gateway.env.update(here, GSAGE_HOST=LOOPBACK)
        assert json.loads(feature.env["BENTOML_CONFIG_OVERRIDES"])["services"]["FeatureRunner"]["workers"] == 2
        for spec in (model, feature, gateway):
            assert not _unmounted_files(spec), _unmounted_files(spec)
        assert "GSAGE_API_KEYS_FILE" not in model.env and "GSAGE_API_KEYS_FILE" not in feature.env
        assert gateway.env["GSAGE_AUTH_ENABLED"] == "true"
        for spec in (model, feature, gateway):
            assert spec.read_only and spec.cap_drop_all and spec.user == f"{BENTO_UID}:{BENTO_UID}", spec.name
            assert spec.env["GSAGE_SERVICE_TOKENS_FILE"] == f"/var/run/secrets/graphsage/service-token/{TOKEN_FILE}"
        cold: dict[str, float] = {}
        running = {}
        for spec, port, name in (
            (model, ports["model"], "GraphSAGERunner"),
            (feature, ports["feature"], "FeatureRunner"),
            (gateway, ports["gateway"], "Gateway"),
        ):
            running[name] = pods.run(_loopback(spec, port, urls))
            cold[name] = round(running[name].wait_ready(f"http://{LOOPBACK}:{port}", READY_TIMEOUT_S), 1)
        feature_c, gateway_c = running["FeatureRunner"], running["Gateway"]
        report["cold_start_s"] = cold

        # 3. Predictions over HTTP and gRPC; the runners refuse a call without the service token.
        client = httpx.Client(timeout=30, headers=headers)
        ids = [0, 7, 42]
        r = client.post(gateway_url + "/predict", json={"node_ids": ids, "seed": 5})
        assert r.status_code == 200, (r.text, gateway_c.logs())
        body = r.json()
        assert body["model"] == v1 and body["degraded"] is False, body
        assert [p["node_id"] for p in body["predictions"]] == ids
        assert httpx.post(gateway_url + "/predict", json={"node_ids": ids}, timeout=10).status_code == 401
        g = grpc_predict(f"{LOOPBACK}:{ports['grpc']}", ids, api_key=key, seed=5)
        assert g["model"] == v1
        assert [p["label"] for p in g["predictions"]] == [p["label"] for p in body["predictions"]]
        assert (
            httpx.post(
                urls["FeatureRunner"] + "/predict",
                content=b"\0" * 16,
                timeout=10,
                headers={"content-type": "application/octet-stream"},
            ).status_code
            == 401
        )
        info = client.get(gateway_url + "/models").json()
        assert info["feature_runner"]["graph_snapshot"] == snapshot, info

        # 3b. A pickled body that would create /tmp/pickle-ran in the container that loads it, to
        # every route of the three containers, its media type and the credentials spelt every way
        # (harness.attacks): only 4xx, and no container's /tmp (a host directory here) has the file.
        token = (token_dir / TOKEN_FILE).read_text().strip()
        attack = send_pickles(
            app_targets(urls["GraphSAGERunner"], urls["FeatureRunner"], gateway_url, token, key), "/tmp/pickle-ran"
        )
        assert not marker_exists(*(tmp_path / pod / "tmp" / "pickle-ran" for pod in ("model", "feature", "gateway")))
        assert not attack.not_4xx, attack.not_4xx[:10]
        report["pickle_attack"] = {"sent": attack.sent, "statuses": dict(sorted(attack.statuses.items()))}

        # 3c. The co-located deployment from the same image (docs/release.md, 3b): the
        # FeatureRunner's pod (the models, the token, its settings) started as the gateway alone,
        # with no --depends, runs the three services in one container; the same seed, the same answer.
        colo_port = free_port()
        colo = spec_from_k8s(
            docs, "feature-runner", name=f"gsage-colocated-{os.getpid()}", image=IMAGE, volumes=volumes("colocated")
        )
        colo.env.update(here, GSAGE_GRPC_PORT="0")
        colo.args = ["start-http-server", "--service-name", "Gateway", "--host", LOOPBACK, "--port", str(colo_port)]
        colocated_c = pods.run(colo)
        cold["colocated"] = round(colocated_c.wait_ready(f"http://{LOOPBACK}:{colo_port}", READY_TIMEOUT_S), 1)
        r2 = httpx.post(f"http://{LOOPBACK}:{colo_port}/predict", json={"node_ids": ids, "seed": 5}, timeout=30)
        assert r2.status_code == 200, (r2.text, colocated_c.logs())
        assert r2.json()["model"] == v1
        assert [p["label"] for p in r2.json()["predictions"]] == [p["label"] for p in body["predictions"]]
        colocated_c.remove()

        # 4. A new version: trained on the packed snapshot (a training machine: this venv, torch),
        # exported, and imported into the runners' store by the model-admin Job (jobs/model-admin.yaml).
        t_canary = time.monotonic()
        train_home = tmp_path / "train-home"
        name, version = snapshot.split(":")
        shutil.copytree(store / "models" / name / version, train_home / "models" / name / version)
        v2 = run_export(
            str(train_home),
            "train",
            "--snapshot",
            snapshot,
            "--aggregator",
            "pool",
            "--epochs",
            "1",
            "--hidden",
            "32",
            "--max-train-nodes",
            "2000",
        )["graphsage"]
        bentomodel = incoming / "graphsage-v2.bentomodel"  # = kubectl cp into /store-home/incoming
        out = subprocess.run(
            [sys.executable, "-m", "bentoml", "models", "export", v2, str(bentomodel)],
            env={**os.environ, "BENTOML_HOME": str(train_home), "BENTOML_DO_NOT_TRACK": "true"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        _own(bentomodel, 0o444)
        admin = pods.run(
            spec_from_k8s(
                docs,
                "graphsage-model-admin",
                kind="Job",
                name=f"gsage-admin-{os.getpid()}",
                image=IMAGE,
                volumes={"home": None, "models": str(store), "incoming": str(incoming), "tmp": None},
            )
        )
        wait_for(lambda: admin.exec("test", "-d", "/store-home/incoming").returncode == 0, 60)
        out = admin.exec("bentoml", "models", "import", f"/store-home/incoming/{bentomodel.name}", timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert v2 in admin.exec("bentoml", "models", "list").stdout
        admin.remove()
        # Loadable before any traffic moves: a pinned request.
        r = client.post(gateway_url + "/predict", json={"node_ids": ids, "version": v2})
        assert r.status_code == 200 and r.json()["model"] == v2, r.text

        # 5. Canary weights moved on the routing file (the ConfigMap flow): 50/50, then all to v2.
        def routing_cli(*args: str) -> None:
            out = subprocess.run(
                [sys.executable, "-m", "services.routing_cli", "--file", str(routes), *args],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr
            os.chmod(routes, 0o444)

        def served(n: int = 24) -> collections.Counter:
            return collections.Counter(
                client.post(gateway_url + "/predict", json={"node_ids": [i], "routing_key": f"user-{i}"}).json()[
                    "model"
                ]
                for i in range(n)
            )

        routing_cli("set-weights", "graphsage", f"{v1}=50", f"{v2}=50")
        mixed = wait_for(lambda: (lambda c: c if len(c) == 2 else None)(served()), 30)
        assert mixed and set(mixed) == {v1, v2}, mixed
        routing_cli("promote", "graphsage", v2)
        assert wait_for(lambda: served(12) == collections.Counter({v2: 12}), 30)
        assert grpc_predict(f"{LOOPBACK}:{ports['grpc']}", ids, api_key=key)["model"] == v2
        report["canary_s"] = round(time.monotonic() - t_canary, 1)

        # 6. The FeatureRunner container killed: degraded answers (the gateway's last answers),
        # then started again (the kubelet's restart): full answers.
        warm = [1, 2, 3]
        assert client.post(gateway_url + "/predict", json={"node_ids": warm}).json()["degraded"] is False
        feature_c.kill()
        assert not feature_c.running()
        r = client.post(gateway_url + "/predict", json={"node_ids": warm})
        assert r.status_code == 200, r.text
        assert r.json()["degraded"] is True and [p["node_id"] for p in r.json()["predictions"]] == warm, r.json()
        feature_c.start()
        report["feature_runner_restart_s"] = round(feature_c.wait_ready(urls["FeatureRunner"], READY_TIMEOUT_S), 1)
        assert wait_for(
            lambda: client.post(gateway_url + "/predict", json={"node_ids": warm}).json()["degraded"] is False, 30
        ), "still degraded after the FeatureRunner came back"
        r = client.post(gateway_url + "/predict", json={"node_ids": ids})
        assert r.status_code == 200 and r.json()["degraded"] is False and r.json()["model"] == v2, r.text

        # 7. The serving image has no torch: the torch backend refuses to start, and says why.
        torch_spec = spec_from_k8s(
            docs, "graphsage-runner", name=f"gsage-torch-{os.getpid()}", image=IMAGE, volumes=volumes("torch")
        )
        torch_spec.env.update(here, GSAGE_BACKEND="torch")
        torch_c = pods.run(_loopback(torch_spec, free_port(), urls))
        state = torch_c.wait_exit(120)
        logs = torch_c.logs(300)
        assert state["exit_code"] not in (0, None), (state, logs)
        assert "the torch backend needs the 'torch' package" in logs and "No module named 'torch'" in logs, logs
        torch_c.remove()

    report["test_s"] = round(time.monotonic() - t0, 1)
    with capsys.disabled():
        print(f"\nrelease image: {json.dumps(report)}")


# --- Without podman: what the images are made of, how a container is started ------------------

TORCH_PACKAGES = ("torch", "torch-geometric", "pyarrow")


def _names(packages: list[str]) -> set[str]:
    import re

    return {re.split(r"[<>=!~\[; ]", p, maxsplit=1)[0].lower() for p in packages}


def test_the_serving_images_have_no_torch():
    from bentos.release import BENTOFILE, GPU_BENTOFILE, load_bentofile

    for path in (BENTOFILE, GPU_BENTOFILE):
        python = load_bentofile(path)["python"]
        assert not _names(python["packages"]) & set(TORCH_PACKAGES), path
        # The PyTorch indexes served torch only (and are unreachable here: uv fails on them).
        assert not python.get("extra_index_url"), path
        assert {"bentoml", "onnx", "numba"} <= _names(python["packages"]), path


def test_the_torch_image_is_the_serving_one_plus_torch():
    from bentos.release import BENTOFILE, TORCH_BENTOFILE, load_bentofile, set_image_options

    serving, torch = load_bentofile(BENTOFILE), load_bentofile(TORCH_BENTOFILE)
    assert "extends" not in torch and torch["name"] == "graphsage-serving-torch"
    assert torch["python"]["packages"][: len(serving["python"]["packages"])] == serving["python"]["packages"]
    assert _names(torch["python"]["packages"]) - _names(serving["python"]["packages"]) == set(TORCH_PACKAGES)
    assert "torch==2.13.0" in torch["python"]["packages"]
    # No project file names an index: the one who builds does (--extra-index), or pip's own.
    assert not torch["python"].get("extra_index_url")
    assert torch["envs"] == serving["envs"] and torch["include"] == serving["include"]
    assert torch["labels"] == {**serving["labels"], "variant": "cpu-torch"}
    cpu_index = "http://127.0.0.1:1/whl/cpu"
    named = set_image_options(torch, extra_indexes=[cpu_index])
    assert named["python"]["extra_index_url"] == [cpu_index] and "extra_index_url" not in torch["python"]
    # Where no index is reachable: none, the CPU wheel from `image --find-links`.
    local = set_image_options(named, base_image="localhost/graphsage-base:bookworm", no_extra_index=True)
    assert "extra_index_url" not in local["python"] and local["python"]["packages"] == torch["python"]["packages"]
    assert local["docker"]["base_image"] == "localhost/graphsage-base:bookworm" and "distro" not in local["docker"]
    assert local["docker"]["dockerfile_template"] == serving["docker"]["dockerfile_template"]


def test_build_mounts_leave_nothing_in_the_image(tmp_path):
    from bentos.image import IMAGE_CA_BUNDLE, build_mounts

    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with build_mounts(str(ca), str(wheels)) as volumes:
        assert volumes[0] == f"{ca}:{IMAGE_CA_BUNDLE}:ro"
        assert volumes[1] == f"{wheels}:/build-wheels:ro" and volumes[2].endswith(":/etc/uv:ro")
        conf = Path(volumes[2].split(":")[0]) / "uv.toml"
        assert conf.read_text() == 'find-links = ["/build-wheels"]\n'
    assert not conf.exists()
    with build_mounts("", None) as volumes:
        assert volumes == []


def test_containers_start_as_the_manifests_say(tmp_path):
    import resource

    from harness.containers import machine_ulimits, run_options

    docs = k8s_docs(K8S_DIR)
    spec = spec_from_k8s(
        docs,
        "feature-runner",
        name="x",
        image="img",
        volumes={
            "models": str(tmp_path / "store"),
            "service-token": str(tmp_path / "tok"),
            "tmp": None,
            "bentoml-home": str(tmp_path / "home"),
        },
    )
    assert spec.args[:3] == ["start-http-server", "--service-name", "FeatureRunner"]
    assert spec.env["GSAGE_REDIS_URL"].startswith("redis+cluster://")  # the ConfigMap, through envFrom
    assert spec.env["NUMBA_CACHE_DIR"] == "/tmp/numba-cache"  # the container's own env
    assert spec.read_only and spec.cap_drop_all and spec.no_new_privileges and spec.user == "1034:1034"
    mounts = {m.target: m for m in spec.mounts}
    assert mounts["/home/bentoml/bento/models"].source == str(tmp_path / "store" / "models")  # subPath
    assert not mounts["/home/bentoml/bento/models"].read_only  # a compaction saves its snapshot there
    assert mounts["/tmp"].source is None and mounts["/tmp"].tmpfs_size == "1g"
    args = _loopback(spec, 4321, {"GraphSAGERunner": "http://127.0.0.1:1234"}).args
    assert args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--port") + 1] == "4321"
    assert args[args.index("--depends") + 1] == "GraphSAGERunner=http://127.0.0.1:1234"
    run = spec.run_args(str(tmp_path / "cid"))
    assert run[:4] == ["run", "--detach", "--cidfile", str(tmp_path / "cid")]
    assert run[-len(args) - 1 :] == ["img", *args]
    opts = run_options()
    assert opts[:4] == ["--runtime", "runc", "--network", "host"]
    for flag, res in zip(machine_ulimits()[1::2], (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC)):
        soft, hard = (int(v) for v in flag.split("=")[1].split(":"))
        own_soft, own_hard = resource.getrlimit(res)
        assert soft <= hard and (own_hard == resource.RLIM_INFINITY or hard <= own_hard), flag
        assert own_soft == resource.RLIM_INFINITY or soft <= own_soft, flag


def test_the_torch_backend_refuses_without_torch(monkeypatch):
    """Where torch is not installed (the serving image), the torch backend says so and what to
    serve with instead; torch stays installed here: its import is made to fail."""
    from runners.graphsage import backends

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(backends.BackendUnavailable) as exc:
        backends.TorchBackend(None)  # the package check comes before the artifacts are read
    msg = str(exc.value)
    assert "the torch backend needs the 'torch' package, which is not installed here" in msg, msg
    assert "the serving image does not ship torch" in msg and "GSAGE_BACKEND=onnx" in msg, msg
