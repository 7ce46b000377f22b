"""One typed configuration object, read once from the environment and validated at start.

Every knob of the platform is a field here: a deployment changes behaviour with environment
variables (``GSAGE_<FIELD>``, upper case; tuples as comma-separated lists) and never by editing
code. Closed choices are ``Literal``, sizes and times have bounds, and a bad value or an unknown
``GSAGE_*`` name stops the start with a message that names the variable and the reason
(``SettingsError``). The defaults run on a laptop with no Redis: L1 cache + the memory-mapped
graph snapshot.

The fields are grouped in sections, one per subsystem; ``python -m common.settings`` prints the
configuration table of the README from the fields' descriptions (a test keeps the two equal).
"""

from __future__ import annotations

import difflib
import functools
import logging
import math
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, PrivateAttr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "GSAGE_"
# GSAGE_ variables that are not service settings: the gRPC CLI's key and the load generators'.
CLIENT_VARIABLES = frozenset({"GSAGE_API_KEY"})
CLIENT_PREFIXES = ("GSAGE_BENCH_",)


class SettingsError(ValueError):
    """A bad or unknown ``GSAGE_*`` variable; the message names it."""


def _split(value: Any) -> Any:
    """``"25,10"`` -> ``["25", "10"]`` (an environment variable); anything else as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _readable_file(path: str) -> str:
    if path and not os.access(path, os.R_OK):
        raise ValueError(f"{path!r} is not a readable file")
    return path


def _redis_url(url: str) -> str:
    if url:
        from common.redis_client import parse_url

        parse_url(url)
    return url


CommaList = Annotated[tuple[Any, ...], NoDecode, BeforeValidator(_split)]
FilePath = Annotated[str, AfterValidator(_readable_file)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1)]


# -- closed choices, each defined once ----------------------------------------------------------

Backend = Literal["onnx", "onnx-cuda", "openvino", "torch", "tensorrt"]
Precision = Literal["fp32", "int8"]
GraphLogChoice = Literal["auto", "file", "redis"]
FeatureSource = Literal["snapshot", "redis"]
TransportDtype = Literal["float32", "float16"]
BACKENDS: tuple[str, ...] = get_args(Backend)
PRECISIONS: tuple[str, ...] = get_args(Precision)
TRANSPORT_DTYPES: tuple[str, ...] = get_args(TransportDtype)


# -- the sections, one per owner ----------------------------------------------------------------------


class ModelStoreSection(BaseModel):
    snapshot_tag: str = Field(
        "graph-snapshot:latest", min_length=1, description="graph the FeatureRunner serves (memory-mapped)"
    )
    model_tags: Annotated[tuple[Annotated[str, Field(min_length=1)], ...], NoDecode, BeforeValidator(_split)] = Field(
        ("graphsage:latest",),
        min_length=1,
        description="versions the GraphSAGERunner loads at start; the first is the default route",
    )


class SamplingSection(BaseModel):
    fanout: Annotated[tuple[Annotated[int, Field(ge=1, le=1024)], ...], NoDecode, BeforeValidator(_split)] = Field(
        (25, 10), min_length=1, max_length=8, description="maximum fanout per hop (a request may ask for less)"
    )
    max_nodes_per_request: Count = Field(1024, description="node ids in one client request (413 above)")
    explain_max_nodes: Count = Field(
        16,
        description="node ids in one request with `explain` (413 above): each adds a tree per hop-1 neighbour "
        "to the forward pass",
    )


class RedisSection(BaseModel):
    redis_url: Annotated[str, AfterValidator(_redis_url)] = Field(
        "",
        description="L2 and shared rate limits: `redis://host:port/0`, `redis+cluster://host:port`, "
        "`rediss://` for TLS; empty: no Redis",
    )
    redis_ca_file: FilePath = Field(
        "", description="CA bundle that verifies a `rediss://` server (empty: the system's)"
    )


class FeatureCacheSection(BaseModel):
    l1_bytes: Annotated[int, Field(ge=0)] = Field(
        64 * 1024 * 1024, description="per-process LRU+TTL cache of feature rows, bytes"
    )
    l1_ttl_s: Positive = Field(300.0, description="L1 entry lifetime")
    l1_admit_min_uses: Annotated[int, Field(ge=0)] = Field(
        3, description="a full L1 admits a row only after this many recent lookups (TinyLFU-style; 0: plain LRU)"
    )
    l2_ttl_s: Count = Field(3600, description="Redis entry lifetime, seconds")
    l2_timeout_s: Positive = Field(0.05, description="a Redis read's deadline (then origin)")
    l2_timeout_per_key_us: NonNegative = Field(
        5.0, description="added to a read's deadline per key: a bulk read is not cut off at a single node's budget"
    )
    l2_retry_backoff_s: Positive = Field(
        1.0, description="after a Redis failure, calls skip it this long before one probe"
    )
    l2_script_pause_s: Positive = Field(
        60.0,
        description="after a Redis Cluster refused the read script, reads use plain MGETs this long before trying it again",
    )
    l2_write_delay_ms: NonNegative = Field(100.0, description="write-back of origin misses is coalesced this long")
    l2_write_batch_rows: Count = Field(1024, description="... or until this many rows wait")
    l2_max_inflight_writes: Count = Field(64, description="write-backs in flight; more are dropped and counted")
    warm_nodes: Annotated[int, Field(ge=0)] = Field(0, description="hottest nodes (by degree) preloaded into L1/L2")
    scan_min_targets: Annotated[int, Field(ge=0)] = Field(
        64, description="feature batches this large are scans: the snapshot only, no cache read or fill (0: off)"
    )


class FeatureSourceSection(BaseModel):
    feature_source: FeatureSource = Field(
        "snapshot",
        description="where feature rows come from: the snapshot's `features.npy` (mapped by every FeatureRunner), "
        "or `redis`: a Redis Cluster that `python -m training_export load-features` filled (no worker maps the rows)",
    )
    feature_redis_url: Annotated[str, AfterValidator(_redis_url)] = Field(
        "", description="the feature cluster, `redis+cluster://host:port` (empty: `GSAGE_REDIS_URL`)"
    )
    feature_read_timeout_s: Positive = Field(0.25, description="one read of the feature cluster's rows")
    feature_write_timeout_s: Positive = Field(
        2.0, description="one write of an update's rows (with its replicas' `WAIT`)"
    )
    feature_failover_wait_s: NonNegative = Field(
        5.0,
        description="reads and writes retry this long while the feature cluster fails over (then 503); "
        "above the cluster's `cluster-node-timeout`",
    )
    feature_write_replicas: Annotated[int, Field(ge=0)] = Field(
        1, description="replicas of a master that must hold an update's rows before it is acknowledged (0: none)"
    )


class FeatureTensorSection(BaseModel):
    feature_transport_dtype: TransportDtype = Field(
        "float16", description="FeatureTensor rows between the runners (`float32` for bit-exact features)"
    )
    premean: bool = Field(
        True, description="mean-aggregator versions get the premean FeatureTensor (the last hop as its means)"
    )
    premean_min_targets: Count = Field(16, description="... for requests of at least this many nodes")


class LiveGraphSection(BaseModel):
    graph_capacity: Annotated[int, Field(ge=0)] = Field(
        0, description="node ids an update may use: [0, capacity) (0: twice the snapshot's nodes)"
    )
    graph_log: GraphLogChoice = Field(
        "auto",
        description="the update log: Redis Streams, or an fsynced file on local disk (auto: Redis when "
        "`GSAGE_GRAPH_LOG_REDIS_URL` or `GSAGE_REDIS_URL` is set)",
    )
    graph_log_redis_url: Annotated[str, AfterValidator(_redis_url)] = Field(
        "",
        description="the Redis of the update log, when it is not the cache's: one with `appendonly yes`, "
        "`appendfsync always` and no eviction (empty: `GSAGE_REDIS_URL`)",
    )
    graph_log_dir: str = Field(
        "", description="the file log's directory (empty: `~/.local/share/graphsage/update-log`)"
    )
    graph_log_key: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")] = Field(
        "gsage-updates", description="the Redis log's key prefix (one slot in a Cluster)"
    )
    graph_log_segment_bytes: Annotated[int, Field(ge=1 << 16)] = Field(
        64 << 20, description="the file log rolls to a new segment once a record would take it past this"
    )
    graph_log_lock_timeout_s: Positive = Field(30.0, description="the longest a writer waits for the file log's lock")
    graph_log_read_batch: Count = Field(500, description="log entries a worker reads at a time while it catches up")
    graph_poll_interval_ms: Positive = Field(
        20.0, description="how often each FeatureRunner worker looks for new updates"
    )
    graph_status_interval_s: Positive = Field(
        1.0, description="how often each worker publishes its status (`GET /graph/status`) and trims the log"
    )
    graph_max_ops: Count = Field(10_000, description="ops in one update batch (413 above)")
    min_sequence_wait_s: NonNegative = Field(
        1.0, description="how long a prediction with `min_sequence` waits for that update (then 503 with Retry-After)"
    )


class ModelRunnerSection(BaseModel):
    backend: Backend = Field(
        "onnx",
        description="`onnx`, `onnx-cuda`, `openvino` (needs the `openvino` extra), `torch` (reference, "
        "needs torch installed); `tensorrt` is the GPU issue's",
    )
    precision: Precision = Field(
        "fp32",
        description="`int8`: a version's INT8 graph where its export stored one that passed the accuracy "
        "guard on this backend (`onnx`, `openvino`), else FP32; answers say which served them",
    )
    intra_op_threads: Count = Field(1, description="compute threads per model worker")
    max_batch_targets: Count = Field(256, description="targets per forward pass (adaptive batching)")
    max_batch_delay_ms: NonNegative = Field(
        0.0, description="wait for company (0: take what queued while the last batch ran)"
    )
    inline_forward_max_targets: Annotated[int, Field(ge=0)] = Field(
        16, description="forward passes this small run on the event loop, larger ones in the forward thread"
    )
    model_sync_interval_s: Positive = Field(
        0.5, description="how often each model worker applies the admin loads and unloads its sibling workers received"
    )


class ServingSection(BaseModel):
    gateway_workers: Count = Field(1, description="gateway worker processes")
    feature_workers: Count = Field(1, description="FeatureRunner worker processes")
    model_workers: Count = Field(1, description="GraphSAGERunner worker processes")
    host: str = Field(
        "",
        description="the gateway's HTTP and gRPC bind address; empty: 127.0.0.1 while auth is off, "
        "all interfaces with auth on",
    )
    request_timeout_s: Positive = Field(
        30.0, description="BentoML's per-request timeout of every service (504 after it)"
    )
    gateway_max_concurrency: Count = Field(2048, description="requests in flight per gateway worker (503 above)")
    runner_max_concurrency: Count = Field(1024, description="requests in flight per runner worker (503 above)")
    tracing: bool = Field(
        False,
        description="BentoML's OpenTelemetry spans, joined across the hops by `traceparent` (off: its middleware "
        "passes requests through)",
    )
    tracing_otlp_endpoint: str = Field(
        "",
        description="where the spans go: an OTLP/HTTP collector, e.g. `http://otel-collector:4318/v1/traces` "
        "(empty: spans are made and propagated, not exported)",
    )
    tracing_sample_rate: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = Field(
        1.0, description="the share of requests traced (the gateway decides; the runners follow its choice)"
    )
    access_log: bool = Field(True, description="the gateway's access log (the internal hops never log one)")


class AccessSection(BaseModel):
    auth_enabled: bool = Field(False, description="API keys required (`predict`, `admin` scopes)")
    api_keys_file: FilePath = Field("", description="the key file (`python -m services.auth create`)")
    rate_limit_per_s: NonNegative = Field(
        0.0,
        description="token bucket per key (0: unlimited); one budget for HTTP and "
        "gRPC, shared through Redis when `GSAGE_REDIS_URL` is set",
    )
    rate_limit_burst: Count = Field(100, description="bucket size")


class RoutingSection(BaseModel):
    routing_file: str = Field("", description="canary / A-B routing table (empty: in memory)")
    routing_poll_interval_s: Positive = Field(
        1.0, description="how often each gateway worker looks for routing changes"
    )


class RunnerCallsSection(BaseModel):
    runner_timeout_s: Positive = Field(
        2.0, description="deadline of one FeatureRunner call (its model call gets 3/4 of it)"
    )
    connection_retry_pauses_s: Annotated[
        tuple[Annotated[float, Field(ge=0, le=5)], ...], NoDecode, BeforeValidator(_split)
    ] = Field(
        (0.0, 0.02, 0.1), max_length=5, description="a connection lost mid-call is retried after each of these pauses"
    )
    breaker_failures: Count = Field(5, description="consecutive failures that open a runner's circuit breaker")
    breaker_reset_s: NonNegative = Field(2.0, description="an open breaker lets a probe through after this long")

    @property
    def model_call_timeout_s(self) -> float:
        """The time the FeatureRunner waits on the model runner for one request (its calls
        together, its own work in between not counted): within the gateway's deadline, so that a
        slow model runner is reported as such rather than as a slow FeatureRunner (-> degraded
        answers); the last quarter is left to sampling and fetching."""
        return 0.75 * self.runner_timeout_s


class CoalescingSection(BaseModel):
    coalesce_max_inflight: Count = Field(4, description="merged FeatureRunner calls in flight per gateway worker")
    coalesce_overlap_ratio: Annotated[float, Field(gt=0)] = Field(
        1.0,
        description="beside calls in flight, a new one starts once full or this many times the largest (`inf`: full only)",
    )
    coalesce_max_nodes: Count = Field(2048, description="nodes in one merged FeatureRunner call")


class GatewaySection(BaseModel):
    max_body_bytes: Count = Field(1 << 20, description="largest request body (HTTP and gRPC; 413 above)")
    stale_answers: Annotated[int, Field(ge=0)] = Field(
        200_000, description="nodes whose last answer is kept for degraded answers while the FeatureRunner is down"
    )
    grpc_port: Annotated[int, Field(ge=0, le=65535)] = Field(50051, description="gRPC port (0: off)")
    graph_update_timeout_s: Positive = Field(
        10.0,
        description="the gateway's deadline for one update batch "
        "(the FeatureRunner catches up, validates, appends, applies)",
    )
    compaction_timeout_s: Positive = Field(
        600.0, description="the gateway's deadline for `POST /admin/graph/compact` (the fold and the snapshot's save)"
    )


class ShadowSection(BaseModel):
    shadow_queue_size: Count = Field(
        1024, description="requests waiting for their shadow call, per gateway worker; more are dropped and counted"
    )
    shadow_max_inflight: Count = Field(
        1,
        description="shadow calls in flight per gateway worker (each takes every request waiting, up to "
        "`GSAGE_COALESCE_MAX_NODES` nodes)",
    )
    shadow_batch_nodes: Count = Field(
        256,
        description="a shadow call starts once this many nodes wait (or the oldest waited `GSAGE_SHADOW_LINGER_MS`): "
        "off the response path, larger calls cost less per request",
    )
    shadow_linger_ms: NonNegative = Field(
        50.0, description="the longest a shadowed request waits for others to share its call"
    )
    shadow_timeout_s: Positive = Field(
        2.0, description="deadline of one shadow call (a failure counts for the shadow only)"
    )
    shadow_stats_dir: str = Field(
        "",
        description="where each gateway worker writes its shadow figures, for `GET /admin/shadow` and the routing "
        "CLI to add up (empty: `<routing file>.shadow` beside a routing file, else per worker)",
    )
    shadow_flush_interval_s: Positive = Field(
        1.0, description="how often each gateway worker writes its shadow figures"
    )


class SecuritySection(BaseModel):
    tls_cert_file: FilePath = Field("", description="TLS certificate (PEM) for the gateway's HTTP and gRPC")
    tls_key_file: FilePath = Field("", description="its private key (PEM); both or neither")
    service_tokens: CommaList = Field(
        (),
        max_length=2,
        description="tokens the runners accept on internal calls (the first is sent; two during a rotation)",
    )
    service_tokens_file: FilePath = Field(
        "", description="the same from a file, one per line, re-read on change (a Secret)"
    )
    service_tokens_reload_s: Positive = Field(1.0, description="how often the token file is looked at for a change")

    @model_validator(mode="after")
    def _tls_pair(self) -> SecuritySection:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            missing = "tls_key_file" if self.tls_cert_file else "tls_cert_file"
            raise ValueError(
                f"TLS needs both GSAGE_TLS_CERT_FILE and GSAGE_TLS_KEY_FILE; {ENV_PREFIX}{missing.upper()} is missing"
            )
        return self


SECTIONS: tuple[type[BaseModel], ...] = (
    ModelStoreSection,
    SamplingSection,
    RedisSection,
    FeatureCacheSection,
    FeatureSourceSection,
    FeatureTensorSection,
    LiveGraphSection,
    ModelRunnerSection,
    ServingSection,
    AccessSection,
    RoutingSection,
    RunnerCallsSection,
    CoalescingSection,
    GatewaySection,
    ShadowSection,
    SecuritySection,
)
S = TypeVar("S", bound=BaseModel)
# Variables that once were settings: set, they are ignored with a warning instead of stopping the start.
RETIRED = {"GSAGE_DIRECT_API": "every endpoint is answered by the service's own router now (common/endpoints.py)"}


class _MappingEnv(EnvSettingsSource):
    """The environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._env.items()}


class Settings(
    SecuritySection,
    ShadowSection,
    GatewaySection,
    CoalescingSection,
    RunnerCallsSection,
    RoutingSection,
    AccessSection,
    ServingSection,
    ModelRunnerSection,
    LiveGraphSection,
    FeatureTensorSection,
    FeatureSourceSection,
    FeatureCacheSection,
    RedisSection,
    SamplingSection,
    ModelStoreSection,
    BaseSettings,
):
    """Every ``GSAGE_*`` variable, flat (the names stay those documented); each owner takes its
    section (``section``, or the named properties below), never the whole object."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, case_sensitive=False, extra="forbid", frozen=True)
    _sections: dict[type[BaseModel], BaseModel] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The init values and the environment only (no .env file, no secrets directory)."""
        env = _SOURCE.get("env")
        return (init_settings, env_settings if env is None else _MappingEnv(settings_cls, env))

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.auth_enabled and not self.api_keys_file:
            raise ValueError("GSAGE_AUTH_ENABLED is on but GSAGE_API_KEYS_FILE is empty")
        if self.feature_source == "redis" and not self.feature_cluster_url:
            raise ValueError("GSAGE_FEATURE_SOURCE=redis needs GSAGE_FEATURE_REDIS_URL or GSAGE_REDIS_URL")
        if self.graph_log == "redis" and not self.graph_log_url:
            raise ValueError("GSAGE_GRAPH_LOG=redis needs GSAGE_GRAPH_LOG_REDIS_URL or GSAGE_REDIS_URL")
        if self.shadow_batch_nodes > self.coalesce_max_nodes:
            raise ValueError(
                f"GSAGE_SHADOW_BATCH_NODES ({self.shadow_batch_nodes}) is over GSAGE_COALESCE_MAX_NODES "
                f"({self.coalesce_max_nodes}), the most one shadow call may carry: it would never fill"
            )
        return self

    def section(self, kind: type[S]) -> S:
        """This configuration's ``kind`` section (a copy of its fields)."""
        cached = self._sections
        if kind not in cached:
            cached[kind] = kind.model_construct(**{name: getattr(self, name) for name in kind.model_fields})
        section = cached[kind]
        assert isinstance(section, kind)
        return section

    @property
    def model_store(self) -> ModelStoreSection:
        return self.section(ModelStoreSection)

    @property
    def sampling(self) -> SamplingSection:
        return self.section(SamplingSection)

    @property
    def redis(self) -> RedisSection:
        return self.section(RedisSection)

    @property
    def feature_cache(self) -> FeatureCacheSection:
        return self.section(FeatureCacheSection)

    @property
    def feature_source_section(self) -> FeatureSourceSection:
        return self.section(FeatureSourceSection)

    @property
    def feature_tensor(self) -> FeatureTensorSection:
        return self.section(FeatureTensorSection)

    @property
    def live_graph(self) -> LiveGraphSection:
        return self.section(LiveGraphSection)

    @property
    def model_runner(self) -> ModelRunnerSection:
        return self.section(ModelRunnerSection)

    @property
    def serving(self) -> ServingSection:
        return self.section(ServingSection)

    @property
    def access(self) -> AccessSection:
        return self.section(AccessSection)

    @property
    def routing(self) -> RoutingSection:
        return self.section(RoutingSection)

    @property
    def runner_calls(self) -> RunnerCallsSection:
        return self.section(RunnerCallsSection)

    @property
    def coalescing(self) -> CoalescingSection:
        return self.section(CoalescingSection)

    @property
    def gateway(self) -> GatewaySection:
        return self.section(GatewaySection)

    @property
    def shadow(self) -> ShadowSection:
        return self.section(ShadowSection)

    @property
    def security(self) -> SecuritySection:
        return self.section(SecuritySection)

    # -- values that combine sections ----------------------------------------------------------

    @property
    def runner_call_max_nodes(self) -> int:
        """The most nodes one FeatureRunner call may carry: a client's request, or the gateway's
        merge of several."""
        return max(self.max_nodes_per_request, self.coalesce_max_nodes)

    @property
    def feature_cluster_url(self) -> str:
        """The Redis (Cluster) that holds the feature rows when ``feature_source`` is ``redis``."""
        return self.feature_redis_url or self.redis_url

    @property
    def graph_log_url(self) -> str:
        """The Redis the update log is kept in: its own when one is set, else the cache's (on a
        cache configured to evict or not to persist, the FeatureRunner warns at start)."""
        return self.graph_log_redis_url or self.redis_url

    @property
    def graph_log_kind(self) -> str:
        return ("redis" if self.graph_log_url else "file") if self.graph_log == "auto" else self.graph_log

    @property
    def graph_log_path(self) -> str:
        return self.graph_log_dir or os.path.join(os.path.expanduser("~"), ".local", "share", "graphsage", "update-log")

    @property
    def bind_host(self) -> str:
        """Where the gateway listens: loopback while anyone may call it, unless told otherwise."""
        return self.host or ("0.0.0.0" if self.auth_enabled else "127.0.0.1")


_SOURCE: dict[str, Mapping[str, str] | None] = {}


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _unknown(env: Mapping[str, str]) -> list[str]:
    known = {env_name(name) for name in Settings.model_fields}
    return sorted(
        k
        for k in env
        if k.upper().startswith(ENV_PREFIX)
        and k.upper() not in known
        and k.upper() not in CLIENT_VARIABLES
        and not k.upper().startswith(CLIENT_PREFIXES)
        and k.upper() not in RETIRED
    )


def _warn_retired(env: Mapping[str, str]) -> None:
    for name in sorted(k.upper() for k in env if k.upper() in RETIRED):
        message = f"{name} is set but no longer has an effect: {RETIRED[name]}; unset it"
        logging.getLogger("graphsage.settings").warning(message)
        warnings.warn(message, stacklevel=3)


def _explain(exc: ValidationError, env: Mapping[str, str]) -> str:
    lines = []
    upper = {k.upper(): v for k, v in env.items()}
    for err in exc.errors(include_url=False):
        field = str(err["loc"][0]) if err["loc"] else ""
        if field in Settings.model_fields:
            name = env_name(field)
            raw = upper.get(name)
            where = f"{name}={raw!r}" if raw is not None else name
            detail = ".".join(str(p) for p in err["loc"][1:])
            lines.append(
                f"{where}: {str(err['msg']).removeprefix('Value error, ')}" + (f" (item {detail})" if detail else "")
            )
        else:
            lines.append(str(err["msg"]).removeprefix("Value error, "))
    return "; ".join(lines)


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from the defaults overridden by ``GSAGE_*`` variables of ``env`` (default: this
    process's environment); raises ``SettingsError`` naming every bad or unknown variable."""
    env = os.environ if env is None else env
    unknown = _unknown(env)
    if unknown:
        names = [env_name(n) for n in Settings.model_fields]
        hints = [
            f"{u} (did you mean {', '.join(m)}?)" if (m := difflib.get_close_matches(u.upper(), names, 2)) else u
            for u in unknown
        ]
        raise SettingsError(f"unknown setting {'; '.join(hints)}; `python -m common.settings` lists them all")
    _warn_retired(env)
    _SOURCE["env"] = {k: v for k, v in env.items() if k.upper() not in RETIRED}
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsError(f"bad configuration: {_explain(exc, env)}") from None
    finally:
        _SOURCE.pop("env", None)


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    """The process-wide settings, read once (a bad value stops the start here)."""
    return load_settings()


# -- the README's configuration table --------------------------------------------------------------


def _default(info: FieldInfo) -> str:
    value = info.default
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) if value else "empty"
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "empty"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return str(value)


def markdown_table() -> str:
    """The configuration table, one block of rows per section."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for section in SECTIONS:
        title = section.__name__.removesuffix("Section")
        rows.append(f"| **{' '.join(_words(title))}** | | |")
        for name in section.__annotations__:
            info = Settings.model_fields[name]
            rows.append(f"| `{env_name(name)}` | {_default(info)} | {info.description} |")
    return "\n".join(rows) + "\n"


def _words(camel: str) -> list[str]:
    out, word = [], ""
    for ch in camel:
        if ch.isupper() and word and not word[-1].isupper():
            out.append(word)
            word = ch
        else:
            word += ch
    return [*out, word]


if __name__ == "__main__":
    try:
        load_settings()
    except SettingsError as exc:
        print(exc, file=sys.stderr)
    sys.stdout.write(markdown_table())
