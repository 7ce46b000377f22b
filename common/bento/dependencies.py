"""Where a dependency runs: the URL BentoML assigned it, or an instance in this process.

``bentoml.depends(Svc)`` declares the composition (what ``bentoml serve`` starts, what a bento
contains, what ``start-http-server --depends Svc=<url>`` points at), but its proxy is not used for
calls: it speaks pickle (``common.remote`` says why). ``connect`` reads the address BentoML gave
the dependency (``--depends``, or the socket ``bentoml serve`` made for it) and returns this
project's ``RunnerClient`` for it, or a ``LocalRunner`` when BentoML runs it in this process
(development mode).
"""

from __future__ import annotations

from typing import Any

from common.remote import LocalRunner, Runner, RunnerClient


def dependency_url(service_name: str) -> str | None:
    """The address BentoML assigned to ``service_name`` in this process, if any."""
    from bentoml._internal.configuration.containers import BentoMLContainer

    return BentoMLContainer.remote_runner_mapping.get().get(service_name)


def connect(dependency: Any, tokens: Any, *, timeout_s: float, retry_pauses_s: tuple[float, ...]) -> Runner:
    """A ``Runner`` for ``dependency`` (a ``bentoml.depends(...)`` class attribute)."""
    name = dependency.on.name
    url = dependency_url(name) or dependency.url
    if url:
        return RunnerClient(name, url, tokens, timeout_s=timeout_s, retry_pauses_s=retry_pauses_s)
    return LocalRunner(name, dependency.get())


async def bentoml_proxy(url: str, service: Any) -> Any:
    """BentoML's own dependency proxy for ``service`` at ``url``, as a worker builds it for a
    ``bentoml.depends`` dependency (pickle media type, raised connection limits). Not used by the
    services; bench/bench_internal_hops.py measures RunnerClient against it."""
    from _bentoml_impl.client.proxy2 import RemoteProxy

    service.inject_config()  # what a BentoML worker has loaded before it builds a proxy
    proxy = RemoteProxy(url, service=service)
    await proxy.__aenter__()
    return proxy
