"""Which of a candidate's tensors hold which of its original's: by name (float16 converters,
quantizers and onnxslim keep most), as the same node's output where a converter renamed it (a
Cast inserted after it), and after a QuantizeLinear/DequantizeLinear pair (the value the
candidate's consumers read). What is not matched is said with the reason: computed inside a
fused kernel of the candidate, folded into its weights, or not in it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import onnx

from xbackend.results.candidates import Unmatched

__all__ = ["Pair", "match_graphs", "precision_of"]

_QUANT = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})
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
            if dq:
                pairs.append(Pair(t, dq, "dequantized", depth, node.op_type))
    found = {p.original: p.candidate for p in pairs if p.how != "dequantized"}
    consumers = _readers(original.node)
    unmatched = [
        Unmatched(original=t, reason=_why(t, node, weights, found, consumers, produced))
        for _, node, t in missing
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
    t: str,
    node: onnx.NodeProto,
    weights: set[str],
    found: Mapping[str, str],
    consumers: Mapping[str, Sequence[onnx.NodeProto]],
    produced: Mapping[str, onnx.NodeProto],
) -> str:
    if t in weights:
        return "folded into the candidate's weights (computed from constants only)"
    # the nearest tensor below it that the candidate holds: a kernel of another op computes it
    seen = {t}
    frontier = [t]
    for _ in range(64):
        nxt: list[str] = []
        for x in frontier:
            for c in consumers.get(x, ()):
                for o in c.output:
                    if not o or o in seen:
                        continue
                    seen.add(o)
                    if o in found:
                        maker = produced.get(found[o])
                        if maker is not None and (maker.op_type != c.op_type or maker.domain):
                            who = f"{maker.op_type} node {maker.name}" if maker.name else maker.op_type
                            return (
                                f"computed inside the candidate's {who} (a fused kernel), which computes {o}"
                            )
                    else:
                        nxt.append(o)
        if not nxt:
            break
        frontier = nxt
    what = f"node {node.name} ({node.op_type})" if node.name else f"a {node.op_type} node"
    return f"the candidate has no tensor of that name and no {what}: removed or renamed"


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
