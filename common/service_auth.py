"""Service tokens: how a runner knows a call comes from another service of this app.

The runners are internal: only the gateway calls the FeatureRunner, and only the gateway and the
FeatureRunner call the GraphSAGERunner. Every such call carries ``Authorization: Bearer <token>``
and ``ServiceGuard`` (an ASGI middleware in front of each runner, outside everything BentoML
does with a request) admits it only when the token is one of the accepted ones. Health and
metrics routes stay open for probes and scrapers; everything else, the OpenAPI documents
included, answers 401 without a token.

The guard also refuses every request body that is not of its route's media type (JSON or
``application/octet-stream``) with 415, before any parser sees it and whatever the token, and a
request that sends ``Content-Type`` (or ``Authorization``, or another header that decides how a
body is read) twice with 400: a service BentoML starts as a dependency (``start-http-server
--service-name X``) would otherwise unpickle ``application/vnd.bentoml+pickle`` bodies, which
runs code of the sender's choosing, and BentoML reads the first of two ``Content-Type`` headers
(``common.request_headers``).

Tokens (``Settings.service_tokens`` or ``Settings.service_tokens_file``; at most two):

- the first is the one this process sends, every one listed is accepted;
- the file (a mounted Kubernetes Secret, one token per line) is re-read when it changes, at most
  once per ``GSAGE_SERVICE_TOKENS_RELOAD_S``, so a rotation needs no restart: list ``new`` after ``old``
  everywhere, then ``new`` first, then ``new`` alone;
- with neither set, an ephemeral token is generated once and put in this process's
  environment, so that the processes it starts share it (``bentoml serve`` runs every service
  as a child of one process). Services started apart (containers, ``start-http-server``) must
  be given the same token; without one their calls are refused, never admitted.

A token is never logged: ``repr`` shows only how many there are, and a refusal says why without
echoing what was presented.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from common.bento.foreign_errors import in_one_shape
from common.errors import ApiError, send_error
from common.files import file_signature
from common.request_context import REQUEST_ID_HEADER, adopt
from common.request_headers import BODY_METHODS, JSON, OCTET_STREAM, RequestHeaders, with_body_type
from common.settings import SecuritySection

log = logging.getLogger("graphsage.service_auth")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TOKENS_ENV = "GSAGE_SERVICE_TOKENS"
MAX_TOKENS = 2
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 512
# Probes and scrapers: no token, no body.
OPEN_PATHS = frozenset({"/livez", "/readyz", "/healthz", "/metrics"})
# What the services here send each other: JSON (admin calls) and the binary wire format.
ACCEPTED_MEDIA_TYPES = (JSON, OCTET_STREAM)
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="graphsage-internal"'}


def parse_tokens(raw: str, source: str) -> tuple[str, ...]:
    """Tokens from a comma- or newline-separated text; raises ``ValueError`` naming ``source``."""
    tokens = tuple(t.strip() for t in raw.replace("\n", ",").split(",") if t.strip())
    if len(tokens) > MAX_TOKENS:
        raise ValueError(f"{source}: {len(tokens)} service tokens; at most {MAX_TOKENS} (the current and the next)")
    for i, token in enumerate(tokens):
        if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS or not token.isprintable() or " " in token:
            raise ValueError(
                f"{source}: service token #{i + 1} must be {MIN_TOKEN_CHARS}-{MAX_TOKEN_CHARS} "
                "printable characters without spaces"
            )
    return tokens


def ensure_shared_token() -> None:
    """With no token configured, put an ephemeral one in this process's environment (inherited
    by the processes it starts). A no-op when a token or a token file is configured."""
    if os.environ.get(TOKENS_ENV) or os.environ.get(TOKENS_ENV + "_FILE"):
        return
    os.environ[TOKENS_ENV] = "gst_" + secrets.token_urlsafe(24)
    log.info(
        "no service token configured: an ephemeral one is shared by the processes started from here; "
        "services started apart need %s or %s_FILE",
        TOKENS_ENV,
        TOKENS_ENV,
    )


class ServiceTokens:
    """The accepted tokens (the first is the one to send), from a list or a file re-read on change."""

    def __init__(
        self,
        tokens: Sequence[str] = (),
        path: str = "",
        *,
        reload_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._reload_interval_s = reload_interval_s
        self._clock = clock
        self._signature: tuple[int, int, int] | None = None
        self._next_check = 0.0
        self._tokens: tuple[str, ...] = ()
        self._encoded: tuple[bytes, ...] = ()
        if path:
            self._load_file(initial=True)
        else:
            self._set(parse_tokens(",".join(tokens), TOKENS_ENV))
        if not self._tokens:
            raise ValueError(f"no service token: set {TOKENS_ENV} or {TOKENS_ENV}_FILE")

    @classmethod
    def from_settings(cls, security: SecuritySection) -> ServiceTokens:
        if not security.service_tokens and not security.service_tokens_file:
            # Read at call time: ensure_shared_token may have set it after the settings were read.
            return cls(parse_tokens(os.environ.get(TOKENS_ENV, ""), TOKENS_ENV))
        return cls(
            security.service_tokens, security.service_tokens_file, reload_interval_s=security.service_tokens_reload_s
        )

    def __repr__(self) -> str:
        return f"ServiceTokens({len(self._tokens)} token(s){', file ' + self.path if self.path else ''})"

    def _set(self, tokens: tuple[str, ...]) -> None:
        self._tokens = tokens
        self._encoded = tuple(t.encode() for t in tokens)

    def _load_file(self, initial: bool = False) -> None:
        signature = file_signature(self.path)
        if signature == self._signature:
            return
        try:
            with open(self.path, encoding="utf-8") as f:
                tokens = parse_tokens(f.read(), f"{TOKENS_ENV}_FILE={self.path}")
            if not tokens:
                raise ValueError(f"{TOKENS_ENV}_FILE={self.path}: no token in the file")
        except (OSError, ValueError) as exc:
            if initial:
                raise ValueError(str(exc)) from None
            log.error("service token file not reloaded, keeping %d token(s): %s", len(self._tokens), exc)
            self._signature = signature
            return
        self._signature = signature
        if not initial:
            log.info("service token file %s reloaded: %d token(s)", self.path, len(tokens))
        self._set(tokens)

    def _refresh(self) -> None:
        if self.path and self._clock() >= self._next_check:
            self._next_check = self._clock() + self._reload_interval_s
            self._load_file()

    @property
    def current(self) -> str:
        """The token this process sends."""
        self._refresh()
        return self._tokens[0]

    def accepts(self, presented: str | None) -> bool:
        """Constant time per accepted token, every one compared (no early exit)."""
        self._refresh()
        if not presented or len(presented) > MAX_TOKEN_CHARS:
            return False
        candidate = presented.encode("utf-8", "surrogatepass")
        ok = False
        for token in self._encoded:
            ok |= hmac.compare_digest(candidate, token)
        return ok

    def header(self) -> dict[str, str]:
        """The header a call to another service carries."""
        return {"Authorization": f"Bearer {self.current}"}


def bearer(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, else None."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class ServiceGuard:
    """Outermost middleware of a runner. In this order, whatever the token: 400 for a request
    that sends a header of ``common.request_headers.SINGLE_VALUED`` twice; 415 for a body that is
    not of the route's media type (JSON or ``application/octet-stream`` where the route is not
    in ``routes``), or is encoded; 406 for an ``Accept`` that excludes the route's answer. Then
    401 for any call without an accepted token, except the probe and scrape routes. What passes
    carries the one ``Content-Type`` judged here (``with_body_type``).

    ``tokens``: the accepted tokens, or what builds them on the first request (in the worker,
    after ``ensure_shared_token``). ``routes``: path -> (the body's media type, the answer's)."""

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        tokens: ServiceTokens | Callable[[], ServiceTokens],
        routes: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        self.app = app
        self._tokens = tokens
        self._routes = dict(routes or {})

    @property
    def tokens(self) -> ServiceTokens:
        if not isinstance(self._tokens, ServiceTokens):
            self._tokens = self._tokens()
        return self._tokens

    def _admit_headers(self, scope: Scope, headers: RequestHeaders) -> Scope:
        """The scope to pass on; raises the ``ApiError`` that refuses the request."""
        route = self._routes.get(scope["path"])
        if route is not None:
            headers.check_accept(route[1])
        if scope.get("method") not in BODY_METHODS:
            return scope
        return with_body_type(scope, headers.body_type((route[0],) if route else ACCEPTED_MEDIA_TYPES))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            headers = RequestHeaders(scope.get("headers", ()))
            scope = self._admit_headers(scope, headers)
        except ApiError as exc:
            return await send_error(send, exc)
        send = in_one_shape(send)  # what BentoML answers itself (its router's 404) in the one error shape
        if scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        presented = headers.get("authorization")
        if not self.tokens.accepts(bearer(presented)):
            reason = "no service token" if presented is None else "service token not accepted"
            return await send_error(send, ApiError(401, f"{reason}: this is an internal service", CHALLENGE))
        adopt(headers.get(REQUEST_ID_HEADER))  # the caller's: one id across the hops
        await self.app(scope, receive, send)
