"""The gateway's gRPC front end (``graphsage.v1.GraphSAGE``, services/proto/graphsage/v1/predict.proto).

BentoML 1.4 serves no gRPC for new-style services, so this is a ``grpc.aio`` server started by the
Gateway's ``on_startup`` hook in the same worker process and event loop as the HTTP front end. It
calls the same core as HTTP (``services.core.GatewayCore``: routing, breakers, degraded answers,
metrics), admits with the same ``ApiKeyAuth`` and rate limiter (``services.access``: one budget
per key across both protocols), and adds the standard health service (``grpc.health.v1.Health``: SERVING for ``""`` and
``graphsage.v1.GraphSAGE``) and server reflection.

Auth: metadata ``authorization: Bearer <key>`` or ``x-api-key: <key>``; both RPCs need the
``predict`` scope (as HTTP ``/predict`` and ``/models``). Rate limits are per key name, as HTTP.

Errors: the same ``ApiError`` as HTTP, its status mapped to a code, its message as the details,
its type and param as the trailers ``error-type`` and ``error-param``, its headers as trailers.
Status codes (never INTERNAL for bad input)::

    no/invalid key                      UNAUTHENTICATED     (trailer www-authenticate: Bearer)
    key without the scope               PERMISSION_DENIED
    rate limited                        RESOURCE_EXHAUSTED  (trailer retry-after: <seconds>)
    undecodable bytes, invalid fields   INVALID_ARGUMENT    (field-by-field message)
    ApiError 400 / 422                  INVALID_ARGUMENT
    ApiError 413 (too many node ids)    INVALID_ARGUMENT    (a property of the request; retrying
                                                             cannot help, and RESOURCE_EXHAUSTED
                                                             invites retries)
    ApiError 404 unknown model/version  NOT_FOUND
    ApiError 429                        RESOURCE_EXHAUSTED  (retry-after)
    ApiError 503 runner unavailable     UNAVAILABLE         (retry-after)
    ApiError 502 / 504                  UNAVAILABLE (retry-after: 1) / DEADLINE_EXCEEDED
    message > 1 MiB                     RESOURCE_EXHAUSTED  (rejected by grpc itself)
    > max concurrent RPCs               RESOURCE_EXHAUSTED  (grpc itself)
    a bug here                          INTERNAL            ("internal error", details logged)

Several gateway workers: the listening socket is bound without SO_REUSEPORT, so exactly one
worker serves gRPC; the others log a warning and serve HTTP only (``start_grpc_server`` returns
None). A port held by any other process is reported the same way, never shared silently.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pydantic import ValidationError

from common.bento.tracing import server_span
from common.errors import ApiError
from common.graph_ops import BY_NAME
from common.request_context import REQUEST_ID_HEADER, adopt, tracing_enabled
from common.request_headers import RequestHeaders
from services.access import GatewayAccess
from services.answer import Answer
from services.core import GatewayCore
from services.grpc_codegen import ensure_stubs
from services.protocol import PredictRequest, PredictResponse
from services.ratelimit import rate_limited

# Before importing the stubs: a fresh checkout has none (they are generated, not committed).
ensure_stubs()

from services.grpc_gen.graphsage.v1 import predict_pb2 as pb  # noqa: E402
from services.grpc_gen.graphsage.v1 import predict_pb2_grpc as pb_grpc  # noqa: E402

log = logging.getLogger("graphsage.gateway.grpc")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GraphSAGE"].full_name  # graphsage.v1.GraphSAGE
DEFAULT_MODEL = PredictRequest.model_fields["model"].default

_BY_HTTP_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_for(http_status: int) -> grpc.StatusCode:
    """The gRPC code for an ``ApiError`` status: any other 4xx is the caller's input
    (INVALID_ARGUMENT), any other 5xx is ours (INTERNAL)."""
    if http_status in _BY_HTTP_STATUS:
        return _BY_HTTP_STATUS[http_status]
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= http_status < 500 else grpc.StatusCode.INTERNAL


class _Malformed:
    """What the request deserializer returns for bytes that are not the message: the handler
    answers INVALID_ARGUMENT (grpc's own deserialization failure would be INTERNAL)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(message_type: Any) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except (DecodeError, ValueError, TypeError) as exc:
            return _Malformed(f"request is not a valid {message_type.DESCRIPTOR.full_name}: {exc}")

    return deserialize


class _Reject(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, trailers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.code, self.message, self.trailers = code, message, tuple(trailers)


def to_request(msg: Any) -> PredictRequest:
    """The proto request as the shared pydantic model; raises ``ValidationError``. Absent
    ``optional`` fields and an empty ``fanout`` are None (the HTTP defaults)."""
    params: dict[str, Any] = {
        "node_ids": list(msg.node_ids),
        "model": msg.model or DEFAULT_MODEL,
        "embedding": msg.embedding,
        "explain": msg.explain,
    }
    if msg.fanout:
        params["fanout"] = list(msg.fanout)
    for name in ("version", "routing_key", "seed", "min_sequence"):
        if msg.HasField(name):
            params[name] = getattr(msg, name)
    return PredictRequest(**params)


def ops_from_proto(msg: Any) -> list[dict[str, Any]]:
    """The proto batch as the JSON ops of ``common.graph_ops.OPS`` (what HTTP carries): each
    oneof case is an op of that name, each of its fields the op's field of the same name."""
    ops: list[dict[str, Any]] = []
    for op in msg.ops:
        kind = op.WhichOneof("op")
        spec = BY_NAME.get(kind or "")
        if spec is None:
            ops.append({"op": "(none)"})  # refused by the shape check, with this op's index
            continue
        body = getattr(op, kind)
        item: dict[str, Any] = {"op": kind}
        for field in spec.fields:
            if field.kind == "node":
                item[field.name] = getattr(body, field.name)
            elif field.kind == "features":
                item[field.name] = list(getattr(body, field.name))
            elif body.HasField("label"):  # proto3: one label, or a repeated list of tags
                item["label"] = body.label
            elif body.labels:
                item["label"] = list(body.labels)
        ops.append(item)
    return ops


def to_proto(resp: Answer | PredictResponse) -> Any:
    out = pb.PredictResponse(
        model=resp.model, precision=resp.precision, degraded=resp.degraded, degraded_reason=resp.degraded_reason or ""
    )
    nodes = resp.nodes() if isinstance(resp, Answer) else (p.model_dump() for p in resp.predictions)
    for p in nodes:
        node = out.predictions.add(node_id=p["node_id"], stale=p["stale"])
        if p["label"] is not None:
            node.label = p["label"]
        if p["labels"]:
            node.labels.extend(p["labels"])
        if p["score"] is not None:
            node.score = float(p["score"])
        node.probabilities.extend(_floats(p["probabilities"]))
        if p["embedding"] is not None and len(p["embedding"]):
            node.embedding.extend(_floats(p["embedding"]))
        if p.get("explanation") is not None:
            _explanation(node.explanation, p["explanation"])
    return out


def _explanation(out: Any, explanation: dict[str, Any]) -> None:
    """``protocol.Explanation`` (a dict, rows numpy or lists) into the proto message ``out``."""
    out.classes.extend(_ints(explanation["classes"]))
    out.empty_slots = explanation["empty_slots"]
    for n in explanation["neighbours"]:
        out.neighbours.add(
            node_id=n["node_id"], influence=_floats(n["influence"]), hop2=_ints(n["hop2"]), hop2_empty=n["hop2_empty"]
        )


def _ints(values: Any) -> list[int]:
    return values.tolist() if hasattr(values, "tolist") else values


def _floats(values: Any) -> list[float]:
    """numpy rows (an Answer) or lists (a PredictResponse) as the plain floats protobuf takes."""
    return values.tolist() if hasattr(values, "tolist") else values


def trailers_of(exc: ApiError) -> list[tuple[str, str]]:
    """An error's type, param and headers as the trailers of the RPC that failed."""
    out = [("error-type", exc.type), *((("error-param", exc.param),) if exc.param else ())]
    return out + [
        (k.lower(), str(v)) for k, v in exc.headers.items() if k.lower() in ("retry-after", "www-authenticate")
    ]


class GraphSAGEServicer(pb_grpc.GraphSAGEServicer):
    """``graphsage.v1.GraphSAGE`` over the gateway's core."""

    def __init__(self, core: GatewayCore, access: GatewayAccess) -> None:
        self.core = core
        self.access = access

    async def _admit(self, context: grpc.aio.ServicerContext, scope: str) -> None:
        # One reading of the credentials, as HTTP's: a second authorization or x-api-key is refused.
        metadata = RequestHeaders(
            (key.encode("latin-1"), value.encode("latin-1"))
            for key, value in context.invocation_metadata() or ()
            if isinstance(value, str)
        )
        principal = self.access.auth.check(metadata.get("authorization"), metadata.get("x-api-key"), scope)
        decision = await self.access.limiter.acquire(principal.name)
        if not decision.allowed:
            raise rate_limited(decision.retry_after_s)

    async def _serve(
        self,
        request: Any,
        context: grpc.aio.ServicerContext,
        body: Callable[[Any], Any],
        method: str,
        scope: str = "predict",
    ) -> Any:
        metadata = [(k, v) for k, v in context.invocation_metadata() or () if isinstance(v, str)]
        # The request's id (the client's x-request-id, or a new one), answered in the trailers.
        sent = [v for k, v in metadata if k == REQUEST_ID_HEADER]
        request_id = ((REQUEST_ID_HEADER, adopt(sent[0] if len(sent) == 1 else None)),)
        context.set_trailing_metadata(request_id)
        try:
            if isinstance(request, _Malformed):
                raise _Reject(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
            if not tracing_enabled():
                await self._admit(context, scope)
                return await body(request)
            # BentoML traces its HTTP server only: the gRPC call gets its span here, and the core's
            # internal calls carry it on (common.request_context).
            with server_span(
                f"grpc {method}",
                dict(metadata),
                {"rpc.system": "grpc", "rpc.method": method, "request.id": request_id[0][1]},
            ):
                await self._admit(context, scope)
                return await body(request)
        except _Reject as exc:
            failure = exc
        except ApiError as exc:
            failure = _Reject(status_for(exc.status), exc.message, trailers_of(exc))
        except Exception:
            log.exception("gRPC %s failed", method)
            failure = _Reject(grpc.StatusCode.INTERNAL, "internal error")
        trailers = (*failure.trailers, *request_id)
        if failure.code == grpc.StatusCode.UNAVAILABLE and not any(k == "retry-after" for k, _ in trailers):
            trailers += (("retry-after", "1"),)  # as HTTP: every 503 says when to retry
        # Outside the try: abort() ends the RPC by raising.
        await context.abort(failure.code, failure.message, trailers)

    async def Predict(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def body(msg: Any) -> Any:
            try:
                req = to_request(msg)
            except ValidationError as exc:  # only the request's: a ValidationError later is a bug
                raise _Reject(grpc.StatusCode.INVALID_ARGUMENT, ApiError.invalid(exc).message) from exc
            return to_proto(await self.core.predict(req))

        return await self._serve(request, context, body, "Predict")

    async def UpdateGraph(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def body(msg: Any) -> Any:
            ack = await self.core.graph_update(ops_from_proto(msg))
            return pb.UpdateGraphResponse(accepted=ack.accepted, sequence=ack.sequence)

        return await self._serve(request, context, body, "UpdateGraph", scope="graph")

    async def ListModels(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def body(_: Any) -> Any:
            doc = await self.core.models()
            runner = doc.get("model_runner")
            loaded = runner.get("loaded", []) if isinstance(runner, dict) else []
            tags = [m.get("tag", "") if isinstance(m, dict) else str(m) for m in loaded]
            return pb.ListModelsResponse(
                routing_json=json.dumps(doc.get("routing"), sort_keys=True),
                loaded_models=[t for t in tags if t],
                details_json=json.dumps(doc, sort_keys=True, default=str),
            )

        return await self._serve(request, context, body, "ListModels")


def rpc_handler(servicer: GraphSAGEServicer) -> grpc.GenericRpcHandler:
    """Like the generated ``add_GraphSAGEServicer_to_server``, but with a deserializer that turns
    undecodable bytes into INVALID_ARGUMENT instead of grpc's INTERNAL."""
    handlers = {
        "Predict": grpc.unary_unary_rpc_method_handler(
            servicer.Predict,
            request_deserializer=_lenient(pb.PredictRequest),
            response_serializer=pb.PredictResponse.SerializeToString,
        ),
        "UpdateGraph": grpc.unary_unary_rpc_method_handler(
            servicer.UpdateGraph,
            request_deserializer=_lenient(pb.UpdateGraphRequest),
            response_serializer=pb.UpdateGraphResponse.SerializeToString,
        ),
        "ListModels": grpc.unary_unary_rpc_method_handler(
            servicer.ListModels,
            request_deserializer=_lenient(pb.ListModelsRequest),
            response_serializer=pb.ListModelsResponse.SerializeToString,
        ),
    }
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials | None:
    """TLS credentials from the gateway's certificate and key (PEM), or None for plain gRPC."""
    if not cert_file:
        return None
    with open(key_file, "rb") as key, open(cert_file, "rb") as cert:
        return grpc.ssl_server_credentials([(key.read(), cert.read())])


async def start_grpc_server(
    core: GatewayCore,
    access: GatewayAccess,
    port: int,
    *,
    host: str,
    max_receive_bytes: int,
    max_concurrent_rpcs: int,
    tls_cert_file: str = "",
    tls_key_file: str = "",
) -> grpc.aio.Server | None:
    """Start ``graphsage.v1.GraphSAGE`` + health + reflection on ``host:port`` (port 0 picks a
    free one) and return the started server, or None (logged) when the port cannot be bound,
    e.g. another gateway worker holds it. The bound port is recorded as ``server.bound_port``."""
    credentials = server_credentials(tls_cert_file, tls_key_file)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.so_reuseport", 0),  # a taken port is an error, never silently shared
        ],
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )
    server.add_generic_rpc_handlers((rpc_handler(GraphSAGEServicer(core, access)),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)

    address = f"{host}:{port}"
    try:
        bound = (
            server.add_insecure_port(address) if credentials is None else server.add_secure_port(address, credentials)
        )
    except RuntimeError as exc:  # grpc >= 1.5x raises; older versions return 0
        log.debug("binding %s: %s", address, exc)
        bound = 0
    if not bound:
        log.warning(
            "gRPC front end NOT started: cannot bind %s (port in use, e.g. by another "
            "gateway worker, which then serves gRPC). This worker serves HTTP only.",
            address,
        )
        await server.stop(None)
        return None
    await server.start()
    server.bound_port = bound
    log.info(
        "gRPC front end (graphsage.v1.GraphSAGE, health, reflection) listening on %s:%d%s",
        host,
        bound,
        " (TLS)" if credentials is not None else "",
    )
    return server
