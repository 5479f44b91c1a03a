"""Load and check an ONNX model; describe it as a ModelSpec (and a ModelRef for runners).

Nothing here imports a backend. The IR-version downgrade lives here because
several backends read older IR versions than onnx writes by default.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from xbackend.errors import ModelLoadError, first_line
from xbackend.files.codec import OMIT_DEFAULT
from xbackend.files.modelref import KNOWN_DOMAINS, ModelRef, model_file, np_dtype, read_model_bytes
from xbackend.files.textfmt import CONTROL
from xbackend.model.elemtypes import check_elem_types
from xbackend.model.extdata import (
    all_tensors,
    check_external_files,
    external_files,
    raw_size,
    uses_external_data,
)
from xbackend.model.extdata import load_external as read_weights
from xbackend.model.graphorder import index_bounds, sort_nodes
from xbackend.model.ortdomain import as_contrib, has_ort_onnx_ops

__all__ = [
    "ModelRef",
    "ModelSpec",
    "NodeTensor",
    "TensorSpec",
    "downgrade_blockers",
    "downgrade_ir",
    "kind_of",
    "load_model",
    "load_proto",
    "model_file",
    "model_sha256",
    "np_dtype",
    "parse_model",
    "read_model_bytes",
    "used_domains",
]

Dim = int | str | None

# IR version that introduced each element type (onnx.proto's IR changelog).
_DTYPE_MIN_IR: dict[str, int] = {
    "FLOAT8E4M3FN": 9,
    "FLOAT8E4M3FNUZ": 9,
    "FLOAT8E5M2": 9,
    "FLOAT8E5M2FNUZ": 9,
    "UINT4": 10,
    "INT4": 10,
    "FLOAT4E2M1": 11,
    "FLOAT8E8M0": 12,
    "UINT2": 13,
    "INT2": 13,
    "FLOAT6E2M3": 14,
    "FLOAT6E3M2": 14,
}
_DTYPE_ATTRS = frozenset({"to", "dtype", "output_dtype"})
_SHAPE_ONLY = frozenset({"Shape", "Size", "EyeLike"})  # outputs depend on input shapes only


def kind_of(tp: onnx.TypeProto) -> tuple[str, onnx.TypeProto | None]:
    """('tensor' | 'sequence' | 'optional' | 'map' | 'sparse_tensor' | 'unknown', innermost tensor type)."""
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return "tensor", tp
    if which == "sequence_type":
        return "sequence", kind_of(tp.sequence_type.elem_type)[1]
    if which == "optional_type":
        return "optional", kind_of(tp.optional_type.elem_type)[1]
    if which == "map_type":
        return "map", kind_of(tp.map_type.value_type)[1]
    if which == "sparse_tensor_type":
        return "sparse_tensor", None
    return "unknown", None


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, numpy dtype name and shape (str = symbolic, None = unknown).

    `kind` is the ONNX value kind; for sequences, optionals and maps, dtype and
    shape describe the innermost tensor type and `type_str` the whole type.
    """

    name: str
    dtype: str
    shape: tuple[Dim, ...] | None
    kind: str = "tensor"
    type_str: str = ""

    @classmethod
    def from_value_info(cls, vi: onnx.ValueInfoProto) -> TensorSpec:
        """The tensor a graph input or output declares (its dtype, shape, kind; `unknown` where untyped)."""
        kind, inner = kind_of(vi.type)
        type_str = _type_str(vi.type)
        if inner is None:
            return cls(vi.name, "unknown", None, kind, type_str)
        tt = inner.tensor_type
        dtype = _dtype_name(tt.elem_type)
        if not tt.HasField("shape"):
            return cls(vi.name, dtype, None, kind, type_str)
        dims: list[Dim] = []
        for dim in tt.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        return cls(vi.name, dtype, tuple(dims), kind, type_str)

    @property
    def dynamic_dims(self) -> list[int]:
        """Indices of dimensions that are not fixed numbers."""
        if self.shape is None:
            return []
        return [index for index, size in enumerate(self.shape) if not isinstance(size, int)]

    def shape_str(self) -> str:
        """The shape as `[1,?,64]` (`?` for what is not fixed)."""
        if self.shape is None:
            return "?"
        return "[" + ",".join("?" if size is None else str(size) for size in self.shape) + "]"


@dataclass(frozen=True)
class NodeTensor:
    """A tensor produced by a top-level node, with its position in topological order."""

    name: str
    op_type: str
    node: str
    index: int
    inputs: tuple[str, ...] = ()
    module: str = ""  # source module path (e.g. 'layer4.1.bn2') where the exporter recorded it
    subgraph: bool = False  # the node holds subgraphs (If, Loop, Scan): data flow is not visible


@dataclass(frozen=True)
class ModelSpec:
    """What xbackend needs to know about a model; built once, read by every later stage."""

    path: str
    sha256: str
    ir_version: int
    opsets: tuple[tuple[str, int], ...]
    producer: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    tensors: tuple[NodeTensor, ...]
    external_data: bool
    metadata: tuple[tuple[str, str], ...]
    index_bounds: tuple[tuple[str, int], ...] = ()  # input -> rows of the table it indexes (Gather)
    # --tensors: the names exposed (None: every tensor) and the selection that chose them
    exposed: tuple[str, ...] | None = None
    selection: str = "all"
    weight_bytes: int = 0  # the initializers' bytes as stored (external data included)
    # the file's nodes are not in topological order (ONNX Runtime's float16 converter): runs use a sorted copy
    unsorted: bool = field(default=False, metadata={OMIT_DEFAULT: True})

    @classmethod
    def from_proto(cls, proto: onnx.ModelProto, path: str, sha256: str) -> ModelSpec:
        """The spec of a loaded model: its inputs and outputs, opsets, nodes and tensors, without its
        weights' bytes."""
        graph = proto.graph
        init_names = {initializer.name for initializer in graph.initializer}
        return cls(
            path=path,
            sha256=sha256,
            ir_version=int(proto.ir_version),
            opsets=tuple(
                sorted((opset.domain or "ai.onnx", int(opset.version)) for opset in proto.opset_import)
            ),
            producer=f"{proto.producer_name} {proto.producer_version}".strip(),
            inputs=tuple(
                TensorSpec.from_value_info(input_name)
                for input_name in graph.input
                if input_name.name not in init_names
            ),
            outputs=tuple(TensorSpec.from_value_info(output_name) for output_name in graph.output),
            tensors=tuple(_node_tensors(graph)),
            external_data=uses_external_data(proto),
            metadata=tuple(sorted((prop.key, prop.value) for prop in proto.metadata_props)),
            index_bounds=tuple(sorted(index_bounds(graph, init_names).items())),
            weight_bytes=sum(raw_size(tensor) or 0 for tensor in all_tensors(graph)),
        )

    def ref(self) -> ModelRef:
        """The runner's view: absolute path and I/O names."""
        return ModelRef(
            str(Path(self.path).resolve()),
            self.ir_version,
            self.input_names,
            self.output_names,
            self.external_data,
            self.weight_bytes,
        )

    @property
    def output_names(self) -> tuple[str, ...]:
        """The graph's output names, in order."""
        return tuple(output.name for output in self.outputs)

    @property
    def input_names(self) -> tuple[str, ...]:
        """The graph's input names (initializers excluded), in order."""
        return tuple(i.name for i in self.inputs)

    def op_types(self) -> dict[str, str]:
        """Tensor name -> op type of the node that produced it."""
        return {tensor.name: tensor.op_type for tensor in self.tensors}

    def opset(self, domain: str = "ai.onnx") -> int | None:
        """The model's opset for `domain`, or None where it imports none."""
        return dict(self.opsets).get(domain)

    def modules(self) -> dict[str, str]:
        """Tensor name -> source module path, from the exporter's node scopes and xbackend's
        verified export map (which wins where both name one)."""
        out = {tensor.name: tensor.module for tensor in self.tensors if tensor.module}
        out.update({verified_module: key for key, verified_module in self.verified_modules().items()})
        return out

    def verified_modules(self) -> dict[str, str]:
        """Module path -> the tensor `xbackend export torch` verified as its output."""
        recorded = dict(self.metadata).get("xbackend.torch.module_outputs")
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            return {str(key): str(load) for key, load in json.loads(recorded or "{}").items()}
        return {}

    def data_dependent(self, sources: Iterator[str] | tuple[str, ...] | list[str]) -> set[str]:
        """Node outputs whose values depend on the values of `sources` (inputs), not only on
        their shapes: Shape and Size read shapes only, so what is computed from them (a Range
        over the batch size, a ConstantOfShape) is shape-derived. Control flow counts as data."""
        tainted = set(sources)
        for tensor in self.tensors:
            if tensor.op_type in _SHAPE_ONLY:
                continue
            if tensor.subgraph or any(input_name in tainted for input_name in tensor.inputs):
                tainted.add(tensor.name)
        return tainted

    def tensor_order(self) -> tuple[str, ...]:
        """Names to capture (those --tensors selected, resolved once into `exposed`), in
        topological order; graph outputs last if not produced by a node."""
        if self.exposed is not None:
            return self.exposed
        return self.all_tensors()

    @property
    def outputs_only(self) -> bool:
        """--tensors outputs (or --outputs-only): only the graph outputs are exposed."""
        return self.selection == "outputs"

    def output_order(self) -> tuple[str, ...]:
        """The graph outputs, in topological order (what a plain build captures)."""
        order = {tensor.name: tensor.index for tensor in self.tensors}
        return tuple(sorted(self.output_names, key=lambda output_name: order.get(output_name, len(order))))

    def all_tensors(self) -> tuple[str, ...]:
        """Every tensor, in topological order, whatever --tensors selected."""
        names = [tensor.name for tensor in self.tensors]
        seen = set(names)
        return tuple(names + [output_name for output_name in self.output_names if output_name not in seen])


def _type_str(tp: onnx.TypeProto) -> str:
    """'tensor(float)', 'seq(tensor(int64))', 'optional(seq(tensor(float)))', 'map(int64,tensor(float))'."""
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        elem = getattr(tp, which).elem_type
        name = TensorProto.DataType.Name(elem).lower() if elem else "undefined"
        return f"{'sparse_' if which == 'sparse_tensor_type' else ''}tensor({name})"
    if which == "sequence_type":
        return f"seq({_type_str(tp.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"optional({_type_str(tp.optional_type.elem_type)})"
    if which == "map_type":
        key = TensorProto.DataType.Name(tp.map_type.key_type).lower()
        return f"map({key},{_type_str(tp.map_type.value_type)})"
    return "unknown"


def _dtype_name(elem_type: int) -> str:
    if elem_type == TensorProto.UNDEFINED:
        return "unknown"
    try:
        dt: np.dtype[np.generic] = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
        return str(dt.name)
    except (KeyError, TypeError, ValueError):
        return str(TensorProto.DataType.Name(elem_type)).lower()


_NAME_SCOPES = "pkg.torch.onnx.name_scopes"
_REWRITE_RULE = "pkg.onnxscript.rewriter.rule_name"  # the optimizer rules that rewrote a node


def node_module(node: onnx.NodeProto, params: frozenset[str] = frozenset()) -> str:
    """The innermost source module the torch exporter attributed `node` to ('' if none). A node
    an optimizer fused (a Conv that absorbed a BatchNorm keeps only the BatchNorm's scope) is
    labelled with every module whose parameters it reads, too: `conv1+bn1`."""
    meta = {prop.key: prop.value for prop in node.metadata_props}
    try:
        scopes = ast.literal_eval(meta.get(_NAME_SCOPES, "[]"))
    except (ValueError, SyntaxError):
        return ""
    # [root '', module paths..., fx node name]
    own = str(scopes[-2]) if isinstance(scopes, list) and len(scopes) >= 3 else ""
    if not own or "Fuse" not in meta.get(_REWRITE_RULE, ""):
        return own
    owners = [name.rpartition(".")[0] for name in node.input if name in params and "." in name]
    return "+".join(dict.fromkeys([*owners, own]))


def _node_tensors(graph: onnx.GraphProto) -> Iterator[NodeTensor]:
    index = 0
    params = frozenset(initializer.name for initializer in graph.initializer)
    for i, node in enumerate(graph.node):
        module = node_module(node, params)
        sub = any(attribute.HasField("g") or len(attribute.graphs) for attribute in node.attribute)
        for out in node.output:
            if out:
                yield NodeTensor(
                    out,
                    node.op_type,
                    node.name or f"{node.op_type}_{i}",
                    index,
                    tuple(node.input),
                    module,
                    sub,
                )
                index += 1


def model_sha256(path: Path, proto: onnx.ModelProto | None = None, data: bytes | None = None) -> str:
    """sha256 over the model file and, in name order, every external data file it uses."""
    digest = hashlib.sha256()
    digest.update(path.read_bytes() if data is None else data)
    if proto is not None:
        for rel in external_files(proto):
            ext = path.parent / rel
            digest.update(rel.encode())
            if ext.is_file():
                digest.update(ext.read_bytes())
    return digest.hexdigest()


def parse_model(data: bytes, path: Path) -> onnx.ModelProto:
    """Parse model bytes read from `path` (external data not loaded)."""
    try:
        proto = onnx.load_model_from_string(data)
    except Exception as error:
        raise ModelLoadError(
            f"{path} is not a readable ONNX model ({type(error).__name__}: {first_line(error)}); "
            "pass a .onnx file written by onnx.save or an exporter"
        ) from error
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.graph.node:
        raise ModelLoadError(
            f"{path} parsed as protobuf but holds no ONNX graph (ir_version={proto.ir_version}, "
            f"{len(proto.graph.node)} nodes); pass a .onnx model file"
        )
    return proto


def load_proto(path: str | os.PathLike[str], load_external: bool = True) -> onnx.ModelProto:
    """Parse the model file; one-line ModelLoadError for every way that can fail."""
    p = Path(path)
    proto = parse_model(read_model_bytes(p), p)
    if load_external:
        read_weights(proto, p)
    return proto


def load_model(path: str | os.PathLike[str]) -> tuple[ModelSpec, onnx.ModelProto]:
    """Load, check and describe a model.

    The returned proto holds the graph but not external weights: the parent
    process only plans; each backend loads weights in its own process.
    """
    p = Path(path)
    if CONTROL.search(p.name):
        raise ModelLoadError(
            f"the model's file name {p.name!r} holds a line break or control character; rename the file"
        )
    data = read_model_bytes(p)
    proto = parse_model(data, p)
    external = uses_external_data(proto)
    if external:
        check_external_files(proto, p)
    check_elem_types(proto, p)
    unsorted = sort_nodes(proto.graph)  # engines take it so; the checker and the float64 judge do not
    _check(proto, p, external and not unsorted)
    spec = ModelSpec.from_proto(proto, str(path), model_sha256(p, proto, data))
    return (replace(spec, unsorted=True) if unsorted else spec), proto


def _names(proto: onnx.ModelProto) -> Iterator[object]:
    graph = proto.graph
    yield from (v.name for v in (*graph.input, *graph.output, *graph.value_info))
    yield from (initializer.name for initializer in graph.initializer)
    for node in graph.node:
        yield from (node.name, node.op_type, node.domain, *node.input, *node.output)


def used_domains(proto: onnx.ModelProto) -> dict[str, list[str]]:
    """Each op domain the main graph's nodes use (model-local functions aside), with its ops."""
    local = {(function.domain, function.name) for function in proto.functions}
    out: dict[str, list[str]] = {}
    for node in proto.graph.node:
        if (node.domain, node.op_type) not in local and node.op_type not in out.get(node.domain, []):
            out.setdefault(node.domain, []).append(node.op_type)
    return out


def _check_names_and_domains(proto: onnx.ModelProto, path: Path) -> None:
    """Names that are not text (protobuf hands over invalid UTF-8 as bytes) and ops from a
    domain no engine here implements are the model's fault: one line, before anything runs."""
    bad = next((name for name in _names(proto) if not isinstance(name, str)), None)
    if bad is not None:
        raise ModelLoadError(
            f"{path} has a tensor or node name that is not valid UTF-8 ({bad!r:.60}); rename it and save "
            "the model again"
        )
    odd = next((name for name in _names(proto) if CONTROL.search(str(name))), None)
    if odd is not None:  # a line break in a name would start a line of its own in a report
        raise ModelLoadError(
            f"{path} has a tensor or node name with a line break or control character ({odd!r:.60}); "
            "rename it and save the model again"
        )
    local = {(function.domain, function.name) for function in proto.functions}
    strange = sorted(
        {
            f"{node.domain}:{node.op_type}"
            for node in proto.graph.node
            if node.domain not in KNOWN_DOMAINS and (node.domain, node.op_type) not in local
        }
    )
    if strange:
        raise ModelLoadError(
            f"{path} uses op(s) {', '.join(strange[:5])} from a domain no backend implements (custom "
            "ops need the engine's custom-op library); export the model with standard ONNX ops"
        )


def _check(proto: onnx.ModelProto, path: Path, external: bool) -> None:
    _check_names_and_domains(proto, path)
    known = set(TensorProto.DataType.values())
    odd = next((tensor for tensor in all_tensors(proto.graph) if tensor.data_type not in known), None)
    if odd is not None:  # the checker misses it in a weight stored outside the model
        raise ModelLoadError(
            f"{path} is not a valid ONNX model: weight {odd.name!r:.60} has data_type {odd.data_type}, "
            "no ONNX type; fix the model or re-export it"
        )
    for v in (*proto.graph.input, *proto.graph.output):
        dims = v.type.tensor_type.shape.dim if v.type.HasField("tensor_type") else ()
        bad = next((dim.dim_value for dim in dims if dim.HasField("dim_value") and dim.dim_value < 0), None)
        if bad is not None:  # numpy would refuse it later, deep in a run
            raise ModelLoadError(
                f"{path} declares dimension {bad} for {v.name!r:.60}; a size is >= 0 (a dynamic one is "
                "named): fix the model or re-export it"
            )
    if proto.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(
            f"{path} has IR version {proto.ir_version}, newer than this onnx {onnx.__version__} "
            f"reads (at most {onnx.IR_VERSION}); upgrade onnx or re-export the model"
        )
    # From the path when weights live in files beside it (the C++ checker finds them there);
    # else a copy without the large weights, whose byte counts are checked on the way.
    target: str | onnx.ModelProto = str(path) if external else _without_large_weights(proto, path)
    if has_ort_onnx_ops(proto):  # the checker knows them as com.microsoft ops
        target = as_contrib(_without_large_weights(proto, path) if external else target)  # type: ignore[arg-type]
    try:
        onnx.checker.check_model(target)
    except Exception as error:
        raise ModelLoadError(
            f"{path} is not a valid ONNX model: {first_line(error)}; fix the model or re-export it"
        ) from error


_CHECK_INLINE = 1 << 16


def _without_large_weights(proto: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """A copy for the checker, which serializes what it checks: large raw initializers emptied
    once their byte counts are checked against their shapes here."""
    light = onnx.ModelProto()
    _copy_fields(proto, light, "graph")  # field by field: a whole copy costs 0.2 s per 100 MiB
    _copy_fields(proto.graph, light.graph, "initializer")
    for initializer in proto.graph.initializer:
        n = len(initializer.raw_data)
        if n <= _CHECK_INLINE:
            light.graph.initializer.add().CopyFrom(initializer)
            continue
        want = raw_size(initializer)
        if want is not None and want != n:
            raise ModelLoadError(
                f"{path} is not a valid ONNX model: initializer {initializer.name!r} holds {n} bytes, "
                f"its shape {list(initializer.dims)} needs {want}; fix the model or re-export it"
            )
        _copy_fields(initializer, light.graph.initializer.add(), "raw_data", "dims").dims.append(0)
    return light


def _copy_fields(src: Any, dst: Any, *skip: str) -> Any:
    """dst gets every field of src that is set, but those named in `skip`."""
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        repeated = (
            fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        )  # protobuf < 6
        if repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)
    return dst


# --- IR version downgrade -------------------------------------------------------------


def _max_opset_for_ir(ir: int) -> int:
    return max((row[2] for row in helper.VERSION_TABLE if row[1] <= ir), default=1)


def _elem_types(graph: onnx.GraphProto) -> Iterator[int]:
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.HasField("tensor_type"):
            yield vi.type.tensor_type.elem_type
    for initializer in graph.initializer:
        yield initializer.data_type
    for node in graph.node:
        for attr in node.attribute:
            if attr.name in _DTYPE_ATTRS and attr.type == onnx.AttributeProto.INT:
                yield int(attr.i)
            if attr.HasField("t"):
                yield attr.t.data_type
            if attr.HasField("g"):
                yield from _elem_types(attr.g)
            for sub in attr.graphs:
                yield from _elem_types(sub)


def _uses_opaque(graph: onnx.GraphProto) -> bool:
    return any(vi.type.HasField("opaque_type") for vi in [*graph.input, *graph.output, *graph.value_info])


def downgrade_blockers(proto: onnx.ModelProto, target_ir: int) -> list[str]:
    """What in the model needs an IR version above `target_ir` (empty: downgrade is safe)."""
    blockers: list[str] = []
    max_opset = _max_opset_for_ir(target_ir)
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > max_opset:
            blockers.append(f"opset ai.onnx {opset.version} (IR {target_ir} allows at most {max_opset})")
    used = {TensorProto.DataType.Name(elem_type) for elem_type in set(_elem_types(proto.graph)) if elem_type}
    for name in sorted(used):
        need = _DTYPE_MIN_IR.get(name, 0)
        if need > target_ir:
            blockers.append(f"element type {name} (needs IR {need})")
    if target_ir < 14 and _uses_opaque(proto.graph):
        blockers.append("TypeProto.Opaque outside ONNX-ML (needs IR 14)")
    return blockers


def downgrade_ir(proto: onnx.ModelProto, target_ir: int) -> onnx.ModelProto:
    """The model restamped with IR `target_ir`; ModelLoadError if it uses something newer."""
    blockers = downgrade_blockers(proto, target_ir)
    if blockers:
        raise ModelLoadError(
            f"model has IR version {proto.ir_version} and uses {'; '.join(blockers)}, so it "
            f"cannot be safely downgraded to IR {target_ir}; re-export it with an older opset "
            "or upgrade the backend"
        )
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    out.ir_version = target_ir
    return out
