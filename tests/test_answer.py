"""Answer: the columnar prediction renders exactly the documented PredictResponse shape."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from services.answer import Answer, from_wire
from services.prediction import StaleAnswers
from services.protocol import NodePrediction, PredictResponse

PROBS = np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]], dtype=np.float32)
EMB = np.array([[1.5, -2.0], [0.25, 3.0]], dtype=np.float32)


def expected(multilabel: bool, embedding: bool, precision: str = "fp32") -> PredictResponse:
    """What the per-node pydantic path built for the same arrays."""
    preds = []
    for node, row, emb in zip([7, 9], PROBS.tolist(), EMB.tolist()):
        preds.append(
            NodePrediction(
                node_id=node,
                label=None if multilabel else int(np.argmax(row)),
                labels=[j for j, x in enumerate(row) if x >= 0.5] if multilabel else None,
                score=max(row),
                probabilities=row,
                embedding=emb if embedding else None,
            )
        )
    return PredictResponse(model="graphsage:v1", precision=precision, predictions=preds)


@pytest.mark.parametrize("multilabel", [False, True])
@pytest.mark.parametrize("embedding", [False, True])
def test_json_matches_the_pydantic_shape(multilabel, embedding):
    meta = {"model": "graphsage:v1", "precision": "fp32", "task": "multilabel" if multilabel else "multiclass"}
    arrays = {"probs": PROBS, **({"embedding": EMB} if embedding else {})}
    answer = from_wire([7, 9], meta, arrays)
    got = orjson.loads(answer.to_json())
    # A plain answer leaves the optional ``explanation`` out (nothing rendered unless asked for).
    want = expected(multilabel, embedding).model_dump(exclude={"predictions": {"__all__": {"explanation"}}})
    assert "explanation" not in got["predictions"][0]
    assert list(got) == list(want) and [list(p) for p in got["predictions"]] == [list(p) for p in want["predictions"]]
    for g, w in zip(got["predictions"], want["predictions"]):
        for key in ("node_id", "label", "labels", "stale"):
            assert g[key] == w[key], key
        assert g["score"] == pytest.approx(w["score"], abs=1e-7)
        np.testing.assert_allclose(g["probabilities"], w["probabilities"], atol=1e-7)
        if embedding:
            np.testing.assert_allclose(g["embedding"], w["embedding"], atol=1e-7)
        else:
            assert g["embedding"] is None
    assert got["precision"] == "fp32"
    # And it validates as the public model.
    assert answer.to_response().predictions[1].node_id == 9


@pytest.mark.parametrize("nodes", [2, 6])  # the per-node and the column rendering
def test_the_model_runners_precision_reaches_json_and_grpc(nodes):
    from services.grpc_server import to_proto

    probs = np.resize(PROBS, (nodes, 3))
    meta = {"model": "graphsage:v1", "backend": "onnx-cpu", "precision": "int8", "task": "multiclass"}
    answer = from_wire(list(range(nodes)), meta, {"probs": probs})
    assert orjson.loads(answer.to_json())["precision"] == "int8"
    assert answer.to_response().precision == "int8"
    assert to_proto(answer).precision == "int8"
    assert to_proto(answer.to_response()).precision == "int8"
    # A model runner that does not say: still a string, never null.
    assert from_wire([7], {"model": "graphsage:v1"}, {"probs": PROBS[:1]}).to_dict()["precision"] == "unknown"


def test_a_degraded_answer_says_the_precision_of_the_rows_it_repeats():
    stale = StaleAnswers()
    stale.put("v", from_wire([1], {"model": "v", "precision": "int8"}, {"probs": PROBS[:1]}))
    stale.put("v", from_wire([2], {"model": "v", "precision": "fp32"}, {"probs": PROBS[1:]}))
    assert stale.degraded("v", [1, 3], "x").to_dict()["precision"] == "int8"  # 3: never answered
    assert stale.degraded("v", [2], "x").to_dict()["precision"] == "fp32"
    assert stale.degraded("v", [1, 2], "x").to_dict()["precision"] == "mixed"
    assert stale.degraded("v", [3], "x").to_response().precision == "none"


def test_degraded_answer_serves_stale_rows_and_nulls():
    stale = StaleAnswers()
    stale.put("graphsage:v1", from_wire([7, 9], {"model": "graphsage:v1"}, {"probs": PROBS, "embedding": EMB}))
    got = orjson.loads(stale.degraded("graphsage:v1", [9, 4], "feature runner unavailable: timeout").to_json())
    assert got["degraded"] is True and got["degraded_reason"].endswith("timeout")
    known, unknown = got["predictions"]
    assert known["node_id"] == 9 and known["stale"] is True and known["label"] == 0
    np.testing.assert_allclose(known["probabilities"], PROBS[1], atol=1e-7)
    np.testing.assert_allclose(known["embedding"], EMB[1], atol=1e-7)
    assert unknown == {
        "node_id": 4,
        "label": None,
        "labels": None,
        "score": None,
        "probabilities": [],
        "embedding": None,
        "stale": False,
    }
    # Nothing cached at all: every node unknown, still well-formed.
    empty = StaleAnswers().degraded("graphsage:v1", [1, 2], "x").to_response()
    assert [p.label for p in empty.predictions] == [None, None]


def test_stale_store_keeps_the_latest_rows_and_its_capacity():
    stale = StaleAnswers(capacity=4)  # generations of 2 rows
    stale.put("v", Answer("v", [1, 2, 3], PROBS[[0, 0, 0]]))
    stale.put("v", Answer("v", [1], PROBS[[1]]))  # 1 answered again: its latest row wins
    stale.put("v", Answer("v", [4], PROBS[[1]]))  # a full young generation: 2 and 3 age out
    assert stale.get("v", 2) is None and stale.get("v", 3) is None and stale.get("v", 4) is not None
    np.testing.assert_array_equal(stale.get("v", 1)[0], PROBS[1])
    assert len(stale) == 2
    assert stale.get("other", 1) is None


def test_stale_store_finds_every_node_of_the_last_half_capacity_rows():
    rng = np.random.default_rng(3)
    stale = StaleAnswers(capacity=50)
    history: list[tuple[int, int]] = []  # (node, step of the put), one per row put
    for step in range(300):
        nodes = list(dict.fromkeys(rng.integers(0, 80, size=int(rng.integers(1, 8))).tolist()))
        stale.put("v", Answer("v", nodes, np.full((len(nodes), 2), step, dtype=np.float32)))
        history.extend((n, step) for n in nodes)
        assert len(stale) <= stale.capacity
        latest = dict(history)  # each node's last put
        for node in {n for n, _ in history[-stale.capacity // 2 :]}:
            got = stale.get("v", node)
            assert got is not None and got[0][0] == latest[node], (step, node)


def test_column_rendering_is_byte_identical_to_the_per_node_path():
    rng = np.random.default_rng(11)
    for trial in range(300):
        n, classes = int(rng.integers(1, 40)), int(rng.integers(1, 12))
        probs = (rng.random((n, classes)) ** int(rng.integers(1, 30))).astype(np.float32)
        if trial % 7 == 0:
            probs[0, 0] = np.nan
        if trial % 5 == 0:
            probs *= np.float32(1e-30)
        emb = (rng.normal(size=(n, 3)) * 10.0 ** int(rng.integers(-8, 8))).astype(np.float32) if trial % 2 else None
        stale = trial % 3 == 0
        answer = Answer(
            "graphsage:v1",
            rng.integers(0, 2**40, n).tolist(),
            probs,
            embedding=emb,
            stale=stale,
            degraded=stale,
            degraded_reason='a "quoted" reason' if stale else None,
        )
        assert answer._json_columns() == answer._json_per_node(), trial
    # The cases the column path does not take still render.
    multilabel = Answer("graphsage:v1", [1], PROBS[:1], multilabel=True)
    assert orjson.loads(multilabel.to_json())["predictions"][0]["labels"] == [1]
