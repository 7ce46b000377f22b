"""Gateway: the bento's entry service. HTTP (this module) and gRPC (``services.grpc_server``) front
ends over one core (``services.core.GatewayCore``); the runners are composed with
``bentoml.depends`` and run in their own processes.

Declarations and wiring only. Every public endpoint (``services.api``) is answered by the
project's router behind ``services.http_guard.HttpGuard`` (auth, rate limits, media types, body
size); the ``@bentoml.api`` declarations below call the same core and are what BentoML documents
(``/docs.json``, ``/schema.json``) and what its own clients (``bentoml.SyncHTTPClient``) read.
"""

from __future__ import annotations

import logging
from typing import Any

import bentoml

from common.bento.config import gateway_service_config
from common.bento.dependencies import transport_for
from common.bento.openapi import document
from common.bento.serving import prepare_service_module
from common.bento.wiring import CoreHolder, expose, service_started
from common.breaker import CircuitBreaker
from common.feature_runner_api import CompactRequest, FeatureRunnerApi
from common.graph_ops import GraphUpdate, GraphUpdateAck
from common.model_runner_api import ModelRunnerApi
from common.service_auth import ServiceTokens
from common.settings import Settings, settings
from runners.feature.service import FeatureRunner
from runners.graphsage.service import GraphSAGERunner
from services import api
from services.access import GatewayAccess
from services.admin import Admin
from services.auth import ApiKeyAuth
from services.core import GatewayCore
from services.graph_updates import GraphUpdates
from services.http_guard import HttpGuard
from services.metrics import GatewayPrometheus, ShadowPrometheus
from services.prediction import PredictionCore, StaleAnswers
from services.protocol import PredictRequest, PredictResponse, RoutingChange
from services.ratelimit import build_rate_limiter
from services.routing import RoutingTable
from services.shadow import ShadowCanary
from services.shadow_stats import stats_dir, worker_stats_path

prepare_service_module()  # BentoML's traffic middlewares patched, quiet client errors, the shared service token

log = logging.getLogger("graphsage.gateway")
_core: CoreHolder[GatewayCore] = CoreHolder()


def _access(cfg: Settings) -> GatewayAccess:
    return GatewayAccess(
        lambda: (
            ApiKeyAuth.from_settings(cfg.access),
            build_rate_limiter(
                cfg.access, cfg.redis, timeout_s=cfg.l2_timeout_s, retry_backoff_s=cfg.l2_retry_backoff_s
            ),
        )
    )


ACCESS = _access(settings())  # one per process, for the HTTP guard and the gRPC front end


def assemble(cfg: Settings, feature: FeatureRunnerApi, model: ModelRunnerApi, access: GatewayAccess) -> GatewayCore:
    """The core and its parts, each from its own section of ``cfg``."""
    routing = RoutingTable.from_settings(cfg.routing, cfg.model_tags)
    shadow_cfg = cfg.shadow
    shadow = ShadowCanary(
        routing.shadow_for,
        feature.predict,
        queue_size=shadow_cfg.shadow_queue_size,
        max_inflight=shadow_cfg.shadow_max_inflight,
        max_nodes=cfg.coalesce_max_nodes,
        batch_nodes=shadow_cfg.shadow_batch_nodes,
        linger_s=shadow_cfg.shadow_linger_ms / 1000,
        timeout_s=shadow_cfg.shadow_timeout_s,
        transport_dtype=cfg.feature_transport_dtype,
        breaker=CircuitBreaker.from_settings("shadow", cfg.runner_calls),
        stats_path=worker_stats_path(stats_dir(shadow_cfg.shadow_stats_dir, cfg.routing_file)),
        flush_interval_s=shadow_cfg.shadow_flush_interval_s,
        observer=ShadowPrometheus(),
    )
    prediction = PredictionCore(
        routing,
        feature.predict,
        CircuitBreaker.from_settings("feature-runner", cfg.runner_calls),
        CircuitBreaker.from_settings("model-runner", cfg.runner_calls),
        cfg.runner_timeout_s,
        cfg.coalescing,
        stale=StaleAnswers(cfg.stale_answers),
        min_sequence_wait_s=cfg.min_sequence_wait_s,
        transport_dtype=cfg.feature_transport_dtype,
        shadow=shadow,
    )
    observer = GatewayPrometheus()
    graph = GraphUpdates(feature, cfg.graph_update_timeout_s, cfg.runner_timeout_s, accepted=observer.graph_ops)
    admin = Admin(
        routing,
        shadow,
        feature,
        model,
        compaction_timeout_s=cfg.compaction_timeout_s,
        describe_timeout_s=cfg.runner_timeout_s,
    )

    def reload() -> None:  # routing changes made by any worker or the CLI; keys created or revoked
        routing.reload_if_changed(force=True)
        access.auth.reload_if_changed()

    return GatewayCore(
        prediction,
        graph,
        admin,
        max_nodes_per_request=cfg.max_nodes_per_request,
        explain_max_nodes=cfg.explain_max_nodes,
        reload=reload,
        reload_interval_s=cfg.routing_poll_interval_s,
        observer=observer,
    )


@bentoml.service(
    name="Gateway", **gateway_service_config(settings().serving, settings().security, settings().bind_host)
)
class Gateway:
    feature_runner = bentoml.depends(FeatureRunner)
    model_runner = bentoml.depends(GraphSAGERunner)

    def __init__(self) -> None:
        cfg = settings()
        self.settings = cfg
        tokens = ServiceTokens.from_settings(cfg.security)
        # A compaction's call is the longest any may take; each call is bounded by its own deadline.
        feature = FeatureRunnerApi(
            transport_for(type(self).feature_runner, tokens, cfg.runner_calls, backstop_s=cfg.compaction_timeout_s + 30)
        )
        model = ModelRunnerApi(transport_for(type(self).model_runner, tokens, cfg.runner_calls))
        self.core = assemble(cfg, feature, model, ACCESS)
        self.grpc_server: Any = None
        _core.set(self.core)
        service_started()

    @bentoml.on_startup
    async def start(self) -> None:
        """The runners, where they run in this process (co-located), then the gRPC front end."""
        await self.core.admin.model.start()
        await self.core.admin.feature.start()
        await self.start_grpc()

    async def start_grpc(self) -> None:
        cfg = self.settings
        if cfg.grpc_port <= 0:
            return
        try:
            from services.grpc_server import start_grpc_server
        except ImportError:  # stubs not generated: HTTP keeps working
            log.exception("gRPC front end unavailable")
            return
        self.grpc_server = await start_grpc_server(
            self.core,
            ACCESS,
            cfg.grpc_port,
            host=cfg.bind_host,
            max_receive_bytes=cfg.max_body_bytes,
            max_concurrent_rpcs=cfg.gateway_max_concurrency,
            tls_cert_file=cfg.tls_cert_file,
            tls_key_file=cfg.tls_key_file,
        )

    @bentoml.on_shutdown
    async def close(self) -> None:
        """Stop the gRPC front end (in-flight calls get a second), close the runner clients and
        the rate limiter's Redis connection."""
        if self.grpc_server is not None:
            await self.grpc_server.stop(grace=1.0)
        await self.core.admin.shadow.aclose()
        await self.core.admin.feature.close()
        await self.core.admin.model.close()
        await ACCESS.aclose()

    # -- what BentoML documents and its clients call (served by the router: services.api) ---------

    @bentoml.api(route=api.PREDICT.path, input_spec=PredictRequest)
    async def predict(self, **params: Any) -> PredictResponse:
        """Per-node predictions for ``node_ids``: label, score, probabilities, the exact
        ``graphsage:<version>`` that answered, and ``degraded`` when features were unavailable;
        with ``explain``, each node's sampled neighbourhood and its neighbours' influence."""
        return (await self.core.predict(PredictRequest(**params))).to_response()

    @bentoml.api(route=api.GRAPH_UPDATES.path, input_spec=GraphUpdate)
    async def graph_updates(self, **params: Any) -> GraphUpdateAck:
        """Add nodes, set features, add or remove edges and nodes (scope ``graph``). The batch is
        validated whole and applied atomically; the answer, ``{"accepted": N, "sequence": S}``,
        comes once it is durable in the update log; ``/predict`` with ``min_sequence: S`` reads it."""
        return await self.core.graph_update(GraphUpdate(**params).model_dump(exclude_none=True)["ops"])

    @bentoml.api(route=api.COMPACT.path, input_spec=CompactRequest)
    async def admin_graph_compact(self, **params: Any) -> dict[str, Any]:
        """Fold the update log into a new graph snapshot (scope ``admin``); every FeatureRunner
        worker switches to it with no failed request and no changed answer."""
        return await self.core.compact(CompactRequest(**params))

    @bentoml.api(route=api.ROUTING.path, input_spec=RoutingChange)
    async def admin_routing(self, **params: Any) -> dict[str, Any]:
        """Set weights, promote (optionally behind a shadow agreement bar: 409 under it), roll
        back, set or clear a shadow (scope ``admin``). Every gateway worker sees the change within
        ~1 s; the model runner pre-loads the versions now in use, shadows included."""
        return await self.core.change_routing(RoutingChange(**params))


expose(
    Gateway,
    api.ENDPOINTS,
    _core,
    HttpGuard,
    {"access": ACCESS, "max_body_bytes": settings().max_body_bytes},
    documents={"/docs.json": lambda: document(Gateway, api.ENDPOINTS, api.ERRORS)},
)
