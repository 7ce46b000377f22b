"""A minimal client of the gateway's gRPC API (``graphsage.v1.GraphSAGE``), and how to call it.

From Python::

    from services.grpc_client import predict
    out = predict("127.0.0.1:50051", [1, 2, 3], api_key="gsk_...", seed=7)
    out["model"], out["predictions"][0]["label"]

From a shell (prints the response as JSON; a gRPC error prints ``{"error", "code"}`` to stderr
and exits 1)::

    python -m services.grpc_client --target 127.0.0.1:50051 --node-ids 1,2,3 [--api-key K]
        [--model graphsage] [--version V] [--fanout 10,5] [--routing-key user-42] [--seed 7]
        [--embedding] [--explain] [--list-models]

The key is sent as ``authorization: Bearer <key>`` metadata (``x-api-key: <key>`` works too).
Any other language: generate stubs from services/proto/graphsage/v1/predict.proto, or use
reflection (``grpcurl -plaintext -d '{"node_ids": [1]}' 127.0.0.1:50051
graphsage.v1.GraphSAGE/Predict``). Health: the standard ``grpc.health.v1.Health/Check``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from services.grpc_codegen import ensure_stubs

ensure_stubs()

from services.grpc_gen.graphsage.v1 import predict_pb2 as pb  # noqa: E402
from services.grpc_gen.graphsage.v1 import predict_pb2_grpc as pb_grpc  # noqa: E402

# Responses with embeddings for many nodes can pass grpc's default 4 MiB client limit.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


def _metadata(api_key: str | None) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {api_key}")] if api_key else []


def build_request(
    node_ids: list[int],
    *,
    model: str = "",
    version: str | None = None,
    fanout: list[int] | None = None,
    routing_key: str | None = None,
    seed: int | None = None,
    embedding: bool = False,
    min_sequence: int | None = None,
    explain: bool = False,
) -> Any:
    """A ``PredictRequest``; fields left None stay absent (proto3 ``optional``)."""
    msg = pb.PredictRequest(node_ids=node_ids, model=model, fanout=fanout or [], embedding=embedding, explain=explain)
    if version is not None:
        msg.version = version
    if routing_key is not None:
        msg.routing_key = routing_key
    if seed is not None:
        msg.seed = seed
    if min_sequence is not None:
        msg.min_sequence = min_sequence
    return msg


def to_dict(msg: Any) -> dict[str, Any]:
    """Proto -> JSON-able dict with snake_case names, int64 as numbers, and the zero values of
    non-optional fields present (``degraded: false``, ``stale: false``)."""
    out = MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)

    def ints(d: dict[str, Any], *keys: str) -> None:
        for k in keys:  # MessageToDict writes 64-bit integers as strings (JSON mapping)
            if k in d:
                d[k] = int(d[k])

    for p in out.get("predictions", []):
        ints(p, "node_id")
        p.setdefault("label", None)  # absent optional fields as null, as in the HTTP JSON
        p.setdefault("score", None)
        for n in p.get("explanation", {}).get("neighbours", []):
            ints(n, "node_id")
            n["hop2"] = [int(v) for v in n.get("hop2", [])]
    return out


def channel(target: str, tls_ca_file: str | None = None) -> grpc.Channel:
    """A plain channel, or a TLS one verifying the server with ``tls_ca_file`` (PEM)."""
    if tls_ca_file is None:
        return grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    with open(tls_ca_file, "rb") as f:
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(f.read()), options=CHANNEL_OPTIONS)


def predict(
    target: str,
    node_ids: list[int],
    api_key: str | None = None,
    *,
    timeout_s: float = 10.0,
    tls_ca_file: str | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """One ``Predict`` call; ``kw``: model, version, fanout, routing_key, seed, embedding, explain.
    Raises ``grpc.RpcError`` (``.code()``, ``.details()``) on any error status."""
    with channel(target, tls_ca_file) as channel_:
        stub = pb_grpc.GraphSAGEStub(channel_)
        reply = stub.Predict(build_request(list(node_ids), **kw), metadata=_metadata(api_key), timeout=timeout_s)
    return to_dict(reply)


def list_models(
    target: str, api_key: str | None = None, *, timeout_s: float = 10.0, tls_ca_file: str | None = None
) -> dict[str, Any]:
    with channel(target, tls_ca_file) as channel_:
        reply = pb_grpc.GraphSAGEStub(channel_).ListModels(
            pb.ListModelsRequest(), metadata=_metadata(api_key), timeout=timeout_s
        )
    return {
        "routing": json.loads(reply.routing_json or "null"),
        "loaded_models": list(reply.loaded_models),
        "details": json.loads(reply.details_json or "null"),
    }


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.grpc_client", description="Call the gateway's gRPC API and print JSON."
    )
    parser.add_argument("--target", default="127.0.0.1:50051", help="host:port (default %(default)s)")
    parser.add_argument("--node-ids", type=_ints, help="comma-separated node ids")
    parser.add_argument("--api-key", default=os.environ.get("GSAGE_API_KEY"), help="API key (default: $GSAGE_API_KEY)")
    parser.add_argument("--model", default="")
    parser.add_argument("--version")
    parser.add_argument("--fanout", type=_ints)
    parser.add_argument("--routing-key")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--embedding", action="store_true")
    parser.add_argument("--explain", action="store_true", help="also each node's neighbourhood and influences")
    parser.add_argument("--list-models", action="store_true", help="call ListModels instead")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--tls-ca", metavar="PEM", help="TLS: verify the gateway with this CA (default: plain)")
    args = parser.parse_args(argv)
    try:
        if args.list_models:
            out = list_models(args.target, args.api_key, timeout_s=args.timeout, tls_ca_file=args.tls_ca)
        else:
            if not args.node_ids:
                parser.error("--node-ids is required (or --list-models)")
            out = predict(
                args.target,
                args.node_ids,
                args.api_key,
                timeout_s=args.timeout,
                tls_ca_file=args.tls_ca,
                model=args.model,
                version=args.version,
                fanout=args.fanout,
                routing_key=args.routing_key,
                seed=args.seed,
                embedding=args.embedding,
                explain=args.explain,
            )
    except grpc.RpcError as exc:
        print(json.dumps({"error": exc.details(), "code": exc.code().name}), file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
