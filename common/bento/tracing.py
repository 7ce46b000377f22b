"""The tracer BentoML made for this process (``BentoMLContainer.tracer_provider``: its exporter,
sampler and resource from the service's ``tracing`` config), for spans BentoML does not open
itself: the gateway's gRPC server, which is the project's own, not BentoML's ASGI app.

BentoML does not install its provider as OpenTelemetry's global one, so ``trace.get_tracer``
would give a no-op tracer whose spans carry no context to propagate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any


def tracer(name: str) -> Any:
    from bentoml._internal.configuration.containers import BentoMLContainer

    return BentoMLContainer.tracer_provider.get().get_tracer(name)


@contextlib.contextmanager
def server_span(name: str, carrier: Mapping[str, str], attributes: Mapping[str, str]) -> Iterator[None]:
    """A SERVER span, current for the block, continuing the trace ``carrier``'s ``traceparent``
    names (a caller's), else starting one."""
    from opentelemetry import trace
    from opentelemetry.propagate import extract

    with tracer("graphsage.grpc").start_as_current_span(
        name, context=extract(dict(carrier)), kind=trace.SpanKind.SERVER, attributes=dict(attributes)
    ):
        yield
