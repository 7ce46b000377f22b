"""API keys: hashing at rest, Bearer / X-API-Key, 401 vs 403, disabled mode, the CLI."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys

import pytest

from services.auth import (
    SCOPES,
    ApiKeyAuth,
    Forbidden,
    KeyEntry,
    Unauthenticated,
    generate_key,
    hash_key,
    main,
    write_entries,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def keys(tmp_path):
    """A key file with a predict-only and an admin key; yields (path, {name: key})."""
    clear = {"client": generate_key(), "ops": generate_key()}
    entries = [
        KeyEntry("client", hash_key(clear["client"]), frozenset({"predict"})),
        KeyEntry("ops", hash_key(clear["ops"]), frozenset({"predict", "admin"})),
    ]
    path = str(tmp_path / "keys.json")
    write_entries(path, entries)
    return path, clear


def test_generated_keys_have_the_documented_shape():
    key = generate_key()
    assert key.startswith("gsk_") and len(key) == 4 + 32
    assert generate_key() != key


def test_valid_key_by_bearer_and_by_x_api_key(keys):
    path, clear = keys
    auth = ApiKeyAuth.from_file(path)
    p = auth.authenticate(f"Bearer {clear['client']}", None)
    assert p.name == "client" and p.scopes == {"predict"}
    p = auth.authenticate(None, clear["ops"])
    assert p.name == "ops" and p.scopes == {"predict", "admin"}
    assert auth.authenticate(f"bearer   {clear['client']}  ", None).name == "client"
    # Both headers: the Bearer token is the one used.
    assert auth.authenticate(f"Bearer {clear['ops']}", clear["client"]).name == "ops"
    auth.authorize(p, "predict")
    auth.authorize(p, "admin")


def test_wrong_and_missing_keys_are_401_without_echoing_the_key(keys):
    path, clear = keys
    auth = ApiKeyAuth.from_file(path)
    wrong = clear["client"][:-1] + ("A" if clear["client"][-1] != "A" else "B")
    cases = [
        (f"Bearer {wrong}", None),
        (None, wrong),
        (None, None),
        ("", "  "),
        ("Bearer ", None),
        (f"Basic {wrong}", None),
        ("Bearer " + "x" * 10_000, None),
    ]
    for authorization, x_api_key in cases:
        with pytest.raises(Unauthenticated) as info:
            auth.authenticate(authorization, x_api_key)
        assert info.value.status_code == 401
        message = str(info.value)
        assert wrong not in message and clear["client"] not in message
        assert "API key" in message or "Bearer" in message


def test_wrong_scope_is_403_and_names_the_scope_not_the_key(keys):
    path, clear = keys
    auth = ApiKeyAuth.from_file(path)
    principal = auth.authenticate(None, clear["client"])
    with pytest.raises(Forbidden) as info:
        auth.authorize(principal, "admin")
    assert info.value.status_code == 403
    assert "admin" in str(info.value) and clear["client"] not in str(info.value)
    with pytest.raises(Forbidden):
        auth.check(f"Bearer {clear['client']}", None, "admin")
    assert auth.check(f"Bearer {clear['ops']}", None, "admin").name == "ops"
    with pytest.raises(ValueError):
        auth.authorize(principal, "root")  # a typo in the caller is a bug, not a 403


def test_key_file_holds_no_clear_key_and_is_private(keys):
    path, clear = keys
    text = open(path).read()
    for key in clear.values():
        assert key not in text and key[4:] not in text
        assert hash_key(key) in text
    doc = json.loads(text)
    assert {e["name"] for e in doc["keys"]} == {"client", "ops"}
    assert set(doc["keys"][0]) == {"name", "sha256", "scopes"}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_invalid_key_files_are_rejected(tmp_path):
    bad = tmp_path / "bad.json"
    for doc in (
        {"keys": [{"name": "a", "sha256": "zz", "scopes": ["predict"]}]},
        {"keys": [{"name": "a", "sha256": "0" * 64, "scopes": ["root"]}]},
        {
            "keys": [
                {"name": "a", "sha256": "0" * 64, "scopes": ["predict"]},
                {"name": "a", "sha256": "1" * 64, "scopes": ["predict"]},
            ]
        },
        {"nokeys": []},
    ):
        bad.write_text(json.dumps(doc))
        with pytest.raises(ValueError):
            ApiKeyAuth.from_file(str(bad))
    with pytest.raises(FileNotFoundError):  # auth never fails open on a missing file
        ApiKeyAuth.from_file(str(tmp_path / "missing.json"))


def test_disabled_mode_admits_everyone_and_warns_once(caplog):
    with caplog.at_level(logging.WARNING, logger="services.auth"):
        auth = ApiKeyAuth.disabled()
        p = auth.authenticate(None, None)
        auth.authenticate("Bearer whatever", None)
    assert p.scopes == SCOPES
    auth.authorize(p, "admin")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "DISABLED" in warnings[0].getMessage()


def test_from_settings(keys):
    from common.settings import load_settings

    path, clear = keys
    assert not ApiKeyAuth.from_settings(load_settings({}).access).enabled
    s = load_settings({"GSAGE_AUTH_ENABLED": "1", "GSAGE_API_KEYS_FILE": path})
    assert ApiKeyAuth.from_settings(s.access).authenticate(None, clear["ops"]).name == "ops"
    with pytest.raises(ValueError):
        ApiKeyAuth.from_settings(load_settings({"GSAGE_AUTH_ENABLED": "1"}))


def test_reload_picks_up_a_revocation(keys):
    path, clear = keys
    auth = ApiKeyAuth.from_file(path)
    assert not auth.reload_if_changed()
    assert main(["revoke", "--name", "client", "--file", path]) == 0
    assert auth.reload_if_changed()
    with pytest.raises(Unauthenticated):
        auth.authenticate(None, clear["client"])
    assert auth.authenticate(None, clear["ops"]).name == "ops"


def test_cli_create_prints_the_key_once_and_list_shows_no_secrets(tmp_path, caplog):
    path = str(tmp_path / "keys.json")
    env = {**os.environ, "PYTHONPATH": ROOT}
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "services.auth", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=30,
    )
    created = run("create", "--name", "ops", "--scopes", "predict,admin", "--file", path)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("gsk_") and created.stdout.count(key) == 1 and key not in created.stderr

    auth = ApiKeyAuth.from_file(path)
    assert auth.authenticate(f"Bearer {key}", None).scopes == {"predict", "admin"}
    assert key not in open(path).read()

    # The rest in-process (faster); the same main().
    with caplog.at_level(logging.DEBUG):
        assert main(["create", "--name", "ops", "--file", path]) == 1  # duplicate name
        assert main(["create", "--name", "x", "--scopes", "root", "--file", path]) == 1
        assert main(["create", "--name", "client", "--file", path]) == 0
    assert key not in caplog.text

    listed = run("list", "--file", path)
    assert listed.returncode == 0
    assert listed.stdout.splitlines() == ["ops\tadmin,predict", "client\tpredict"]
    assert "gsk_" not in listed.stdout and hash_key(key) not in listed.stdout
