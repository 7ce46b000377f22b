"""The internal hops, attacked directly: each runner started the way the Kubernetes manifests start
it (``start-http-server --service-name <Runner>``, i.e. as a dependency, not as the bento's main
service), then called as a pod inside the cluster could call it."""

from __future__ import annotations

import collections
import json
import os
import pickle
import subprocess
import sys
import time
import urllib.parse

import httpx
import pytest

from harness.app import Service, free_port
from harness.attacks import app_targets, marker_exists, send_pickles, service_routes
from services.auth import SCOPES, KeyEntry, generate_key, hash_key, write_entries
from tests.conftest import private_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NEW, OLD, STRANGER = "rotated-in-" + "n" * 20, "rotated-out-" + "o" * 20, "stranger-" + "s" * 20
PICKLE = "application/vnd.bentoml+pickle"
API_KEY = generate_key()  # every scope: the gateway's routes are reached past its auth


def service_named(name: str):
    from services.gateway import Gateway

    return Gateway if name == "Gateway" else Gateway.find_dependent_by_name(name)


runner_routes = service_routes


@pytest.fixture(scope="module")
def runners(demo_store, tmp_path_factory):
    """The GraphSAGERunner reads its tokens from a file (a mounted Secret, rotated below); the
    FeatureRunner and the gateway get two tokens at once in the environment, the first sent."""
    root = tmp_path_factory.mktemp("hops")
    token_file = root / "tokens"
    token_file.write_text(f"{OLD}\n{NEW}\n")
    # Its own store: the fuzzer reaches the FeatureRunner's graph_compact, which saves a snapshot.
    base = {
        **os.environ,
        "BENTOML_HOME": private_store(demo_store, root),
        "BENTOML_DO_NOT_TRACK": "true",
        "GSAGE_MODEL_TAGS": demo_store.v1,
        "GSAGE_GRPC_PORT": "0",
    }
    base.pop("GSAGE_SERVICE_TOKENS", None)
    model = Service(
        "GraphSAGERunner", free_port(), {**base, "GSAGE_SERVICE_TOKENS_FILE": str(token_file)}, log_dir=str(root)
    )
    feature = Service(
        "FeatureRunner",
        free_port(),
        {**base, "GSAGE_SERVICE_TOKENS": f"{OLD},{NEW}"},
        depends={"GraphSAGERunner": model.url},
        log_dir=str(root),
    )
    keys = root / "keys.json"
    write_entries(str(keys), [KeyEntry("attacker-with-a-key", hash_key(API_KEY), SCOPES)])
    gateway = Service(
        "Gateway",
        free_port(),
        {**base, "GSAGE_SERVICE_TOKENS": f"{OLD},{NEW}", "GSAGE_AUTH_ENABLED": "1", "GSAGE_API_KEYS_FILE": str(keys)},
        depends={"FeatureRunner": feature.url, "GraphSAGERunner": model.url},
        log_dir=str(root),
    )
    started = []
    try:
        for svc in (model, feature, gateway):
            started.append(svc.start())
        yield {"model": model, "feature": feature, "gateway": gateway, "token_file": token_file, "root": root}
    finally:
        for svc in reversed(started):
            svc.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_pickle_is_refused_on_every_route_whatever_its_headers_and_nothing_runs(runners):
    """Every route of the three services, the pickle's media type spelt every way (duplicated
    beside an accepted type in both orders, with parameters, in other cases, in comma lists) and
    every credential (none, wrong, valid, duplicated): only 4xx, and the pickle never ran."""
    marker = runners["root"] / "pickle-ran"
    targets = app_targets(runners["model"].url, runners["feature"].url, runners["gateway"].url, NEW, API_KEY)
    outcome = send_pickles(targets, str(marker))
    assert not marker_exists(marker), "a pickle was loaded"
    assert not outcome.not_4xx, outcome.not_4xx[:10]
    assert outcome.sent >= 14 * 6 * (len(runner_routes("GraphSAGERunner")) + len(runner_routes("FeatureRunner")))
    print(f"{outcome.sent} pickled requests, statuses {dict(sorted(outcome.statuses.items()))}")


def test_a_single_pickle_type_is_refused_with_415_with_or_without_a_token(runners):
    body = pickle.dumps(None)
    for key, name in (("model", "GraphSAGERunner"), ("feature", "FeatureRunner")):
        for route in runner_routes(name):
            for headers in ({}, bearer(OLD)):
                r = httpx.post(
                    runners[key].url + route, content=body, headers={"Content-Type": PICKLE, **headers}, timeout=10
                )
                assert r.status_code == 415 and "vnd.bentoml+pickle" in r.json()["error"], (name, route, r.text)


def test_duplicated_credentials_and_media_types_are_refused_with_400_naming_the_header(runners):
    """A wrong token before the valid one used to pass (the guard read the last copy)."""
    for key, name in (("model", "GraphSAGERunner"), ("feature", "FeatureRunner")):
        for route in runner_routes(name):
            url = runners[key].url + route
            r = httpx.post(
                url,
                content=b"{}",
                headers=[
                    ("Content-Type", "application/json"),
                    ("Authorization", f"Bearer {STRANGER}"),
                    ("Authorization", f"Bearer {NEW}"),
                ],
                timeout=10,
            )
            assert r.status_code == 400 and "Authorization sent 2 times" in r.json()["error"], (name, route, r.text)
            r = httpx.post(
                url,
                content=b"{}",
                headers=[
                    ("Content-Type", "application/json"),
                    ("Content-Type", "application/json"),
                    ("Authorization", f"Bearer {NEW}"),
                ],
                timeout=10,
            )
            assert r.status_code == 400 and "Content-Type sent 2 times" in r.json()["error"], (name, route, r.text)
    gateway = runners["gateway"].url + "/predict"
    for header in ("Authorization", "X-API-Key"):
        value = f"Bearer {API_KEY}" if header == "Authorization" else API_KEY
        r = httpx.post(
            gateway,
            content=b'{"node_ids": [1]}',
            timeout=10,
            headers=[("Content-Type", "application/json"), (header, value), (header, value)],
        )
        assert r.status_code == 400 and f"{header} sent 2 times" in r.json()["error"], r.text


def test_every_runner_route_needs_the_token_and_probes_do_not(runners):
    from common import feature_runner_api, model_runner_api
    from common.endpoints import media_types

    for key, name, api in (
        ("model", "GraphSAGERunner", model_runner_api),
        ("feature", "FeatureRunner", feature_runner_api),
    ):
        url = runners[key].url
        for route, (takes, _) in media_types(api.ENDPOINTS).items():
            media = {"content-type": takes}
            for headers in ({}, bearer(STRANGER), {"X-Api-Key": NEW}):
                r = httpx.post(url + route, content=b"{}", timeout=10, headers={**media, **headers})
                assert r.status_code == 401, (name, route, headers, r.text)
                assert r.headers["www-authenticate"].startswith("Bearer")
            r = httpx.post(url + route, content=b"{}", timeout=30, headers={**media, **bearer(NEW)})
            assert r.status_code != 401, (name, route, r.text)
        for route in ("/docs.json", "/schema.json", "/no-such-route"):
            assert httpx.get(url + route, timeout=10).status_code == 401, route
        assert httpx.get(url + "/docs.json", headers=bearer(NEW), timeout=10).status_code == 200
        for route in ("/livez", "/readyz", "/metrics"):
            assert httpx.get(url + route, timeout=10).status_code == 200, route


def test_the_gateway_and_the_feature_runner_send_the_token(runners):
    key = {"X-API-Key": API_KEY}
    r = httpx.post(
        runners["gateway"].url + "/predict", json={"node_ids": [1, 2, 3], "seed": 3}, headers=key, timeout=30
    )
    assert r.status_code == 200 and not r.json()["degraded"], r.text
    models = httpx.get(runners["gateway"].url + "/models", headers=key, timeout=30).json()
    assert "error" not in models["model_runner"] and "error" not in models["feature_runner"], models


def test_two_tokens_at_once_and_a_rotation_of_the_mounted_file(runners):
    feature, model, token_file = runners["feature"].url, runners["model"].url, runners["token_file"]
    for token in (OLD, NEW):  # the FeatureRunner's environment lists both
        assert httpx.post(feature + "/info", json={}, headers=bearer(token), timeout=10).status_code == 200
        assert httpx.post(model + "/models", json={}, headers=bearer(token), timeout=10).status_code == 200
    token_file.write_text(f"{NEW}\n")  # the last step of a rotation: the old token is retired
    deadline = time.monotonic() + 15
    while httpx.post(model + "/models", json={}, headers=bearer(OLD), timeout=10).status_code != 401:
        assert time.monotonic() < deadline, "the rotated token file was not re-read"
        time.sleep(0.2)
    assert httpx.post(model + "/models", json={}, headers=bearer(NEW), timeout=10).status_code == 200
    token_file.write_text(f"{OLD}\n{NEW}\n")  # back, for the other tests of this module
    deadline = time.monotonic() + 15
    while httpx.post(model + "/models", json={}, headers=bearer(OLD), timeout=10).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_no_token_is_ever_logged(runners):
    for key in ("model", "feature", "gateway"):
        httpx.post(runners[key].url + "/models", json={}, headers=bearer(STRANGER), timeout=10)
    logs = "".join(runners[key].log_tail(10**7) for key in ("model", "feature", "gateway"))
    assert logs and not any(token in logs for token in (NEW, OLD, STRANGER))


@pytest.mark.parametrize("key, name", [("model", "GraphSAGERunner"), ("feature", "FeatureRunner")])
def test_fuzzing_a_runners_openapi_with_the_token_finds_no_server_error(runners, key, name, tmp_path):
    """schemathesis on the runner's OpenAPI document (its ``/docs.json``, built from its endpoint
    table), called directly as a holder of the token would: never a 5xx."""
    pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install -e '.[dev]')")
    url = runners[key].url
    schema = tmp_path / "openapi.json"
    served = httpx.get(url + "/docs.json", headers=bearer(NEW), timeout=10)
    assert served.status_code == 200, served.text
    schema.write_text(served.text)
    st = os.path.join(os.path.dirname(sys.executable), "st")
    out = subprocess.run(
        [
            st,
            "run",
            str(schema),
            "--url",
            url,
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "40",
            "--header",
            f"Authorization: Bearer {NEW}",
            "--workers",
            "2",
            "--report",
            "har",
            "--report-har-path",
            str(tmp_path / "calls.har"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    summary = next((line for line in out.stdout.splitlines() if " generated, " in line), "")
    assert summary and "failed" not in summary and "failure" not in summary, out.stdout[-3000:]
    # The fuzzer got past the guard: every operation of the document was called, and each had
    # answers other than 401 (with a token refused, every answer would be 401 and no 5xx).
    statuses: dict[str, set[int]] = collections.defaultdict(set)
    for entry in json.loads((tmp_path / "calls.har").read_text())["log"]["entries"]:
        statuses[urllib.parse.urlsplit(entry["request"]["url"]).path].add(entry["response"]["status"])
    routes = set(json.loads(schema.read_text())["paths"])
    assert routes <= set(statuses), sorted(routes - set(statuses))
    assert all(statuses[r] - {401} for r in routes), {r: sorted(statuses[r]) for r in routes}
    print(key, summary, {r: sorted(statuses[r]) for r in sorted(routes)})
