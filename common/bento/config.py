"""The BentoML service configuration of each service, from its settings sections.

- ``runner_service_config``: both runners (separately scaled, internal hops only);
- ``gateway_service_config``: the entry service (port 3000, its bind address, TLS);
- ``tracing_config``: BentoML wraps every service in OpenTelemetry's ASGI middleware, which builds
  a span per request even with no exporter (``bench.suite``'s profile shows its share of the
  gateway's CPU). Unless ``GSAGE_TRACING`` is on, every URL is excluded: a pass-through. On, the
  spans go to ``GSAGE_TRACING_OTLP_ENDPOINT`` (OTLP over HTTP); ``common.request_context`` joins
  them across the hops.

BentoML applies the entry service's ``ssl`` config to whatever server the process starts: a
runner started from the same bento with ``start-http-server --service-name GraphSAGERunner``
would serve HTTPS with the gateway's certificate, and its callers speak plain HTTP to it. So the
gateway's TLS config is given only when this process serves the gateway itself
(``common.bento.serving.serves``).
"""

from __future__ import annotations

from typing import Any

from common.bento.serving import serves
from common.settings import SecuritySection, ServingSection

GATEWAY_PORT = 3000


def tracing_config(serving: ServingSection) -> dict[str, Any]:
    if not serving.tracing:
        return {"excluded_urls": [".*"]}
    config: dict[str, Any] = {
        "sample_rate": serving.tracing_sample_rate,
        "excluded_urls": ["readyz", "livez", "metrics"],
    }
    if serving.tracing_otlp_endpoint:
        config.update(exporter_type="otlp", otlp={"protocol": "http", "endpoint": serving.tracing_otlp_endpoint})
    return config


def runner_service_config(serving: ServingSection, workers: int) -> dict[str, Any]:
    return {
        "workers": workers,
        "traffic": {"timeout": serving.request_timeout_s, "max_concurrency": serving.runner_max_concurrency},
        # The gateway's access log, metrics and traces cover a request; a log line per hop costs CPU.
        "logging": {"access": {"enabled": False}},
        "tracing": tracing_config(serving),
    }


def gateway_ssl_config(security: SecuritySection) -> dict[str, Any]:
    """On when ``tls_cert_file`` and ``tls_key_file`` are set, in a process that serves the gateway."""
    if not security.tls_cert_file or not serves("Gateway", main=True):
        return {}
    return {"enabled": True, "certfile": security.tls_cert_file, "keyfile": security.tls_key_file}


def gateway_service_config(serving: ServingSection, security: SecuritySection, bind_host: str) -> dict[str, Any]:
    return {
        "workers": serving.gateway_workers,
        "http": {"port": GATEWAY_PORT, "host": bind_host},
        "traffic": {"timeout": serving.request_timeout_s, "max_concurrency": serving.gateway_max_concurrency},
        "logging": {"access": {"enabled": serving.access_log}},
        "tracing": tracing_config(serving),
        "ssl": gateway_ssl_config(security),
    }
