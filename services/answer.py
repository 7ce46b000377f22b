"""A prediction answer kept as columns (the model runner's arrays), rendered once at the edge.

The public shape is ``services.protocol.PredictResponse`` (OpenAPI, gRPC). Building one pydantic
``NodePrediction`` per node, even with ``model_construct``, was the gateway's largest cost for bulk
requests (the ``gateway_bulk256`` py-spy profile of ``python -m bench.suite``). An ``Answer`` holds
``probs [n, C]`` (and ``embedding``) as they arrived and renders straight to JSON bytes with orjson,
to protobuf, or to the pydantic model where a caller wants objects.

Degraded answers carry, per node, either the node's last answer (``stale``) or nothing
(``known`` False): null label and score, empty probabilities.

Every answer says the precision the model runner served it at (its reply's meta ``precision``:
``fp32``, ``int8``). The rows of a degraded answer may come from several earlier answers, so it
says theirs when they agree, ``PRECISION_MIXED`` when they differ and ``PRECISION_NONE`` when it
has no row; ``PRECISION_UNKNOWN`` where the model runner did not say (one older than the field),
so the public field is always a string.

An explained answer also carries the FeatureRunner's explanation arrays
(``runners.feature.explain.Explanation.arrays``), rendered per node as ``protocol.Explanation``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

from common.feature_runner_api import EXPLANATION_ARRAYS
from services.protocol import PredictResponse

MULTILABEL_THRESHOLD = 0.5
# From this many nodes the column rendering is the cheaper one. No benchmark covers the crossover:
# timing ``_json_per_node`` against ``_json_columns`` in-process at a few sizes would show it.
COLUMNS_MIN_NODES = 4
PRECISION_NONE = "none"  # a degraded answer with no earlier row: no model computed any of it
PRECISION_MIXED = "mixed"  # a degraded answer repeating rows served at different precisions
PRECISION_UNKNOWN = "unknown"  # the model runner's meta had no precision


@dataclasses.dataclass(eq=False)
class Answer:
    model: str
    node_ids: list[int]
    probs: np.ndarray  # [n, C] float32
    multilabel: bool = False
    embedding: np.ndarray | list[np.ndarray | None] | None = None  # [n, H] when asked for; per row when stale
    degraded: bool = False
    degraded_reason: str | None = None
    known: np.ndarray | None = None  # [n] bool; None: every node has an answer
    stale: bool = False  # the known rows are earlier answers (degraded mode)
    explanation: dict[str, np.ndarray] | None = None  # explain_hop1 [n, k1], explain_hop2, ... (explain)
    precision: str = PRECISION_UNKNOWN  # what the model runner served it at ("fp32", "int8")

    def nodes(self) -> Iterator[dict[str, Any]]:
        """One dict per node in ``NodePrediction``'s field order; arrays stay numpy rows."""
        probs, emb = self.probs, self.embedding
        has_rows = probs.shape[0] > 0 and probs.shape[1] > 0
        labels = probs.argmax(1).tolist() if has_rows else []
        scores = probs.max(1) if has_rows else []
        known = self.known.tolist() if self.known is not None else None
        for i, node in enumerate(self.node_ids):
            if known is not None and not known[i]:
                yield {
                    "node_id": node,
                    "label": None,
                    "labels": None,
                    "score": None,
                    "probabilities": [],
                    "embedding": None,
                    "stale": False,
                }
                continue
            row = probs[i]
            out = {
                "node_id": node,
                "label": None if self.multilabel else labels[i],
                "labels": np.flatnonzero(row >= MULTILABEL_THRESHOLD).tolist() if self.multilabel else None,
                "score": scores[i],
                "probabilities": row,
                "embedding": emb[i] if emb is not None else None,
                "stale": self.stale,
            }
            if self.explanation is not None:  # absent from a plain answer (the schema's default)
                out["explanation"] = explanation_of(self.explanation, i)
            yield out

    def to_json(self) -> bytes:
        if (
            self.multilabel
            or self.known is not None
            or not isinstance(self.embedding, (np.ndarray, type(None)))
            or self.probs.shape[0] < COLUMNS_MIN_NODES
            or self.probs.shape[1] == 0
            or self.explanation is not None
        ):
            return self._json_per_node()
        return self._json_columns()

    def _json_per_node(self) -> bytes:
        return orjson.dumps(
            {**self._head(), "predictions": list(self.nodes())},
            option=orjson.OPT_SERIALIZE_NUMPY,
        )

    def _json_columns(self) -> bytes:
        """The same bytes as ``_json_per_node`` for a multiclass answer with every node known: each
        column is serialised once by orjson and cut into rows, instead of one dict per node
        (on bulk requests, the gateway's largest own cost after the stale store in the
        ``gateway_bulk256`` py-spy profile of ``python -m bench.suite``)."""
        probs = self.probs
        probs_rows = _row_fragments(probs)
        scores = orjson.dumps(probs.max(1), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
        labels = probs.argmax(1).tolist()
        emb = self.embedding  # an array here: to_json sends per-row embeddings to the per-node rendering
        emb_rows = (
            [b"[" + r + b"]" for r in _row_fragments(np.asarray(emb))] if emb is not None else [b"null"] * len(labels)
        )
        stale = b"true" if self.stale else b"false"
        nodes = b",".join(
            [
                b'{"node_id":%d,"label":%d,"labels":null,"score":%b,"probabilities":[%b],"embedding":%b,"stale":%b}'
                % (node, label, score, row, e, stale)
                for node, label, score, row, e in zip(self.node_ids, labels, scores, probs_rows, emb_rows)
            ]
        )
        head = orjson.dumps(self._head())
        return head[:-1] + b',"predictions":[' + nodes + b"]}"

    def _head(self) -> dict[str, Any]:
        """The answer-level fields, in ``PredictResponse``'s order."""
        return {
            "model": self.model,
            "precision": self.precision,
            "degraded": self.degraded,
            "degraded_reason": self.degraded_reason,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values, the same as ``to_response().model_dump(exclude_unset=True)``
        (a plain answer has no ``explanation`` key)."""
        return orjson.loads(self.to_json())

    def to_response(self) -> PredictResponse:
        return PredictResponse.model_validate_json(self.to_json())


def _row_fragments(a: np.ndarray) -> list[bytes]:
    """Each row of a non-empty 2-D array as orjson writes it, without its brackets."""
    body = orjson.dumps(np.ascontiguousarray(a), option=orjson.OPT_SERIALIZE_NUMPY)  # b"[[..],[..]]"
    return body[2:-2].split(b"],[")


def explanation_of(arrays: dict[str, np.ndarray], i: int) -> dict[str, Any]:
    """Node ``i``'s ``protocol.Explanation`` from the explanation arrays: the real slots, in
    order (the sampler fills slots in order, so the empty ones are the last)."""
    hop1, hop2, influence = arrays["explain_hop1"][i], arrays["explain_hop2"][i], arrays["explain_influence"][i]
    neighbours = []
    for j in np.flatnonzero(hop1 >= 0).tolist():
        second = hop2[j][hop2[j] >= 0]
        neighbours.append(
            {
                "node_id": int(hop1[j]),
                "influence": influence[j],
                "hop2": second,
                "hop2_empty": int(hop2.shape[1] - second.size),
            }
        )
    return {
        "classes": arrays["explain_classes"][i],
        "neighbours": neighbours,
        "empty_slots": int(hop1.size - len(neighbours)),
    }


def from_wire(node_ids: list[int], meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Answer:
    """The model runner's answer (``common.wire`` arrays + meta) for ``node_ids``, with the
    FeatureRunner's explanation when it sent one. Every request of a merged call gets this
    call's meta, so each says the precision of the call that answered it."""
    explanation = {k: arrays[k] for k in EXPLANATION_ARRAYS} if EXPLANATION_ARRAYS[0] in arrays else None
    return Answer(
        meta["model"],
        node_ids,
        arrays["probs"],
        meta.get("task") == "multilabel",
        arrays.get("embedding"),
        explanation=explanation,
        precision=str(meta.get("precision") or PRECISION_UNKNOWN),
    )
