"""What this process was started to serve (configuration that only the bento's main service may
carry: ``common.bento.config``), and what every service module runs before its class."""

from __future__ import annotations

import os
import sys

SERVICE_NAME_ENV = "BENTOML_SERVE_SERVICE_NAME"  # start-http-server's --service-name, as an env var


def served_service_name(argv: list[str] | None = None) -> str:
    """The ``--service-name`` this process (a ``start-http-server`` arbiter or one of BentoML's
    service workers) was started with, or '' for the bento's main service."""
    argv = sys.argv if argv is None else argv
    for i, arg in enumerate(argv):
        if arg == "--service-name" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--service-name="):
            return arg.split("=", 1)[1]
    return os.environ.get(SERVICE_NAME_ENV, "")


def serves(service: str, main: bool = False) -> bool:
    """Does this process serve ``service``? ``main``: it is the bento's main service, which a
    process serves when no other one is named."""
    name = served_service_name()
    return name == service or (main and not name)


def prepare_service_module() -> None:
    """What each service module runs before its ``@bentoml.service`` class: BentoML's traffic
    middlewares patched (``traffic``, before BentoML builds the ASGI app), a caller's bad input
    not logged as the service's error, and one service token that every process BentoML starts
    from here shares (before it starts any)."""
    from common.bento import traffic
    from common.bento.logs import quiet_client_errors
    from common.request_context import enable_tracing
    from common.service_auth import ensure_shared_token
    from common.settings import settings

    enable_tracing(settings().serving.tracing)
    traffic.install()
    quiet_client_errors()
    ensure_shared_token()
