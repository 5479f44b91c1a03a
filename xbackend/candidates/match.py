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
    produced: dict[str, onnx.NodeProto] = {o: n for n in candidate.node for o in n.output if o}
    inputs = {i.name for i in candidate.input}
    weights = {t.name for t in candidate.initializer}
    by_name = {n.name: n for n in candidate.node if n.name}
    readers = _readers(candidate.node)
    pairs: list[Pair] = []
    missing: list[tuple[int, onnx.NodeProto, str]] = []
    folded = {o: n.op_type for n in original.node for o in n.output}
    for depth, node in enumerate(original.node, 1):
        twin = by_name.get(node.name) if node.name else None
        for k, t in enumerate(node.output):
            if not t:
                continue
            if t in produced or t in inputs:
                pairs.append(Pair(t, t, "name", depth, node.op_type))
                got = t
            elif (
                twin is not None and twin.op_type == node.op_type and k < len(twin.output) and twin.output[k]
            ):
                got = twin.output[k]
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
        Unmatched(original=t, reason=_why(t, node, weights, inside, constant)) for _, node, t in missing
    ]
    return pairs, unmatched


def _readers(nodes: Iterable[onnx.NodeProto]) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for i in n.input:
            if i:
                out.setdefault(i, []).append(n)
    return out


def _dequantized(t: str, readers: Mapping[str, Sequence[onnx.NodeProto]]) -> str:
    """The DequantizeLinear output that reads `t` back through a QuantizeLinear ('' : none)."""
    for q in readers.get(t, ()):
        if q.op_type not in _QUANT or not q.output or q.input[0] != t:
            continue
        for d in readers.get(q.output[0], ()):
            if d.op_type == "DequantizeLinear" and d.input[0] == q.output[0]:
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


def constants_of(g: onnx.GraphProto) -> set[str]:
    """Tensors of `g` computed from its weights alone (Constant nodes included)."""
    known = {t.name for t in g.initializer}
    for n in g.node:
        if all(i in known for i in n.input if i):
            known.update(o for o in n.output if o)
    return known - {t.name for t in g.initializer}


def _inside(
    original: onnx.GraphProto, candidate: onnx.GraphProto, found: Mapping[str, str]
) -> dict[str, str]:
    """Each original tensor a group of the candidate's own kernels computes inside it: the group
    (kernels joined by tensors the original does not hold) from its inputs the original holds to
    the outputs it holds, the original's nodes between those being what it replaced."""
    held = {c: o for o, c in found.items()}
    ops = {(n.domain or "", n.op_type) for n in original.node}
    kernels = [
        n for n in candidate.node if (n.domain or "", n.op_type) not in ops and n.op_type not in _PLUMBING
    ]
    made = {o: k for k, n in enumerate(kernels) for o in n.output if o}
    sets = NodeSets(len(kernels))
    for k, n in enumerate(kernels):  # kernels joined through tensors the original does not hold
        for i in n.input:
            if i in made and i not in held:
                sets.join(k, made[i])
    groups: dict[int, list[onnx.NodeProto]] = {}
    for k, n in enumerate(kernels):
        groups.setdefault(sets.root(k), []).append(n)
    producer = {o: n for n in original.node for o in n.output if o}
    out: dict[str, str] = {}
    for nodes in groups.values():
        outs = {held[o] for node in nodes for o in node.output if o in held}
        inner = {o for node in nodes for o in node.output}
        bounds = {held.get(i, i) for node in nodes for i in node.input if i and i not in inner}
        if not outs:
            continue
        if len(nodes) == 1:
            named = f"{nodes[0].op_type} node {nodes[0].name}" if nodes[0].name else nodes[0].op_type
        else:
            count = Counter(node.op_type for node in nodes)
            named = ", ".join(f"{c} {op}" if c > 1 else op for op, c in sorted(count.items()))
        stack = [i for o in outs if (p := producer.get(o)) is not None for i in p.input if i]
        seen: set[str] = set()
        while stack:
            t = stack.pop()
            if t in seen or t in bounds or t not in producer:
                continue
            seen.add(t)
            what = "a fused kernel" if len(nodes) == 1 else "fused kernels"
            out.setdefault(t, f"{named} ({what}), which compute(s) {sorted(outs)[0]}")
            stack += [i for i in producer[t].input if i]
    return out


def precision_of(graph: onnx.GraphProto) -> str:
    """What a candidate declares, in words: the float and integer types its nodes compute in."""
    kinds: set[str] = set()
    for t in graph.initializer:
        if t.data_type in _TYPES:
            kinds.add(_TYPES[t.data_type])
    ops = {n.op_type for n in graph.node}
    for n in graph.node:
        if n.op_type == "Cast":
            to = next((a.i for a in n.attribute if a.name == "to"), 0)
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
