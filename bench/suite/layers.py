"""The layers of a co-located request, for charging profile samples: which layer of the app's
own a py-spy sample's stack is in (the innermost one it enters), so that a c=1 profile says which
layer holds the time that the one-process baseline (B5) does not spend.

Used by ``bench/bench_request_layers.py --layers`` (the ASGI app called in-process) and by the
suite's co-located profile (``scenarios.PROFILE_COLOCATED_C1``, the process behind its HTTP server).
"""

from __future__ import annotations

from collections.abc import Sequence

# (layer, the frame names that enter it), outermost first; a sample goes to the innermost it is in.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("HTTP server (uvicorn, httptools)", ("RequestResponseCycle.", "HttpToolsProtocol.", "H11Protocol.")),
    (
        "BentoML middleware (metrics, tracing, access log, timeout)",
        (
            "Starlette.__call__",
            "RunnerTrafficMetricsMiddleware",
            "OpenTelemetryMiddleware",
            "AccessLogMiddleware",
            "_timeout_call",
            "_concurrency_call",
        ),
    ),
    ("gateway guard and router", ("HttpGuard.", "EndpointRouter.", "with_request_id", "in_one_shape")),
    ("gateway core (routing, coalescer, breaker, answer)", ("GatewayCore.", "PredictionCore.", "CircuitBreaker.")),
    ("gateway answer encoding", ("Answer.", "AnswerJson.")),
    ("hop to the FeatureRunner (in-process)", ("LocalTransport.call", "FeatureRunnerApi.")),
    ("FeatureRunner pipeline (batcher, lock, metrics)", ("FeaturePipeline.",)),
    ("sampling and fetch (B5 does it too)", ("NeighbourhoodBuilder.build", "TieredFeatureStore._drain_fills")),
    ("model runner core (batcher, metrics, answer)", ("ModelRunnerApi.", "ModelRunnerCore.infer", "WaitBudget.")),
    ("forward (B5 does it too)", ("run_batch",)),
]
OUTSIDE = "event loop (socket I/O, callbacks), background tasks"  # a sample in none of the layers
B5_WORK = ("sampling and fetch (B5 does it too)", "forward (B5 does it too)")


def layer_of(frames: Sequence[str]) -> str:
    """The innermost layer of a stack (outermost frame first; frames as py-spy writes them,
    ``func (file:line)``)."""
    layer = OUTSIDE
    for frame in frames:
        layer = next((name for name, entries in LAYERS if frame.startswith(entries)), layer)
    return layer
