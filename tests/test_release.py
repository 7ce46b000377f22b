"""Release: the bento is built (models pinned), laid out as the image lays it out (BentoML's own
build context: Dockerfile + bento + models), and its three services are started from that
directory as separate processes (the image's ``start-http-server --service-name`` form, each on
its own port, GraphSAGERunner with 2 workers), then served over HTTP and gRPC end to end, and a
canary moves traffic between the two packed versions. Deployment specs are validated."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from common.bento.launch import START_HTTP_SERVER, WORKER_MODULE
from harness.app import ROOT, free_port
from tests.conftest import wait_for

K8S_DIR = ROOT / "bentos" / "k8s"


def release(home: str, *args: str, timeout: float = 300) -> str:
    env = {**os.environ, "BENTOML_HOME": home, "BENTOML_DO_NOT_TRACK": "true"}
    out = subprocess.run(
        [sys.executable, "-m", "bentos.release", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, f"bentos.release {args} failed:\n{out.stderr[-4000:]}"
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def released(tmp_path_factory, demo_store):
    root = tmp_path_factory.mktemp("release")
    home, v1, v2 = demo_store.home, demo_store.v1, demo_store.v2
    # Pack both versions (a canary in one image); v1 first = the default version.
    tag = release(home, "build", "--model", v1, "--model", v2)
    ctx = Path(release(home, "context", tag, "--out", str(root / "context")))
    return {"root": root, "home": home, "v1": v1, "v2": v2, "tag": tag, "ctx": ctx}


@pytest.mark.integration
@pytest.mark.slow
def test_build_context_is_the_image(released):
    ctx, v1, v2 = released["ctx"], released["v1"], released["v2"]
    dockerfile = (ctx / "env/docker/Dockerfile").read_text()
    for needed in (
        "EXPOSE 3000",
        "EXPOSE 50051",
        'ENTRYPOINT [ "/home/bentoml/bento/env/docker/entrypoint.sh" ]',
        "ENV BENTO_PATH=$BENTO_PATH",
        "COPY --chown=bentoml:bentoml . ./",
        "FROM python:3.11",
    ):
        assert needed in dockerfile, needed
    # The runners' pinned tags are baked in as the image's environment.
    assert "ENV GSAGE_MODEL_TAGS=$GSAGE_MODEL_TAGS" in dockerfile
    assert f"ARG GSAGE_MODEL_TAGS={v1},{v2}" in dockerfile
    assert "ARG GSAGE_SNAPSHOT_TAG=graph-snapshot:" in dockerfile
    assert (ctx / "env/docker/entrypoint.sh").is_file()
    reqs = (ctx / "env/python/requirements.txt").read_text()
    assert "bentoml==1.4.40" in reqs and "onnxruntime" in reqs
    assert "torch" not in reqs and "pyarrow" not in reqs  # the serving image (tests/test_image.py)
    # Models: both graphsage versions and the snapshot, pinned, in the context's models/.
    for tag in (v1, v2):
        name, version = tag.split(":")
        assert (ctx / "models" / name / version / "model.onnx").is_file()
    info = yaml.safe_load((ctx / "bento.yaml").read_text())
    packed = {m["tag"] for m in info["models"]}
    assert {v1, v2} <= packed and any(t.startswith("graph-snapshot:") for t in packed)
    assert not any(t.endswith(":latest") for t in packed)
    # Sources: the .proto and the generated stubs travel with the bento.
    src = ctx / "src" / "services"
    assert (src / "proto/graphsage/v1/predict.proto").is_file()
    assert (src / "grpc_gen/graphsage/v1/predict_pb2.py").is_file()
    assert (src / "grpc_gen/graphsage/v1/predict_pb2_grpc.py").is_file()
    assert not list((ctx / "src").rglob("__pycache__"))


@pytest.mark.integration
@pytest.mark.slow
def test_gpu_variant_builds(released):
    home, root = released["home"], released["root"]
    tag = release(home, "build", "--gpu", "--no-codegen")
    assert tag.startswith("graphsage-serving-gpu:")
    ctx = Path(release(home, "context", tag, "--out", str(root / "context-gpu")))
    dockerfile = (ctx / "env/docker/Dockerfile").read_text()
    assert "FROM nvidia/cuda:12.6" in dockerfile and "EXPOSE 50051" in dockerfile
    assert "ARG GSAGE_BACKEND=onnx-cuda" in dockerfile
    reqs = (ctx / "env/python/requirements.txt").read_text().split()
    assert "onnxruntime-gpu>=1.18" in reqs and "tensorrt>=10.0" in reqs
    assert not any(r.startswith("onnxruntime>") or r == "onnxruntime" for r in reqs)


@pytest.mark.integration
@pytest.mark.slow
def test_split_services_from_the_bento_directory(released, tmp_path):
    from bentos.local_split import SplitDeployment
    from services.grpc_client import predict as grpc_predict

    ctx, v1, v2 = released["ctx"], released["v1"], released["v2"]
    routes = tmp_path / "routes.json"
    routes.write_text(
        json.dumps(
            {"default_model": "graphsage", "models": {"graphsage": {"routes": [{"version": v1, "weight": 1.0}]}}}
        )
    )
    grpc_port = free_port()
    # The image's environment (the bento's envs) with this test's routing file and gRPC port;
    # each service gets an empty BentoML home of its own, so the models can only come from the
    # bento directory, as in the image.
    env = {
        "GSAGE_ROUTING_FILE": str(routes),
        "GSAGE_GRPC_PORT": str(grpc_port),
        "GSAGE_GRAPH_LOG_DIR": str(tmp_path / "update-log"),
    }
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("GSAGE_", "BENTOML_"))}
    dep = SplitDeployment(
        ctx,
        tmp_path / "split",
        gateway_port=free_port(),
        feature_port=free_port(),
        model_port=free_port(),
        model_workers=2,
        env=env,
        base_env=clean_env,
    )
    dep.up(wait_s=150)
    pids = []
    try:
        # Each service runs from the bento's src/ with its own process tree; GraphSAGERunner
        # has 2 workers.
        for p in dep.procs:
            proc = psutil.Process(p.pid)
            assert Path(proc.cwd()) == ctx / "src"
            cmd = proc.cmdline()  # the entrypoint exec'd start-http-server, same PID
            assert cmd[1:] == [*START_HTTP_SERVER[1:], *cmd[len(START_HTTP_SERVER) : -1], str(ctx)], cmd
            pids += [proc.pid, *(c.pid for c in proc.children(recursive=True))]
        workers = [
            c for c in psutil.Process(dep.model.pid).children(recursive=True) if WORKER_MODULE in " ".join(c.cmdline())
        ]
        assert len(workers) == 2, [c.cmdline() for c in workers]
        assert not (tmp_path / "split" / "home-GraphSAGERunner" / "models" / "graphsage").exists()
        probe = subprocess.run(
            [sys.executable, "-c", "import services.gateway as g; print(g.__file__)"],
            cwd=ctx / "src",
            capture_output=True,
            text=True,
            env={**clean_env, "BENTOML_HOME": str(tmp_path / "probe-home")},
        )
        assert probe.stdout.strip().startswith(str(ctx / "src")), probe

        url = dep.gateway.url
        ids = [0, 7, 3999]
        r = httpx.post(url + "/predict", json={"node_ids": ids, "seed": 5}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == v1 and body["degraded"] is False
        assert [p["node_id"] for p in body["predictions"]] == ids
        g = grpc_predict(f"127.0.0.1:{grpc_port}", ids, seed=5)
        assert g["model"] == v1
        assert [p["label"] for p in g["predictions"]] == [p["label"] for p in body["predictions"]]
        models = httpx.get(url + "/models", timeout=10).json()
        assert models["feature_runner"]["graph_snapshot"].startswith("graph-snapshot:")

        def served(n: int = 12) -> collections.Counter:
            return collections.Counter(
                httpx.post(url + "/predict", json={"node_ids": [i], "routing_key": f"user-{i}"}, timeout=30).json()[
                    "model"
                ]
                for i in range(n)
            )

        # Canary: half the keys to v2, then all traffic; each gateway worker re-reads the
        # routing file within ~1 s.
        r = httpx.post(
            url + "/admin/routing",
            json={"action": "set_weights", "model": "graphsage", "weights": {v1: 50, v2: 50}},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        mixed = wait_for(lambda: (lambda c: c if len(c) == 2 else None)(served(24)))
        assert mixed and set(mixed) == {v1, v2}, mixed
        r = httpx.post(
            url + "/admin/routing",
            json={"action": "set_weights", "model": "graphsage", "weights": {v1: 0, v2: 100}},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert wait_for(lambda: served() == collections.Counter({v2: 12}))
        assert grpc_predict(f"127.0.0.1:{grpc_port}", ids, seed=5)["model"] == v2
        # The same change made on the routing file by the CLI (as for a ConfigMap): promote v1.
        cli = subprocess.run(
            [sys.executable, "-m", "services.routing_cli", "--file", str(routes), "promote", "graphsage", v1],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert cli.returncode == 0, cli.stderr
        assert wait_for(lambda: served() == collections.Counter({v1: 12}))
    finally:
        dep.down()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _k8s_files() -> list[Path]:
    return sorted(p for p in K8S_DIR.rglob("*.yaml") if p.name != "kustomization.yaml")


def test_k8s_manifests_validate_against_the_kubernetes_schema():
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate not installed (pip install -e '.[release]')"
    )
    files = _k8s_files()
    assert files
    kinds: collections.Counter = collections.Counter()
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            kv.validate(doc, kv.latest_version(), strict=True)
            kinds[doc["kind"]] += 1
    # StatefulSets: the Redis Cluster (L2 cache) and redis-log (the graph update log).
    assert kinds["Deployment"] == 3 and kinds["HorizontalPodAutoscaler"] == 3 and kinds["StatefulSet"] == 2
    assert kinds["Service"] >= 7 and kinds["Secret"] == 1 and kinds["ConfigMap"] >= 4


def test_k8s_wiring():
    docs = [d for p in _k8s_files() for d in yaml.safe_load_all(p.read_text()) if d]
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    gateway = by[("Deployment", "gateway")]["spec"]["template"]["spec"]["containers"][0]
    args = gateway["args"]
    assert args[:3] == ["start-http-server", "--service-name", "Gateway"]
    assert "FeatureRunner=http://feature-runner:3000" in args and "GraphSAGERunner=http://graphsage-runner:3000" in args
    assert {p["containerPort"] for p in gateway["ports"]} == {3000, 50051}
    config = by[("ConfigMap", "graphsage-config")]["data"]
    mounts = {m["name"]: m for m in gateway["volumeMounts"]}
    # The routing and API-key files are the gateway's own: the runners mount neither, and a path
    # in the shared ConfigMap that a pod does not mount would stop its start.
    own_env = {e["name"]: e["value"] for e in gateway["env"]}
    assert own_env["GSAGE_ROUTING_FILE"].startswith(mounts["routing"]["mountPath"] + "/")
    assert "subPath" not in mounts["routing"]  # subPath mounts never see ConfigMap updates
    assert own_env["GSAGE_AUTH_ENABLED"] == "true"
    assert own_env["GSAGE_API_KEYS_FILE"].startswith(mounts["api-keys"]["mountPath"] + "/")
    assert not {"GSAGE_ROUTING_FILE", "GSAGE_API_KEYS_FILE", "GSAGE_AUTH_ENABLED"} & set(config)
    depends = {"feature-runner": ["GraphSAGERunner=http://graphsage-runner:3000"], "graphsage-runner": []}
    for name, service in (("feature-runner", "FeatureRunner"), ("graphsage-runner", "GraphSAGERunner")):
        c = by[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
        assert c["args"][:3] == ["start-http-server", "--service-name", service]
        # every dependency named: one left out would be started inside this pod
        assert [b for a, b in zip(c["args"], c["args"][1:]) if a == "--depends"] == depends[name]
        assert by[("Service", name)]["spec"]["ports"][0]["port"] == 3000
    for d in docs:
        if d["kind"] == "Deployment":
            c = d["spec"]["template"]["spec"]["containers"][0]
            assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert c["resources"]["requests"] and c["resources"]["limits"]
            assert {"configMapRef": {"name": "graphsage-config"}} in c["envFrom"]
    gpu = by[("Deployment", "graphsage-runner")]["spec"]["template"]["spec"]["containers"][0]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert by[("StatefulSet", "redis-cluster")]["spec"]["replicas"] == 6
    assert config["GSAGE_REDIS_URL"] == "redis+cluster://redis-cluster:6379"

    # The graph update log is not on that cache: the services read the ConfigMap as their
    # settings, and the log's URL names the redis-log Service, whose pods are the StatefulSet's.
    from common.settings import load_settings

    cfg = load_settings(config)
    assert cfg.graph_log_kind == "redis" and cfg.graph_log_url == "redis://redis-log:6379/0"
    log_service = by[("Service", "redis-log")]["spec"]
    assert log_service["ports"][0]["port"] == 6379 and "clusterIP" not in log_service
    log_set = by[("StatefulSet", "redis-log")]["spec"]
    assert log_set["replicas"] == 1
    assert _k8s_selects({"matchLabels": log_service["selector"]}, log_set["template"]["metadata"]["labels"])
    assert by[("Service", log_set["serviceName"])]["spec"]["clusterIP"] == "None"
    assert [t["metadata"]["name"] for t in log_set["volumeClaimTemplates"]] == ["data"]
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    assert "redis-log.yaml" in kustomization["resources"] and "redis-cluster.yaml" in kustomization["resources"]


# --- Hardening: security contexts, network policies, service token -------------------------

SERVICE_DEPLOYMENTS = ("gateway", "feature-runner", "graphsage-runner")
SERVICE_TOKEN_SECRET = "graphsage-service-token"
SERVICE_TOKEN_DIR = "/var/run/secrets/graphsage/service-token"
BENTO_PATH = "/home/bentoml/bento"  # the image's $BENTO_PATH (bento + the read-only models mount)


def _k8s_docs() -> list[dict]:
    return [d for p in _k8s_files() for d in yaml.safe_load_all(p.read_text()) if d]


def _k8s_pod_templates(docs: list[dict]) -> dict[str, dict]:
    """Pod templates of every workload (jobs/ included), by component: the
    app.kubernetes.io/component label, else app.kubernetes.io/name."""
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job", "CronJob"):
            template = (d["spec"]["jobTemplate"] if d["kind"] == "CronJob" else d)["spec"]["template"]
            labels = template["metadata"]["labels"]
            comp = labels.get("app.kubernetes.io/component") or labels["app.kubernetes.io/name"]
            assert comp not in out, f"two workloads with pods labelled {comp}"
            out[comp] = template
    return out


def _k8s_selects(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels + matchExpressions) against a pod's labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and labels.get(key) in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


def _k8s_peers(peers: list[dict] | None, labels_by_component: dict[str, dict]) -> set[str]:
    """What a rule's from/to admits: components of this namespace, `ns/pod-labels` outside it,
    `*` (no peers: anywhere)."""
    if not peers:
        return {"*"}
    out = set()
    for peer in peers:
        assert "ipBlock" not in peer, peer  # addresses outside the graph: none expected
        if "namespaceSelector" in peer:
            ns = (peer["namespaceSelector"].get("matchLabels") or {}).get("kubernetes.io/metadata.name")
            assert ns and ns != "graphsage", peer  # a named namespace, never "any namespace"
            pods = (
                ",".join(
                    f"{k}={v}" for k, v in sorted(((peer.get("podSelector") or {}).get("matchLabels") or {}).items())
                )
                or "*"
            )
            out.add(f"{ns}/{pods}")
        else:
            matched = {c for c, labels in labels_by_component.items() if _k8s_selects(peer["podSelector"], labels)}
            assert matched, f"peer selects no pod: {peer}"
            out |= matched
    return out


def _k8s_policy_edges(docs: list[dict], labels_by_component: dict[str, dict]) -> tuple[set, set]:
    """(ingress, egress) edges (source, destination, protocol, port) the NetworkPolicies allow."""
    ingress, egress = set(), set()
    for pol in (d for d in docs if d["kind"] == "NetworkPolicy"):
        assert pol["metadata"]["namespace"] == "graphsage"
        spec = pol["spec"]
        selected = {c for c, labels in labels_by_component.items() if _k8s_selects(spec["podSelector"], labels)}
        assert selected, f"{pol['metadata']['name']} selects no pod"
        for direction, peers_key, edges in (("Ingress", "from", ingress), ("Egress", "to", egress)):
            rules = spec.get(direction.lower()) or []
            assert direction in spec["policyTypes"] or not rules, pol["metadata"]["name"]
            for rule in rules:
                assert rule.get("ports"), f"{pol['metadata']['name']}: a rule without ports admits every port"
                ports = [(p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]]
                assert all(isinstance(port, int) for _, port in ports), ports  # numbers: checkable here
                for peer in _k8s_peers(rule.get(peers_key), labels_by_component):
                    for proto, port in ports:
                        for comp in selected:
                            src, dst = (peer, comp) if direction == "Ingress" else (comp, peer)
                            edges.add((src, dst, proto, port))
    return ingress, egress


def test_k8s_network_policies_form_the_allowed_graph():
    docs = _k8s_docs()
    templates = _k8s_pod_templates(docs)
    labels = {c: t["metadata"]["labels"] for c, t in templates.items()}
    assert set(labels) == {*SERVICE_DEPLOYMENTS, "redis-cluster", "redis-cluster-create", "redis-log", "model-admin"}
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    # Everything denied first: every pod of the namespace, both directions, no rule.
    deny = [
        p
        for p in policies
        if p["spec"]["podSelector"] == {}
        and sorted(p["spec"]["policyTypes"]) == ["Egress", "Ingress"]
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert len(deny) == 1, "a default-deny NetworkPolicy (podSelector {}, Ingress + Egress, no rule)"
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    assert "network-policies.yaml" in kustomization["resources"]

    ingress, egress = _k8s_policy_edges(docs, labels)
    tcp = lambda src, dst, *ports: {(src, dst, "TCP", p) for p in ports}  # noqa: E731
    expected_ingress = (
        tcp("*", "gateway", 3000, 50051)  # clients: HTTP and gRPC
        | tcp("gateway", "feature-runner", 3000)
        | tcp("gateway", "graphsage-runner", 3000)
        | tcp("feature-runner", "graphsage-runner", 3000)
        | tcp("gateway", "redis-cluster", 6379)
        | tcp("feature-runner", "redis-cluster", 6379)
        | tcp("redis-cluster-create", "redis-cluster", 6379)
        | tcp("redis-cluster", "redis-cluster", 6379, 16379)  # replication + cluster bus
        | tcp("feature-runner", "redis-log", 6379)  # the update log: only the FeatureRunner opens it
        | {("monitoring/*", c, "TCP", 3000) for c in SERVICE_DEPLOYMENTS}  # Prometheus: /metrics
    )
    assert ingress == expected_ingress, (sorted(ingress - expected_ingress), sorted(expected_ingress - ingress))
    # Under a default deny a hop needs both ends: every pod-to-pod ingress rule has its egress
    # rule on the caller's side, and no egress rule reaches a pod that does not admit it.
    internal_in = {e for e in ingress if e[0] in labels}
    internal_out = {e for e in egress if e[1] in labels}
    assert internal_out == internal_in, (sorted(internal_out - internal_in), sorted(internal_in - internal_out))
    # Out of the namespace: DNS only, for every pod.
    dns = {(c, "kube-system/k8s-app=kube-dns", proto, 53) for c in labels for proto in ("UDP", "TCP")}
    assert {e for e in egress if e[1] not in labels} == dns

    # Who can reach whom (any port), as the task states it.
    callers = lambda dst: {s for s, d, _, _ in ingress if d == dst and s in labels}  # noqa: E731
    assert callers("feature-runner") == {"gateway"}
    assert callers("graphsage-runner") == {"gateway", "feature-runner"}
    assert callers("redis-cluster") == {"gateway", "feature-runner", "redis-cluster", "redis-cluster-create"}
    assert callers("redis-log") == {"feature-runner"}
    assert callers("gateway") == set() and callers("model-admin") == callers("redis-cluster-create") == set()
    for quiet in ("graphsage-runner", "redis-log"):
        assert {d for s, d, _, _ in egress if s == quiet} == {"kube-system/k8s-app=kube-dns"}, quiet


def test_k8s_security_contexts():
    docs = _k8s_docs()
    templates = _k8s_pod_templates(docs)
    for comp, template in templates.items():
        spec = template["spec"]
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        redis = all(c["image"].startswith("redis:") for c in containers)
        assert redis or all(c["image"].startswith("graphsage-serving") for c in containers), comp
        uid = 999 if redis else 1034  # the official redis image's user / the BentoML image's bentoml
        psc = spec.get("securityContext") or {}
        assert psc.get("runAsNonRoot") is True, comp
        assert psc.get("seccompProfile") == {"type": "RuntimeDefault"}, comp
        assert (psc.get("runAsUser"), psc.get("runAsGroup"), psc.get("fsGroup")) == (uid, uid, uid), comp
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), comp
        for c in containers:
            sc = c.get("securityContext") or {}
            where = f"{comp}/{c['name']}"
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert (sc.get("capabilities") or {}).get("drop") == ["ALL"], where
            assert not (sc.get("capabilities") or {}).get("add"), where
            assert not sc.get("privileged"), where
            assert sc.get("runAsUser", uid) == uid and sc.get("runAsNonRoot", True) is True, where
            # Every container here runs with a read-only root; what they write has a volume.
            assert sc.get("readOnlyRootFilesystem") is True, where

    # The three services write only to /tmp (BentoML's temp files, numba's cache) and to
    # $BENTOML_HOME (prometheus_multiproc_dir, store directories): emptyDirs, neither over the bento.
    for name in SERVICE_DEPLOYMENTS:
        spec = templates[name]["spec"]
        c = spec["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
        empty_dirs = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        writable = {m["mountPath"].rstrip("/") for m in c["volumeMounts"] if m["name"] in empty_dirs}
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        home = env.get("BENTOML_HOME", "").rstrip("/")
        assert "/tmp" in writable and home in writable, (name, writable, home)
        # The image's own BENTOML_HOME (/home/bentoml/) contains $BENTO_PATH: an emptyDir there or
        # at the bento would hide the bento and its models.
        for path in writable:
            assert not (BENTO_PATH + "/").startswith(path + "/") and not path.startswith(BENTO_PATH + "/"), path
        models = [m for m in c["volumeMounts"] if m["mountPath"] == BENTO_PATH + "/models"]
        # The FeatureRunner writes its store: a compaction saves the new graph-snapshot there.
        if name != "gateway":
            assert len(models) == 1 and models[0].get("readOnly", False) is (name != "feature-runner"), name
        assert len({m["mountPath"] for m in c["volumeMounts"]}) == len(c["volumeMounts"]), name
    feature = templates["feature-runner"]["spec"]["containers"][0]
    numba_dir = {e["name"]: e.get("value") for e in feature["env"]}.get("NUMBA_CACHE_DIR", "")
    assert numba_dir.startswith("/tmp/"), "numba's cache must be on a writable path (NUMBA_CACHE_DIR)"
    # Redis writes only its data volume (nodes.conf): no RDB/AOF.
    redis = templates["redis-cluster"]["spec"]["containers"][0]
    assert "/data" in {m["mountPath"] for m in redis["volumeMounts"]}
    conf = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "redis-cluster-config")
    assert 'save ""' in conf["data"]["redis.conf"] and "appendonly no" in conf["data"]["redis.conf"]
    # redis-log writes its AOF to /data, a volume claimed per pod (it outlives the pod), and is
    # configured as the FeatureRunner's start-up check wants it: no warning against it.
    from runners.feature.update_log import DURABILITY_SETTINGS, durability_problems

    log_set = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "redis-log")
    log_redis = templates["redis-log"]["spec"]["containers"][0]
    data = next(m for m in log_redis["volumeMounts"] if m["mountPath"] == "/data")
    assert data["name"] in {t["metadata"]["name"] for t in log_set["spec"]["volumeClaimTemplates"]}
    assert data["name"] not in {v["name"] for v in templates["redis-log"]["spec"].get("volumes") or []}
    assert log_redis["startupProbe"] and log_redis["livenessProbe"] and log_redis["readinessProbe"]
    assert log_redis["resources"]["requests"] and log_redis["resources"]["limits"]

    def redis_conf(name: str) -> dict[str, str]:
        text = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)["data"]["redis.conf"]
        pairs = (line.split(None, 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))
        return {k: v for k, v in pairs if k in DURABILITY_SETTINGS or k == "dir"}

    log_conf = redis_conf("redis-log-config")
    assert log_conf == {"dir": "/data", "appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"}
    assert durability_problems("redis-log", log_conf) == []
    cache_conf = {"appendfsync": "everysec", **redis_conf("redis-cluster-config")}  # everysec: Redis's default
    assert len(durability_problems("redis-cluster", cache_conf)) == 2  # evicts, and keeps nothing on disk


def test_k8s_service_token_and_tls_secrets():
    docs = _k8s_docs()
    templates = _k8s_pod_templates(docs)
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "graphsage-config")
    for name in SERVICE_DEPLOYMENTS:
        spec = templates[name]["spec"]
        c = spec["containers"][0]
        vols = [v for v in spec["volumes"] if (v.get("secret") or {}).get("secretName") == SERVICE_TOKEN_SECRET]
        assert len(vols) == 1, f"{name} mounts the {SERVICE_TOKEN_SECRET} Secret"
        assert not vols[0]["secret"].get("optional"), "without the token the pod must not start"
        mounts = [m for m in c["volumeMounts"] if m["name"] == vols[0]["name"]]
        assert len(mounts) == 1 and mounts[0]["readOnly"] is True, name
        assert "subPath" not in mounts[0], "a subPath mount never sees a rotated Secret"
        mount = mounts[0]["mountPath"].rstrip("/")
        assert mount == SERVICE_TOKEN_DIR, name
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        path = env.get("GSAGE_SERVICE_TOKENS_FILE") or config["data"].get("GSAGE_SERVICE_TOKENS_FILE", "")
        assert path.startswith(mount + "/"), (name, path)
        key = path[len(mount) + 1 :]
        items = vols[0]["secret"].get("items")
        assert key == "tokens" if not items else key in {i["path"] for i in items}, (name, key)
        # Never a token in the manifests themselves.
        assert "GSAGE_SERVICE_TOKENS" not in env and "GSAGE_SERVICE_TOKENS" not in config["data"], name
    secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    assert SERVICE_TOKEN_SECRET not in secrets and "graphsage-gateway-tls" not in secrets, "created by hand"

    # Gateway TLS: an optional Secret volume; the env (when set) must point inside it.
    spec = templates["gateway"]["spec"]
    c = spec["containers"][0]
    tls = [v for v in spec["volumes"] if (v.get("secret") or {}).get("secretName") == "graphsage-gateway-tls"]
    assert len(tls) == 1 and tls[0]["secret"].get("optional") is True
    tls_mount = next(m for m in c["volumeMounts"] if m["name"] == tls[0]["name"])
    assert tls_mount["mountPath"] == "/var/run/secrets/graphsage/tls" and tls_mount["readOnly"] is True
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    for var, key in (("GSAGE_TLS_CERT_FILE", "tls.crt"), ("GSAGE_TLS_KEY_FILE", "tls.key")):
        value = env.get(var) or config["data"].get(var)
        assert value is None or value == f"{tls_mount['mountPath']}/{key}", (var, value)
    assert ("GSAGE_TLS_CERT_FILE" in env) == ("GSAGE_TLS_KEY_FILE" in env), "both or neither"


def test_bentocloud_config_matches_the_deployment_schema():
    from common.bento.release import deployment_schema_fields, structure_deployment

    allowed = deployment_schema_fields()
    cfg = yaml.safe_load((ROOT / "bentos" / "bentocloud.yaml").read_text())
    assert set(cfg) <= allowed["deployment"] | {"cluster"}
    assert set(cfg["services"]) == {"Gateway", "FeatureRunner", "GraphSAGERunner"}
    for svc in cfg["services"].values():
        assert set(svc) <= allowed["service"], svc
        assert set(svc["scaling"]) <= allowed["scaling"]
        assert set(svc["scaling"].get("policy", {})) <= allowed["policy"]
    schema = structure_deployment(cfg)
    gpu = schema.services["GraphSAGERunner"]
    assert gpu.instance_type.startswith("gpu.") and gpu.scaling.policy.metrics[0].type == "gpu"
    assert schema.services["Gateway"].config_overrides["traffic"]["concurrency"] > 0
    assert {m.type for m in schema.services["FeatureRunner"].scaling.policy.metrics} == {"memory", "qps"}


CLUSTER_MODE_DIR = ROOT / "bentos" / "k8s-cluster-mode"


def _pointer_patch(doc: dict, ops: list[dict]) -> None:
    """Apply kustomize's JSON 6902 ``add`` / ``replace`` ops (the only ones the overlay uses)."""
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            assert op["op"] == "replace" and int(last) < len(node), op
            node[int(last)] = op["value"]
        else:
            assert op["op"] == "add" or last in node, f"{op['path']}: nothing to replace"
            node[last] = op["value"]


def _cluster_mode_docs() -> list[dict]:
    """The base's objects with the overlay's patches applied, plus the overlay's own (what
    `kubectl apply -k bentos/k8s-cluster-mode` applies), and the on-demand loader Job."""
    kustomization = yaml.safe_load((CLUSTER_MODE_DIR / "kustomization.yaml").read_text())
    assert kustomization["resources"][0] == "../k8s"
    docs = [d for p in _k8s_files() if p.parent == K8S_DIR for d in yaml.safe_load_all(p.read_text()) if d]
    for name in [*kustomization["resources"][1:], "load-features.yaml"]:
        docs += [d for d in yaml.safe_load_all((CLUSTER_MODE_DIR / name).read_text()) if d]
    for patch in kustomization["patches"]:
        target = patch["target"]
        matches = [d for d in docs if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]]
        assert len(matches) == 1, target
        _pointer_patch(matches[0], yaml.safe_load(patch["patch"]))
    return docs


def test_k8s_cluster_mode_overlay_validates_and_wires_the_feature_cluster():
    from common.settings import load_settings

    docs = _cluster_mode_docs()
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    for doc in docs:
        kv.validate(doc, kv.latest_version(), strict=True)
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    config = by[("ConfigMap", "graphsage-config")]["data"]
    cfg = load_settings({k: v for k, v in config.items() if k.startswith("GSAGE_")})  # a bad value raises
    assert cfg.feature_source == "redis" and cfg.feature_cluster_url.startswith("redis+cluster://redis-cluster:")
    redis_conf = by[("ConfigMap", "redis-cluster-config")]["data"]["redis.conf"]
    for line in ("maxmemory-policy noeviction", "appendonly yes"):  # an authority: nothing evicted or forgotten
        assert line in redis_conf.splitlines(), redis_conf
    hpa = by[("HorizontalPodAutoscaler", "feature-runner")]["spec"]["metrics"]
    assert [m["resource"]["name"] for m in hpa if m["type"] == "Resource"] == ["cpu"]  # memory is no longer load
    job = by[("Job", "graphsage-load-features")]["spec"]["template"]
    assert "python -m training_export.load_features" in job["spec"]["containers"][0]["args"][0]
    assert job["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "graphsage-models"
    # The prune: scheduled, one at a time, the store read-only, in the serving image.
    cron = by[("CronJob", "graphsage-prune-features")]["spec"]
    assert cron["concurrencyPolicy"] == "Forbid"
    prune = cron["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert prune["command"] == ["python", "-m", "training_export.prune_features"]
    assert prune["image"] == by[("Deployment", "feature-runner")]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert [m["readOnly"] for m in prune["volumeMounts"] if m["name"] == "models"] == [True]

    # The jobs' hops, admitted at both ends under the base's default deny, and nothing else new.
    labels = {c: t["metadata"]["labels"] for c, t in _k8s_pod_templates(docs).items()}
    base_labels = {c: t["metadata"]["labels"] for c, t in _k8s_pod_templates(_k8s_docs()).items()}
    assert set(labels) - set(base_labels) == {"load-features", "prune-features"}
    ingress, egress = _k8s_policy_edges(docs, labels)
    base_ingress, _ = _k8s_policy_edges(_k8s_docs(), base_labels)
    new_hops = {
        ("load-features", "redis-cluster", "TCP", 6379),
        ("prune-features", "redis-cluster", "TCP", 6379),
        ("prune-features", "redis-log", "TCP", 6379),  # the workers' statuses
    }
    assert ingress - base_ingress == new_hops, sorted(ingress - base_ingress)
    assert {e for e in egress if e[1] in labels} >= {e for e in ingress if e[0] in labels}
    assert {e for e in egress if e[0] in ("load-features", "prune-features") and e[1] in labels} == new_hops


def _kustomize(directory: Path) -> list[dict]:
    """What `kubectl apply -k directory` would apply, rendered by kubectl's own kustomize."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: the overlay is checked by the JSON-patch reading above only")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _by_object(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_kustomize_renders_what_the_tests_check():
    """kubectl's kustomize renders the base and the cluster-mode overlay to exactly the objects
    the tests above read from the files (the overlay's patches applied as this module applies them)."""
    base = [d for p in _k8s_files() if p.parent == K8S_DIR for d in yaml.safe_load_all(p.read_text()) if d]
    assert _by_object(_kustomize(K8S_DIR)) == _by_object(base)
    overlay = [d for d in _cluster_mode_docs() if d["metadata"]["name"] != "graphsage-load-features"]
    assert _by_object(_kustomize(CLUSTER_MODE_DIR)) == _by_object(overlay)


def test_the_loader_runs_without_the_training_packages():
    """The serving image has no pyarrow or torch: the loader's module must not need them."""
    code = (
        "import sys; sys.modules['pyarrow'] = None; sys.modules['torch'] = None\n"
        "import training_export.load_features as m; m.add_arguments"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
