"""Baselines B1 and B2: BentoML services that do no work.

B1: ``TrivialGateway`` -> ``TrivialFeature`` -> ``TrivialModel`` with ``bentoml.depends``,
exactly the topology of the real app (the gateway sends the node ids to the feature service's
``predict`` as int64 bytes, which sends a bytes blob to the model service, as the app's services
do: one raw ``application/octet-stream`` body per hop, not pickled keyword arguments; async APIs, ``await
dep.to_async.method(...)``; the runners' service options of the app
(``common.bento.config.runner_service_config``: no access log, tracing as configured, plus the
``runner_connection`` workaround), started split: one process per service). Their endpoints are
plain ``@bentoml.api`` ones, BentoML's own dispatch: the app answers every endpoint past it
(``common.endpoints.EndpointRouter``), which is part of what the app is measured for. The answer has the same shape
as ``/predict``'s (one entry per node), so the gateway pays comparable JSON costs; the runners
only echo a few bytes.

B2: ``TrivialSingle``: one service, the same request and answer, nothing behind it.
"""

from __future__ import annotations

import gc
import struct
from typing import Annotated

import bentoml
import numpy as np
from bentoml.validators import ContentType

from common.bento import traffic as bentoml_traffic
from common.bento.config import runner_service_config, tracing_config
from common.settings import load_settings

bentoml_traffic.install()  # before BentoML builds this service's ASGI app (see the module)

# A raw binary body and answer; the declared media type spares BentoML a pydantic JSON-schema
# build per response to find one.
BinaryBody = Annotated[bytes, ContentType("application/octet-stream")]
SERVING = load_settings().serving

# The app's runners' service options, so that B1 differs from the app by the work only; plus the
# connection limits BentoML's dependency proxy needs (B1 calls through it, the app through its own
# client): it recycles its session every 100 requests and closes it under calls in flight, which
# fails a share of requests under concurrency otherwise.
RUNNER_OPTIONS = {
    **runner_service_config(SERVING, workers=1),
    "runner_connection": {"max_requests": 1_000_000_000, "max_age": 1e9},
}
TRAFFIC = {"timeout": 30, "max_concurrency": 2048}


@bentoml.service(name="TrivialModel", **RUNNER_OPTIONS)
class TrivialModel:
    def __init__(self) -> None:
        gc.freeze()

    @bentoml.api
    async def infer(self, tensor: BinaryBody, /) -> BinaryBody:
        return tensor


@bentoml.service(name="TrivialFeature", **RUNNER_OPTIONS)
class TrivialFeature:
    model = bentoml.depends(TrivialModel)

    def __init__(self) -> None:
        gc.freeze()

    @bentoml.api
    async def predict(self, request: BinaryBody, /) -> BinaryBody:
        return await self.model.to_async.infer(struct.pack("<I", len(request) // 8))


def _answer(node_ids: list[int]) -> dict:
    return {
        "model": "trivial",
        "degraded": False,
        "predictions": [{"node_id": n, "label": 0, "score": 1.0} for n in node_ids],
    }


@bentoml.service(name="TrivialGateway", workers=1, traffic=TRAFFIC, tracing=tracing_config(SERVING))
class TrivialGateway:
    feature = bentoml.depends(TrivialFeature)
    model = bentoml.depends(TrivialModel)

    def __init__(self) -> None:
        gc.freeze()

    @bentoml.api(route="/predict")
    async def predict(self, node_ids: list[int]) -> dict:
        out = await self.feature.to_async.predict(np.asarray(node_ids, dtype=np.int64).tobytes())
        assert struct.unpack("<I", out)[0] == len(node_ids)
        return _answer(node_ids)


@bentoml.service(name="TrivialSingle", workers=1, traffic=TRAFFIC, tracing=tracing_config(SERVING))
class TrivialSingle:
    def __init__(self) -> None:
        gc.freeze()

    @bentoml.api(route="/predict")
    async def predict(self, node_ids: list[int]) -> dict:
        return _answer(node_ids)
