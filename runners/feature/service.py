"""FeatureRunner: the separately scaled BentoML service that turns node ids into FeatureTensors
and hands them to the GraphSAGERunner. No torch in this process.

Declarations and wiring only: the core is ``runners.feature.pipeline.FeaturePipeline``, its
endpoints ``common.feature_runner_api.ENDPOINTS``, answered by the project's router behind the
service-token guard (``common.bento.wiring``). This module builds the pipeline's parts from their
settings sections: the live graph over the snapshot and the update log, the tiered feature
store, the neighbourhood builder, the model runner's client.
"""

from __future__ import annotations

import logging

import bentoml

from common.bento.config import runner_service_config
from common.bento.dependencies import transport_for
from common.bento.serving import prepare_service_module
from common.bento.wiring import CoreHolder, expose, service_started
from common.endpoints import media_types, openapi_document
from common.feature_runner_api import ENDPOINTS, ERRORS, SERVICE
from common.model_runner_api import ModelRunnerApi
from common.service_auth import ServiceGuard, ServiceTokens
from common.settings import Settings, settings
from runners.feature.authority import ClusterOrigin, authority_for, load_without_rows
from runners.feature.cache.tiered import build_feature_store
from runners.feature.graph import LiveGraph
from runners.feature.live import GraphKeeper
from runners.feature.metrics import PrometheusObserver, graph_observer
from runners.feature.neighbourhood import NeighbourhoodBuilder
from runners.feature.pipeline import FeaturePipeline, PipelineLimits
from runners.feature.snapshot import load_snapshot
from runners.feature.update_log import update_log_from
from runners.graphsage.service import GraphSAGERunner

prepare_service_module()  # BentoML's traffic middlewares patched, quiet client errors, the shared service token

log = logging.getLogger("graphsage.feature")
_core: CoreHolder[FeaturePipeline] = CoreHolder()


def assemble(cfg: Settings, model: ModelRunnerApi) -> FeaturePipeline:
    """The pipeline and its parts, each from its own section of ``cfg``."""
    live, calls = cfg.live_graph, cfg.runner_calls
    cluster = cfg.feature_source == "redis"
    snapshot = load_without_rows(cfg.snapshot_tag) if cluster else load_snapshot(cfg.snapshot_tag)
    graph = LiveGraph(snapshot, live.graph_capacity)
    authority = authority_for(cfg, snapshot.feature_set, snapshot.feature_dim) if cluster else None
    store = build_feature_store(
        cfg.feature_cache,
        cfg.redis,
        snapshot.features,
        snapshot.tag,
        graph,
        cluster_origin=ClusterOrigin(authority, graph) if authority is not None else None,
    )
    store.on_fill = PrometheusObserver.l1_fill
    builder = NeighbourhoodBuilder(graph, store, cfg.fanout, cfg.runner_call_max_nodes, cfg.scan_min_targets)
    update_log = update_log_from(
        cfg.graph_log_kind,
        cfg.graph_log_path,
        cfg.graph_log_url,
        cfg.redis_ca_file,
        live.graph_log_key,
        segment_bytes=live.graph_log_segment_bytes,
        lock_timeout_s=live.graph_log_lock_timeout_s,
    )
    limits = PipelineLimits(
        premean=cfg.premean,
        premean_min_targets=cfg.premean_min_targets,
        explain_max_nodes=cfg.explain_max_nodes,
        min_sequence_wait_s=live.min_sequence_wait_s,
        model_call_timeout_s=calls.model_call_timeout_s,
        warm_nodes=cfg.warm_nodes,
        max_batch_targets=max(cfg.max_batch_targets, cfg.runner_call_max_nodes),
        graph_log_kind=cfg.graph_log_kind,
    )
    keeper = GraphKeeper(
        graph,
        update_log,
        on_rows_changed=store.invalidate,
        poll_interval_s=live.graph_poll_interval_ms / 1000,
        max_ops=live.graph_max_ops,
        capacity=live.graph_capacity,
        observer=graph_observer(),
        read_batch=live.graph_log_read_batch,
        status_interval_s=live.graph_status_interval_s,
        row_writer=authority.write if authority is not None else None,
        load=load_without_rows if cluster else load_snapshot,
    )
    pipeline = FeaturePipeline(keeper, store, builder, model, update_log, limits, observer=PrometheusObserver())
    log.info(
        "FeatureRunner: %s (%d nodes, %d edges), rows from %s, L2 %s",
        snapshot.tag,
        snapshot.num_nodes,
        snapshot.num_edges,
        f"the feature cluster (feature set {snapshot.feature_set})" if cluster else "the snapshot",
        "off" if cluster or not cfg.redis_url else cfg.redis_url,
    )
    return pipeline


@bentoml.service(name=SERVICE, **runner_service_config(settings().serving, settings().feature_workers))
class FeatureRunner:
    model_runner = bentoml.depends(GraphSAGERunner)

    def __init__(self) -> None:
        cfg = settings()
        tokens = ServiceTokens.from_settings(cfg.security)
        model = ModelRunnerApi(transport_for(type(self).model_runner, tokens, cfg.runner_calls))
        self.core = assemble(cfg, model)
        _core.set(self.core)
        service_started()

    @bentoml.on_startup
    async def start(self) -> None:
        await self.core.start()

    @bentoml.on_shutdown
    async def close(self) -> None:
        await self.core.close()


expose(
    FeatureRunner,
    ENDPOINTS,
    _core,
    ServiceGuard,
    {"tokens": lambda: ServiceTokens.from_settings(settings().security), "routes": media_types(ENDPOINTS)},
    documents={"/docs.json": lambda: openapi_document(SERVICE, ENDPOINTS, ERRORS)},
)
