import numpy as np

from runners.feature import narrowing
from runners.feature.narrowing import to_dtype


def _rows() -> np.ndarray:
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((517, 128)) * rng.choice([1e-6, 1e-2, 1.0, 1e3, 1e5], (517, 1))).astype(np.float32)
    rows[0, :8] = [np.nan, np.inf, -np.inf, 65504.0, 65520.0, -1e9, 6e-8, -0.0]  # edges: NaN, overflow, subnormal
    rows[1, :4] = [1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 2.0**-24, 2.0**-25]  # ties: round half to even
    return rows


def test_onnx_cast_is_bit_identical_to_numpy():
    rows = _rows()
    with np.errstate(over="ignore"):
        want = rows.astype(np.float16)
    got = to_dtype(rows, "float16")
    assert narrowing._session is not None, "ONNX Runtime's Cast was not used"
    assert got.dtype == np.float16 and got.shape == rows.shape
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_non_contiguous_rows_and_other_dtypes():
    rows = _rows()
    sliced = rows[::3, ::2]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(
            to_dtype(sliced, np.float16).view(np.uint16), sliced.astype(np.float16).view(np.uint16)
        )
    assert to_dtype(rows, "float32") is rows
    with np.errstate(over="ignore"):
        half = rows.astype(np.float16)
    np.testing.assert_array_equal(to_dtype(half, "float32"), half.astype(np.float32))
    assert to_dtype(np.empty((0, 128), np.float32), "float16").shape == (0, 128)


def test_numpy_is_the_fallback(monkeypatch):
    monkeypatch.setattr(narrowing, "_session", None)
    monkeypatch.setattr(narrowing, "_build_session", lambda: (_ for _ in ()).throw(ImportError("no onnxruntime")))
    monkeypatch.setattr(narrowing, "_unavailable", False)
    rows = _rows()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(
            to_dtype(rows, "float16").view(np.uint16), rows.astype(np.float16).view(np.uint16)
        )
    assert narrowing._unavailable is True
