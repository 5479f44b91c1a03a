"""Values between numpy and ONNX Runtime: element types ORT's run() cannot return (bfloat16,
float8, 4- and 2-bit types) through OrtValues, sub-byte types packed as ONNX packs them, and
map values typed as the model declares them (ORT hands them back as Python numbers).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from xbackend.errors import RunnerFailedError
from xbackend.numerics.values import Value

__all__ = [
    "from_ortvalue",
    "map_value_dtype",
    "numpy_readable",
    "pack_bits",
    "to_ort_feeds",
    "typed_map_values",
    "unpack_bits",
]


_NUMPY_TYPES = frozenset(
    [
        "float",
        "double",
        "float16",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
        "string",
        "complex64",
        "complex128",
    ]
)
_TENSOR = re.compile(r"^tensor\((\w+)\)$")


_MAP_VALUES = re.compile(r"map\(\w+,\s*tensor\((\w+)\)\)")
_MAP_DTYPES = {"float": "float32", "double": "float64", "int64": "int64"}


def map_value_dtype(ort_type: str) -> str | None:
    """The numpy dtype a map's values are declared as ('seq(map(int64,tensor(float)))' ->
    float32): ORT hands map values back as Python numbers, which carry no width."""
    m = _MAP_VALUES.search(ort_type)
    return _MAP_DTYPES.get(m.group(1)) if m else None


def typed_map_values(value: Any, dtype: str) -> Any:
    """Map values (in a sequence of maps, or one map) as 0-d arrays of their declared dtype."""
    if isinstance(value, dict):
        return {key: np.asarray(item, dtype=dtype) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [typed_map_values(v, dtype) for v in value]
    return value


def numpy_readable(ort_type: str) -> bool:
    """False for tensor types ORT's run() cannot return (bfloat16, float8, int4, ...)."""
    m = _TENSOR.match(ort_type)
    return m is None or m.group(1) in _NUMPY_TYPES


# Sub-byte types ml_dtypes holds one per byte and ONNX packs, lowest bits first: bits each.
_PACKED_BITS = {"int4": 4, "uint4": 4, "float4_e2m1fn": 4, "int2": 2, "uint2": 2}


def pack_bits(a: np.ndarray, bits: int) -> np.ndarray:
    """One element per byte (its low `bits` bits) packed 8 // bits per byte, lowest first."""
    per = 8 // bits
    flat = np.require(a, requirements="C").reshape(-1).view(np.uint8) & np.uint8((1 << bits) - 1)
    padded = np.zeros(-(-flat.size // per) * per, np.uint8)
    padded[: flat.size] = flat
    lanes = padded.reshape(-1, per)
    out = np.zeros(lanes.shape[0], np.uint8)
    for k in range(per):
        out |= lanes[:, k] << np.uint8(k * bits)
    return out


def unpack_bits(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """The inverse of pack_bits: n elements, one per byte in its low bits (as ml_dtypes holds
    them, signed types too)."""
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    lanes = np.stack([(packed >> np.uint8(k * bits)) & mask for k in range(per)], axis=1)
    return np.ascontiguousarray(lanes.reshape(-1)[:n])


def _to_ortvalue(a: np.ndarray) -> Any:
    import onnxruntime as ort  # engine: onnxruntime
    from onnx import helper  # onnx in workers: a foreign environment may lack onnx

    elem = helper.np_dtype_to_tensor_dtype(a.dtype)
    bits = _PACKED_BITS.get(str(a.dtype))
    if bits is not None:  # ORT reads these packed: an OrtValue of the shape, the packed bytes copied in
        packed = pack_bits(a, bits)
        v = ort.OrtValue.ortvalue_from_shape_and_type(list(a.shape), elem)
        if v.tensor_size_in_bytes() != packed.nbytes:
            raise RunnerFailedError(f"cannot hand onnxruntime a {a.dtype} tensor of shape {list(a.shape)}")
        if packed.nbytes:
            ctypes.memmove(v.data_ptr(), packed.ctypes.data, packed.nbytes)
        return v
    raw = a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.require(raw, requirements="C"), elem)


def from_ortvalue(v: Any) -> np.ndarray:
    """Copy an OrtValue tensor of any element type into a numpy (ml_dtypes) array; packed
    sub-byte types are unpacked to one element per byte."""
    from onnx import helper  # onnx in workers: a foreign environment may lack onnx

    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(v.element_type()))
    out = np.empty(tuple(v.shape()), dtype=dtype)
    bits = _PACKED_BITS.get(str(dtype))
    if bits is not None:
        packed = np.empty(v.tensor_size_in_bytes(), np.uint8)
        if packed.nbytes:
            ctypes.memmove(packed.ctypes.data, v.data_ptr(), packed.nbytes)
        out.reshape(-1).view(np.uint8)[:] = unpack_bits(packed, bits, out.size)
        return out
    if v.tensor_size_in_bytes() != out.nbytes:
        raise RunnerFailedError(
            f"onnxruntime returned {v.tensor_size_in_bytes()} bytes for a {v.data_type()} of shape "
            f"{v.shape()}; this element type is not read back"
        )
    if out.nbytes:
        ctypes.memmove(out.ctypes.data, v.data_ptr(), out.nbytes)
    return out


def to_ort_feeds(feeds: Mapping[str, Value]) -> dict[str, Any]:
    """numpy cannot hand ml_dtypes arrays (bfloat16, float8, ...) to ORT: wrap those as OrtValues."""
    return {
        key: _to_ortvalue(feed) if isinstance(feed, np.ndarray) and feed.dtype.kind == "V" else feed
        for key, feed in feeds.items()
    }
