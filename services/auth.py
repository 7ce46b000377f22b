"""API keys for the gateway: authentication (who) and scopes (may they).

Key file (JSON, written 0600)::

    {"keys": [
        {"name": "ci-bot", "sha256": "<64 hex chars>", "scopes": ["predict"]},
        {"name": "ops",    "sha256": "<64 hex chars>", "scopes": ["predict", "admin"]}
    ]}

(a bare list of entries is accepted too). A key is never stored, logged or echoed in clear: the
file holds the SHA-256 hex digest of the key. Keys are ``gsk_`` + 32 URL-safe characters from
``secrets`` (192 random bits), so a plain unsalted SHA-256 is enough: salts and slow KDFs exist
to protect low-entropy human passwords from dictionary attacks, and a 192-bit random key cannot
be guessed offline from its digest.

A request presents its key as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (when both
are sent, the Bearer token is used). The presented key is hashed and compared with *every*
stored digest by ``hmac.compare_digest``, without an early exit, so timing reveals neither
which entry matched nor how much of a digest did.

Errors: ``Unauthenticated`` (HTTP 401: no key, malformed header, unknown key) and ``Forbidden``
(HTTP 403: a valid key without the scope). Their messages never contain the key.

``ApiKeyAuth.disabled()`` admits everyone with every scope (development); it logs a WARNING when
created. ``ApiKeyAuth.from_settings`` picks it when ``Settings.auth_enabled`` is false.

CLI (the new key is printed once, to stdout; nothing else ever shows it)::

    python -m services.auth create --name ops --scopes predict,admin --file keys.json
    python -m services.auth list --file keys.json
    python -m services.auth revoke --name ops --file keys.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import sys
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from common.errors import KindOfError
from common.files import atomic_write_json, file_lock, file_signature
from common.settings import AccessSection

log = logging.getLogger(__name__)

# predict: /predict, /models, /graph/status; graph: POST /graph/updates (writing the graph is
# neither predicting nor administering it, so neither of those keys may do it); admin: /admin/*.
SCOPES: frozenset[str] = frozenset({"predict", "graph", "admin"})
KEY_PREFIX = "gsk_"
KEY_RANDOM_BYTES = 24  # -> 32 URL-safe characters
MAX_KEY_CHARS = 256  # anything longer is not one of ours; never hash unbounded input
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


class AuthError(KindOfError):
    """Who may call: 401 or 403."""


class Unauthenticated(AuthError):
    """No key, a malformed header, or an unknown key (HTTP 401)."""

    status_code = 401
    headers_of_kind: ClassVar[dict[str, str]] = {"WWW-Authenticate": "Bearer"}


class Forbidden(AuthError):
    """A valid key without the scope the operation needs (HTTP 403)."""

    status_code = 403


@dataclasses.dataclass(frozen=True)
class Principal:
    name: str
    scopes: frozenset[str]

    def has(self, scope: str) -> bool:
        return scope in self.scopes


ANONYMOUS = Principal("anonymous", SCOPES)


@dataclasses.dataclass(frozen=True)
class KeyEntry:
    name: str
    sha256: str  # hex digest of the key
    scopes: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "sha256": self.sha256, "scopes": sorted(self.scopes)}


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def hash_key(key: str) -> str:
    """What the key file stores for ``key``: its SHA-256, hex."""
    return _digest(key).hex()


def parse_scopes(scopes: Iterable[str] | str) -> frozenset[str]:
    if isinstance(scopes, str):
        scopes = scopes.split(",")
    out = frozenset(s.strip() for s in scopes if s.strip())
    unknown = out - SCOPES
    if unknown:
        raise ValueError(f"unknown scope(s) {sorted(unknown)}; known: {sorted(SCOPES)}")
    if not out:
        raise ValueError(f"at least one scope is needed; known: {sorted(SCOPES)}")
    return out


def _entry_from_json(raw: Any, where: str) -> KeyEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: an entry must be an object, got {type(raw).__name__}")
    name, digest, scopes = raw.get("name"), raw.get("sha256"), raw.get("scopes")
    if isinstance(digest, str):
        digest = digest.strip().lower()
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"{where}: bad name {name!r} (letters, digits, . _ @ -; max 64)")
    if not isinstance(digest, str) or not _HEX64_RE.match(digest):
        raise ValueError(f"{where}: entry {name!r}: sha256 must be 64 hex characters")
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise ValueError(f"{where}: entry {name!r}: scopes must be a list of strings")
    try:
        return KeyEntry(name, digest, parse_scopes(scopes))
    except ValueError as exc:
        raise ValueError(f"{where}: entry {name!r}: {exc}") from None


def load_entries(path: str) -> list[KeyEntry]:
    """Parse and validate a key file; a missing file is an error (auth must not fail open)."""
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
    raw = doc.get("keys") if isinstance(doc, dict) else doc
    if not isinstance(raw, list):
        raise ValueError(f'{path}: expected {{"keys": [...]}} or a list of entries')
    entries = [_entry_from_json(item, f"{path}[{i}]") for i, item in enumerate(raw)]
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate key names")
    if len({e.sha256 for e in entries}) != len(entries):
        raise ValueError(f"{path}: duplicate key digests")
    return entries


def write_entries(path: str, entries: Sequence[KeyEntry]) -> None:
    """Atomically (temp file + ``os.replace``), readable by the owner only."""
    atomic_write_json(path, {"keys": [e.to_json() for e in entries]}, mode=0o600)


class ApiKeyAuth:
    def __init__(self, entries: Iterable[KeyEntry], *, enabled: bool = True, path: str | None = None) -> None:
        self.enabled = enabled
        self.path = path
        self._set_entries(list(entries))
        self._signature = file_signature(path) if path else None
        if not enabled:
            log.warning(
                "!!! API key authentication is DISABLED: every request is admitted with all "
                "scopes (%s). Set GSAGE_AUTH_ENABLED=1 and GSAGE_API_KEYS_FILE in production. !!!",
                ",".join(sorted(SCOPES)),
            )
        elif not self._entries:
            log.warning(
                "API key authentication is enabled but %s holds no keys: every request will get 401",
                path or "the key list",
            )

    def _set_entries(self, entries: list[KeyEntry]) -> None:
        self._entries = entries
        self._digests = [bytes.fromhex(e.sha256) for e in entries]

    @classmethod
    def from_file(cls, path: str) -> ApiKeyAuth:
        return cls(load_entries(path), path=path)

    @classmethod
    def disabled(cls) -> ApiKeyAuth:
        return cls((), enabled=False)

    @classmethod
    def from_settings(cls, access: AccessSection) -> ApiKeyAuth:
        if not access.auth_enabled:
            return cls.disabled()
        if not access.api_keys_file:
            raise ValueError("GSAGE_AUTH_ENABLED is on but GSAGE_API_KEYS_FILE is empty")
        return cls.from_file(access.api_keys_file)

    def names(self) -> list[str]:
        return [e.name for e in self._entries]

    def reload_if_changed(self) -> bool:
        """Re-read the key file when it changed (new or revoked keys without a restart).

        A file that became unreadable or invalid keeps the keys loaded before (logged)."""
        if not self.enabled or not self.path:
            return False
        sig = file_signature(self.path)
        if sig is None or sig == self._signature:
            return False
        self._signature = sig
        try:
            entries = load_entries(self.path)
        except (OSError, ValueError) as exc:
            log.error("API key file %s not reloaded, keeping %d keys: %s", self.path, len(self._entries), exc)
            return False
        self._set_entries(entries)
        log.info("API key file %s reloaded: %d keys", self.path, len(entries))
        return True

    # -- request path ----------------------------------------------------------------------------

    @staticmethod
    def _presented_key(authorization: str | None, api_key_header: str | None) -> str:
        if authorization is not None and authorization.strip():
            scheme, _, token = authorization.strip().partition(" ")
            if scheme.lower() == "bearer":
                token = token.strip()
                if not token:
                    raise Unauthenticated("empty Bearer token in the Authorization header")
                return token
            if not (api_key_header and api_key_header.strip()):
                raise Unauthenticated(
                    "unsupported Authorization scheme: send 'Authorization: Bearer <api key>' or 'X-API-Key: <api key>'"
                )
        if api_key_header is not None and api_key_header.strip():
            return api_key_header.strip()
        raise Unauthenticated("missing API key: send 'Authorization: Bearer <api key>' or 'X-API-Key: <api key>'")

    def authenticate(self, header_value: str | None, api_key_header: str | None) -> Principal:
        """``header_value``: the Authorization header; ``api_key_header``: X-API-Key."""
        if not self.enabled:
            return ANONYMOUS
        key = self._presented_key(header_value, api_key_header)
        if len(key) > MAX_KEY_CHARS:
            raise Unauthenticated("invalid API key")
        presented = _digest(key)
        match: KeyEntry | None = None
        for entry, digest in zip(self._entries, self._digests, strict=True):  # no early exit
            if hmac.compare_digest(presented, digest):
                match = entry
        if match is None:
            raise Unauthenticated("invalid API key")
        return Principal(match.name, match.scopes)

    def authorize(self, principal: Principal, scope: str) -> None:
        """Raise ``Forbidden`` unless ``principal`` holds ``scope``."""
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; known: {sorted(SCOPES)}")
        if not principal.has(scope):
            raise Forbidden(f"API key {principal.name!r} lacks the {scope!r} scope")

    def check(self, header_value: str | None, api_key_header: str | None, scope: str) -> Principal:
        """``authenticate`` then ``authorize``: the one call a request handler makes."""
        principal = self.authenticate(header_value, api_key_header)
        self.authorize(principal, scope)
        return principal


# -- CLI -----------------------------------------------------------------------------------------


def _read_for_update(path: str) -> list[KeyEntry]:
    return load_entries(path) if os.path.exists(path) else []


def main(argv: Sequence[str] | None = None) -> int:
    default_file = os.environ.get("GSAGE_API_KEYS_FILE") or None
    parser = argparse.ArgumentParser(
        prog="python -m services.auth",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, help_ in (
        ("create", "add a key and print it once"),
        ("list", "names and scopes"),
        ("revoke", "remove a key by name"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument(
            "--file",
            default=default_file,
            required=default_file is None,
            help="the key file (default: $GSAGE_API_KEYS_FILE)",
        )
        if name in ("create", "revoke"):
            p.add_argument("--name", required=True)
        if name == "create":
            p.add_argument("--scopes", default="predict", help=f"comma-separated, of {','.join(sorted(SCOPES))}")
    args = parser.parse_args(argv)

    try:
        if args.cmd == "list":
            entries = load_entries(args.file) if os.path.exists(args.file) else []
            for e in entries:
                print(f"{e.name}\t{','.join(sorted(e.scopes))}")
            return 0
        with file_lock(args.file):
            entries = _read_for_update(args.file)
            if args.cmd == "create":
                if not _NAME_RE.match(args.name):
                    raise ValueError(f"bad name {args.name!r} (letters, digits, . _ @ -; max 64)")
                if any(e.name == args.name for e in entries):
                    raise ValueError(f"a key named {args.name!r} exists; revoke it first")
                scopes = parse_scopes(args.scopes)
                key = generate_key()
                write_entries(args.file, [*entries, KeyEntry(args.name, hash_key(key), scopes)])
                print(key)  # the only time the key is shown
                print(
                    f"created key {args.name!r} with scopes {','.join(sorted(scopes))} in "
                    f"{args.file}; store it now, it cannot be shown again",
                    file=sys.stderr,
                )
            else:  # revoke
                kept = [e for e in entries if e.name != args.name]
                if len(kept) == len(entries):
                    raise ValueError(f"no key named {args.name!r} in {args.file}")
                write_entries(args.file, kept)
                print(f"revoked key {args.name!r}", file=sys.stderr)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
