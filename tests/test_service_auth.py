"""common.service_auth: the runners' token check and media-type guard, without a server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle

import pytest

from common.service_auth import OPEN_PATHS, ServiceGuard, ServiceTokens, bearer, ensure_shared_token, parse_tokens

OLD, NEW, OTHER = "old-token-" + "a" * 16, "new-token-" + "b" * 16, "stranger-" + "c" * 16
PICKLE = "application/vnd.bentoml+pickle"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def call(guard, method="POST", path="/load", headers=(), body=b"{}", routes=None, seen=None):
    """Run one request through ``guard``; (status, headers, body, whether the app was reached).
    ``seen``: a list that gets the headers the app was handed."""
    reached = []
    sent = []

    async def app(scope, receive, send):
        if seen is not None:
            seen.append(scope["headers"])
        reached.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
    }
    asyncio.run(ServiceGuard(app, guard, routes)(scope, receive, send))
    start, out = sent
    return start["status"], dict(start["headers"]), out["body"], bool(reached)


def test_two_tokens_are_accepted_and_the_first_is_sent():
    tokens = ServiceTokens([NEW, OLD])
    assert tokens.accepts(NEW) and tokens.accepts(OLD) and not tokens.accepts(OTHER)
    assert not tokens.accepts(None) and not tokens.accepts("") and not tokens.accepts(NEW + "x")
    assert tokens.current == NEW and tokens.header() == {"Authorization": f"Bearer {NEW}"}
    assert NEW not in repr(tokens) and OLD not in repr(tokens)


@pytest.mark.parametrize(
    "raw, problem",
    [(f"{OLD},{NEW},{OTHER}", "at most 2"), ("short", "16-512"), ("has space in it plenty long", "16-512")],
)
def test_bad_token_lists_are_refused_naming_the_variable(raw, problem):
    with pytest.raises(ValueError, match=problem) as info:
        parse_tokens(raw, "GSAGE_SERVICE_TOKENS")
    assert "GSAGE_SERVICE_TOKENS" in str(info.value) and "plenty" not in str(info.value)


def test_a_token_file_is_reread_when_it_changes_at_most_once_a_second(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(OLD + "\n")
    clock = FakeClock()
    tokens = ServiceTokens(path=str(path), clock=clock)
    assert tokens.accepts(OLD) and not tokens.accepts(NEW)
    path.write_text(f"{OLD}\n{NEW}\n")  # rotation, step 1: both accepted, the old one still sent
    os.utime(path, ns=(1, 1))  # a new signature even within the file system's time resolution
    assert not tokens.accepts(NEW)  # not re-read before the interval is over
    clock.now = 1.0
    assert tokens.accepts(NEW) and tokens.accepts(OLD) and tokens.current == OLD
    path.write_text(f"{NEW}\n")  # step 3: the new one alone
    os.utime(path, ns=(2, 2))
    clock.now = 2.0
    assert tokens.current == NEW and not tokens.accepts(OLD)


def test_a_broken_token_file_keeps_the_tokens_loaded_before(tmp_path, caplog):
    path = tmp_path / "tokens"
    path.write_text(NEW)
    clock = FakeClock()
    tokens = ServiceTokens(path=str(path), clock=clock)
    path.write_text("")
    os.utime(path, ns=(1, 1))
    clock.now = 5.0
    with caplog.at_level(logging.ERROR):
        assert tokens.accepts(NEW)
    assert "keeping 1 token" in caplog.text
    with pytest.raises(ValueError, match="no token in the file"):
        ServiceTokens(path=str(path))
    with pytest.raises(ValueError, match="no service token"):
        ServiceTokens([])


def test_no_configured_token_means_one_ephemeral_token_shared_with_child_processes(monkeypatch):
    monkeypatch.delenv("GSAGE_SERVICE_TOKENS", raising=False)
    monkeypatch.delenv("GSAGE_SERVICE_TOKENS_FILE", raising=False)
    ensure_shared_token()
    first = os.environ["GSAGE_SERVICE_TOKENS"]
    ensure_shared_token()  # a child process sees the parent's and keeps it
    assert os.environ["GSAGE_SERVICE_TOKENS"] == first and len(first) >= 16


def test_pickle_is_refused_on_every_route_with_or_without_a_token():
    tokens = ServiceTokens([NEW])

    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled')",))

    body = pickle.dumps(Boom())
    for path in ["/load", "/infer", "/predict", "/readyz", "/metrics", "/docs.json", "/anything"]:
        for auth in ((), (("Authorization", f"Bearer {NEW}"),)):
            status, headers, answer, reached = call(
                tokens, path=path, headers=(("Content-Type", PICKLE), *auth), body=body
            )
            assert (status, reached) == (415, False), path
            assert json.loads(answer)["status"] == 415
    for kind in ("multipart/form-data; boundary=x", "text/plain", "application/x-www-form-urlencoded", ""):
        headers = (("Content-Type", kind),) if kind else ()
        assert call(tokens, headers=(*headers, ("Authorization", f"Bearer {NEW}")))[::3] == (415, False)


def test_calls_without_an_accepted_token_get_401_except_probes_and_scrapes(caplog):
    tokens = ServiceTokens([NEW, OLD])
    json_type = ("Content-Type", "application/json")
    with caplog.at_level(logging.DEBUG):
        for headers in (
            (),
            (("Authorization", f"Bearer {OTHER}"),),
            (("Authorization", f"Basic {NEW}"),),
            (("X-Api-Key", NEW),),
        ):
            status, out_headers, answer, reached = call(tokens, headers=(json_type, *headers))
            assert (status, reached) == (401, False)
            assert out_headers[b"www-authenticate"].startswith(b"Bearer")
            assert OTHER.encode() not in answer and NEW.encode() not in answer
        for path in ("/docs.json", "/schema.json", "/infer", "/models"):
            assert call(tokens, path=path, headers=(json_type,))[0] == 401
    assert OTHER not in caplog.text and NEW not in caplog.text
    for path in sorted(OPEN_PATHS):
        assert call(tokens, method="GET", path=path, body=b"")[::3] == (200, True)
    for token in (NEW, OLD):
        assert call(tokens, headers=(json_type, ("Authorization", f"Bearer {token}")))[::3] == (200, True)
    octet = ("Content-Type", "application/octet-stream")
    assert call(tokens, path="/infer", headers=(octet, ("Authorization", f"bearer {NEW}")))[::3] == (200, True)


def test_bearer_parses_only_bearer_headers():
    assert bearer("Bearer abc") == "abc" and bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") is None and bearer("Bearer") is None and bearer(None) is None


def test_a_second_content_type_or_authorization_header_is_refused_before_anything_reads_it():
    """BentoML reads the first of two Content-Type headers, a dict the last: either way round,
    and whatever the token, a request with two never reaches the service."""
    tokens = ServiceTokens([NEW])
    valid, wrong = ("Authorization", f"Bearer {NEW}"), ("Authorization", f"Bearer {OTHER}")
    for types in ((PICKLE, "application/json"), ("application/json", PICKLE), ("application/json",) * 2):
        for auth in ((), (valid,), (wrong, valid), (valid, wrong)):
            status, _, answer, reached = call(
                tokens, headers=(*(("Content-Type", t) for t in types), *auth), body=pickle.dumps(None)
            )
            assert (status, reached) == (400, False), (types, auth)
            assert json.loads(answer)["error"] == "header Content-Type sent 2 times; send it once"
    for auth in ((wrong, valid), (valid, wrong), (valid, valid)):
        status, _, answer, reached = call(tokens, headers=(("Content-Type", "application/json"), *auth))
        assert (status, reached) == (400, False) and b"Authorization sent 2 times" in answer


def test_the_service_sees_only_the_media_type_the_guard_admitted():
    tokens = ServiceTokens([NEW])
    seen: list = []
    status, *_ = call(
        tokens,
        headers=(("Content-Type", "Application/JSON; charset=utf-8"), ("Authorization", f"Bearer {NEW}")),
        seen=seen,
    )
    assert status == 200
    assert [v for k, v in seen[0] if k == b"content-type"] == [b"application/json"]
    assert not [k for k, _ in seen[0] if k == b"Content-Type"]


def test_a_route_of_the_table_takes_its_own_media_type_and_answers_its_own():
    tokens = ServiceTokens([NEW])
    routes = {
        "/infer": ("application/octet-stream", "application/octet-stream"),
        "/load": ("application/json", "application/json"),
    }
    auth = ("Authorization", f"Bearer {NEW}")
    octet, json_type = ("Content-Type", "application/octet-stream"), ("Content-Type", "application/json")
    assert call(tokens, path="/infer", headers=(octet, auth), routes=routes)[::3] == (200, True)
    assert call(tokens, path="/infer", headers=(json_type, auth), routes=routes)[::3] == (415, False)
    assert call(tokens, path="/load", headers=(octet, auth), routes=routes)[::3] == (415, False)
    assert call(tokens, path="/load", headers=(json_type, auth, ("Accept", "application/octet-stream")), routes=routes)[
        ::3
    ] == (406, False)
    assert call(tokens, path="/load", headers=(json_type, auth, ("Accept", "*/*")), routes=routes)[::3] == (200, True)
