"""One typed configuration object, read once from the environment.

Every knob of the platform lives here so that a deployment changes behaviour with environment
variables (``GSAGE_<FIELD>``, upper case) and never by editing code. Defaults run on a laptop
with no Redis: L1 cache + the memory-mapped graph snapshot.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, get_type_hints

ENV_PREFIX = "GSAGE_"

def runner_service_options(workers: int) -> dict:
    """BentoML service config shared by both runners (separately scaled, internal hops only)."""
    return {
        "workers": workers,
        "traffic": {"timeout": 30, "max_concurrency": 1024},
        # The gateway's access log, metrics and traces cover a request; a log line per hop costs CPU.
        "logging": {"access": {"enabled": False}},
        "tracing": tracing_config(),
    }


def tracing_config() -> dict:
    """BentoML wraps every service in OpenTelemetry's ASGI middleware; with no exporter it still
    built a span per request, 28% of the gateway's CPU samples under load (bench.suite, py-spy).
    Unless ``GSAGE_TRACING`` is on, every URL is excluded, which makes the middleware a pass-through."""
    return {} if settings().tracing else {"excluded_urls": [".*"]}


def gateway_ssl_config() -> dict:
    """BentoML's ``ssl`` service config for the gateway's HTTP front end (the gRPC front end
    reads the same files): on when ``tls_cert_file`` and ``tls_key_file`` are set, and only in
    a process that serves the gateway (``common.bento.serving`` says why)."""
    from common.bento.serving import serves

    cfg = settings()
    if not cfg.tls_cert_file or not serves("Gateway", main=True):
        return {}
    return {"enabled": True, "certfile": cfg.tls_cert_file, "keyfile": cfg.tls_key_file}


@dataclasses.dataclass(frozen=True)
class Settings:
    # Model store tags the runners load.
    snapshot_tag: str = "graph-snapshot:latest"
    model_tags: tuple[str, ...] = ("graphsage:latest",)

    # Sampling: the maximum fanout per hop; a request may ask for less, never more.
    fanout: tuple[int, ...] = (25, 10)
    max_nodes_per_request: int = 1024  # one client request; merged calls: coalesce_max_nodes

    # L1: per-process LRU bounded in bytes, with TTL.
    l1_bytes: int = 64 * 1024 * 1024
    l1_ttl_s: float = 300.0
    # Admission: when full, L1 takes a new row only once it was looked up this many times recently
    # (0: plain LRU). Zipf single-target stream, L1 at 10%: hit ratio 47.3% -> 58.3%, L1 inserts
    # per request 28.8 -> 0.8 (runners/feature/cache/l1.py, bench/bench_features.py).
    l1_admit_min_uses: int = 3
    # L2: Redis. Empty URL = no L2. ``redis://host:port/0`` or ``redis+cluster://host:port``.
    redis_url: str = ""
    l2_ttl_s: int = 3600
    l2_timeout_s: float = 0.05
    # A read's deadline grows with its key count: a bulk request's ~7k-key MGET took 25-50 ms
    # under load and timed out at a flat 50 ms, opening the circuit for everyone (bench.suite).
    l2_timeout_per_key_us: float = 5.0
    l2_retry_backoff_s: float = 1.0
    # Write-back of origin misses is coalesced for this long (or until 1024 rows wait): a warm
    # cache misses a few rows in most requests, one Redis write each cost a round trip of CPU.
    l2_write_delay_ms: float = 100.0
    warm_nodes: int = 0
    # Feature batches of at least this many targets are scans: the snapshot only (no L1, no
    # Redis), no cache fill (runners/feature/cache/tiered.py says why). 0 turns it off. Single-node
    # traffic merged at concurrency 32 stays below it.
    scan_min_targets: int = 64
    # The FeatureTensor rows as the gateway asks for them (float32 | float16). float16 halves the
    # bytes that cross two hops (256 targets: 4.42 -> 2.26 MB); on the demo model it changed no
    # class over 10,240 targets, max |prob diff| 9.9e-4 (tests/test_inference.py checks the bound).
    feature_transport_dtype: str = "float16"
    # Mean-aggregator versions get the premean FeatureTensor for requests of at least
    # premean_min_targets nodes (the last hop as its means, repeated hop-1 nodes once: 256 targets
    # 1.79 -> 0.59 MB, the model runner's decode + forward 3.68 -> 1.69 ms). Below ~16 targets the
    # FeatureRunner's extra pass costs more than the model saves (bench/bench_premean.py).
    premean: bool = True
    premean_min_targets: int = 16

    # Worker processes per service (each scales on its own; one batch in flight per worker).
    gateway_workers: int = 1
    feature_workers: int = 1
    model_workers: int = 1

    # Model runner.
    backend: str = "onnx"  # onnx | onnx-cuda | torch | tensorrt
    intra_op_threads: int = 1
    max_batch_targets: int = 256
    # 0: a batch takes what queued while the previous one ran (no wait at low load). Measured:
    # 2 ms cost 2.5 ms of P50 at concurrency 1 and gained nothing at 32 (bench.suite).
    max_batch_delay_ms: float = 0.0
    # Batches up to this many targets run on the event loop, larger ones in the forward thread.
    inline_forward_max_targets: int = 16

    # The hot APIs (the gateway's /predict, FeatureRunner.predict, GraphSAGERunner.infer) answered
    # by common.bento.direct_api, past BentoML's per-request API dispatch; off: through @bentoml.api,
    # with the same answers. c=32: 1,205 -> 1,746 req/s; c=1 mean 7.67 -> 5.40 ms (bench.suite.ab).
    direct_api: bool = True

    # Observability.
    tracing: bool = False  # BentoML's OpenTelemetry spans; configure an exporter when on

    # Gateway.
    access_log: bool = True
    auth_enabled: bool = False
    api_keys_file: str = ""
    rate_limit_per_s: float = 0.0  # 0 = unlimited
    rate_limit_burst: int = 100
    routing_file: str = ""
    # The gateway's deadline for one FeatureRunner.predict call, the model call inside it included.
    runner_timeout_s: float = 2.0
    # Merged runner calls in flight per gateway worker. Beside calls in flight, the next starts
    # once full (coalesce_max_nodes nodes) or once it holds coalesce_overlap_ratio times the
    # nodes of the largest call in flight (inf: only full calls): bulk traffic pipelines, small
    # requests merge into a few calls of similar size (common/batching.py has the figures).
    coalesce_max_inflight: int = 4
    # The most nodes one merged call carries (the FeatureRunner admits calls of this size): merging
    # amortises each call's fixed cost over more nodes. Bulk 256 at c=16 (bench.suite.ab, each
    # against 1024 in windows interleaved): 1024 -> 2048 nodes 291 -> 314 req/s (P99 88 -> 80 ms);
    # 1024 -> 4096 284 -> 295 req/s (P99 90 -> 105 ms). 256 (bulk never merged): 216 vs 283-306.
    coalesce_max_nodes: int = 2048
    coalesce_overlap_ratio: float = 1.0
    breaker_failures: int = 5
    breaker_reset_s: float = 2.0
    grpc_port: int = 50051
    # TLS for the gateway's HTTP and gRPC front ends (PEM files; both or neither).
    tls_cert_file: str = ""
    tls_key_file: str = ""

    # Internal hops: the service tokens a runner accepts (the first is the one sent; two at once
    # for a rotation), as a list or as a file re-read on change (common/service_auth.py).
    service_tokens: tuple[str, ...] = ()
    service_tokens_file: str = ""
    # CA bundle to verify a rediss:// server (L2 and the rate limiter); empty: the system's.
    redis_ca_file: str = ""

    @property
    def runner_call_max_nodes(self) -> int:
        """The most nodes one FeatureRunner call may carry: a client's request, or the gateway's
        merge of several."""
        return max(self.max_nodes_per_request, self.coalesce_max_nodes)

    @property
    def model_call_timeout_s(self) -> float:
        """The time the FeatureRunner waits on the model runner for one request (its calls
        together, its own work in between not counted): within the gateway's deadline, so that a
        slow model runner is reported as such (502 -> 503) rather than as a slow FeatureRunner
        (-> degraded answers); the last quarter is left to sampling and fetching."""
        return 0.75 * self.runner_timeout_s


def _parse(raw: str, kind: Any) -> Any:
    if kind is bool:
        return raw.strip().lower() in {"1", "true", "yes", "on"}
    if kind in (int, float, str):
        return kind(raw)
    item = kind.__args__[0]  # tuple[X, ...]
    return tuple(item(p.strip()) for p in raw.split(",") if p.strip())


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Build Settings from defaults overridden by ``GSAGE_*`` environment variables."""
    env = os.environ if env is None else env
    hints = get_type_hints(Settings)
    overrides = {}
    for field in dataclasses.fields(Settings):
        raw = env.get(ENV_PREFIX + field.name.upper())
        if raw is not None:
            try:
                overrides[field.name] = _parse(raw, hints[field.name])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{ENV_PREFIX}{field.name.upper()}={raw!r}: {exc}") from exc
    return Settings(**overrides)


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
