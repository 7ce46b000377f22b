"""The body of ``FeatureRunner.predict``: call options + the node ids (and per-node seeds) as
int64 arrays, one raw ``application/octet-stream`` body.

``wire.envelope({"model", "embedding", "dtype", "fanout", "seed"[, "min_sequence", "explain"]},
wire.pack({"node_ids"[, "seeds"]}))``. Keyword arguments through BentoML's client were pickled and written in chunks, a
visible share of the gateway's busy time on bulk requests (the ``gateway_bulk256`` py-spy
profile of ``python -m bench.suite``), and the runner validated two 256-int JSON lists with
pydantic.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np

from common import wire
from common.errors import KindOfError


def random_seed() -> int:
    """A seed for a request that sent none (63 bits: a non-negative int64 on the wire)."""
    return secrets.randbits(63)


# The FeatureRunner's answer while a request's ``min_sequence`` is not applied yet (425 Too Early):
# the gateway answers it 503 with Retry-After, and it is no failure of the FeatureRunner.
NOT_YET_APPLIED = 425


# The explanation's arrays beside the answer's (``common.wire``), first axis the targets.
EXPLANATION_ARRAYS = ("explain_hop1", "explain_hop2", "explain_classes", "explain_influence")


class ExplainTooLarge(KindOfError):
    """More node ids than one explained request may carry (``GSAGE_EXPLAIN_MAX_NODES``)."""

    status_code = 413


def check_explain_size(nodes: int, limit: int) -> None:
    """Raise ``ExplainTooLarge`` naming the limit when ``nodes`` is over it."""
    if nodes > limit:
        raise ExplainTooLarge(f"explain: {nodes} node ids in one request; at most {limit} per explained request "
                              f"(GSAGE_EXPLAIN_MAX_NODES): each costs one more tree per hop-1 neighbour")


class BadPredictRequest(ValueError):
    """A body that is not a well-formed predict request."""


def encode(node_ids: Sequence[int], seeds: Sequence[int], fanout: Sequence[int] | None, model: str,
           embedding: bool, dtype: str, min_sequence: int = 0, explain: bool = False,
           premean: bool | None = None) -> bytes:
    """One seed for all nodes travels in the options (the common case: one client request).
    ``min_sequence``: answer only once this graph update is applied (0: now). ``explain``: also
    the neighbourhood and each hop-1 neighbour's influence (``runners.feature.explain``).
    ``premean``: the input layout asked for (None: the FeatureRunner's choice by the call's size;
    True: premean where the version takes it; False: full rows), so the shadow canary's merged
    call runs on the layout its primary's call ran on."""
    arrays = {"node_ids": np.asarray(node_ids, dtype=np.int64)}
    options: dict[str, Any] = {"model": model, "embedding": embedding, "dtype": dtype,
                               "fanout": list(fanout) if fanout is not None else None, "seed": None}
    if min_sequence:
        options["min_sequence"] = int(min_sequence)
    if explain:
        options["explain"] = True
    if premean is not None:
        options["premean"] = bool(premean)
    if len(set(seeds)) == 1:
        options["seed"] = int(seeds[0])
    else:
        arrays["seeds"] = np.asarray(seeds, dtype=np.int64)
    return wire.pack(arrays, prefix=wire.envelope_head(options))


def decode(body: bytes | bytearray | memoryview) -> tuple[dict[str, Any], np.ndarray, np.ndarray | None]:
    """(options, node ids, per-node seeds or None); raises BadPredictRequest. The values are
    checked by ``NeighbourhoodBuilder.validate``; this checks the container and the types."""
    try:
        options, payload = wire.open_envelope(body)
        _, arrays = wire.unpack(payload)
    except wire.WireError as exc:
        raise BadPredictRequest(str(exc)) from exc
    ids, seeds = arrays.pop("node_ids", None), arrays.pop("seeds", None)
    if ids is None or arrays or ids.ndim != 1 or ids.dtype != np.int64:
        raise BadPredictRequest("expected an int64 node_ids array (and an int64 seeds array) and nothing else")
    if seeds is not None and (seeds.dtype != np.int64 or seeds.shape != ids.shape):
        raise BadPredictRequest("seeds must be int64, one per node id")
    if not isinstance(options.get("model"), str) or not isinstance(options.get("embedding"), bool):
        raise BadPredictRequest("options: model must be a string, embedding a bool")
    min_sequence = options.get("min_sequence", 0)
    if not isinstance(min_sequence, int) or isinstance(min_sequence, bool) or min_sequence < 0:
        raise BadPredictRequest("options: min_sequence must be an integer >= 0")
    if not isinstance(options.get("explain", False), bool):
        raise BadPredictRequest("options: explain must be a bool")
    if options.get("premean") is not None and not isinstance(options["premean"], bool):
        raise BadPredictRequest("options: premean must be a bool or absent")
    return options, ids, seeds
