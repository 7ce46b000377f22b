"""float32 -> float16 narrowing of feature rows for transport, through ONNX Runtime's ``Cast``.

numpy converts element by element in software, which was the largest single cost of the
FeatureRunner on bulk requests (the ``feature_bulk256`` py-spy profile of ``python -m
bench.suite``). ONNX Runtime's ``Cast`` uses the CPU's conversion instructions, many times faster
on the same rows, with bit-identical results (round to nearest even, overflow to inf, NaN kept;
asserted in tests). No benchmark times the two side by side: a ``timeit`` of
``astype(np.float16)`` against ``to_dtype`` on a bulk request's rows would. One tiny session per
process, made on first use; numpy stays the fallback when ONNX Runtime cannot load.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

log = logging.getLogger("graphsage.features")

_lock = threading.Lock()
_session: Any = None
_unavailable = False


def _cast_session() -> Any:
    global _session, _unavailable
    if _session is not None:  # the hot path: no lock once built
        return _session
    with _lock:
        if _session is None and not _unavailable:
            try:
                _session = _build_session()
            except Exception:
                log.exception("ONNX Runtime Cast unavailable; narrowing rows with numpy")
                _unavailable = True
        return _session


def _build_session() -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["rows"], ["narrow"], to=TensorProto.FLOAT16)],
        "narrow_rows",
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("narrow", TensorProto.FLOAT16, [None, None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one core per worker, as the model runner
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def to_dtype(rows: np.ndarray, dtype: str | np.dtype) -> np.ndarray:
    """``rows`` as ``dtype``; float32 -> float16 on 2-D rows goes through ONNX Runtime."""
    target = np.dtype(dtype)
    if rows.dtype == target:
        return rows
    if target == np.float16 and rows.dtype == np.float32 and rows.ndim == 2 and rows.size:
        session = _cast_session()
        if session is not None:
            return session.run(None, {"rows": np.ascontiguousarray(rows)})[0]
    return rows.astype(target)
