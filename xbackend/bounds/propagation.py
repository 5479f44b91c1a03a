"""First-order composition through nodes a backend computes from above the tensors it was fed
(torch exposes module outputs; ORT's fused kernels hide their inner tensors): each uncaptured
node's allowance, carried to the nodes below it through the ops' derivatives, as float64
tensors in the judged graph."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import onnx
from onnx import helper

from xbackend.bounds.element import AUX, Builder, NodeBound, attributes

__all__ = ["ERR", "PROP", "independent", "own_allowance", "own_probabilistic", "propagate", "propagate_rest"]


PROP = "xb.prop."  # the judged graph's propagated allowance of node output t: PROP + t
ERR = "xb.err."  # an uncaptured tensor's whole allowance (its own plus what it inherited)

# Ops whose error is their data input's error moved the same way (indices and shapes kept).
_MOVE = frozenset(
    {
        "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Identity", "Slice",
        "Gather", "GatherElements", "GatherND", "Tile", "DepthToSpace", "SpaceToDepth", "Cast",
        "CastLike", "Dropout", "Trilu", "Pad", "ReverseSequence", "Resize", "Compress",
    }
)  # fmt: skip
# 1-Lipschitz elementwise ops: the error passes at most unchanged.
_LIPSCHITZ = frozenset(
    {"Relu", "Abs", "Neg", "Clip", "LeakyRelu", "PRelu", "Floor", "Ceil", "Round", "Sin", "Cos"}
)


def own_allowance(bound: NodeBound, out: str, u: float, has_mag: bool, bld: Builder) -> str:
    """`bound`'s allowance of node output `out` as a float64 tensor in the judged graph (`u`: the
    unit roundoff of its dtype)."""
    terms: list[str] = [bld.op("Mul", bld.abs(out), bld.const(u * bound.a))]
    if bound.b and has_mag:
        terms.append(bld.op("Mul", bld.abs(AUX + out), bld.const(u * bound.b)))
    if bound.c:
        terms.append(bld.const(u * bound.c))
    if bound.scaled:
        terms.append(
            bld.op("Mul", bld.op("ReduceMax", bld.abs(out), keepdims=1), bld.const(u * bound.scaled))
        )
    total = _sum(bld, terms)
    assert total is not None
    return total


def own_probabilistic(bound: NodeBound, out: str, u: float, has_mag: bool, bld: Builder) -> str | None:
    """Of `bound`'s allowance of `out`, the part that is Higham & Mary's λ·sqrt(n) (a sum of
    independent roundings, subgaussian); None where it has none."""
    terms = []
    if bound.prob_a:
        terms.append(bld.op("Mul", bld.abs(out), bld.const(u * bound.prob_a)))
    if bound.prob_b and has_mag:
        terms.append(bld.op("Mul", bld.abs(AUX + out), bld.const(u * bound.prob_b)))
    return _sum(bld, terms)


def independent(bld: Builder, inherited: str | None, own: str | None) -> tuple[str | None, str | None]:
    """A node's own probabilistic rounding and the probabilistic part of what it inherits are
    independent (Higham & Mary's model: each rounding's δ independent of the values before it), so
    they add root-sum-square at the same λ: (that sum, and what it saves against adding them);
    where only one is present, (it, None): nothing is saved."""
    if inherited is None or own is None:
        return inherited or own, None
    rss = bld.op("Sqrt", bld.op("Add", bld.op("Mul", inherited, inherited), bld.op("Mul", own, own)))
    saved = bld.op("Sub", bld.op("Add", inherited, own), rss)
    # an infinite part saves nothing (inf - inf): the allowance stays infinite, said as vacuous
    return rss, bld.op("Where", bld.op("IsNaN", saved), bld.const(0.0), saved)


def _sum(bld: Builder, parts: Sequence[str]) -> str | None:
    parts = [part for part in parts if part]
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = bld.op("Add", total, p)
    return total


def propagate(
    node: onnx.NodeProto, err: Mapping[str, str], bld: Builder, opset: int
) -> tuple[str | None, str]:
    """First-order: what the errors `err` (input name -> its error tensor) of `node`'s inputs bring
    to its first output, as a float64 tensor; and '' or why the composition is an assumption."""
    op = node.op_type
    ins = list(node.input)
    e = [err.get(input_name, "") for input_name in ins]
    x = ins[0] if ins else ""
    v = node.output[0]
    if op == "Split" and e and e[0]:
        return _first_part(node, e[0], bld), ""
    if op in _MOVE and e and e[0]:
        attrs = attributes(node)
        if op in ("Cast", "CastLike"):
            return e[0], ""
        if op == "Pad":
            return bld.op(
                "Pad", e[0], *ins[1:2], **{key: attr for key, attr in attrs.items() if key == "mode"}
            ), ""
        return bld.op(op, e[0], *ins[1:], **attrs), ""
    if op in _LIPSCHITZ:
        return e[0] or None, ""
    if op in ("Add", "Sub", "Sum", "Max", "Min", "Mean"):
        return _sum(bld, e), ""
    if op == "Mul":
        return _sum(bld, [bld.op("Mul", e[0], bld.abs(ins[1])) if e[0] else "",
                          bld.op("Mul", e[1], bld.abs(ins[0])) if e[1] else ""]), ""  # fmt: skip
    if op == "Div":
        a = bld.op("Div", e[0], bld.abs(ins[1])) if e[0] else ""
        b = bld.op("Mul", e[1], bld.abs(bld.op("Div", v, ins[1]))) if e[1] else ""
        return _sum(bld, [a, b]), ""
    if op == "Where":
        zero = bld.op("Mul", bld.abs(v), bld.const(0.0))
        if not (e[1] or e[2]):
            return None, ""
        return bld.op("Where", ins[0], e[1] or zero, e[2] or zero), ""
    if op == "Concat":
        parts = [
            ei or bld.op("Mul", bld.abs(input_name), bld.const(0.0))
            for input_name, ei in zip(ins, e, strict=True)
        ]
        return bld.op(
            "Concat",
            *parts,
            axis=int(next(attribute.i for attribute in node.attribute if attribute.name == "axis")),
        ), ""
    if op == "Pow" and e and e[0]:  # d(x^c)/dx = c·x^c/x; 0 where x = 0 (c >= 1 for a finite result)
        slope = bld.op("Div", bld.abs(v), bld.abs(x))
        slope = bld.op("Where", bld.op("Equal", x, bld.op("Mul", x, bld.const(0.0))), bld.const(0.0), slope)
        c = bld.op("Cast", ins[1], to=onnx.TensorProto.FLOAT)  # an integer exponent too
        return bld.op("Mul", e[0], bld.op("Mul", slope, bld.abs(c))), ""
    gain = _derivative(op, x, v, bld)
    if gain is not None and e and e[0]:
        return bld.op("Mul", e[0], gain), ""
    if op == "MatMul":
        return _sum(bld, [bld.op("MatMul", e[0], bld.abs(ins[1])) if e[0] else "",
                          bld.op("MatMul", bld.abs(ins[0]), e[1]) if e[1] else ""]), ""  # fmt: skip
    if op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin") and e[0]:
        attrs = attributes(node)
        base = "ReduceMax" if op in ("ReduceMax", "ReduceMin") else op
        if base == "ReduceMax" and len(ins) > 1 and opset < 18:
            return None, "ReduceMax with axes as an input"
        return bld.op(base, e[0], *ins[1:2], **attrs), ""
    if op == "Softmax" and e[0] and opset >= 13:
        axis = next((int(attribute.i) for attribute in node.attribute if attribute.name == "axis"), -1)
        weighted = bld.reduce("ReduceSum", bld.op("Mul", v, e[0]), [axis])
        return bld.op("Mul", bld.abs(v), bld.op("Add", e[0], weighted)), ""
    present = [p for p in e if p]
    if not present:
        return None, ""
    # No rule: the largest inherited error, passed with gain 1 (stated as an assumption).
    tops = [bld.op("ReduceMax", p, keepdims=0) for p in present]
    total = _sum(bld, tops)
    assert total is not None
    return bld.op(
        "Add", bld.op("Mul", bld.abs(v), bld.const(0.0)), total
    ), f"{op}: inherited errors passed with gain 1"


def _first_part(node: onnx.NodeProto, e0: str, bld: Builder) -> str:
    """A Split's first part of its input's error `e0`."""
    names = [bld.name() for _ in node.output]
    bld.nodes.append(helper.make_node("Split", [e0, *node.input[1:]], names, **attributes(node)))
    return names[0]


def propagate_rest(node: onnx.NodeProto, err: Mapping[str, str], bld: Builder) -> dict[str, tuple[str, str]]:
    """What the errors of `node`'s inputs bring to each of its outputs after the first (a Split's
    parts, LayerNormalization's mean): output -> (its error tensor, '' or why it is an assumption)."""
    rest = [output_name for output_name in node.output[1:] if output_name]
    present = [err[input_name] for input_name in node.input if input_name in err]
    if not rest or not present:
        return {}
    if node.op_type == "Split" and node.input[0] in err:  # each part holds its slice of the error
        names = [bld.name() for _ in node.output]
        bld.nodes.append(
            helper.make_node("Split", [err[node.input[0]], *node.input[1:]], names, **attributes(node))
        )
        return {
            output_name: (name, "")
            for output_name, name in zip(node.output, names, strict=True)
            if output_name in rest
        }
    tops = _sum(bld, [bld.op("ReduceMax", p, keepdims=0) for p in present])
    assert tops is not None
    why = f"{node.op_type}: inherited errors passed with gain 1"
    return {
        output_name: (bld.op("Add", bld.op("Mul", bld.abs(output_name), bld.const(0.0)), tops), why)
        for output_name in rest
    }


def _derivative(op: str, x: str, v: str, bld: Builder) -> str | None:
    """|f'(x)| of a unary elementwise op as a float64 tensor (None: not a unary op here)."""
    if op == "Sigmoid":
        return bld.op("Mul", v, bld.op("Sub", bld.const(1.0), v))
    if op == "Tanh":
        return bld.op("Sub", bld.const(1.0), bld.op("Mul", v, v))
    if op == "Exp":
        return bld.abs(v)
    if op == "Log":
        return bld.op("Reciprocal", bld.abs(x))
    if op == "Sqrt":
        return bld.op("Reciprocal", bld.op("Mul", bld.abs(v), bld.const(2.0)))
    if op == "Reciprocal":
        return bld.op("Mul", v, v)
    if op == "Erf":
        return bld.op(
            "Mul", bld.const(2 / math.sqrt(math.pi)), bld.op("Exp", bld.op("Neg", bld.op("Mul", x, x)))
        )
    if op == "Softplus":
        return bld.op("Sigmoid", x)
    if op in ("Gelu", "Mish", "HardSwish", "Elu", "Selu", "Celu", "Softsign", "HardSigmoid"):
        return bld.const(1.2)  # each is at most 1.13-Lipschitz (Gelu), 1.2 covers the family
    return None
