"""Where a dependency runs: the URL BentoML assigned it, or an instance in this process.

``bentoml.depends(Svc)`` declares the composition (what ``bentoml serve`` starts, what a bento
contains, what ``start-http-server --depends Svc=<url>`` points at), but its proxy is not used for
calls: it speaks pickle (``common.remote`` says why). ``transport_for`` reads the address BentoML
gave the dependency (``--depends``, or the socket ``bentoml serve`` made for it) and returns this
project's ``HttpTransport`` for it, or a ``LocalTransport`` over its core when BentoML runs it in
this process (development mode).
"""

from __future__ import annotations

from typing import Any

from common.remote import DEFAULT_TIMEOUT_S, HttpTransport, LocalTransport, Tokens, Transport
from common.settings import RunnerCallsSection


def dependency_url(service_name: str) -> str | None:
    """The address BentoML assigned to ``service_name`` in this process, if any."""
    from bentoml._internal.configuration.containers import BentoMLContainer

    url: str | None = BentoMLContainer.remote_runner_mapping.get().get(service_name)
    return url


def transport_for(
    dependency: Any, tokens: Tokens, calls: RunnerCallsSection, backstop_s: float = DEFAULT_TIMEOUT_S
) -> Transport:
    """How to reach ``dependency`` (a ``bentoml.depends(...)`` class attribute): HTTP at the
    address BentoML gave it, or its core in this process (development mode). ``backstop_s``:
    the longest any call may take (callers bound each call by their own, shorter deadline)."""
    name = dependency.on.name
    url = dependency_url(name) or dependency.url
    if url:
        return HttpTransport(name, url, tokens, retry_pauses_s=calls.connection_retry_pauses_s, timeout_s=backstop_s)
    return LocalTransport(name, dependency.get().core)


async def bentoml_proxy(url: str, service: Any) -> Any:
    """BentoML's own dependency proxy for ``service`` at ``url``, as a worker builds it for a
    ``bentoml.depends`` dependency (pickle media type, raised connection limits). Not used by the
    services; bench/bench_internal_hops.py measures HttpTransport against it."""
    from _bentoml_impl.client.proxy2 import RemoteProxy

    service.inject_config()  # what a BentoML worker has loaded before it builds a proxy
    proxy = RemoteProxy(url, service=service)
    await proxy.__aenter__()
    return proxy
