"""Where a dependency runs: the URL BentoML assigned it, or an instance in this process.

``bentoml.depends(Svc)`` declares the composition (what ``bentoml serve`` starts, what a bento
contains, what ``start-http-server --depends Svc=<url>`` points at), but its proxy is not used for
calls: it speaks pickle (``common.remote`` says why). ``transport_for`` reads the address BentoML
gave the dependency (``--depends``, or the socket ``bentoml serve`` made for it) and returns this
project's ``HttpTransport`` for it, or a ``LocalTransport`` over its core when BentoML runs it in
this process.

In this process: the co-located deployment, one process for the three services (the gateway
started with no ``--depends``, or ``bentoml serve --development``); BentoML then builds a
dependency's instance on first use. Here each such service is built once per process
(``LocalService``: the gateway's model runner and the FeatureRunner's are one, so an admin
``load`` reaches the registry that serves), and its ``@bentoml.on_startup`` / ``on_shutdown`` hooks,
which BentoML runs for the process's own service only, are run by the transport's ``start`` and
``close`` (once each, whoever calls first).
"""

from __future__ import annotations

import inspect
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
    local = local_service(dependency)
    return LocalTransport(name, local.instance.core, local)


class LocalService:
    """One instance of a service run in this process, and its BentoML lifecycle hooks."""

    def __init__(self, instance: Any) -> None:
        self.instance = instance
        self._started = self._stopped = False

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self._run_hooks("__bentoml_startup_hook__")

    async def stop(self) -> None:
        if self._started and not self._stopped:
            self._stopped = True
            await self._run_hooks("__bentoml_shutdown_hook__")

    async def _run_hooks(self, mark: str) -> None:
        for name in dir(type(self.instance)):
            if not name.startswith("__") and getattr(getattr(type(self.instance), name), mark, False):
                result = getattr(self.instance, name)()
                if inspect.isawaitable(result):
                    await result


_LOCAL_SERVICES: dict[str, LocalService] = {}


def local_service(dependency: Any) -> LocalService:
    """The process's one instance of ``dependency``'s service (built on first use, as BentoML's
    ``Dependency.get`` builds it)."""
    name = dependency.on.name
    if name not in _LOCAL_SERVICES:
        _LOCAL_SERVICES[name] = LocalService(dependency.get())
    return _LOCAL_SERVICES[name]


async def bentoml_proxy(url: str, service: Any) -> Any:
    """BentoML's own dependency proxy for ``service`` at ``url``, as a worker builds it for a
    ``bentoml.depends`` dependency (pickle media type, raised connection limits). Not used by the
    services; bench/bench_internal_hops.py measures HttpTransport against it."""
    from _bentoml_impl.client.proxy2 import RemoteProxy

    service.inject_config()  # what a BentoML worker has loaded before it builds a proxy
    proxy = RemoteProxy(url, service=service)
    await proxy.__aenter__()
    return proxy
