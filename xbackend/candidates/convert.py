"""The converter that made a candidate, its settings as the graph shows them, the original's nodes
it changed, and the Python that makes the candidate again with some of them kept in float32.

The advice is confirmed on the very code it prints: the float16 tool's and the dynamic
quantizer's snippets are executed as printed (their strings are Python literals of the names);
a static QDQ candidate is kept in place (`keep_float32`, what `nodes_to_exclude` does with the
same calibration), and the quantizer's own call is printed beside it with the settings read."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from xbackend.model.extdata import external_files, weight_array
from xbackend.model.load import load_proto

__all__ = [
    "DYNAMIC",
    "FP16",
    "STATIC",
    "Converter",
    "command",
    "converted",
    "converter_of",
    "keep_float32",
    "requantize",
    "rewrite",
    "weight_bytes",
    "weighted",
]

FP16 = "onnxruntime.transformers.float16"
DYNAMIC = "onnxruntime.quantization.quantize_dynamic"
STATIC = "onnxruntime.quantization.quantize_static"
_SHAPE_ONLY = {"Shape", "Size"}  # they read a quantized tensor's shape, never its values
_QTYPE = {TensorProto.INT8: "QInt8", TensorProto.UINT8: "QUInt8"}
_TWO_GIB = 2**31


@dataclass(frozen=True)
class Converter:
    """What made the candidate, and the settings its graph shows (`unread`: those it cannot)."""

    tool: str  # FP16 | DYNAMIC | STATIC
    keep_io_types: bool = True  # float16: the graph's inputs stayed float32
    weight_type: str = "QInt8"  # quantizers: int8 (QInt8) or uint8 (QUInt8) weights
    activation_type: str = "QInt8"  # static: the activations' Q/DQ type
    per_channel: bool = False  # a weight scale per output channel
    reduce_range: bool = False  # 7-bit weights (every quantized weight within ±64)
    op_types: tuple[str, ...] = ()  # op_types_to_quantize: the ops it quantized
    symmetric_activations: bool = False  # static: every activation's zero point 0
    disable_shape_infer: bool = False  # float16: an original past protobuf's 2 GiB
    unread: tuple[str, ...] = ()  # settings the graph does not show (the calibration's)
    gemms: tuple[str, ...] = ()  # dynamic: the original's Gemm nodes (the quantizer renames them)
    big: bool = False  # the original's weights pass protobuf's 2 GiB: written as external data


def converter_of(
    candidate: onnx.GraphProto, folder: Path | None = None, original: onnx.GraphProto | None = None
) -> Converter | None:
    """The converter whose output the candidate's graph looks like (None: none known), with the
    settings its quantized weights and Q/DQ pairs show (weights read from `folder`)."""
    ops = {node.op_type for node in candidate.node}
    inits = {initializer.name: initializer for initializer in candidate.initializer}
    if ("QuantizeLinear" in ops and "DequantizeLinear" in ops) or "DynamicQuantizeLinear" in ops:
        dynamic = "DynamicQuantizeLinear" in ops
        weights = _quantized_weights(candidate, inits)
        wtype = next((_QTYPE[inits[w].data_type] for w, _ in weights), "QInt8")
        scales = [inits[s] for _, s in weights if s in inits]
        zero_b = [
            inits[node.input[3]]
            for node in candidate.node
            if node.op_type == "MatMulInteger" and len(node.input) > 3 and node.input[3] in inits
        ]
        per_channel = any(int(np.prod(list(s.dims) or [1])) > 1 for s in [*scales, *zero_b])
        reduce = bool(weights) and folder is not None and _seven_bit(weights, inits, folder)
        acts = [
            node
            for node in candidate.node
            if node.op_type == "QuantizeLinear" and node.input[0] not in inits and len(node.input) > 2
        ]
        zps = [inits[act.input[2]] for act in acts if act.input[2] in inits]
        atype = next(
            (_QTYPE[initializer.data_type] for initializer in zps if initializer.data_type in _QTYPE),
            "QUInt8" if dynamic else "QInt8",
        )
        symmetric = bool(zps) and folder is not None and all(_zero(z, folder) for z in zps)
        tool = DYNAMIC if dynamic else STATIC
        conv = Converter(
            tool, weight_type=wtype, activation_type=atype, per_channel=per_channel, reduce_range=reduce
        )
        if original is not None:
            conv = replace(conv, op_types=_chosen(conv, original, candidate, inits))
            if dynamic:
                conv = replace(
                    conv, gemms=tuple(node.name for node in original.node if node.op_type == "Gemm")
                )
            conv = replace(conv, big=weight_bytes(original) >= _TWO_GIB)
        unread = () if dynamic else ("calibration_data_reader", "calibrate_method")
        return replace(conv, symmetric_activations=symmetric and not dynamic, unread=unread)
    if TensorProto.FLOAT16 in {initializer.data_type for initializer in candidate.initializer} or any(
        vi.type.tensor_type.elem_type == TensorProto.FLOAT16 for vi in candidate.value_info
    ):
        io = all(
            input_name.type.tensor_type.elem_type != TensorProto.FLOAT16 for input_name in candidate.input
        )
        big = original is not None and weight_bytes(original) >= _TWO_GIB
        return Converter(FP16, keep_io_types=io, disable_shape_infer=big, big=big)
    return None


def _chosen(
    conv: Converter, original: onnx.GraphProto, candidate: onnx.GraphProto, inits: Mapping[str, TensorProto]
) -> tuple[str, ...]:
    """op_types_to_quantize as the candidate shows it: the ops a quantizer replaced (dynamic), or
    whose every non-constant input it dequantized and whose output it quantized again (static QDQ;
    a reader of a quantized tensor alone is quantized for another op's sake)."""
    kinds = {node.name: node.op_type for node in original.node}
    if conv.tool == DYNAMIC:
        return tuple(sorted({kinds[n] for n in converted(conv, original, candidate)}))
    made = {output_name: node.op_type for node in candidate.node for output_name in node.output}
    quantized = {node.input[0] for node in candidate.node if node.op_type == "QuantizeLinear"}
    out = set()
    for n in candidate.node:
        if n.name not in kinds or n.op_type in _SHAPE_ONLY:
            continue
        ins = [
            input_name
            for input_name in n.input
            if input_name and input_name not in inits and made.get(input_name) != "Constant"
        ]
        if (
            ins
            and all(made.get(input_name) == "DequantizeLinear" for input_name in ins)
            and any(output_name in quantized for output_name in n.output)
        ):
            out.add(kinds[n.name])
    return tuple(sorted(out))


def _zero(tensor: TensorProto, folder: Path) -> bool:
    v = weight_array(tensor, folder)
    return v is not None and not np.any(v)


def _quantized_weights(graph: onnx.GraphProto, inits: Mapping[str, TensorProto]) -> list[tuple[str, str]]:
    """(quantized weight, its scale) for each integer weight a DequantizeLinear, an integer kernel
    or a Gather reads as its data (never a scale or a zero point); those a MatMul, Gemm or Conv
    computes with first (their type is the weight_type asked for)."""
    scale_of = {
        node.input[0]: node.input[1]
        for node in graph.node
        if node.op_type == "DequantizeLinear" and len(node.input) > 1
    }
    readers: dict[str, set[str]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, set()).add(n.op_type)
    data = {("DequantizeLinear", 0), ("MatMulInteger", 1), ("ConvInteger", 1), ("Gather", 0)}
    kernels = {"MatMul", "Gemm", "Conv", "MatMulInteger", "ConvInteger"}
    out: list[tuple[bool, str, str]] = []
    for n in graph.node:
        for index, i in enumerate(n.input):
            initializer = inits.get(i)
            if initializer is None or initializer.data_type not in _QTYPE or (n.op_type, index) not in data:
                continue
            computes = n.op_type in kernels or (
                n.op_type == "DequantizeLinear" and bool(readers.get(n.output[0], set()) & kernels)
            )
            out.append((not computes, i, scale_of.get(i, "")))
    return [(i, sc) for _, i, sc in sorted(dict.fromkeys(out), key=lambda fromkey: fromkey[0])]


def _seven_bit(weights: Sequence[tuple[str, str]], inits: Mapping[str, TensorProto], folder: Path) -> bool:
    """Every quantized weight within ±64 around its zero point: reduce_range (a full-range
    quantizer reaches ±127 in some element of each)."""
    for w, _ in weights:
        v = weight_array(inits[w], folder)
        if v is None:
            return False
        centre = 128 if v.dtype == np.uint8 else 0
        if int(np.max(np.abs(v.astype(np.int32) - centre))) > 64:
            return False
    return True


def converted(conv: Converter, original: onnx.GraphProto, candidate: onnx.GraphProto) -> tuple[str, ...]:
    """The original's nodes the converter changed, in the original's order: for float16 those
    that read or write a float16 tensor; for the dynamic quantizer those it replaced or gave an
    integer weight; for static QDQ those that read a dequantized value (never a Shape)."""
    theirs = {node.name: node for node in candidate.node if node.name}
    names = [node for node in original.node if node.name]
    if conv.tool == FP16:
        half = _float16_tensors(candidate)
        return tuple(
            name.name
            for name in names
            if name.name in theirs
            and name.op_type not in _SHAPE_ONLY
            and any(t in half for t in (*theirs[name.name].input, *theirs[name.name].output))
        )
    if conv.tool == DYNAMIC:
        inits = {initializer.name: initializer.data_type for initializer in candidate.initializer}
        mine = {initializer.name for initializer in original.initializer}

        def quantized(node: onnx.NodeProto) -> bool:
            return any(
                inits.get(input_name) in _QTYPE and input_name not in mine for input_name in node.input
            )

        return tuple(
            name.name
            for name in names
            if name.op_type not in _SHAPE_ONLY and (name.name not in theirs or quantized(theirs[name.name]))
        )
    dq = {
        output_name
        for node in candidate.node
        if node.op_type == "DequantizeLinear"
        for output_name in node.output
    }
    return tuple(
        name.name
        for name in names
        if name.op_type not in _SHAPE_ONLY
        and (name.name not in theirs or any(input_name in dq for input_name in theirs[name.name].input))
    )


def _float16_tensors(graph: onnx.GraphProto) -> set[str]:
    out = {
        initializer.name for initializer in graph.initializer if initializer.data_type == TensorProto.FLOAT16
    }
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
            out.add(vi.name)
    for node in graph.node:
        to = next((attribute.i for attribute in node.attribute if attribute.name == "to"), None)
        if node.op_type == "Cast" and to == TensorProto.FLOAT16:
            out.update(node.output)
        if node.op_type == "Constant" and any(
            attribute.t.data_type == TensorProto.FLOAT16 for attribute in node.attribute
        ):
            out.update(node.output)
    return out


_WEIGHT = 256  # elements: an initializer this large is a weight (not a scale, an epsilon, a shape)


def weighted(graph: onnx.GraphProto) -> tuple[str, ...]:
    """The nodes that read a float weight: what a converter shrinks."""
    big = {
        initializer.name
        for initializer in graph.initializer
        if initializer.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE)
        and int(np.prod(list(initializer.dims) or [1])) >= _WEIGHT
    }
    return tuple(
        node.name for node in graph.node if node.name and any(input_name in big for input_name in node.input)
    )


def weight_bytes(graph: onnx.GraphProto) -> int:
    """The bytes a graph's weights take (initializers and Constant tensors), from their shapes and
    types: external weights need not be read."""
    total = 0
    for initializer in (
        *graph.initializer,
        *(
            attribute.t
            for node in graph.node
            if node.op_type == "Constant"
            for attribute in node.attribute
            if attribute.t.dims
        ),
    ):
        size = (
            helper.tensor_dtype_to_np_dtype(initializer.data_type).itemsize
            if initializer.data_type != TensorProto.STRING
            else 0
        )
        total += int(np.prod(list(initializer.dims) or [1])) * size
    return total


# float16: the tool names the cast it inserts before each kept reader of a float16 tensor alike
# (the same cast twice: ONNX Runtime refuses the model), and rounds a kept node's output to
# float16 and back for a kept reader; the lines after the call keep one cast of each name and
# hand a kept reader the float32 value
_FP16_TIDY = """\
def cast_to(n):
    return next((a.i for a in n.attribute if a.name == "to"), None) if n.op_type == "Cast" else None

nodes, seen = [], set()
for n in model.graph.node:
    if cast_to(n) is not None and n.output[0] in seen:
        continue
    seen.update(n.output)
    nodes.append(n)
down = {n.output[0]: n for n in nodes if cast_to(n) == onnx.TensorProto.FLOAT16}
for n in nodes:
    up = down.get(n.input[0]) if cast_to(n) == onnx.TensorProto.FLOAT else None
    if up is not None and (n.name.endswith("_cast_to_fp32_node") or n.name.startswith("graph_output_cast")):
        n.input[0] = up.input[0]
read = {i for n in nodes for i in n.input} | {o.name for o in model.graph.output}
nodes = [n for n in nodes if n.op_type != "Cast" or n.output[0] in read]
del model.graph.node[:]
model.graph.node.extend(nodes)
"""


_BIG = (
    "# past 2 GiB the weights go to NAME.data beside it; onnx refuses to write them where the\n"
    "# working folder holds a file of that name: run it from another folder\n"
)


def command(conv: Converter, keep: Sequence[str], original: str, candidate: str, dest: str) -> str:
    """The Python that makes the candidate again with `keep` in float32, runnable as printed:
    the converter's own call with the settings read from the candidate (a static QDQ model: kept
    in place, what nodes_to_exclude does with the same calibration)."""
    code = _command(conv, keep, original, candidate, dest)
    return _BIG + code if conv.big else code


def _command(conv: Converter, keep: Sequence[str], original: str, candidate: str, dest: str) -> str:
    nodes = "[\n" + "".join(f"    {n!r},\n" for n in keep) + "]"
    if conv.tool == FP16:
        shape = ", disable_shape_infer=True" if conv.disable_shape_infer else ""
        return (
            "import onnx\n"
            "from onnxruntime.transformers.float16 import convert_float_to_float16\n\n"
            f"KEEP = {nodes}\n"
            f"model = convert_float_to_float16(\n    onnx.load({original!r}),\n"
            f"    keep_io_types={conv.keep_io_types},\n    node_block_list=KEEP{shape},\n)\n"
            f"{_FP16_TIDY}"
            f"onnx.save(model, {dest!r}{_external(dest) if conv.big else ''})\n"
        )
    if conv.tool == DYNAMIC:
        renamed = [f"{n}_MatMul" if n in conv.gemms else n for n in keep]
        nodes = "[\n" + "".join(f"    {n!r},\n" for n in renamed) + "]"
        why = (
            "# the quantizer turns each Gemm NAME into a MatMul named NAME_MatMul before it reads this list\n"
            if any(n in conv.gemms for n in keep)
            else ""
        )
        return (
            "from onnxruntime.quantization import QuantType, quantize_dynamic\n\n"
            f"{why}KEEP = {nodes}\n"
            f"quantize_dynamic(\n    {original!r},\n    {dest!r},\n"
            f"    weight_type=QuantType.{conv.weight_type},\n"
            f"    per_channel={conv.per_channel},\n    reduce_range={conv.reduce_range},\n"
            f"    op_types_to_quantize={list(conv.op_types)!r},\n"
            f"{'    use_external_data_format=True,' + chr(10) if conv.big else ''}"
            "    nodes_to_exclude=KEEP,\n)\n"
        )
    return (
        "from xbackend import keep_float32\n\n"
        f"KEEP = {nodes}\n"
        f"keep_float32({original!r}, {candidate!r}, KEEP, {dest!r})\n"
    )


def _external(dest: str) -> str:
    """onnx.save's arguments for a model past 2 GiB: its weights in one file beside it."""
    return f", save_as_external_data=True, location={Path(dest).name + '.data'!r}"


def requantize(conv: Converter, keep: Sequence[str], original: str, dest: str) -> str:
    """Static QDQ: the quantizer's own call with the settings the candidate shows; the calibration
    (its data and method) is not in the graph: READER is yours."""
    if conv.tool != STATIC:
        return ""
    extra = "    extra_options={'ActivationSymmetric': True},\n" if conv.symmetric_activations else ""
    nodes = "[\n" + "".join(f"    {n!r},\n" for n in keep) + "]"
    return (
        "from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static\n\n"
        "READER = ...  # yours: a CalibrationDataReader over the data the candidate was calibrated on\n"
        f"KEEP = {nodes}\n"
        f"quantize_static(\n    {original!r},\n    {dest!r},\n    READER,\n"
        "    quant_format=QuantFormat.QDQ,\n"
        f"    activation_type=QuantType.{conv.activation_type},\n"
        f"    weight_type=QuantType.{conv.weight_type},\n"
        f"    per_channel={conv.per_channel},\n    reduce_range={conv.reduce_range},\n"
        f"    op_types_to_quantize={list(conv.op_types)!r},\n"
        "    calibrate_method=CalibrationMethod.MinMax,  # the graph does not show it: yours\n"
        f"{extra}"
        f"{'    use_external_data_format=True,' + chr(10) if conv.big else ''}"
        "    nodes_to_exclude=KEEP,\n)\n"
    )


def rewrite(
    conv: Converter, original: Path, candidate: Path, keep: Sequence[str], dest: Path
) -> tuple[Path, str]:
    """The candidate made again with `keep` in float32 by the code the advice prints (run here as
    printed), and that code."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    code = command(conv, keep, str(original), str(candidate), str(dest))
    if conv.tool == STATIC:
        keep_float32(original, candidate, keep, dest)
        return dest, code
    source = _loadable(original, dest.parent.parent / "advise-original")
    run = code if source == original else command(conv, keep, str(source), str(candidate), str(dest))
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice to pre-process, on the root logger
    try:
        exec(compile(run, "advice", "exec"), {"__name__": "advice"})  # our code: names are literals
    finally:
        logging.getLogger().setLevel(quiet)
    return dest, code


def _loadable(original: Path, folder: Path) -> Path:
    """The original as onnx.load takes it: while this run's folder holds hard links to its external
    weights (its workers' copies), onnx.load refuses them ("a potential hardlink attack"), so the
    converter reads a copy of its own, made once per run in `folder`."""
    files = external_files(load_proto(original, load_external=False))
    if not any((original.parent / file).stat().st_nlink > 1 for file in files):
        return original
    copy = folder / original.name
    if not copy.exists():
        folder.mkdir(parents=True, exist_ok=True)
        for f in files:
            (folder / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(original.parent / f, folder / f)
        shutil.copyfile(original, copy)
    return copy


def keep_float32(original: str | Path, candidate: str | Path, keep: Sequence[str], dest: str | Path) -> None:
    """A static QDQ candidate with each node in `keep` reading the original's inputs (its
    activations before their QuantizeLinear, the original's float weights) and handing out its
    output unquantized where it leaves the graph; written to `dest`."""
    theirs_model = load_proto(original)
    mine = load_proto(candidate)
    out = _unquantized(theirs_model, mine, set(keep))
    if weight_bytes(out.graph) >= _TWO_GIB:  # past protobuf's limit: the weights in a file beside it
        onnx.save(out, str(dest), save_as_external_data=True, location=Path(dest).name + ".data")
    else:
        onnx.save(out, str(dest))


def _unquantized(original: onnx.ModelProto, candidate: onnx.ModelProto, keep: set[str]) -> onnx.ModelProto:
    made = {output_name: node for node in candidate.graph.node for output_name in node.output}
    theirs = {node.name: node for node in original.graph.node if node.name}
    owned = {initializer.name for initializer in candidate.graph.initializer}
    wanted: dict[str, onnx.TensorProto] = {}
    weights = {initializer.name: initializer for initializer in original.graph.initializer}
    for node in candidate.graph.node:
        if node.name not in keep or node.name not in theirs:
            continue
        src = theirs[node.name]
        for index, i in enumerate(list(node.input)):
            d = made.get(i)
            if d is None or d.op_type != "DequantizeLinear" or index >= len(src.input):
                continue
            name = src.input[index]
            if name in weights:  # the original's float weight, under a name of its own
                fresh = f"{name}_float32"
                if fresh not in owned:
                    wanted[fresh] = onnx.TensorProto()
                    wanted[fresh].CopyFrom(weights[name])
                    wanted[fresh].name = fresh
                name = fresh
            node.input[index] = name
    # a kept node's output quantized on its way out of the graph: handed out as computed
    outputs = {output_name.name for output_name in candidate.graph.output}
    readers = {input_name: node for node in candidate.graph.node for input_name in node.input}
    for node in candidate.graph.node:
        if node.name not in keep:
            continue
        for o in node.output:
            q = readers.get(o)
            d = readers.get(q.output[0]) if q is not None and q.op_type == "QuantizeLinear" else None
            if d is not None and d.op_type == "DequantizeLinear" and d.output[0] in outputs:
                d.op_type, d.domain = "Identity", ""
                del d.input[:]
                del d.attribute[:]
                d.input.append(o)
    candidate.graph.initializer.extend(wanted.values())
    _prune(candidate.graph)
    return candidate


def _prune(graph: onnx.GraphProto) -> None:
    """Drop the Q/DQ nodes and the quantized weights no node reads any more."""
    while True:
        read = {input_name for node in graph.node for input_name in node.input} | {
            output_name.name for output_name in graph.output
        }
        dead = [
            index
            for index, node in enumerate(graph.node)
            if node.op_type in ("QuantizeLinear", "DequantizeLinear")
            and not any(output_name in read for output_name in node.output)
        ]
        for k in reversed(dead):
            del graph.node[k]
        if not dead:
            break
    read = {input_name for node in graph.node for input_name in node.input}
    kept = [initializer for initializer in graph.initializer if initializer.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
