"""End to end: the composed app as separate processes (split ``start-http-server`` mode), a real
model store with two versions, auth on, a routing file; faults injected by killing processes."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter

import httpx
import numpy as np
import pytest

from common import wire
from common.feature_runner_api import PredictBatch, encode_predict
from common.feature_tensor import LAYOUT, PREMEAN, decode
from harness.app import SplitApp, answers_under_load, free_port
from services.auth import KeyEntry, generate_key, hash_key, write_entries
from tests.conftest import bentoml_home, private_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(tmp_path_factory, demo_store):
    root = tmp_path_factory.mktemp("e2e")
    # Its own store: the fuzzer reaches /admin/graph/compact, which saves a snapshot.
    home, v1, v2 = private_store(demo_store, root), demo_store.v1, demo_store.v2
    keys = {"predict": generate_key(), "admin": generate_key(), "noscope": generate_key()}
    write_entries(
        str(root / "keys.json"),
        [
            KeyEntry("client", hash_key(keys["predict"]), frozenset({"predict"})),
            KeyEntry("ops", hash_key(keys["admin"]), frozenset({"predict", "admin"})),
            KeyEntry("admin-only", hash_key(keys["noscope"]), frozenset({"admin"})),
        ],
    )
    (root / "routes.json").write_text(
        json.dumps(
            {"default_model": "graphsage", "models": {"graphsage": {"routes": [{"version": v1, "weight": 1.0}]}}}
        )
    )
    settings_env = {
        "GSAGE_AUTH_ENABLED": "1",
        "GSAGE_API_KEYS_FILE": str(root / "keys.json"),
        "GSAGE_ROUTING_FILE": str(root / "routes.json"),
        "GSAGE_MODEL_TAGS": v1,
        "GSAGE_RUNNER_TIMEOUT_S": "2",
        "GSAGE_BREAKER_RESET_S": "1",
        "GSAGE_BREAKER_FAILURES": "3",
        "GSAGE_GRPC_PORT": str(free_port()),
    }
    return {"home": home, "v1": v1, "v2": v2, "keys": keys, "settings": settings_env, "root": root}


@pytest.fixture(scope="module")
def app(env):
    app = SplitApp(env["home"], env["settings"], model_workers=2)
    app.start()
    yield app
    app.stop()


def auth(env, which: str = "predict") -> dict[str, str]:
    return {"Authorization": f"Bearer {env['keys'][which]}"}


def predict(app, env, body, which="predict", timeout=10.0) -> httpx.Response:
    return httpx.post(app.gateway.url + "/predict", json=body, headers=auth(env, which), timeout=timeout)


def admin(app, env, body) -> httpx.Response:
    return httpx.post(app.gateway.url + "/admin/routing", json=body, headers=auth(env, "admin"), timeout=30)


def in_process_probs(env, tag: str, node_ids: list[int], seed: int, premean_layout: bool | None = None) -> np.ndarray:
    import onnxruntime as ort

    from common.settings import Settings
    from runners.feature.sampling import sample_tree
    from runners.feature.snapshot import load_snapshot
    from runners.feature.tree_layout import compact, premean
    from runners.graphsage.model_artifacts import load_artifacts

    with bentoml_home(env["home"]):
        snap, art = load_snapshot(), load_artifacts(tag)
        tree = sample_tree(snap.indptr, snap.indices, np.array(node_ids), art.config.fanout, seed=seed)
        unique, index = compact(tree)
        rows = np.asarray(snap.features[unique], dtype=np.float32)
        # Rows rounded as the gateway's transport dtype rounds them (float16 by default).
        narrow = lambda a: a.astype(Settings().feature_transport_dtype).astype(np.float32)  # noqa: E731
        if premean_layout is None:
            premean_layout = len(node_ids) >= Settings().premean_min_targets
        if not premean_layout:
            sess = ort.InferenceSession(art.onnx_path, providers=["CPUExecutionProvider"])
            return sess.run(["probs"], {"features": narrow(rows), **{f"idx{d}": i for d, i in enumerate(index)}})[0]
        # A larger request to a mean model gets the premean input (the last hop as its means).
        assert os.path.exists(art.onnx_premean_path) and Settings().premean
        rows, index, last_rows, last_mean = premean(rows, index, seed)
        sess = ort.InferenceSession(art.onnx_premean_path, providers=["CPUExecutionProvider"])
        feed = {
            "features": narrow(rows),
            **{f"idx{d}": i for d, i in enumerate(index)},
            "last_rows": last_rows,
            "last_mean": narrow(last_mean),
        }
        return sess.run(["probs"], feed)[0]


@pytest.mark.parametrize("ids", [[0, 5, 17, 3999, 5], [0, 5, 17, 3999, 5] * 4], ids=["full rows", "premean"])
def test_predict_equals_in_process_computation(app, env, ids):
    r = predict(app, env, {"node_ids": ids, "seed": 1234})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == env["v1"] and body["degraded"] is False
    got = np.array([p["probabilities"] for p in body["predictions"]])
    np.testing.assert_allclose(got, in_process_probs(env, env["v1"], ids, 1234), atol=1e-5)
    assert [p["node_id"] for p in body["predictions"]] == ids
    assert [p["label"] for p in body["predictions"]] == list(got.argmax(1))


def test_bulk_request_of_isolated_nodes_is_answered(app, env):
    """Targets without neighbours: a premean-sized request whose tree has no last hop is sent in
    the level layout (it once failed in the FeatureRunner, a 5xx and a breaker failure)."""
    from runners.feature.snapshot import load_snapshot

    with bentoml_home(env["home"]):
        isolated = np.flatnonzero(np.diff(load_snapshot().indptr) == 0)[:16].tolist()
    assert len(isolated) == 16, "the demo graph needs 16 isolated nodes"
    r = predict(app, env, {"node_ids": isolated, "seed": 7})
    assert r.status_code == 200, r.text
    assert r.json()["degraded"] is False, r.text
    got = np.array([p["probabilities"] for p in r.json()["predictions"]])
    np.testing.assert_allclose(got, in_process_probs(env, env["v1"], isolated, 7, premean_layout=False), atol=1e-5)


def test_auth_and_scopes(app, env):
    url = app.gateway.url + "/predict"
    body = {"node_ids": [1]}
    assert httpx.post(url, json=body).status_code == 401
    wrong = httpx.post(url, json=body, headers={"Authorization": "Bearer gsk_wrong"})
    assert wrong.status_code == 401 and "gsk_wrong" not in wrong.text
    assert predict(app, env, body, "noscope").status_code == 403
    assert httpx.post(url, json=body, headers={"X-API-Key": env["keys"]["predict"]}).status_code == 200
    r = httpx.post(app.gateway.url + "/admin/routing", json={"action": "rollback"}, headers=auth(env, "predict"))
    assert r.status_code == 403
    assert httpx.get(app.gateway.url + "/models").status_code == 401
    models = httpx.get(app.gateway.url + "/models", headers=auth(env)).json()
    assert models["routing"]["models"]["graphsage"]["routes"][0]["version"] == env["v1"]
    assert any(m["tag"] == env["v1"] for m in models["model_runner"]["loaded"])


BAD_BODIES = [
    ({}, None),
    ({"node_ids": []}, None),
    ({"node_ids": ["a"]}, None),
    ({"node_ids": [1.5]}, None),
    ({"node_ids": [-1]}, None),
    ({"node_ids": [10**20]}, None),
    ({"node_ids": [True]}, None),
    ({"node_ids": [10**9]}, None),
    ({"node_ids": [1], "fanout": [100, 100]}, None),
    ({"node_ids": [1], "fanout": [1]}, None),
    ({"node_ids": [1], "fanout": [0, 1]}, None),
    ({"node_ids": [1], "version": "bad tag!!"}, None),
    ({"node_ids": [1], "model": "nope"}, 404),
    ({"node_ids": [1], "version": "doesnotexist"}, 404),
    ({"node_ids": [1], "seed": -1}, None),
    ({"node_ids": [1], "seed": "x"}, None),
    ({"node_ids": [1], "surprise": 1}, None),
    ({"node_ids": list(range(2000))}, None),
    ({"node_ids": 7}, None),
    ([1, 2], None),
]


@pytest.mark.parametrize("body,status", BAD_BODIES)
def test_bad_json_input_is_a_clear_4xx(app, env, body, status):
    r = predict(app, env, body)
    assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
    if status:
        assert r.status_code == status, r.text
    assert "error" in r.json()


def test_bad_transport_input_is_a_clear_4xx(app, env):
    url, h = app.gateway.url + "/predict", auth(env)
    cases = [
        httpx.post(url, content=b'{"node_ids": [NaN]}', headers={**h, "content-type": "application/json"}),
        httpx.post(url, content=b"{not json", headers={**h, "content-type": "application/json"}),
        httpx.post(url, content=b"node_ids=1", headers={**h, "content-type": "text/plain"}),
        httpx.post(url, content=b"\x80\x04K\x01.", headers={**h, "content-type": "application/vnd.bentoml+pickle"}),
        httpx.post(url, content=b"{" + b" " * (2 << 20) + b"}", headers={**h, "content-type": "application/json"}),
    ]
    statuses = [r.status_code for r in cases]
    assert all(400 <= s < 500 for s in statuses), statuses
    assert statuses[3] == 415 and statuses[4] == 413


def test_model_runner_takes_an_envelope_and_rejects_anything_else(app, env):
    url, octet = app.model.url + "/infer", {"content-type": "application/octet-stream"}
    for body in (b"", b"GSE1junk", b"GSE1\x02\0\0\0{}GSW1", wire.envelope({"model": 7}, b"GSW1")):
        r = httpx.post(url, content=body, headers={**octet, **app.service_headers})
        assert r.status_code == 400 and "bad FeatureTensor" in r.text, (body, r.status_code, r.text)


def test_feature_runner_hands_the_tensor_to_the_model_runner(app, env):
    """FeatureRunner.predict (the gateway's path) answers what its FeatureTensor (premean: the
    demo model is a mean model, whose export recorded both layouts) gives the model runner when
    sent there by hand, and passes the model runner's refusals through. The answer names the input
    layout; a caller may ask for one."""
    body = {"node_ids": [3, 9, 3, 3999] * 5, "seed": 77, "dtype": "float16"}  # 20 >= GSAGE_PREMEAN_MIN_TARGETS
    octet = {"content-type": "application/octet-stream", **app.service_headers}

    def chain(model: str, ids: list[int] = body["node_ids"], layout: str | None = None) -> httpx.Response:
        batch = PredictBatch.of(ids, 77, model, dtype="float16", layout=layout)
        return httpx.post(app.feature.url + "/predict", headers=octet, timeout=10, content=encode_predict(batch))

    for ids, asked, layout in (
        (body["node_ids"], None, PREMEAN),
        (body["node_ids"], LAYOUT, LAYOUT),
        ([3, 9], None, LAYOUT),
        ([3, 9], PREMEAN, PREMEAN),
    ):
        answered = chain(env["v1"], ids, asked)
        assert answered.status_code == 200 and wire.unpack(answered.content)[0]["layout"] == layout, (ids, asked)
    # The pool version's export records the level layout only: asked for premean, it gets levels.
    pooled = chain(env["v2"], body["node_ids"], PREMEAN)
    assert pooled.status_code == 200 and wire.unpack(pooled.content)[0]["layout"] == LAYOUT

    chained = chain(env["v1"])
    assert chained.status_code == 200, chained.text
    tensor = httpx.post(
        app.feature.url + "/features", json={**body, "layout": PREMEAN}, timeout=10, headers=app.service_headers
    )
    assert tensor.status_code == 200, tensor.text
    full = httpx.post(app.feature.url + "/features", json=body, timeout=10, headers=app.service_headers)
    assert len(full.content) > len(tensor.content) and decode(tensor.content).layout == PREMEAN
    by_hand = httpx.post(
        app.model.url + "/infer",
        content=wire.envelope({"model": env["v1"], "embedding": False}, tensor.content),
        headers=octet,
        timeout=10,
    )
    assert by_hand.status_code == 200, by_hand.text
    (meta, got), (meta_by_hand, want) = wire.unpack(chained.content), wire.unpack(by_hand.content)
    assert meta == meta_by_hand and meta["model"] == env["v1"] and set(got) == set(want) == {"logits", "probs"}
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    unknown = chain("graphsage:nosuchversion")
    assert unknown.status_code == 404 and unknown.json()["type"] == "unknown_version", unknown.text
    for bad in (
        b"",
        b"GSE1junk",
        wire.envelope({"model": env["v1"], "embedding": False}, wire.pack({"x": np.zeros(1)})),
    ):
        r = httpx.post(app.feature.url + "/predict", headers=octet, content=bad, timeout=10)
        assert r.status_code == 400 and "bad predict request" in r.text, (bad, r.text)


def _error_body_schema(doc: dict) -> dict:
    """The declared error model, with the document's components to resolve against."""
    return {**doc["components"]["schemas"]["ErrorBody"], "$defs": doc["components"]["schemas"]}


def _assert_error_model(r: httpx.Response, schema: dict, declared: dict | None = None) -> dict:
    """``r`` is an error answer in the declared error model, of a status its route declares."""
    import jsonschema

    assert r.headers["content-type"] == "application/json", r.text
    body = r.json()
    jsonschema.validate(body, schema)
    assert body["status"] == r.status_code, body
    if declared is not None:
        assert str(r.status_code) in declared["responses"], (
            r.request.url,
            r.status_code,
            sorted(declared["responses"]),
        )
        ref = declared["responses"][str(r.status_code)]["content"]["application/json"]["schema"]
        assert ref == {"$ref": "#/components/schemas/ErrorBody"}, ref
    return body


def test_every_runner_error_is_the_declared_error_model(app, env):
    """Each runner documents its endpoints (``GET /docs.json``, behind the token) and answers every
    error of them, and of unknown routes, as ErrorBody."""
    cases = {
        "GraphSAGERunner": [
            ("/infer", b"GSE1junk", "application/octet-stream"),
            ("/load", b'{"tag": ""}', None),
            ("/load", b'{"tag": "graphsage:none"}', None),
            ("/models", b'{"x": 1}', None),
            ("/infer", b"{}", None),
            ("/no-such-route", b"{}", None),
        ],
        "FeatureRunner": [
            ("/predict", b"GSE1junk", "application/octet-stream"),
            ("/features", b'{"node_ids": [-1]}', None),
            ("/features", b'{"node_ids": [1], "seed": "x"}', None),
            ("/graph_update", b'{"ops": [{"op": "add_edge", "src": 1, "dst": 999999}]}', None),
            ("/graph_compact", b'{"upto": 999999999}', None),
            ("/info", b"[1]", None),
        ],
    }
    for service, url in (("GraphSAGERunner", app.model.url), ("FeatureRunner", app.feature.url)):
        doc = httpx.get(url + "/docs.json", headers=app.service_headers, timeout=10).json()
        schema = _error_body_schema(doc)
        for path, content, media_type in cases[service]:
            r = httpx.post(
                url + path,
                content=content,
                timeout=10,
                headers={"content-type": media_type or "application/json", **app.service_headers},
            )
            assert r.status_code >= 400, (service, path, r.text)
            _assert_error_model(r, schema, doc["paths"].get(path, {}).get("post"))
        r = httpx.post(url + "/load", json={}, timeout=10)  # no token
        assert r.status_code == 401 and _assert_error_model(r, schema)["type"] == "unauthenticated"


@pytest.fixture(scope="module")
def second_gateway(app, env):
    """Another gateway on the same runners, with a rate limit whose burst only the contract test
    spends, and a breaker reset (3 s) that no other Retry-After here has."""
    limits = {
        "GSAGE_RATE_LIMIT_PER_S": "0.01",
        "GSAGE_RATE_LIMIT_BURST": "40",
        "GSAGE_GRPC_PORT": "0",
        "GSAGE_BREAKER_RESET_S": "3",
    }
    gw = app.gateway_for({**app.env, **limits}).start()
    try:
        yield gw
    finally:
        gw.stop()


def _answer(r: httpx.Response) -> tuple[int, dict, object]:
    """What a client sees of an error: status, the headers that carry meaning, the body."""
    kept = {k: v for k, v in r.headers.items() if k in ("content-type", "retry-after", "www-authenticate")}
    return r.status_code, kept, r.json()


CONTRACT_CASES = {
    "validation": ({"node_ids": [-1]}, "predict", "application/json"),
    "validation, two fields": ({"node_ids": [1], "fanout": [0], "seed": -2}, "predict", "application/json"),
    "unknown field": ({"node_ids": [1], "surprise": True}, "predict", "application/json"),
    "no key": ({"node_ids": [1]}, None, "application/json"),
    "wrong key": ({"node_ids": [1]}, "gsk_wrong", "application/json"),
    "no scope": ({"node_ids": [1]}, "noscope", "application/json"),
    "unknown version": ({"node_ids": [1], "version": "doesnotexist"}, "predict", "application/json"),
    "unknown model": ({"node_ids": [1], "model": "nope"}, "predict", "application/json"),
    "unknown node": ({"node_ids": [5000]}, "predict", "application/json"),
    "too many ids": ({"node_ids": list(range(2000))}, "predict", "application/json"),
    "body too large": (b"{" + b" " * (2 << 20) + b"}", "predict", "application/json"),
    "media type": (b"node_ids=1", "predict", "text/plain"),
}


def _send(
    gw, env, body, key, media_type, path: str = "/predict", method: str = "POST", headers: dict | None = None
) -> httpx.Response:
    headers = {"content-type": media_type, **(headers or {})}
    if key is not None:
        headers["Authorization"] = f"Bearer {env['keys'].get(key, key)}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.request(
        method, gw.url + path, content=content if method == "POST" else None, headers=headers, timeout=30
    )


def test_every_error_answer_of_every_public_route_is_the_declared_error_model(second_gateway, env):
    """The contract, for each kind of error of each public route: the body validates against
    ``ErrorBody`` as ``/docs.json`` declares it, and the route declares that status."""
    gw = second_gateway
    doc = httpx.get(gw.url + "/docs.json", timeout=10).json()
    schema = _error_body_schema(doc)
    seen = {}
    for name, (body, key, media_type) in CONTRACT_CASES.items():
        r = _send(gw, env, body, key, media_type)
        seen[name] = _answer(r)
        _assert_error_model(r, schema, doc["paths"]["/predict"]["post"])
    assert {name: a[0] for name, a in seen.items()} == {
        "validation": 400,
        "validation, two fields": 400,
        "unknown field": 400,
        "no key": 401,
        "wrong key": 401,
        "no scope": 403,
        "unknown version": 404,
        "unknown model": 404,
        "unknown node": 404,
        "too many ids": 413,
        "body too large": 413,
        "media type": 415,
    }
    # A 400 names the field and the reason, as the gRPC answer does, and says which field.
    assert seen["validation"][2]["error"] == "invalid request: node_ids.0: Input should be greater than or equal to 0"
    assert seen["validation"][2]["param"] == "node_ids.0" and seen["validation"][2]["type"] == "invalid_request"
    assert (
        "fanout.0" in seen["validation, two fields"][2]["error"]
        and "seed" in seen["validation, two fields"][2]["error"]
    )
    assert seen["no key"][1]["www-authenticate"] == "Bearer"
    assert seen["unknown version"][2]["type"] == "unknown_version"  # the model runner's kind, through two hops
    others = [  # (path, method, body, key, extra headers, status)
        ("/graph/updates", "POST", {"ops": [{"op": "add_edge", "src": 1, "dst": 999999}]}, "admin", {}, 403),
        ("/graph/updates", "POST", {"ops": "x"}, None, {}, 401),
        ("/admin/routing", "POST", {"action": "promote"}, "admin", {}, 400),
        ("/admin/routing", "POST", {"action": "nonsense"}, "admin", {}, 400),
        ("/admin/routing", "POST", {"action": "rollback", "model": "nope"}, "admin", {}, 404),
        ("/admin/graph/compact", "POST", {"upto": -1}, "admin", {}, 400),
        ("/admin/graph/compact", "POST", {}, "predict", {}, 403),
        ("/admin/shadow", "GET", {}, "predict", {}, 403),
        ("/models", "GET", {}, None, {}, 401),
        ("/graph/status", "GET", {}, None, {}, 401),
        ("/predict", "POST", {"node_ids": [1]}, "predict", {"Accept": "text/html"}, 406),
    ]
    for path, method, body, key, extra, status in others:
        r = _send(gw, env, body, key, "application/json", path, method, extra)
        assert r.status_code == status, (path, r.status_code, r.text)
        _assert_error_model(r, schema, doc["paths"][path][method.lower()])
    for path, method in (("/no-such-route", "GET"), ("/predict", "GET")):  # BentoML's own 404 and 405
        r = _send(gw, env, {}, "predict", "application/json", path, method)
        assert r.status_code in (404, 405) and _assert_error_model(r, schema)["type"] in (
            "not_found",
            "method_not_allowed",
        )
    dup = httpx.post(
        gw.url + "/predict",
        content=b'{"node_ids": [1]}',
        timeout=10,
        headers=[("content-type", "application/json"), ("content-type", "application/json")],
    )
    assert dup.status_code == 400 and _assert_error_model(dup, schema)["param"] == "Content-Type"
    # 429 with Retry-After, in the same shape.
    for _ in range(41):
        r = _send(gw, env, {"node_ids": [1]}, "admin", "application/json")
        if r.status_code == 429:
            break
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
    assert _assert_error_model(r, schema, doc["paths"]["/predict"]["post"])["type"] == "rate_limited"


def test_a_503_keeps_its_reason_and_retry_after_over_http(app, env, second_gateway):
    """The model runner down: the first answers are the FeatureRunner's (its kind, its words, its
    Retry-After of 1 s), then the gateway's open breaker answers at once with its own Retry-After:
    GSAGE_BREAKER_RESET_S=3 here, so the two are told apart."""
    app.model.kill()
    try:
        first = _answer(_send(second_gateway, env, {"node_ids": [7]}, "predict", "application/json"))
        assert first[0] == 503 and first[2]["error"].startswith("model runner unavailable: "), first
        assert first[2]["type"] == "model_runner_unavailable" and first[1]["retry-after"] == "1", first
        for _ in range(5):  # GSAGE_BREAKER_FAILURES=3: the breaker opens
            last = _answer(_send(second_gateway, env, {"node_ids": [7]}, "predict", "application/json"))
        assert last[0] == 503 and last[2]["error"] == "model runner unavailable: circuit open", last
        assert last[2]["type"] == "model_runner_unavailable" and last[1]["retry-after"] == "3", last
    finally:
        app.model.start()


def test_concurrent_load_has_zero_errors(app, env):
    # Regression: bentoml.depends' client recycled its session under in-flight requests (5xx).
    out = asyncio.run(
        answers_under_load(
            app.gateway.url + "/predict", auth(env), 6.0, 32, lambda w, n: {"node_ids": [(w * 997 + n) % 4000]}
        )
    )
    total = sum(out.values())
    assert out[env["v1"]] == total and total > 150, out


def test_bulk_requests_merge_past_the_client_limit(app, env):
    """The gateway merges concurrent bulk requests into FeatureRunner calls of up to
    GSAGE_COALESCE_MAX_NODES (2048) nodes, past the 1024 a client may send, and the FeatureRunner
    admits them (it once answered them 413, and the gateway split them up again)."""
    from bench.suite import promtext

    before = promtext.scrape(app.feature.url)
    out = asyncio.run(
        answers_under_load(
            app.gateway.url + "/predict",
            auth(env),
            3.0,
            16,
            lambda w, n: {"node_ids": [(w * 131 + n * 7 + i) % 4000 for i in range(512)]},
        )
    )
    assert set(out) == {env["v1"]} and sum(out.values()) > 16, out
    batches = promtext.diff(before, promtext.scrape(app.feature.url), "feature_batch_targets")
    assert batches is not None, "no FeatureRunner batch observed"
    merged = round(batches["count"] * (1 - batches["le_fraction"]["1024.0"]))
    assert merged > 0, f"no FeatureRunner batch over 1024 targets among {batches['count']}: {out}"


def test_canary_weights_and_stickiness(app, env):
    r = admin(app, env, {"action": "set_weights", "model": "graphsage", "weights": {env["v1"]: 70, env["v2"]: 30}})
    assert r.status_code == 200, r.text
    time.sleep(1.5)  # every worker polls the routing file once a second
    share = Counter(predict(app, env, {"node_ids": [i % 4000]}).json()["model"] for i in range(300))
    assert set(share) == {env["v1"], env["v2"]}
    assert abs(share[env["v2"]] / 300 - 0.3) < 0.1, share  # 0.3 +- ~3.8 sd
    for key in ("alice", "bob", "carol", "dave", "erin"):
        seen = {predict(app, env, {"node_ids": [1], "routing_key": key}).json()["model"] for _ in range(8)}
        assert len(seen) == 1, (key, seen)
    pinned = predict(app, env, {"node_ids": [1], "version": env["v2"].split(":")[1], "routing_key": "alice"})
    assert pinned.json()["model"] == env["v2"]


def test_promote_and_rollback_under_load(app, env):
    async def scenario() -> Counter:
        load = asyncio.create_task(
            answers_under_load(
                app.gateway.url + "/predict", auth(env), 7.0, 16, lambda w, n: {"node_ids": [(w * 31 + n) % 4000]}
            )
        )
        await asyncio.sleep(1.5)
        assert (
            await asyncio.to_thread(admin, app, env, {"action": "promote", "version": env["v2"]})
        ).status_code == 200
        await asyncio.sleep(2.5)
        assert (await asyncio.to_thread(admin, app, env, {"action": "rollback"})).status_code == 200
        return await load

    out = asyncio.run(scenario())
    failures = {k: v for k, v in out.items() if k not in (env["v1"], env["v2"])}
    assert not failures, out
    assert out[env["v2"]] > 0 and out[env["v1"]] > 0, out


def test_rate_limit_then_recovery(app, env):
    limited_env = {**app.env, "GSAGE_RATE_LIMIT_PER_S": "1", "GSAGE_RATE_LIMIT_BURST": "2", "GSAGE_GRPC_PORT": "0"}
    gw = app.gateway_for(limited_env).start()
    try:
        url, h = gw.url + "/predict", auth(env)
        codes = [httpx.post(url, json={"node_ids": [1]}, headers=h, timeout=10) for _ in range(4)]
        assert [c.status_code for c in codes[:2]] == [200, 200]
        limited = [c for c in codes if c.status_code == 429]
        assert limited and int(limited[0].headers["Retry-After"]) >= 1
        time.sleep(int(limited[0].headers["Retry-After"]) + 0.2)
        assert httpx.post(url, json={"node_ids": [1]}, headers=h, timeout=10).status_code == 200
    finally:
        gw.stop()


def test_grpc_answers_equal_http(app, env):
    grpc_client = pytest.importorskip("services.grpc_client")
    ids = [3, 1, 4, 1, 5]
    http = predict(app, env, {"node_ids": ids, "seed": 99, "version": env["v1"]}).json()
    rpc = grpc_client.predict(
        f"127.0.0.1:{env['settings']['GSAGE_GRPC_PORT']}",
        ids,
        api_key=env["keys"]["predict"],
        seed=99,
        version=env["v1"],
    )
    assert rpc["model"] == http["model"]
    assert rpc["precision"] == http["precision"] == "fp32"  # the default GSAGE_PRECISION
    np.testing.assert_allclose(
        [p["probabilities"] for p in rpc["predictions"]], [p["probabilities"] for p in http["predictions"]], atol=1e-6
    )


def in_process_explanation(env, tag: str, node_ids: list[int], seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """(the sampled tree, each hop-1 slot's influence on the predicted class): the model run in
    process on the tree and, one run per neighbour, on the tree without it (NaN: empty slots)."""
    import onnxruntime as ort

    from common.settings import Settings
    from runners.feature.sampling import sample_tree
    from runners.feature.snapshot import load_snapshot
    from runners.feature.tree_layout import compact
    from runners.graphsage.model_artifacts import load_artifacts
    from tests.test_explain import without_slot

    with bentoml_home(env["home"]):
        snap, art = load_snapshot(), load_artifacts(tag)
    session = ort.InferenceSession(art.onnx_path, providers=["CPUExecutionProvider"])
    dtype = Settings().feature_transport_dtype  # the rows as the gateway's transport rounds them

    def probs(tree: list[np.ndarray]) -> np.ndarray:
        unique, index = compact(tree)
        rows = np.asarray(snap.features[unique], dtype=np.float32).astype(dtype).astype(np.float32)
        return session.run(["probs"], {"features": rows, **{f"idx{d}": i for d, i in enumerate(index)}})[0]

    tree = sample_tree(snap.indptr, snap.indices, np.array(node_ids), art.config.fanout, seed=seed)
    full = probs(tree)
    label = full.argmax(1)
    influence = np.full(tree[1].shape, np.nan)
    for b, j in zip(*np.nonzero(tree[1] >= 0)):
        influence[b, j] = full[b, label[b]] - probs(without_slot(tree, b, j))[0, label[b]]
    return tree, influence


def test_explain_over_http_and_grpc(app, env):
    """The neighbourhood is the sampler's, each influence the in-process difference with that
    neighbour left out; gRPC answers the same explanation; the limit is a 4xx that names itself."""
    import grpc

    from common.settings import Settings

    grpc_client = pytest.importorskip("services.grpc_client")
    target = f"127.0.0.1:{env['settings']['GSAGE_GRPC_PORT']}"
    ids, seed = [5, 17, 3999], 4242
    r = predict(app, env, {"node_ids": ids, "seed": seed, "version": env["v1"], "explain": True})
    assert r.status_code == 200, r.text
    http = r.json()
    tree, influence = in_process_explanation(env, env["v1"], ids, seed)
    for b, p in enumerate(http["predictions"]):
        ex = p["explanation"]
        real = tree[1][b] >= 0
        assert [n["node_id"] for n in ex["neighbours"]] == tree[1][b][real].tolist()
        assert ex["empty_slots"] == int((~real).sum()) and ex["classes"] == [p["label"]]
        for n, hop2 in zip(ex["neighbours"], tree[2][b][real]):
            assert n["hop2"] == hop2[hop2 >= 0].tolist() and n["hop2_empty"] == int((hop2 < 0).sum())
        np.testing.assert_allclose([n["influence"][0] for n in ex["neighbours"]], influence[b][real], atol=1e-5)
    assert any(p["explanation"]["empty_slots"] for p in http["predictions"])  # a degree under the fanout

    rpc = grpc_client.predict(target, ids, api_key=env["keys"]["predict"], seed=seed, version=env["v1"], explain=True)
    for h, g in zip(http["predictions"], rpc["predictions"]):
        he, ge = h["explanation"], g["explanation"]
        assert ge["classes"] == he["classes"] and ge["empty_slots"] == he["empty_slots"]
        assert [(n["node_id"], n["hop2"], n["hop2_empty"]) for n in ge["neighbours"]] == [
            (n["node_id"], n["hop2"], n["hop2_empty"]) for n in he["neighbours"]
        ]
        np.testing.assert_array_equal(
            np.float32([n["influence"] for n in ge["neighbours"]]),
            np.float32([n["influence"] for n in he["neighbours"]]),
        )
    plain = predict(app, env, {"node_ids": ids, "seed": seed, "version": env["v1"]}).json()
    assert all("explanation" not in p for p in plain["predictions"])

    limit = Settings().explain_max_nodes
    over = predict(app, env, {"node_ids": list(range(limit + 1)), "explain": True})
    assert over.status_code == 413 and "GSAGE_EXPLAIN_MAX_NODES" in over.json()["error"], over.text
    with pytest.raises(grpc.RpcError) as exc:
        grpc_client.predict(target, list(range(limit + 1)), api_key=env["keys"]["predict"], explain=True)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and exc.value.details() == over.json()["error"]


def shadow_pair(app, env, primary: str, shadow: str, requests: int, wait_s: float = 15.0) -> dict:
    """The pair's figures from ``GET /admin/shadow`` once ``requests`` shadow requests are counted
    (the shadow runs off the response path, so after the answers)."""
    deadline = time.monotonic() + wait_s
    while True:
        doc = httpx.get(app.gateway.url + "/admin/shadow", headers=auth(env, "admin"), timeout=10).json()
        pair = next((p for p in doc["pairs"] if (p["primary"], p["shadow"]) == (primary, shadow)), None)
        done = pair is not None and pair["requests"] + pair["failed"] + pair["dropped"] >= requests
        if done or time.monotonic() > deadline:
            assert pair is not None, doc
            return pair
        time.sleep(0.1)


def test_shadow_canary_scores_the_primarys_neighbourhood(app, env):
    """The shadow at 100%: the same version answers the same (no seed from the client: the one the
    gateway draws serves both sides, over HTTP and gRPC); another version's agreement equals an
    in-process computation on the same requests; promote refuses under the bar, with the figures."""
    from services.routing import RoutingTable
    from services.routing_cli import main as routing_cli
    from services.shadow_stats import load_stats, merge_stats

    grpc_client = pytest.importorskip("services.grpc_client")
    v1, v2, pin = env["v1"], env["v2"], env["v1"].split(":")[1]
    routes_file = env["settings"]["GSAGE_ROUTING_FILE"]
    try:
        assert admin(app, env, {"action": "set_shadow", "version": v1, "share": 1.0}).status_code == 200
        # One request at a time, each shadowed before the next.
        for i in range(12):
            body = {"node_ids": [(i * 37 + k) % 4000 for k in range(1 + i % 3)], "version": pin}
            assert predict(app, env, body).status_code == 200
            shadow_pair(app, env, v1, v1, i + 1)
        for i in range(3):
            grpc_client.predict(
                f"127.0.0.1:{env['settings']['GSAGE_GRPC_PORT']}",
                [i, i + 1],
                api_key=env["keys"]["predict"],
                version=v1,
            )
            shadow_pair(app, env, v1, v1, 13 + i)
        same = shadow_pair(app, env, v1, v1, 15)
        assert (same["requests"], same["failed"], same["dropped"]) == (15, 0, 0), same
        assert same["agreement"] == 1.0 and same["probability_diff"]["max"] == 0.0, same
        assert same["probability_diff"]["p99"] == 0.0 and same["predictions"] == 30, same
        # Requests one after the other without waiting for their shadow: most are under
        # GSAGE_PREMEAN_MIN_TARGETS (full rows), and the shadow merges them into calls over it.
        # Each still runs on its primary's layout, so the answers differ by the float32 rounding
        # of another batch shape (~1e-8), not by float16 premean rounding (~1e-5).
        burst = [
            {"node_ids": [(i * 53 + k) % 4000 for k in range(20 if i % 4 == 0 else 8 + i % 8)], "version": pin}
            for i in range(24)
        ]
        assert all(predict(app, env, b).status_code == 200 for b in burst)
        same = shadow_pair(app, env, v1, v1, 15 + len(burst))
        assert same["predictions"] == 30 + sum(len(b["node_ids"]) for b in burst), same
        assert same["agreement"] == 1.0 and same["probability_diff"]["max"] < 1e-6, same

        assert admin(app, env, {"action": "set_shadow", "version": v2}).status_code == 200
        bodies = [
            {"node_ids": [(i * 101 + k) % 4000 for k in range(3)], "seed": 500 + i, "version": pin} for i in range(10)
        ]
        for body in bodies:
            assert predict(app, env, body).status_code == 200
        other = shadow_pair(app, env, v1, v2, 10)
        p = np.concatenate([in_process_probs(env, v1, b["node_ids"], b["seed"]) for b in bodies])
        q = np.concatenate([in_process_probs(env, v2, b["node_ids"], b["seed"]) for b in bodies])
        assert other["predictions"] == 30 and other["agreed"] == int((p.argmax(1) == q.argmax(1)).sum()), other
        assert other["probability_diff"]["mean"] == pytest.approx(float(np.abs(p - q).max(1).mean()), abs=1e-4)
        assert "gateway_shadow_requests_total" in httpx.get(app.gateway.url + "/metrics").text

        before = RoutingTable(routes_file).routes("graphsage")
        refused = admin(app, env, {"action": "promote", "version": v2, "min_agreement": 1.0, "min_compared": 1000})
        assert refused.status_code == 409, refused.text
        assert "over 30 predictions compared" in refused.json()["error"] and ">= 1000" in refused.json()["error"]
        assert RoutingTable(routes_file).routes("graphsage") == before
        # The routing CLI reads the same figures from the gateway workers' stats files.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            written = merge_stats(load_stats(routes_file + ".shadow")).get((v1, v2))
            if written is not None and written.predictions == 30:
                break
            time.sleep(0.2)
        assert written is not None and written.predictions == 30
        assert routing_cli(["--file", routes_file, "promote", "graphsage", v2, "--min-compared", "1000"]) == 1
    finally:
        admin(app, env, {"action": "clear_shadow"})


def test_metrics_expose_stages_and_versions(app, env):
    # Split deployment: each service exposes its own /metrics (bentoml serve merges them).
    assert predict(app, env, {"node_ids": [1, 2]}).status_code == 200
    expected = {
        app.gateway: ("gateway_requests_total", "gateway_request_seconds", "gateway_breaker_state"),
        app.feature: ("feature_stage_seconds", "feature_lookups_total", "feature_response_bytes"),
        app.model: (
            "graphsage_batch_targets",
            "graphsage_queue_seconds",
            "graphsage_compute_seconds",
            "graphsage_requests_total",
        ),
    }
    for service, names in expected.items():
        text = httpx.get(service.url + "/metrics").text
        for name in names:
            assert name in text, (service.name, name)
    assert 'stage="sample"' in httpx.get(app.feature.url + "/metrics").text


def test_feature_runner_down_gives_degraded_answers_then_recovers(app, env):
    assert predict(app, env, {"node_ids": [42], "version": env["v1"]}).status_code == 200
    app.feature.kill()
    try:
        for _ in range(6):
            started = time.monotonic()
            r = predict(app, env, {"node_ids": [42, 43], "version": env["v1"]})
            assert r.status_code == 200 and time.monotonic() - started < 3.0, r.text
            body = r.json()
            assert body["degraded"] is True and "feature runner" in body["degraded_reason"]
            assert body["predictions"][0]["stale"] is True and body["predictions"][0]["label"] is not None
    finally:
        app.feature.start()
    restarted = time.monotonic()
    while time.monotonic() - restarted < 5.0:
        body = predict(app, env, {"node_ids": [42]}).json()
        if not body["degraded"]:
            break
        time.sleep(0.2)
    assert body["degraded"] is False, "full answers should resume within 5 s of the restart"


def test_model_runner_down_gives_503_then_recovers(app, env):
    app.model.kill()
    try:
        for _ in range(4):
            r = predict(app, env, {"node_ids": [7]})
            assert r.status_code == 503, r.text
            assert "error" in r.json()
    finally:
        app.model.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and predict(app, env, {"node_ids": [7]}).status_code != 200:
        time.sleep(0.3)
    assert predict(app, env, {"node_ids": [7]}).status_code == 200


def test_fuzzing_the_openapi_spec_finds_no_server_error(app, env, tmp_path):
    """schemathesis generates requests from the served /docs.json: never a 5xx. Runs last in
    this module: with the admin key it also fuzzes (and so rewrites) the routing table."""
    import os
    import subprocess
    import sys

    pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install -e '.[dev]')")
    st = os.path.join(os.path.dirname(sys.executable), "st")  # the venv's, whether or not it is on PATH
    out = subprocess.run(
        [
            st,
            "run",
            app.gateway.url + "/docs.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "60",
            "--header",
            f"Authorization: Bearer {env['keys']['admin']}",
            "--workers",
            "2",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    summary = next((line for line in out.stdout.splitlines() if " generated, " in line), "")
    assert summary and "failed" not in summary and "failure" not in summary, out.stdout[-3000:]
    print(summary)
