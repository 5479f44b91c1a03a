"""How many bytes each tensor of one run takes, from the graph alone (onnx shape inference with
the feeds' shapes), and the exposed tensors cut into windows that fit a memory budget."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from xbackend.errors import UsageError
from xbackend.extdata import raw_size
from xbackend.textfmt import gib

__all__ = [
    "DEFAULT_SHARE",
    "Footprint",
    "available_memory",
    "parse_size",
    "plan_windows",
    "tensor_bytes",
    "total_bytes",
]

DEFAULT_SHARE = 0.8  # of the memory available when a comparison starts
_GiB = 2**30
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20}
_UNITS |= {"g": _GiB, "gb": 10**9, "gib": _GiB, "t": 2**40, "tb": 10**12, "tib": 2**40}
_PACKED_BITS = {int(TensorProto.INT4): 4, int(TensorProto.UINT4): 4}
_SMALL = 1024  # initializers up to this many bytes stay constants for shape inference


def parse_size(text: str) -> int:
    """'3GiB', '512MB', '2g', '1.5GiB' -> bytes."""
    t = text.strip().lower().replace(" ", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num) :]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or value <= 0 or not math.isfinite(value):
        raise UsageError(f"--max-memory takes a size such as 3GiB, 512MiB or 2GB, got {text!r}")
    return int(value * _UNITS[unit])


def available_memory() -> int | None:
    """Bytes the OS says are available now (Linux MemAvailable), or None where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def tensor_bytes(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Bytes of each tensor whose type and rank onnx's shape inference finds with the inputs at
    `shapes`; a dimension it leaves symbolic (a Range over the sequence length, say) counts as
    the largest input dimension; tensors of unknown rank are absent. Large weights become typed
    inputs first, so the proto inferred holds no weight (and never serializes past 2 GiB)."""
    g = proto.graph
    light = helper.make_graph(
        list(g.node),
        g.name,
        [_fixed(vi, shapes.get(vi.name)) for vi in g.input],
        list(g.output),
        [
            t
            for t in g.initializer
            if t.data_location != TensorProto.EXTERNAL and (raw_size(t) or 0) <= _SMALL
        ],
        value_info=[],
    )
    inits = {i.name for i in light.initializer}
    light.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in g.initializer
        if t.name not in inits and t.name not in {i.name for i in g.input}
    )
    model = helper.make_model(light, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    model.functions.extend(proto.functions)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # an op onnx cannot infer stops nothing: those tensors stay unsized
        inferred = model
    unknown = max((int(d) for shape in shapes.values() for d in shape), default=1)
    out: dict[str, int] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        n = _nbytes(vi.type, max(unknown, 1))
        if n is not None:
            out[vi.name] = n
    return out


def _fixed(vi: onnx.ValueInfoProto, shape: Sequence[int] | None) -> onnx.ValueInfoProto:
    if shape is None or not vi.type.HasField("tensor_type"):
        return vi
    return helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, list(shape))


def _nbytes(tp: onnx.TypeProto, unknown: int) -> int | None:
    if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else unknown for d in tp.tensor_type.shape.dim]
    try:
        elem = int(tp.tensor_type.elem_type)
        bits = _PACKED_BITS.get(elem) or 8 * helper.tensor_dtype_to_np_dtype(elem).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return int((math.prod(dims) * bits + 7) // 8)


@dataclass(frozen=True)
class Footprint:
    """A phase's exposed tensors cut into windows, each one session run under the budget."""

    windows: tuple[tuple[str, ...], ...]
    budget: int  # bytes of exposed tensors one window may hold
    run_bytes: int  # bytes of every exposed tensor of one run (unsized ones at the largest's size)
    unsized: int  # exposed tensors shape inference could not size


def total_bytes(tensors: Sequence[str], sizes: Mapping[str, int]) -> int:
    """Bytes of `tensors`, one shape inference could not size counted at the largest it could."""
    largest = _largest(tensors, sizes)
    return sum(sizes.get(t, largest) for t in tensors)


def _largest(tensors: Sequence[str], sizes: Mapping[str, int]) -> int:
    return max((sizes[t] for t in tensors if t in sizes), default=0)


def plan_windows(tensors: Sequence[str], sizes: Mapping[str, int], budget: int, what_to_do: str) -> Footprint:
    """Consecutive windows of `tensors` (model order) whose bytes stay within `budget`. A tensor
    shape inference could not size counts at the size of the largest that it could."""
    largest = _largest(tensors, sizes)
    windows: list[tuple[str, ...]] = []
    current: list[str] = []
    used = 0
    for t in tensors:
        n = sizes.get(t, largest)
        if n > budget:
            raise UsageError(
                f"tensor {t} alone takes {gib(n)}, more than the {gib(budget)} "
                f"--max-memory leaves for one window's tensors; {what_to_do}"
            )
        if current and used + n > budget:
            windows.append(tuple(current))
            current, used = [], 0
        current.append(t)
        used += n
    if current:
        windows.append(tuple(current))
    return Footprint(
        tuple(windows), budget, total_bytes(tensors, sizes), sum(1 for t in tensors if t not in sizes)
    )
