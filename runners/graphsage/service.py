"""GraphSAGERunner: the separately scaled BentoML service that runs the model (pure compute).

Declarations and wiring only: the core is ``runners.graphsage.core.ModelRunnerCore``, its
endpoints ``common.model_runner_api.ENDPOINTS``, answered by the project's router behind the
service-token guard (``common.bento.wiring``).
"""

from __future__ import annotations

import logging

import bentoml

from common.bento.config import runner_service_config
from common.bento.serving import prepare_service_module
from common.bento.wiring import CoreHolder, expose, service_started
from common.endpoints import media_types, openapi_document
from common.model_runner_api import ENDPOINTS, ERRORS, SERVICE
from common.service_auth import ServiceGuard, ServiceTokens
from common.settings import settings
from runners.graphsage.admin_state import AdminState
from runners.graphsage.core import ModelRunnerCore
from runners.graphsage.inference import ModelRegistry
from runners.graphsage.metrics import PrometheusObserver

prepare_service_module()  # BentoML's traffic middlewares patched, quiet client errors, the shared service token

log = logging.getLogger("graphsage.model")
_core: CoreHolder[ModelRunnerCore] = CoreHolder()


@bentoml.service(name=SERVICE, **runner_service_config(settings().serving, settings().model_workers))
class GraphSAGERunner:
    def __init__(self) -> None:
        cfg = settings()
        registry = ModelRegistry(cfg.backend, cfg.intra_op_threads, cfg.precision)
        registry.preload(cfg.model_tags)
        self.core = ModelRunnerCore(registry, AdminState.for_this_service(), cfg.model_runner, PrometheusObserver())
        _core.set(self.core)
        service_started()

    @bentoml.on_startup
    async def start(self) -> None:
        await self.core.start()

    @bentoml.on_shutdown
    async def close(self) -> None:
        await self.core.close()


expose(
    GraphSAGERunner,
    ENDPOINTS,
    _core,
    ServiceGuard,
    {"tokens": lambda: ServiceTokens.from_settings(settings().security), "routes": media_types(ENDPOINTS)},
    documents={"/docs.json": lambda: openapi_document(SERVICE, ENDPOINTS, ERRORS)},
)
