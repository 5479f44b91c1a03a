"""How many bytes each tensor of one run takes, from the graph alone (onnx's shape inference with
the feeds' shapes, and ONNX Runtime's symbolic one where onnx's leaves a dimension open), and the
exposed tensors cut into windows that fit a memory budget."""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from xbackend.errors import UsageError
from xbackend.files.textfmt import gib
from xbackend.model.extdata import raw_size

__all__ = [
    "DEFAULT_SHARE",
    "Footprint",
    "Sizes",
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
_MARGIN = 16  # the quick table sizes no further where one run takes under 1/_MARGIN of the budget


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
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True)
class Sizes(Mapping[str, int]):
    """Bytes of each tensor of one run, sized before anything runs (tensor -> bytes), and how."""

    by_tensor: Mapping[str, int]
    symbolic: int = 0  # sized by ONNX Runtime's symbolic shape inference (where it ran, it wins)
    onnx: int = 0  # sized by onnx's shape inference (data propagation) alone
    unsized: tuple[str, ...] = ()  # neither could: data-dependent, or an op they do not know
    measured: int = 0  # sized by running the model once, exposing the unsized (measured_by)
    measured_by: str = ""
    unmeasured: str = ""  # why the unsized could not be measured
    bounded: int = 0  # the budget the unsized were held under, at the largest sized tensor (no run)

    def __getitem__(self, name: str) -> int:
        return self.by_tensor[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_tensor)

    def __len__(self) -> int:
        return len(self.by_tensor)

    def sized(self, tensors: Sequence[str]) -> int:
        """Bytes of `tensors`, those sized before running alone (no guess)."""
        return sum(self.by_tensor.get(tensor, 0) for tensor in tensors)

    def with_measured(self, measured: Mapping[str, int], by: str) -> Sizes:
        """These sizes, the unsized tensors that `measured` holds sized as `by` ran them."""
        got = {t: measured[t] for t in self.unsized if t in measured}
        return replace(
            self,
            by_tensor={**self.by_tensor, **got},
            unsized=tuple(t for t in self.unsized if t not in got),
            measured=len(got),
            measured_by=by,
        )

    def describe(self) -> str:
        """How the tensors were sized, in one sentence (which shape inference, a run, and what was left
        unsized)."""
        sized = [f"{self.symbolic} by ONNX Runtime's symbolic shape inference"] if self.symbolic else []
        sized += [f"{self.onnx} by onnx's shape inference"] if self.onnx else []
        sized += [f"{self.measured} by running the model once on {self.measured_by}"] if self.measured else []
        text = f"tensors sized {', '.join(sized) or 'by neither shape inference'}"
        if self.unsized and self.bounded:
            text += (
                f", {len(self.unsized)} not sized (e.g. {self.unsized[0]}): every tensor, these counted "
                f"at the largest sized one, takes under 1/{_MARGIN} of {gib(self.bounded)}, so neither "
                "ONNX Runtime's symbolic inference nor a sizing run was needed"
            )
        elif self.unsized:
            why = f"; measuring them failed: {self.unmeasured}" if self.unmeasured else ""
            text += (
                f", {len(self.unsized)} not sized (e.g. {self.unsized[0]}; counted at the largest sized "
                f"tensor, and never the reason a run is refused{why})"
            )
        return text


def tensor_bytes(
    proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], budget: int | None = None
) -> Sizes:
    """Bytes of each tensor with the inputs at `shapes`: onnx's shape inference (with data
    propagation), and where it leaves a dimension open, ONNX Runtime's symbolic shape inference,
    whose sizes then win; a tensor neither sizes is left out, never guessed. The exporter's
    value_info is not trusted. Large weights become typed inputs first, so the proto inferred
    holds no weight (and never serializes past 2 GiB).

    `budget` (the quick table): where every tensor, each one onnx left open counted at the
    largest it sized, takes under 1/_MARGIN of it, the symbolic pass is not run (its import and
    run cost more than the table itself) and the open ones stay unsized, `bounded`."""
    graph = proto.graph
    light = helper.make_graph(
        list(graph.node),
        graph.name,
        [_fixed(vi, shapes.get(vi.name)) for vi in graph.input],
        list(graph.output),
        [
            initializer
            for initializer in graph.initializer
            if initializer.data_location != TensorProto.EXTERNAL and (raw_size(initializer) or 0) <= _SMALL
        ],
        value_info=[],
    )
    inits = {initializer.name for initializer in light.initializer}
    light.input.extend(
        helper.make_tensor_value_info(initializer.name, initializer.data_type, list(initializer.dims))
        for initializer in graph.initializer
        if initializer.name not in inits
        and initializer.name not in {input_name.name for input_name in graph.input}
    )
    for o in light.output:  # an output's declared shape is the exporter's word, not inferred
        if o.type.HasField("tensor_type"):
            o.type.tensor_type.ClearField("shape")
    model = helper.make_model(light, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    model.functions.extend(proto.functions)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # an op onnx cannot infer stops nothing: those tensors stay unsized
        inferred = model
    second = _known(inferred)
    produced = [output_name for node in graph.node for output_name in node.output if output_name]
    # Where onnx sizes every tensor (static shapes) the symbolic pass would agree: it runs, and
    # its second of import time is paid, only where onnx leaves a dimension open.
    open_ = [t for t in produced if t not in second]
    largest = max(second.values(), default=0)
    if open_ and budget is not None and _MARGIN * (sum(second.values()) + len(open_) * largest) < budget:
        return Sizes(second, onnx=len(produced) - len(open_), unsized=tuple(open_), bounded=budget)
    first = _known(_symbolic(model)) if open_ else {}
    out = {**{key: value for key, value in second.items() if key not in first}, **first}
    return Sizes(
        out,
        symbolic=sum(1 for t in produced if t in first),
        onnx=sum(1 for t in produced if t in second and t not in first),
        unsized=tuple(t for t in produced if t not in out),
    )


def _symbolic(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """ONNX Runtime's symbolic shape inference, or None where it is absent or gives up."""
    SymbolicShapeInference = _symbolic_shape_inference()
    if SymbolicShapeInference is None:
        return None
    quiet = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        # infer_shapes' own steps, less its save: where inference is incomplete it writes
        # sym_shape_infer_temp.onnx into the working directory, a file xbackend did not create
        symbolic_shape_inference = SymbolicShapeInference(2**31 - 1, True, False, 0)
        symbolic_shape_inference._preprocess(model)
        done = False
        while symbolic_shape_inference.run_:
            done = symbolic_shape_inference._infer_impl()
        symbolic_shape_inference._update_output_from_vi()
        out: onnx.ModelProto = symbolic_shape_inference.out_mp_
        return out if done else None
    except Exception:  # an op it does not know, a shape it cannot follow: onnx's word alone
        return None
    finally:
        quiet.setLevel(level)


@functools.cache
def _symbolic_shape_inference() -> Any:
    """ONNX Runtime's SymbolicShapeInference, read from its file: importing it as
    `onnxruntime.tools.symbolic_shape_infer` runs that package's __init__, which imports torch
    where it is installed (1.3 s and 300 MB for a class that needs sympy alone)."""
    try:
        found = importlib.util.find_spec("onnxruntime")
        if found is None or found.origin is None:
            return None
        path = Path(found.origin).parent / "tools" / "symbolic_shape_infer.py"
        spec = importlib.util.spec_from_file_location("onnxruntime.tools.symbolic_shape_infer", path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.SymbolicShapeInference
    except Exception:  # absent, or sympy missing: onnx's inference alone
        return None


def _known(model: onnx.ModelProto | None) -> dict[str, int]:
    """Bytes of every tensor whose every dimension the inference fixed."""
    if model is None:
        return {}
    out: dict[str, int] = {}
    for vi in [*model.graph.value_info, *model.graph.output, *model.graph.input]:
        n = _nbytes(vi.type)
        if n is not None:
            out[vi.name] = n
    return out


def _fixed(vi: onnx.ValueInfoProto, shape: Sequence[int] | None) -> onnx.ValueInfoProto:
    if shape is None or not vi.type.HasField("tensor_type"):
        return vi
    return helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, list(shape))


def _nbytes(tp: onnx.TypeProto) -> int | None:
    if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    dims = tp.tensor_type.shape.dim
    if not all(dim.HasField("dim_value") and dim.dim_value >= 0 for dim in dims):
        return None
    try:
        elem = int(tp.tensor_type.elem_type)
        bits = _PACKED_BITS.get(elem) or 8 * helper.tensor_dtype_to_np_dtype(elem).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return int((math.prod(dim.dim_value for dim in dims) * bits + 7) // 8)


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
    return sum(sizes.get(tensor, largest) for tensor in tensors)


def _largest(tensors: Sequence[str], sizes: Mapping[str, int]) -> int:
    return max((sizes[tensor] for tensor in tensors if tensor in sizes), default=0)


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
        tuple(windows),
        budget,
        total_bytes(tensors, sizes),
        sum(1 for tensor in tensors if tensor not in sizes),
    )
