"""A small binary container for named numpy arrays: what crosses process boundaries.

``b"GSW1"`` + u32 header length + JSON header ``{"meta": {...}, "arrays": [{"name", "dtype",
"shape"}]}`` + the raw buffers, each 8-byte aligned. Decoding makes zero-copy views with
``np.frombuffer``, never pickles, and rejects anything malformed with ``WireError``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import orjson

MAGIC = b"GSW1"
_ALIGN = 8
MAX_HEADER_BYTES = 64 * 1024
DTYPES = frozenset({"float32", "float16", "int32", "int64", "uint8"})
# str(dtype) is far slower than a dict lookup, and pack names 2-4 arrays per hop (no benchmark
# isolates it; a timeit of the two would show it).
_DTYPE_NAMES = {np.dtype(name): name for name in DTYPES}


class WireError(ValueError):
    """A message that is not a well-formed array container."""


# A request body that carries a few call options in front of an encoded payload. It lets a runner
# API take the whole body as one raw ``bytes`` argument, which BentoML's client sends as is;
# keyword arguments would be pickled, a copy and a chunked write of the whole payload per call.
ENVELOPE_MAGIC = b"GSE1"


def envelope_head(options: dict[str, Any]) -> bytes:
    """The envelope's bytes in front of its payload (``pack(..., prefix=)`` writes both at once),
    padded with JSON white space to a multiple of 8 so that the payload's arrays stay aligned."""
    head = json.dumps(options).encode()
    head += b" " * (-(len(head) + 8) % _ALIGN)
    return b"".join([ENVELOPE_MAGIC, struct.pack("<I", len(head)), head])


def envelope(options: dict[str, Any], payload: bytes) -> bytes:
    return envelope_head(options) + payload


def open_envelope(body: bytes | bytearray | memoryview) -> tuple[dict[str, Any], memoryview]:
    """(options, payload view); raises WireError on anything malformed."""
    view = memoryview(body)
    options, end = _json_header(view, ENVELOPE_MAGIC, "request envelope")
    if not isinstance(options, dict):
        raise WireError("envelope header must be a JSON object")
    return options, view[end:]


def _json_header(view: memoryview, magic: bytes, what: str) -> tuple[Any, int]:
    """``magic`` + u32 length + JSON at the start of ``view``: (the parsed JSON, where it ends)."""
    if len(view) < 8 or bytes(view[:4]) != magic:
        raise WireError(f"not a {what} (bad magic)")
    (hlen,) = struct.unpack("<I", view[4:8])
    if hlen > MAX_HEADER_BYTES or 8 + hlen > len(view):
        raise WireError(f"{what} header length out of range")
    try:
        return orjson.loads(bytes(view[8 : 8 + hlen])), 8 + hlen
    except ValueError as exc:  # orjson.JSONDecodeError is one
        raise WireError(f"bad header of the {what}: {exc}") from exc


def pack(arrays: dict[str, np.ndarray], meta: dict[str, Any] | None = None, prefix: bytes = b"") -> bytes:
    """The container; ``prefix`` (e.g. an ``envelope_head``) is written in front of it in the same
    copy (alignment is relative to the container's start)."""
    header = orjson.dumps(
        {
            "meta": meta or {},
            "arrays": [
                {"name": k, "dtype": _DTYPE_NAMES.get(a.dtype) or str(a.dtype), "shape": list(a.shape)}
                for k, a in arrays.items()
            ],
        }
    )
    parts: list[Any] = [prefix, MAGIC, struct.pack("<I", len(header)), header]  # bytes and uint8 arrays
    offset = len(MAGIC) + 4 + len(header)
    for a in arrays.values():
        pad = -offset % _ALIGN
        data = np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # joined below: one copy, not two
        parts += [b"\0" * pad, data]
        offset += pad + len(data)
    return b"".join(parts)


def unpack(blob: bytes | bytearray | memoryview) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    view = memoryview(blob)
    header, offset = _json_header(view, MAGIC, "array container")
    try:
        meta, specs = header["meta"], header["arrays"]
    except (KeyError, TypeError) as exc:
        raise WireError(f"bad header: {exc}") from exc
    if not isinstance(meta, dict) or not isinstance(specs, list):
        raise WireError("header must hold a meta object and an arrays list")
    arrays = {}
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


class Packed:
    """A ``pack``ed message: what travels, opened on first use. From the wire it is the bytes,
    unpacked (zero-copy views) only by a service that reads it: one that relays it (the
    FeatureRunner, the model runner's answer) never opens it. Made here (``of``) it is the arrays,
    packed only when it goes on the wire: a caller in the same process (the co-located
    deployment's in-process calls) reads them with no pack and unpack between."""

    __slots__ = ("_data", "_unpacked")

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data
        self._unpacked: tuple[dict[str, Any], dict[str, np.ndarray]] | None = None

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None = None) -> Packed:
        """``meta``: JSON values whose types survive a round trip (str, int, float, bool, None,
        lists, dicts), so that an in-process reader sees what a remote one would."""
        packed = cls.__new__(cls)
        packed._data = None
        packed._unpacked = (meta or {}, arrays)
        return packed

    @property
    def data(self) -> bytes:
        """The bytes that travel (packed now, once, for a message made here)."""
        if self._data is None:
            assert self._unpacked is not None
            meta, arrays = self._unpacked
            self._data = pack(arrays, meta)
        return self._data

    def unpack(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(meta, arrays); raises ``WireError`` for a malformed message."""
        if self._unpacked is None:
            self._unpacked = unpack(self.data)
        return self._unpacked

    @property
    def meta(self) -> dict[str, Any]:
        return self.unpack()[0]

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return self.unpack()[1]
