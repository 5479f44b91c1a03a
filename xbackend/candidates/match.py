"""Which of a candidate's tensors hold which of its original's: by name (float16 converters,
quantizers and onnxslim keep most), as the same node's output where a converter renamed it (a
Cast inserted after it), and after a QuantizeLinear/DequantizeLinear pair (the value the
candidate's consumers read). What is not matched is said with the reason: computed inside a
fused kernel of the candidate, folded into its weights, or not in it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import onnx

from xbackend.model.graphorder import NodeSets
from xbackend.results.candidates import Unmatched

__all__ = ["Pair", "constants_of", "match_graphs", "precision_of"]

_QUANT = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})
# activations a QDQ tool folds into the quantization range (the tensor keeps its name, before them)
_FOLDED = frozenset({"Relu", "Clip"})
# a candidate's nodes that convert, quantize or move values: never the kernel another computes inside
_PLUMBING = frozenset(
    {
        "Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Identity",
        "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Shape", "Gather", "Concat", "Slice", "Expand",
    }
)  # fmt: skip
_TYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "int8",
}


@dataclass(frozen=True)
class Pair:
    """An original tensor and the candidate tensor that holds its value."""

    original: str
    candidate: str
    how: str  # "name" | "node" | "dequantized"
    depth: int  # the original's node that computes it, in graph order
    op: str = ""  # the original's op that computes it


def match_graphs(original: onnx.GraphProto, candidate: onnx.GraphProto) -> tuple[list[Pair], list[Unmatched]]:
    """Every output of the original's nodes, matched to the candidate's tensors or said why not,
    in the original's order."""
    produced: dict[str, onnx.NodeProto] = {
        output_name: node for node in candidate.node for output_name in node.output if output_name
    }
    inputs = {input_name.name for input_name in candidate.input}
    weights = {initializer.name for initializer in candidate.initializer}
    by_name = {node.name: node for node in candidate.node if node.name}
    readers = _readers(candidate.node)
    pairs: list[Pair] = []
    missing: list[tuple[int, onnx.NodeProto, str]] = []
    folded = {output_name: node.op_type for node in original.node for output_name in node.output}
    for depth, node in enumerate(original.node, 1):
        twin = by_name.get(node.name) if node.name else None
        for index, t in enumerate(node.output):
            if not t:
                continue
            if t in produced or t in inputs:
                pairs.append(Pair(t, t, "name", depth, node.op_type))
                got = t
            elif (
                twin is not None
                and twin.op_type == node.op_type
                and index < len(twin.output)
                and twin.output[index]
            ):
                got = twin.output[index]
                pairs.append(Pair(t, got, "node", depth, node.op_type))
            else:
                missing.append((depth, node, t))
                continue
            dq = _dequantized(got, readers)
            if dq and node.op_type in _FOLDED and produced.get(got, node).op_type != node.op_type:
                pairs.pop()  # a QDQ tool folded the activation into the range: the name holds its input
            elif dq and got != t and folded.get(got, "") in _FOLDED:
                dq = ""  # its dequantized value is the folded activation's, matched there
            if dq:
                pairs.append(Pair(t, dq, "dequantized", depth, node.op_type))
    found = {pair.original: pair.candidate for pair in pairs if pair.how != "dequantized"}
    inside = _inside(original, candidate, found)
    constant = constants_of(original)
    unmatched = [
        Unmatched(original=original, reason=_why(original, node, weights, inside, constant))
        for _, node, original in missing
    ]
    return pairs, unmatched


def _readers(nodes: Iterable[onnx.NodeProto]) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for input_name in node.input:
            if input_name:
                out.setdefault(input_name, []).append(node)
    return out


def _dequantized(t: str, readers: Mapping[str, Sequence[onnx.NodeProto]]) -> str:
    """The DequantizeLinear output that reads `t` back through a QuantizeLinear ('' : none)."""
    for node in readers.get(t, ()):
        if node.op_type not in _QUANT or not node.output or node.input[0] != t:
            continue
        for d in readers.get(node.output[0], ()):
            if d.op_type == "DequantizeLinear" and d.input[0] == node.output[0]:
                return str(d.output[0])
    return ""


def _why(
    t: str, node: onnx.NodeProto, weights: set[str], inside: Mapping[str, str], constant: set[str]
) -> str:
    if t in weights:
        return "folded into the candidate's weights"
    if t in inside:
        return f"computed inside the candidate's {inside[t]}"
    if t in constant:
        return (
            "computed from the original's weights alone: the candidate folds it into its weights or kernels"
        )
    what = f"node {node.name} ({node.op_type})" if node.name else f"a {node.op_type} node"
    return f"the candidate has no tensor of that name and no {what}: removed or renamed"


def constants_of(graph: onnx.GraphProto) -> set[str]:
    """Tensors of `graph` computed from its weights alone (Constant nodes included)."""
    known = {initializer.name for initializer in graph.initializer}
    for node in graph.node:
        if all(input_name in known for input_name in node.input if input_name):
            known.update(output_name for output_name in node.output if output_name)
    return known - {initializer.name for initializer in graph.initializer}


def _inside(
    original: onnx.GraphProto, candidate: onnx.GraphProto, found: Mapping[str, str]
) -> dict[str, str]:
    """Each original tensor a group of the candidate's own kernels computes inside it: the group
    (kernels joined by tensors the original does not hold) from its inputs the original holds to
    the outputs it holds, the original's nodes between those being what it replaced."""
    held = {value: key for key, value in found.items()}
    ops = {(node.domain or "", node.op_type) for node in original.node}
    kernels = [
        node
        for node in candidate.node
        if (node.domain or "", node.op_type) not in ops and node.op_type not in _PLUMBING
    ]
    made = {
        output_name: index
        for index, kernel in enumerate(kernels)
        for output_name in kernel.output
        if output_name
    }
    sets = NodeSets(len(kernels))
    for k, n in enumerate(kernels):  # kernels joined through tensors the original does not hold
        for i in n.input:
            if i in made and i not in held:
                sets.join(k, made[i])
    groups: dict[int, list[onnx.NodeProto]] = {}
    for k, n in enumerate(kernels):
        groups.setdefault(sets.root(k), []).append(n)
    producer = {output_name: node for node in original.node for output_name in node.output if output_name}
    out: dict[str, str] = {}
    for nodes in groups.values():
        outs = {held[output_name] for node in nodes for output_name in node.output if output_name in held}
        inner = {output_name for node in nodes for output_name in node.output}
        bounds = {
            held.get(input_name, input_name)
            for node in nodes
            for input_name in node.input
            if input_name and input_name not in inner
        }
        if not outs:
            continue
        if len(nodes) == 1:
            named = f"{nodes[0].op_type} node {nodes[0].name}" if nodes[0].name else nodes[0].op_type
        else:
            count = Counter(node.op_type for node in nodes)
            named = ", ".join(f"{value} {op}" if value > 1 else op for op, value in sorted(count.items()))
        stack = [
            input_name
            for out in outs
            if (p := producer.get(out)) is not None
            for input_name in p.input
            if input_name
        ]
        seen: set[str] = set()
        while stack:
            t = stack.pop()
            if t in seen or t in bounds or t not in producer:
                continue
            seen.add(t)
            what = "a fused kernel" if len(nodes) == 1 else "fused kernels"
            out.setdefault(t, f"{named} ({what}), which compute(s) {sorted(outs)[0]}")
            stack += [input_name for input_name in producer[t].input if input_name]
    return out


def precision_of(graph: onnx.GraphProto) -> str:
    """What a candidate declares, in words: the float and integer types its nodes compute in."""
    kinds: set[str] = set()
    for initializer in graph.initializer:
        if initializer.data_type in _TYPES:
            kinds.add(_TYPES[initializer.data_type])
    ops = {node.op_type for node in graph.node}
    for n in graph.node:
        if n.op_type == "Cast":
            to = next((attribute.i for attribute in n.attribute if attribute.name == "to"), 0)
            if int(to) in _TYPES:
                kinds.add(_TYPES[int(to)])
    for vi in [*graph.value_info, *graph.input, *graph.output]:
        elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if int(elem) in _TYPES:
            kinds.add(_TYPES[int(elem)])
    words: list[str] = [k for k in ("float16", "bfloat16") if k in kinds]
    if "int8" in kinds or ops & _QUANT or ops & {"MatMulInteger", "QLinearMatMul", "QLinearConv"}:
        style = (
            "QDQ"
            if "DequantizeLinear" in ops and "QuantizeLinear" in ops
            else ("dynamic" if "DynamicQuantizeLinear" in ops else "quantized operators")
        )
        words.append(f"int8 ({style})")
    return " + ".join(words) if words else "float32"
