"""A small binary container for named numpy arrays: what crosses process boundaries.

``b"GSW1"`` + u32 header length + JSON header ``{"meta": {...}, "arrays": [{"name", "dtype",
"shape"}]}`` + the raw buffers, each 8-byte aligned. Decoding makes zero-copy views with
``np.frombuffer``, never pickles, and rejects anything malformed with ``WireError``.
"""

from __future__ import annotations

import json
import struct
from typing import Annotated, Any

import numpy as np
from bentoml.validators import ContentType

# The return type of a BentoML API that answers with these bytes. The declared media type spares
# BentoML a pydantic JSON-schema build per response to find one (2% of the model runner's CPU).
BinaryBody = Annotated[bytes, ContentType("application/octet-stream")]

MAGIC = b"GSW1"
_ALIGN = 8
MAX_HEADER_BYTES = 64 * 1024
DTYPES = frozenset({"float32", "float16", "int32", "int64", "uint8"})


class WireError(ValueError):
    """A message that is not a well-formed array container."""


def pack(arrays: dict[str, np.ndarray], meta: dict[str, Any] | None = None) -> bytes:
    header = json.dumps(
        {"meta": meta or {}, "arrays": [{"name": k, "dtype": str(a.dtype), "shape": list(a.shape)} for k, a in arrays.items()]}
    ).encode()
    parts = [MAGIC, struct.pack("<I", len(header)), header]
    offset = len(MAGIC) + 4 + len(header)
    for a in arrays.values():
        pad = -offset % _ALIGN
        data = np.ascontiguousarray(a).tobytes()
        parts += [b"\0" * pad, data]
        offset += pad + len(data)
    return b"".join(parts)


def unpack(blob: bytes | bytearray | memoryview) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    view = memoryview(blob)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise WireError("not an array container (bad magic)")
    (hlen,) = struct.unpack("<I", view[4:8])
    if hlen > MAX_HEADER_BYTES or 8 + hlen > len(view):
        raise WireError("header length out of range")
    try:
        header = json.loads(bytes(view[8 : 8 + hlen]))
        meta, specs = header["meta"], header["arrays"]
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"bad header: {exc}") from exc
    if not isinstance(meta, dict) or not isinstance(specs, list):
        raise WireError("header must hold a meta object and an arrays list")
    arrays, offset = {}, 8 + hlen
    for spec in specs:
        name, arr, offset = _read_array(view, offset, spec)
        arrays[name] = arr
    if offset != len(view):
        raise WireError(f"{len(view) - offset} trailing bytes")
    return meta, arrays


def _read_array(view: memoryview, offset: int, spec: object) -> tuple[str, np.ndarray, int]:
    if not isinstance(spec, dict) or spec.get("dtype") not in DTYPES or not isinstance(spec.get("name"), str):
        raise WireError(f"array spec must have a name and a dtype in {sorted(DTYPES)}")
    shape = spec.get("shape")
    if not isinstance(shape, list) or len(shape) > 8 or not all(isinstance(s, int) and 0 <= s < 2**40 for s in shape):
        raise WireError(f"bad shape {shape!r}")
    dtype = np.dtype(spec["dtype"])
    offset += -offset % _ALIGN
    count = 1
    for s in shape:
        count *= s
    end = offset + count * dtype.itemsize
    if end > len(view):
        raise WireError("array data runs past the end of the message")
    return spec["name"], np.frombuffer(view[offset:end], dtype=dtype).reshape(shape), end
