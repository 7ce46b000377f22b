"""Gateway: the bento's entry service. HTTP (this module) and gRPC (``services.grpc_server``)
front ends over one prediction core; the runners are composed with ``bentoml.depends`` and run
in their own processes.

HTTP surface: ``POST /predict``, ``POST /admin/routing`` (both in the OpenAPI document at
``/docs.json``), ``GET /models`` and ``GET /admin/shadow`` (plain routes: BentoML APIs are POST);
Prometheus at ``/metrics``. Auth, rate limits, media types and body size are
checked by ``services.http_guard`` before a handler runs.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter
from typing import Any

import orjson

import bentoml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from common import predict_request
from common.bento.serving import prepare_service_module
from common.bento.dependencies import connect
from common.bento.direct_api import JSON, DirectApi, ServiceInstance, answers_errors
from common.breaker import CircuitBreaker
from common.errors import ApiError, error_response
from common.remote import RunnerFailed, RunnerRejected, failure_reason
from common.metrics import labelled
from common.service_auth import ServiceTokens
from common.settings import gateway_ssl_config, settings, tracing_config
from runners.feature.service import FeatureRunner
from runners.graphsage.service import GraphSAGERunner
from services.access import gateway_access
from services.answer import Answer
from services.http_guard import HttpGuard
from services.metrics import ShadowPrometheus, gateway_metrics
from services.prediction import PredictionCore, StaleAnswers
from services.protocol import CompactRequest, GraphUpdate, GraphUpdateAck, PredictRequest, PredictResponse, RoutingChange
from services.routing import RoutingTable, normalise_version
from services.shadow import PromotionBar, ShadowCanary, require_agreement, stats_dir, worker_stats_path

prepare_service_module()  # timeout fix, quiet client errors, the shared service token

log = logging.getLogger("graphsage.gateway")
COMPACTION_TIMEOUT_S = 600.0  # the 1M/10M graph folds in well under it (bench/bench_live_graph.py)

_instance = ServiceInstance()  # the worker's Gateway, for the routes and middleware outside it


admin_app = Starlette()


@bentoml.service(
    name="Gateway",
    workers=settings().gateway_workers,
    http={"port": 3000, "host": settings().bind_host},
    traffic={"timeout": settings().request_timeout_s, "max_concurrency": settings().gateway_max_concurrency},
    logging={"access": {"enabled": settings().access_log}},
    tracing=tracing_config(),
    ssl=gateway_ssl_config(),
)
@bentoml.asgi_app(admin_app, path="/")
class Gateway:
    feature_runner = bentoml.depends(FeatureRunner)
    model_runner = bentoml.depends(GraphSAGERunner)

    def __init__(self) -> None:
        cfg = settings()
        self.settings = cfg
        self.routing = RoutingTable.from_settings(cfg)
        tokens = ServiceTokens.from_settings(cfg)
        self.feature = connect(type(self).feature_runner, tokens, timeout_s=cfg.runner_timeout_s,
                             retry_pauses_s=cfg.connection_retry_pauses_s)
        self.model = connect(type(self).model_runner, tokens, timeout_s=cfg.runner_timeout_s,
                             retry_pauses_s=cfg.connection_retry_pauses_s)
        feature_predict = lambda **kw: self.feature.call_bytes(  # noqa: E731
            "predict", predict_request.encode(dtype=cfg.feature_transport_dtype, **kw))
        self.shadow = ShadowCanary(
            self.routing.shadow_for, feature_predict, queue_size=cfg.shadow_queue_size,
            max_inflight=cfg.shadow_max_inflight, max_nodes=cfg.coalesce_max_nodes,
            batch_nodes=cfg.shadow_batch_nodes, linger_s=cfg.shadow_linger_ms / 1000, timeout_s=cfg.shadow_timeout_s,
            breaker=CircuitBreaker.from_settings("shadow", cfg),
            stats_path=worker_stats_path(stats_dir(cfg.shadow_stats_dir, cfg.routing_file)),
            flush_interval_s=cfg.routing_poll_interval_s, observer=ShadowPrometheus())
        self.core = PredictionCore(
            self.routing,
            feature_predict,
            CircuitBreaker.from_settings("feature-runner", cfg),
            CircuitBreaker.from_settings("model-runner", cfg),
            cfg.runner_timeout_s,
            stale=StaleAnswers(cfg.stale_answers),
            max_merge_nodes=cfg.coalesce_max_nodes,
            max_inflight=cfg.coalesce_max_inflight,
            overlap_ratio=cfg.coalesce_overlap_ratio,
            min_sequence_wait_s=cfg.min_sequence_wait_s,
            shadow=self.shadow,
        )
        self._next_reload = 0.0
        self.grpc_server: Any = None
        _instance.set(self)
        # Start-up objects out of the collector's reach: gen-2 collections over them paused BentoML
        # workers (no benchmark times the pauses; gc.callbacks under python -m bench.suite would).
        gc.freeze()

    @bentoml.on_startup
    async def start_grpc(self) -> None:
        if self.settings.grpc_port <= 0:
            return
        try:
            from services.grpc_server import start_grpc_server
        except ImportError:  # stubs not generated: HTTP keeps working
            log.exception("gRPC front end unavailable")
            return
        self.grpc_server = await start_grpc_server(self, self.settings.grpc_port)

    @bentoml.on_shutdown
    async def close(self) -> None:
        """Stop the gRPC front end (in-flight calls get a second), close the runner clients and
        the rate limiter's Redis connection."""
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace=1.0)
        await self.shadow.aclose()
        await self.feature.close()
        await self.model.close()
        limiter = gateway_access()[1]
        if hasattr(limiter, "aclose"):
            await limiter.aclose()

    def reload_files(self) -> None:
        """At most once per ``routing_poll_interval_s``: pick up routing changes made by any
        worker or the CLI, and keys created or revoked in the key file."""
        now = time.monotonic()
        if now >= self._next_reload:
            self._next_reload = now + self.settings.routing_poll_interval_s
            self.routing.reload_if_changed(force=True)
            gateway_access()[0].reload_if_changed()

    async def run_predict(self, req: PredictRequest) -> Answer:
        """The one prediction path, for HTTP and gRPC alike; raises ApiError."""
        self.reload_files()
        if len(req.node_ids) > self.settings.max_nodes_per_request:
            raise ApiError(413, f"{len(req.node_ids)} node ids; at most {self.settings.max_nodes_per_request} per request")
        if req.explain:
            predict_request.check_explain_size(len(req.node_ids), self.settings.explain_max_nodes)  # ExplainTooLarge: 413
        started = time.perf_counter()
        try:
            response = await self.core.predict(req)
        except ApiError as exc:  # routing's own (an unknown model or version) included
            labelled(gateway_metrics().requests, req.model, str(exc.status)).inc()
            raise
        finally:
            self._observe_breakers()
        outcome = "degraded" if response.degraded else "ok"
        m = gateway_metrics()
        labelled(m.requests, response.model, outcome).inc()
        labelled(m.latency, response.model, outcome).observe(time.perf_counter() - started)
        return response

    def _observe_breakers(self) -> None:
        m = gateway_metrics()
        labelled(m.breaker, "feature-runner").set(self.core.feature_breaker.state_value)
        labelled(m.breaker, "model-runner").set(self.core.model_breaker.state_value)

    @bentoml.api(route="/predict", input_spec=PredictRequest, output_spec=None)
    @answers_errors
    async def predict(self, **params: Any) -> PredictResponse:
        """Per-node predictions for ``node_ids``: label, score, probabilities, the exact
        ``graphsage:<version>`` that answered, and ``degraded`` when features were unavailable;
        with ``explain``, each node's sampled neighbourhood and its neighbours' influence."""
        # Rendered here, not by BentoML: the declared PredictResponse documents the shape.
        return Response((await self.run_predict(PredictRequest(**params))).to_json(), media_type=JSON)

    async def predict_json(self, body: bytes) -> bytes:
        """``predict`` on the raw JSON body: what ``common.bento.direct_api`` answers /predict with."""
        return (await self.run_predict(PredictRequest.model_validate_json(body or b"{}"))).to_json()

    async def update_graph(self, update: GraphUpdate) -> dict[str, int]:
        """The one graph-update path, for HTTP and gRPC alike: the FeatureRunner validates the
        batch whole, appends it durably to the update log and applies it; raises ApiError."""
        ops = [op.model_dump(exclude_none=True) for op in update.ops]
        try:
            ack = await asyncio.wait_for(self.feature.call_json("graph_update", {"ops": ops}, idempotent=False),
                                         self.settings.graph_update_timeout_s)
        except RunnerRejected as exc:
            raise ApiError(exc.status, str(exc)) from exc
        except RunnerFailed as exc:  # the FeatureRunner's own words (the log down: nothing accepted)
            raise ApiError.unavailable(exc.message, 1.0) from exc
        except Exception as exc:  # noqa: BLE001 - unknown whether it was appended: say so
            raise ApiError.unavailable(f"graph update not confirmed ({failure_reason(exc)}); it may or may not "
                                       "have been applied: read /graph/status before sending it again", 1.0) from exc
        for op, n in Counter(op["op"] for op in ops).items():
            labelled(gateway_metrics().graph_updates, op).inc(n)
        return ack

    async def graph_status(self) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(self.feature.call_json("graph_status"), self.settings.runner_timeout_s)
        except RunnerRejected as exc:
            raise ApiError(exc.status, str(exc)) from exc
        except Exception as exc:  # noqa: BLE001
            raise ApiError.unavailable(f"feature runner unavailable: {failure_reason(exc)}", 1.0) from exc

    @bentoml.api(route="/graph/updates", input_spec=GraphUpdate, output_spec=None)
    @answers_errors
    async def graph_updates(self, **params: Any) -> GraphUpdateAck:
        """Add nodes, set features, add or remove edges and nodes (scope ``graph``). The batch is
        validated whole and applied atomically; the answer, ``{"accepted": N, "sequence": S}``,
        comes once it is durable in the update log; ``/predict`` with ``min_sequence: S`` reads it."""
        return Response(orjson.dumps(await self.update_graph(GraphUpdate(**params))), media_type=JSON)

    @bentoml.api(route="/admin/graph/compact", input_spec=CompactRequest, output_spec=None)
    @answers_errors
    async def admin_graph_compact(self, **params: Any) -> dict:
        """Fold the update log into a new graph snapshot (scope ``admin``); every FeatureRunner
        worker switches to it with no failed request and no changed answer."""
        request = CompactRequest(**params)
        try:
            return await asyncio.wait_for(self.feature.call_json("graph_compact", {"upto": request.upto}),
                                          COMPACTION_TIMEOUT_S)
        except RunnerRejected as exc:
            raise ApiError(exc.status, str(exc)) from exc
        except Exception as exc:  # noqa: BLE001
            raise ApiError.unavailable(f"compaction not confirmed ({failure_reason(exc)})", 5.0) from exc

    async def describe_models(self) -> dict[str, Any]:
        self.reload_files()
        out: dict[str, Any] = {"routing": self.routing.to_json()}
        for name, runner, route in (("model_runner", self.model, "models"), ("feature_runner", self.feature, "info")):
            try:
                out[name] = await runner.call_json(route)
            except Exception as exc:  # noqa: BLE001 - a down runner is reported, not raised
                out[name] = {"error": f"unavailable: {type(exc).__name__}"}
        return out

    @bentoml.api(route="/admin/routing", input_spec=RoutingChange, output_spec=None)
    @answers_errors
    async def admin_routing(self, **params: Any) -> dict:
        """Set weights, promote (optionally behind a shadow agreement bar: 409 under it), roll
        back, set or clear a shadow (scope ``admin``). Every gateway worker sees the change within
        ~1 s; the model runner pre-loads the versions now in use, shadows included."""
        try:
            self.apply_routing_change(RoutingChange(**params))  # a RoutingError is an ApiError already
        except OSError as exc:  # e.g. a routing file mounted read-only from a ConfigMap
            raise ApiError(409, f"routing file not writable here ({exc.strerror}); change it where it is managed") from exc
        for tag in sorted(self.routing.versions_in_use()):
            try:
                await self.model.call_json("load", {"tag": tag})
            except Exception as exc:  # noqa: BLE001 - the first request loads it otherwise
                log.warning("pre-loading %s failed: %s", tag, exc)
        return self.routing.to_json()

    def apply_routing_change(self, change: RoutingChange) -> None:
        model = change.model or self.routing.default_model
        if change.action == "set_weights":
            if not change.weights:
                raise ApiError(400, "set_weights needs weights: {version: weight}")
            self.routing.set_weights(model, change.weights)
        elif change.action == "promote":
            if not change.version:
                raise ApiError(400, "promote needs a version")
            if change.min_agreement is not None or change.min_compared is not None:
                bar = PromotionBar(change.min_agreement or 0.0, change.min_compared or 0)
                require_agreement(self.shadow.figures(), normalise_version(model, change.version), bar,
                                  primaries=self.routing.routes_in_use(model))  # PromotionRefused: 409
            self.routing.promote(model, change.version)
        elif change.action == "set_shadow":
            if not change.version:
                raise ApiError(400, "set_shadow needs a version")
            self.routing.set_shadow(model, change.version, 1.0 if change.share is None else change.share)
        elif change.action == "clear_shadow":
            self.routing.clear_shadow(model)
        else:
            self.routing.rollback(model)

    def shadow_report(self) -> dict[str, Any]:
        """``GET /admin/shadow``: the shadow of each model and every (primary, shadow) pair's figures,
        every gateway worker's added up (``services.shadow``)."""
        self.reload_files()
        shadows = {m: s.to_json() for m in self.routing.models() if (s := self.routing.shadow(m)) is not None}
        return {"shadows": shadows, **self.shadow.report()}


async def _models(request: Request) -> JSONResponse:
    return JSONResponse(await _instance.get().describe_models())


async def _shadow(request: Request) -> JSONResponse:
    return JSONResponse(_instance.get().shadow_report())


async def _graph_status(request: Request) -> Response:
    try:
        return JSONResponse(await _instance.get().graph_status())
    except ApiError as exc:
        return error_response(exc)


admin_app.router.routes.extend([
    Route("/models", _models, methods=["GET"]),
    Route("/graph/status", _graph_status, methods=["GET"]),
    Route("/admin/shadow", _shadow, methods=["GET"]),
])
Gateway.add_asgi_middleware(HttpGuard)
if settings().direct_api:  # inside HttpGuard: auth and rate limits come first
    Gateway.add_asgi_middleware(DirectApi, routes={"/predict": (_instance.handler("predict_json"), JSON)},
                                server_name="Gateway")

# /docs.json: BentoML's document declared OpenAPI 3.1 (what its pydantic schemas are), plus the
# plain route it cannot see (common.bento.openapi).
from common.bento.openapi import docs_route, json_get  # noqa: E402

admin_app.router.routes.append(docs_route(Gateway, {"/models": json_get(
    "Gateway__models", "The routing table and what each runner has loaded (scope ``predict``).",
    {"type": "object", "properties": {"routing": {"type": "object"}}, "required": ["routing"]}),
    "/admin/shadow": json_get(
    "Gateway__admin_shadow", "The shadow canary's figures per (primary, shadow) pair (scope ``admin``).",
    {"type": "object", "properties": {"shadows": {"type": "object"}, "pairs": {"type": "array"}},
     "required": ["shadows", "pairs"]}),
    "/graph/status": json_get(
    "Gateway__graph_status", "The update log's head and each FeatureRunner worker's applied sequence, lag and "
    "overlay size (scope ``predict``).",
    {"type": "object", "properties": {"log": {"type": "object"}, "workers": {"type": "object"},
                                      "capacity": {"type": "integer"}, "directed": {"type": "boolean"}},
     "required": ["log", "workers"]})}))
