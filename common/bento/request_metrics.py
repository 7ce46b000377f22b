"""BentoML's per-request metrics middleware (``RunnerTrafficMetricsMiddleware``), patched in
place to keep its labelled children instead of asking for them on every request.

Every HTTP request through a BentoML service passes it: it sets the last-request timestamp,
counts the request in progress, and on the last body message counts the answer and observes its
duration, by endpoint, status and service. BentoML asks ``labels(**kwargs)`` for each of the
four children on every request; in prometheus_client that is a lock, a validation of the keyword
names and a dict lookup each, while the children never change for an endpoint and status. The
patched ``__call__`` makes each child once per (endpoint, status, service) and reuses it: the
same metrics, labels and values (``tests/test_request_metrics.py`` compares both on the same
requests), at less cost per request in every service of every hop
(``python bench/bench_request_layers.py --stubbed`` prints each layer's own cost).

The answer's count and duration go through the metric tally (``common.metric_tally``): applied
together at most its period later, and at once before this worker serves ``/metrics``, which the
patched ``__call__`` does first. The in-progress gauge and the last-request timestamp stay live.

The children are kept as long as BentoML's metric keeps them (it never drops one); the map of
them is bounded all the same, since an endpoint label is the request's path, which the client
chooses. WebSocket traffic and ``/metrics`` take BentoML's own path, unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from timeit import default_timer
from typing import Any

from common.metric_tally import TALLY

log = logging.getLogger(__name__)

MAX_KEPT = 1024  # (endpoint, service) entries kept; past it the map starts again

Message = MutableMapping[str, Any]
Service = tuple[str, str, "str | None"]  # BentoML's bento name, version and service name: a request's labels
Send = Callable[[Message], Awaitable[None]]

_original: Callable[..., Awaitable[None]] | None = None
_METRICS = (
    "metrics_request_total",
    "metrics_request_duration",
    "metrics_request_in_progress",
    "metrics_last_request_timestamp",
)


class _Children:
    """One endpoint's children for one service: the timestamp gauge (None on a skipped path), the
    in-progress gauge, and (total, duration) per status."""

    def __init__(self, mw: Any, endpoint: str, service: Service) -> None:
        name, version, runner = service
        self.mw, self.endpoint, self.service = mw, endpoint, service
        self.last = (
            None
            if endpoint.startswith(tuple(mw.skip_paths))
            else mw.metrics_last_request_timestamp.labels(
                service_name=name, service_version=version, runner_name=runner
            )
        )
        self.in_progress = mw.metrics_request_in_progress.labels(
            endpoint=endpoint, service_name=name, service_version=version, runner_name=runner
        )
        self._answered: dict[int, tuple[Any, Any]] = {}

    def answered(self, status: int) -> tuple[Any, Any]:
        pair = self._answered.get(status)
        if pair is None:
            name, version, runner = self.service
            labels = {
                "endpoint": self.endpoint,
                "service_name": name,
                "service_version": version,
                "http_response_code": status,
                "runner_name": runner,
            }
            pair = self._answered[status] = (
                self.mw.metrics_request_total.labels(**labels),
                self.mw.metrics_request_duration.labels(**labels),
            )
        return pair


async def _call(self: Any, scope: MutableMapping[str, Any], receive: Any, send: Send) -> None:
    assert _original is not None
    if scope["type"] != "http":
        return await _original(self, scope, receive, send)
    if scope["path"] == "/metrics":
        TALLY.flush()  # this worker's pending updates, in the scrape it serves
        return await _original(self, scope, receive, send)
    if not self._is_setup:
        self._setup()
        if not all(hasattr(self, m) for m in _METRICS):  # another shape: BentoML's own, for good
            log.warning("BentoML RunnerTrafficMetricsMiddleware changed shape: its metrics unpatched")
            self.__dict__["_gsage_unpatched"] = True
    if self.__dict__.get("_gsage_unpatched"):
        return await _original(self, scope, receive, send)
    children = _children_of(self, scope["path"])
    if children.last is not None:
        children.last.set_to_current_time()
    started = default_timer()
    status = 0

    async def counted_send(message: Message) -> None:
        nonlocal status
        kind = message["type"]
        if kind == "http.response.start":
            status = message["status"]
        elif kind == "http.response.body" and not message.get("more_body"):
            total, duration = children.answered(status)
            TALLY.inc(total)
            TALLY.observe(duration, max(default_timer() - started, 0))
        await send(message)

    # BentoML's own wraps ``receive`` only to count WebSocket messages: an HTTP one passes as is.
    children.in_progress.inc()
    try:
        await self.app(scope, receive, counted_send)
    finally:
        children.in_progress.dec()


def _children_of(mw: Any, endpoint: str) -> _Children:
    from bentoml._internal.context import server_context

    service = (server_context.bento_name, server_context.bento_version, server_context.service_name)
    kept: dict[tuple[str, Service], _Children] = mw.__dict__.setdefault("_gsage_children", {})
    key = (endpoint, service)
    children = kept.get(key)
    if children is None:
        if len(kept) >= MAX_KEPT:
            kept.clear()
        children = kept[key] = _Children(mw, endpoint, service)
    return children


def middleware_class() -> type:
    from bentoml._internal.server.http.instruments import RunnerTrafficMetricsMiddleware

    return RunnerTrafficMetricsMiddleware


def original_call() -> Callable[..., Awaitable[None]]:
    """BentoML's own ``__call__`` (for comparisons; ``install`` first)."""
    assert _original is not None, "install() first"
    return _original


def install() -> bool:
    """Patch the middleware in this process (idempotent). False, logged, if its shape is not the
    one this was written for: then BentoML runs unpatched."""
    global _original
    if _original is not None:
        return True
    try:
        cls = middleware_class()
    except ImportError:
        log.warning("BentoML RunnerTrafficMetricsMiddleware not found: not patched")
        return False
    if not all(hasattr(cls, a) for a in ("_setup", "__call__")):
        log.warning("BentoML RunnerTrafficMetricsMiddleware changed shape: not patched")
        return False
    _original = cls.__call__
    cls.__call__ = _call  # type: ignore[method-assign]
    return True
