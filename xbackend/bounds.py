"""What rounding allows each element of a node's output to differ from its float64 value.

A node is judged on its own inputs: the engine's output against the float64 value v of the same
op on the same (exact) inputs. Element i is allowed

    u · (a·|v_i| + b·M_i + c)

where u is the unit roundoff of the output's dtype (float32: 2^-24; a correctly rounded result
is within u·|v|), and M_i is a magnitude computed in float64 from the node's actual operands
(built into the judged graph by `node_bound`):

- exact ops (Reshape, Gather, Concat, Relu, ...): a = b = c = 0, nothing is allowed;
- IEEE 754 arithmetic (Add, Mul, Sqrt, Cast to a float): a = 1 (Div 2: a reciprocal times);
- math functions: each engine's accuracy measured against float64 by
  benchmarks/elementwise_bounds.py (ELEMENTWISE);
- reductions (MatMul, Gemm, Conv, Einsum, ReduceSum, pools): M = the same op on |operands|
  (Σ|a||b|), b = λ·sqrt(n+1) + 1: Higham & Mary's probabilistic bound for n terms (2019,
  SIAM J. Sci. Comput. 41(5)), which holds with probability at least 1 - 2(n+1)·exp(-λ²/2)
  per element; λ is chosen per node so that the node holds with probability 1 - DELTA;
- composites (Softmax, LayerNormalization, Gelu, BatchNormalization) compose their parts'
  bounds, element by element, from their operands.

The deterministic bound γ_n·Σ|a||b| (γ_n = n·u/(1 - n·u)) is kept beside: an error past it is an
error at any confidence. An op without a rule here is allowed 32 ULP of its tensor's largest
element, and the report says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xbackend.metrics import float_info

__all__ = [
    "AUX",
    "DELTA",
    "ELEMENTWISE",
    "ERR",
    "EXACT",
    "PROP",
    "U32",
    "Builder",
    "NodeBound",
    "allowance",
    "lam",
    "node_bound",
    "own_allowance",
    "propagate",
    "secondary_bound",
    "unit_roundoff",
]

U32 = 2.0**-24
DELTA = 1e-6  # per node: the chance that a correct engine's rounding passes the bound
AUX = "xb.mag."  # the judged graph's magnitude output of node output t: AUX + t

_MEASURED = "measured against float64 (benchmarks/elementwise_bounds.py): numpy, ONNX Runtime, OpenVINO"
_IEEE = "IEEE 754: correctly rounded"
_IEEE_DIV = "IEEE 754: correctly rounded; 2 for an engine that multiplies by a reciprocal"
_HM = "Higham & Mary 2019: λ·sqrt(n+1)·u·Σ|a||b| per element, probabilistic"

# op -> (a: in u·|v|, c: in u (absolute), b: in u·|x| (the input's magnitude), source).
# Measured on a 2-core AMD EPYC (Zen 4, AVX-512), 2^18 inputs per range; the bound is the
# largest engine's error doubled (other instruction sets) and rounded up to a power of 2.
ELEMENTWISE: dict[str, tuple[float, float, float, str]] = {
    "Exp": (16, 0, 0, _MEASURED + "; largest: OpenVINO 6.4"),
    "Log": (8, 0, 0, _MEASURED + "; largest: ONNX Runtime 3.8"),
    "Tanh": (16, 0, 0, _MEASURED + "; largest: ONNX Runtime 5.2"),
    # ORT's sigmoid is accurate in absolute terms below x = -2.6 (2.6 u), not relative ones
    "Sigmoid": (16, 8, 0, _MEASURED + "; largest: OpenVINO 4.1 relative, ONNX Runtime 2.6 u absolute"),
    # OpenVINO's erf is accurate in absolute terms near 0 (8.2 u), not relative ones
    "Erf": (4, 32, 0, _MEASURED + "; largest: ONNX Runtime 1.4 relative, OpenVINO 8.2 u absolute"),
    # 0.5·x·(1 + erf(x/√2)) cancels for x < 0: every engine's error scales with |x| there (5.9 u|x|)
    "Gelu": (1, 0, 16, _MEASURED + "; largest: OpenVINO 5.9 u·|x|"),
    "Softplus": (16, 256, 0, _MEASURED + "; largest: ONNX Runtime 4.8 relative, OpenVINO 128 u absolute"),
    "Sin": (8, 4, 0, _MEASURED + " over |x| < 2048; largest: ONNX Runtime 2.8"),
    "Cos": (8, 4, 0, _MEASURED + " over |x| < 2048; largest: ONNX Runtime 2.8"),
    "Sqrt": (2, 0, 0, _IEEE_DIV),
    "Reciprocal": (2, 0, 0, _IEEE_DIV),
    "Add": (1, 0, 0, _IEEE),
    "Sub": (1, 0, 0, _IEEE),
    "Mul": (1, 0, 0, _IEEE),
    "Div": (2, 0, 0, _IEEE_DIV),
    "Cast": (1, 0, 0, _IEEE),
    "CastLike": (1, 0, 0, _IEEE),
    "LeakyRelu": (1, 0, 0, _IEEE),
    "PRelu": (1, 0, 0, _IEEE),
    "DequantizeLinear": (2, 0, 0, _IEEE),
    "HardSigmoid": (2, 0, 0, _IEEE),
    "HardSwish": (4, 0, 0, _IEEE),
    "Elu": (16, 4, 0, "as Exp"),
    "Selu": (16, 4, 0, "as Exp"),
    "Celu": (16, 4, 0, "as Exp"),
    "Softsign": (4, 0, 0, _IEEE_DIV),
    "Mish": (32, 8, 0, "as Softplus and Tanh"),
    "Atan": (8, 4, 0, "as Sin"),
    "Tan": (16, 4, 0, "as Sin"),
    "Asin": (8, 4, 0, "as Sin"),
    "Acos": (8, 4, 0, "as Sin"),
    "Sinh": (16, 4, 0, "as Exp"),
    "Cosh": (16, 4, 0, "as Exp"),
    "Asinh": (16, 4, 0, "as Log"),
    "Acosh": (16, 4, 0, "as Log"),
    "Atanh": (16, 4, 0, "as Log"),
}

# Ops that move, select or compare values: their float64 value is representable, nothing is allowed.
EXACT = frozenset(
    {
        "Abs", "ArgMax", "ArgMin", "BitShift", "Ceil", "Clip", "Compress", "Concat",
        "ConstantOfShape", "Constant", "DepthToSpace", "Equal", "Expand", "Flatten", "Floor",
        "Gather", "GatherElements", "GatherND", "Greater", "GreaterOrEqual", "Identity", "Less",
        "LessOrEqual", "Max", "MaxPool", "Min", "Neg", "NonZero", "Not", "OneHot", "Pad", "Range",
        "Relu", "Reshape", "Round", "Shape", "Sign", "Size", "Slice", "SpaceToDepth", "Split",
        "Squeeze", "Tile", "TopK", "Transpose", "Trilu", "Unsqueeze", "Where", "And", "Or", "Xor",
        "ReduceMax", "ReduceMin", "GlobalMaxPool", "Dropout", "Mod", "IsNaN", "IsInf",
        "SplitToSequence", "SequenceAt", "SequenceConstruct", "ConcatFromSequence", "Optional",
        "OptionalGetElement", "ReverseSequence", "Scatter", "Unique", "MaxUnpool", "Col2Im",
        "CenterCropPad",
    }
)  # fmt: skip

DEFAULT = (64.0, "no per-element bound for this op: 32 ULP of its tensor's largest element")


@dataclass(frozen=True)
class NodeBound:
    """How one node output is judged: allowed = u·(a·|v| + b·M + c), plus `scaled`·u·max|v|."""

    op: str
    kind: str  # "exact" | "elementwise" | "reduction" | "composite" | "default"
    a: float = 0.0
    b: float = 0.0  # coefficient of the magnitude AUX + output (0: no magnitude)
    c: float = 0.0
    scaled: float = 0.0  # in u·max|v| over the tensor (ops without a rule)
    terms: int = 0  # n, for reductions
    lam: float = 0.0
    source: str = ""
    deterministic_b: float = 0.0  # the deterministic bound's coefficient of M (γ_n / u), 0 if none

    @property
    def exact(self) -> bool:
        return self.kind == "exact"

    def general(self) -> str:
        """The rule for the op, without this node's n and λ."""
        if self.exact or self.kind == "default":
            return self.describe()
        parts = [f"{self.a:g}·|v|"] if self.a and not self.terms else (["a·|v|"] if self.a else [])
        if self.b:
            parts.append("(λ·sqrt(n+1) + 1)·M" if self.kind == "reduction" else f"{self.b:g}·M")
        if self.c:
            parts.append(f"{self.c:g}")
        return "u·(" + " + ".join(parts) + ")"

    def describe(self) -> str:
        """The rule in words, for reports."""
        if self.exact:
            return "exact: nothing allowed"
        if self.kind == "default":
            return self.source
        parts = [f"{self.a:g}·|v|"] if self.a else []
        if self.b:
            parts.append(f"{self.b:.3g}·M")
        if self.c:
            parts.append(f"{self.c:g}")
        text = "u·(" + " + ".join(parts) + ")"
        if self.terms:
            text += f", n={self.terms}, λ={self.lam:.2f}"
        return text


def unit_roundoff(dtype: np.dtype[np.generic] | str) -> float:
    """2^-p for a p-bit significand (float32: 2^-24)."""
    return float(2.0 ** -(int(float_info(np.dtype(dtype)).nmant) + 1))


def lam(terms: int, elements: int, delta: float = DELTA) -> float:
    """λ such that λ·sqrt(n)·u·Σ|a||b| holds for every one of `elements` outputs of `terms` terms
    with probability at least 1 - delta (Higham & Mary: 1 - 2n·exp(-λ²/2) per element)."""
    return math.sqrt(2.0 * math.log(2.0 * max(terms, 1) * max(elements, 1) / delta))


def allowance(bound: NodeBound, v: np.ndarray, mag: np.ndarray | None, u: float) -> np.ndarray:
    """Per element, what `bound` allows around the float64 value `v` (`mag`: its M)."""
    av = np.abs(v)
    out = bound.a * av
    if bound.b and mag is not None:
        out = out + bound.b * np.nan_to_num(np.abs(mag), nan=0.0, posinf=np.inf)
    if bound.c:
        out = out + bound.c
    if bound.scaled:
        finite = av[np.isfinite(av)]
        out = out + bound.scaled * (float(finite.max()) if finite.size else 0.0)
    return np.asarray(u * out, np.float64)


# ----------------------------------------------------------------------------- the rules


class Builder:
    """Adds float nodes (promoted to float64 with the judged graph) under unique names."""

    def __init__(self, out: str, opset: int) -> None:
        self.out = out
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self._k = 0

    def name(self) -> str:
        self._k += 1
        return f"{AUX}{self.out}/{self._k}"

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        o = self.name()
        self.nodes.append(helper.make_node(op_type, list(inputs), [o], **attrs))
        return o

    def const(self, value: float | Sequence[int], ints: bool = False) -> str:
        o = self.name()
        arr = np.asarray(value, np.int64 if ints else np.float32)
        self.inits.append(numpy_helper.from_array(arr, o))
        return o

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        attr_until = 18 if op_type in ("ReduceMax", "ReduceMean", "ReduceL1") else 13
        if op_type == "ReduceSum":
            attr_until = 13
        if self.opset < attr_until:
            return self.op(op_type, x, axes=list(axes), keepdims=keepdims)
        return self.op(op_type, x, self.const(list(axes), ints=True), keepdims=keepdims)

    def abs(self, x: str) -> str:
        return self.op("Abs", x)

    def final(self, op_type: str, *inputs: str, **attrs: Any) -> None:
        """The magnitude itself: output AUX + out."""
        self.nodes.append(helper.make_node(op_type, list(inputs), [AUX + self.out], **attrs))


@dataclass(frozen=True)
class _Node:
    """What a rule sees of a node: op, inputs, outputs, attributes, shapes of its tensors."""

    node: onnx.NodeProto
    shapes: Mapping[str, tuple[int, ...]]
    opset: int

    def shape(self, i: int) -> tuple[int, ...] | None:
        if i >= len(self.node.input) or not self.node.input[i]:
            return None
        return self.shapes.get(self.node.input[i])

    def attr(self, name: str, default: Any = None) -> Any:
        for a in self.node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    @property
    def out_elements(self) -> int:
        s = self.shapes.get(self.node.output[0])
        return int(np.prod(s)) if s is not None else 1


def _red(n: _Node, terms: int, source: str = _HM, a: float = 1.0) -> NodeBound:
    lm = lam(terms, n.out_elements)
    b = lm * math.sqrt(terms + 1) + 1
    det = terms / (1 - terms * U32) + 1
    return NodeBound(
        n.node.op_type, "reduction", a=a, b=b, terms=terms, lam=lm, source=source, deterministic_b=det
    )


def _matmul(n: _Node, bld: Builder) -> NodeBound | None:
    sa = n.shape(0)
    if sa is None:
        return None
    bld.final("MatMul", bld.abs(n.node.input[0]), bld.abs(n.node.input[1]))
    return _red(n, int(sa[-1]))


def _gemm(n: _Node, bld: Builder) -> NodeBound | None:
    sa = n.shape(0)
    if sa is None:
        return None
    k = int(sa[0] if n.attr("transA", 0) else sa[-1])
    ins = [bld.abs(i) if i else "" for i in n.node.input]
    attrs = {
        "transA": int(n.attr("transA", 0)),
        "transB": int(n.attr("transB", 0)),
        "alpha": abs(float(n.attr("alpha", 1.0))),
        "beta": abs(float(n.attr("beta", 1.0))),
    }
    bld.final("Gemm", *ins, **attrs)
    return _red(n, k + (1 if len(n.node.input) > 2 and n.node.input[2] else 0))


def _conv(n: _Node, bld: Builder) -> NodeBound | None:
    sw = n.shape(1)
    if sw is None:
        return None
    # Conv's weight is [M, C/group, k...]: n = C/group·prod(k); ConvTranspose's is [C, M/group, k...]
    if n.node.op_type == "Conv":
        terms = int(np.prod(sw[1:]))
    else:
        sx = n.shape(0)
        group = int(n.attr("group", 1))
        if sx is None:
            return None
        terms = int(sx[1] // group * np.prod(sw[2:]))
    ins = [bld.abs(i) if i else "" for i in n.node.input]
    attrs = {a.name: helper.get_attribute_value(a) for a in n.node.attribute}
    bld.final(n.node.op_type, *ins, **attrs)
    return _red(n, terms + (1 if len(n.node.input) > 2 and n.node.input[2] else 0))


def _einsum(n: _Node, bld: Builder) -> NodeBound | None:
    eq = str(n.attr("equation", b"")).replace(" ", "")
    if isinstance(n.attr("equation"), bytes):
        eq = n.attr("equation").decode().replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, rhs = eq.split("->")
    sizes: dict[str, int] = {}
    for term, i in zip(lhs.split(","), range(len(n.node.input)), strict=False):
        s = n.shape(i)
        if s is None or len(s) != len(term):
            return None
        sizes.update(zip(term, s, strict=True))
    terms = int(np.prod([sizes[c] for c in set(lhs) - set(rhs) - {","}] or [1]))
    bld.final("Einsum", *(bld.abs(i) for i in n.node.input), equation=eq)
    return _red(n, terms)


def _axes(n: _Node, rank: int) -> list[int] | None:
    """The reduced axes of a Reduce* node (attribute or constant input), all when none."""
    axes = n.attr("axes")
    if axes is None and len(n.node.input) > 1 and n.node.input[1]:
        return None  # axes from a tensor: resolved by the caller's shapes instead
    if axes is None:
        return [] if int(n.attr("noop_with_empty_axes", 0)) else list(range(rank))
    return [int(a) % rank for a in axes]


def _reduced_terms(n: _Node) -> int | None:
    sx, sy = n.shape(0), n.shapes.get(n.node.output[0])
    if sx is None or sy is None:
        return None
    return max(1, int(np.prod(sx)) // max(1, int(np.prod(sy))))


def _reduce_sum(n: _Node, bld: Builder) -> NodeBound | None:
    terms = _reduced_terms(n)
    if terms is None:
        return None
    op = n.node.op_type
    attrs = {a.name: helper.get_attribute_value(a) for a in n.node.attribute}
    if op in ("ReduceSumSquare", "ReduceL2"):  # positive terms: the magnitude is the value
        lm = lam(terms, n.out_elements)
        a = lm * math.sqrt(terms + 1) + 2
        return NodeBound(
            op, "reduction", a=a / 2 + 1 if op == "ReduceL2" else a, terms=terms, lam=lm, source=_HM
        )
    base = "ReduceSum" if op == "ReduceL1" else op
    bld.final(base, bld.abs(n.node.input[0]), *n.node.input[1:2], **attrs)
    return _red(n, terms, a=2.0 if op == "ReduceMean" else 1.0)


def _pool(n: _Node, bld: Builder) -> NodeBound | None:
    sx = n.shape(0)
    if sx is None:
        return None
    if n.node.op_type == "GlobalAveragePool":
        terms = int(np.prod(sx[2:]))
    else:
        terms = int(np.prod(n.attr("kernel_shape", [1])))
    attrs = {a.name: helper.get_attribute_value(a) for a in n.node.attribute}
    bld.final(n.node.op_type, bld.abs(n.node.input[0]), **attrs)
    return _red(n, terms, a=2.0)


def _variadic_sum(n: _Node, bld: Builder) -> NodeBound | None:
    ins = [bld.abs(i) for i in n.node.input]
    bld.final("Sum", *ins)
    return _red(n, len(ins), a=2.0 if n.node.op_type == "Mean" else 1.0)


def _softmax_axes(n: _Node) -> list[int] | None:
    sx = n.shape(0)
    if sx is None:
        return None
    r = len(sx)
    axis = int(n.attr("axis", -1 if n.opset >= 13 else 1)) % r
    return [axis] if n.opset >= 13 else list(range(axis, r))


def _softmax(n: _Node, bld: Builder) -> NodeBound | None:
    """y_i = exp(x_i - m) / Σ_j exp(x_j - m). Relative to y_i: exp's own error, the rounding of
    x_i - m (|x_i - m|·u, amplified 1:1 by exp), the sum's (λ·sqrt(n)) and the terms' errors
    weighted by the probabilities (Σ_j y_j·|x_j - m|), and the division."""
    axes, sx = _softmax_axes(n), n.shape(0)
    if axes is None or sx is None:
        return None
    terms = int(np.prod([sx[a] for a in axes]))
    x, y = n.node.input[0], n.node.output[0]
    m = bld.reduce("ReduceMax", x, axes)
    s = bld.abs(bld.op("Sub", x, m))
    r = bld.reduce("ReduceSum", bld.op("Mul", y, s), axes)
    bld.final("Mul", bld.abs(y), bld.op("Add", s, r))
    lm = lam(terms, n.out_elements)
    a = ELEMENTWISE["Exp"][0] + lm * math.sqrt(terms) + 2
    source = "composed: Exp's measured bound, the sum of n positive terms (Higham & Mary), x - max's rounding"
    return NodeBound(n.node.op_type, "composite", a=a, b=1.0, c=0.0, terms=terms, lam=lm, source=source)


def _log_softmax(n: _Node, bld: Builder) -> NodeBound | None:
    """y_i = x_i - m - log S: absolute; x_i - m's rounding, log's, and S's relative error."""
    axes, sx = _softmax_axes(n), n.shape(0)
    if axes is None or sx is None:
        return None
    terms = int(np.prod([sx[a] for a in axes]))
    x, y = n.node.input[0], n.node.output[0]
    m = bld.reduce("ReduceMax", x, axes)
    s = bld.abs(bld.op("Sub", x, m))
    p = bld.op("Exp", y)
    r = bld.reduce("ReduceSum", bld.op("Mul", p, s), axes)
    bld.final("Add", bld.op("Add", s, r), bld.abs(bld.op("Sub", bld.op("Sub", x, m), y)))
    lm = lam(terms, n.out_elements)
    c = ELEMENTWISE["Exp"][0] + lm * math.sqrt(terms) + 2
    return NodeBound(
        n.node.op_type, "composite", a=1.0, b=2.0, c=c, terms=terms, lam=lm, source="composed as Softmax"
    )


def _normalization(
    n: _Node,
    bld: Builder,
    axes: list[int],
    scale: str,
    bias: str,
    x: str = "",
    simplified: bool = False,
    carried: str = "",
) -> NodeBound:
    """(x - μ)/σ·γ + β over `axes`, as a stable (two-pass) algorithm computes it: z = (x - μ)/σ
    is off by u·(|z|·(λ·sqrt(n)/2 + 3) + (λ·sqrt(n) + 2)·mean|x|/σ) (the mean's error, the
    variance's relative error halved by the square root, the subtraction and division), then
    scaled by |γ|, plus the rounding of z·γ + β. `carried`: an error the input already holds
    (in units of u; a fused residual add's), propagated to first order: (e + mean e + |z|·mean|z|e)/σ.
    `simplified`: RMS normalization (no mean)."""
    sx = n.shape(0)
    assert sx is not None
    terms = int(np.prod([sx[a] for a in axes]))
    eps = float(n.attr("epsilon", 1e-12 if n.node.domain == "com.microsoft" else 1e-5))
    x = x or n.node.input[0]
    d = x if simplified else bld.op("Sub", x, bld.reduce("ReduceMean", x, axes))
    var = bld.reduce("ReduceMean", bld.op("Mul", d, d), axes)
    sigma = bld.op("Sqrt", bld.op("Add", var, bld.const(eps)))
    z = bld.abs(bld.op("Div", d, sigma))
    lm = lam(terms, n.out_elements)
    k1, k2 = lm * math.sqrt(terms) / 2 + 3, lm * math.sqrt(terms) + 2
    dz = bld.op("Mul", z, bld.const(k1))
    if not simplified:
        ma = bld.op("Div", bld.reduce("ReduceMean", bld.abs(x), axes), sigma)
        dz = bld.op("Add", dz, bld.op("Mul", ma, bld.const(k2)))
    if carried:
        spread = bld.reduce("ReduceMean", bld.op("Mul", z, carried), axes)
        e = bld.op(
            "Add", bld.op("Add", carried, bld.reduce("ReduceMean", carried, axes)), bld.op("Mul", z, spread)
        )
        dz = bld.op("Add", dz, bld.op("Div", e, sigma))
    g = bld.abs(scale) if scale else bld.const(1.0)
    total = bld.op("Add", bld.op("Mul", dz, g), bld.op("Mul", z, g))
    if bias:
        total = bld.op("Add", total, bld.abs(bias))
    bld.final("Identity", total)
    source = "composed: a two-pass mean and variance (Higham & Mary per sum), sqrt, division, scale and shift"
    return NodeBound(n.node.op_type, "composite", a=1.0, b=1.0, terms=terms, lam=lm, source=source)


def _layer_norm(n: _Node, bld: Builder) -> NodeBound | None:
    sx = n.shape(0)
    if sx is None:
        return None
    axis = int(n.attr("axis", -1)) % len(sx)
    ins = [*n.node.input, "", ""]
    return _normalization(n, bld, list(range(axis, len(sx))), ins[1], ins[2])


def _instance_norm(n: _Node, bld: Builder) -> NodeBound | None:
    sx = n.shape(0)
    if sx is None or len(sx) < 3:
        return None
    axes = list(range(2, len(sx)))
    spread = bld.const(list(range(1, len(sx) - 1)), ints=True)  # [C] -> [C, 1, ...] against [N, C, ...]
    scale = bld.op("Unsqueeze", n.node.input[1], spread) if bld.opset >= 13 else ""
    bias = bld.op("Unsqueeze", n.node.input[2], spread) if bld.opset >= 13 else ""
    if not scale:
        return None
    return _normalization(n, bld, axes, scale, bias)


def _batch_norm(n: _Node, bld: Builder) -> NodeBound | None:
    """Inference: x·s' + (β - μ·s') with s' = γ/sqrt(var + eps), as engines fold it."""
    sx = n.shape(0)
    if sx is None or len(sx) < 2 or len(n.node.input) < 5:
        return None
    x, g, b, mu, var = n.node.input[:5]
    eps = float(n.attr("epsilon", 1e-5))
    spread = list(range(1, len(sx) - 1))
    s = bld.op("Div", bld.abs(g), bld.op("Sqrt", bld.op("Add", var, bld.const(eps))))
    if spread:
        axes = bld.const(spread, ints=True) if bld.opset >= 13 else None
        if axes is None:
            return None
        s = bld.op("Unsqueeze", s, axes)
        mu = bld.op("Unsqueeze", mu, axes)
        b = bld.op("Unsqueeze", b, axes)
    total = bld.op("Add", bld.op("Mul", bld.op("Add", bld.abs(x), bld.abs(mu)), s), bld.abs(b))
    bld.final("Identity", total)
    return NodeBound(
        "BatchNormalization", "composite", a=1.0, b=4.0, source="composed: a folded scale and shift"
    )


def _gelu(n: _Node, bld: Builder) -> NodeBound | None:
    bld.final("Abs", n.node.input[0])
    a, c, b, source = ELEMENTWISE["Gelu"]
    return NodeBound("Gelu", "elementwise", a=a, b=b, c=c, source=source)


def _pow(n: _Node, bld: Builder) -> NodeBound | None:
    """x^y through exp(y·log x) in most engines: relative u·|y·log x| beside the function's own."""
    x, y = n.node.input[0], n.node.input[1]
    cond = bld.abs(bld.op("Mul", y, bld.op("Log", bld.abs(x))))
    bld.final("Mul", bld.abs(n.node.output[0]), cond)
    return NodeBound(
        "Pow", "elementwise", a=8.0, b=2.0, source="as Exp and Log: relative u·|y·log x| beside 8"
    )


def _cumsum(n: _Node, bld: Builder) -> NodeBound | None:
    sx = n.shape(0)
    if sx is None:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in n.node.attribute}
    bld.final("CumSum", bld.abs(n.node.input[0]), n.node.input[1], **attrs)
    return _red(n, max(sx) if sx else 1)


def _resize(n: _Node, bld: Builder) -> NodeBound | None:
    mode = n.attr("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode == "nearest":
        return NodeBound("Resize", "exact", source="nearest: selects values")
    attrs = {a.name: helper.get_attribute_value(a) for a in n.node.attribute}
    bld.final("Resize", bld.abs(n.node.input[0]), *n.node.input[1:], **attrs)
    taps = 16 if mode == "cubic" else 4
    return NodeBound(
        "Resize",
        "reduction",
        a=2.0,
        b=float(taps),
        source=f"{mode}: interpolation weights rounded, {taps}·u·Σ|w||x|",
    )


def _scatter(n: _Node, bld: Builder) -> NodeBound | None:
    """A scatter that adds (or multiplies) sums its updates into each cell; others move values."""
    red = n.attr("reduction", b"none")
    red = red.decode() if isinstance(red, bytes) else str(red)
    if red in ("none", "max", "min"):
        return NodeBound(n.node.op_type, "exact", source=f"reduction {red}: moves or selects values")
    su = n.shape(2)
    if red != "add" or su is None:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in n.node.attribute}
    bld.final(n.node.op_type, bld.abs(n.node.input[0]), n.node.input[1], bld.abs(n.node.input[2]), **attrs)
    return _red(n, int(np.prod(su)) + 1)


def _skip_norm(n: _Node, bld: Builder) -> NodeBound | None:
    """ONNX Runtime's SkipLayerNormalization: LayerNormalization of s = input + skip (+ bias);
    the adds' rounding (u·|s| each) is carried through the normalization."""
    sx = n.shape(0)
    if sx is None:
        return None
    simplified = n.node.op_type == "SkipSimplifiedLayerNormalization"
    ins = [*n.node.input, "", "", ""]
    gamma, beta, bias = (ins[2], "", ins[3]) if simplified else (ins[2], ins[3], ins[4])
    s = bld.op("Add", ins[0], ins[1])
    adds = 1.0
    if bias:
        s, adds = bld.op("Add", s, bias), 2.0
    carried = bld.op("Mul", bld.abs(s), bld.const(adds))
    axes = [len(sx) - 1]
    found = _normalization(n, bld, axes, gamma, beta, x=s, simplified=simplified, carried=carried)
    source = "composed: the residual add's rounding carried through a LayerNormalization's bound"
    return replace(found, source=source)


def _fused_matmul(n: _Node, bld: Builder) -> NodeBound | None:
    sa = n.shape(0)
    if sa is None or n.attr("transBatchA", 0) or n.attr("transBatchB", 0):
        return None
    k = int(sa[-2] if n.attr("transA", 0) else sa[-1])
    attrs = {"alpha": abs(float(n.attr("alpha", 1.0))), "transA": int(n.attr("transA", 0)),
             "transB": int(n.attr("transB", 0))}  # fmt: skip
    bld.final(
        "FusedMatMul", bld.abs(n.node.input[0]), bld.abs(n.node.input[1]), domain="com.microsoft", **attrs
    )
    return _red(n, k)


# an activation fused after a Gemm: (its own relative rounding a, absolute c); each is 1-Lipschitz
_ACTIVATIONS = {"": (0.0, 0.0), "Relu": (0.0, 0.0), "LeakyRelu": (1.0, 0.0), "Tanh": (16.0, 0.0),
                "Sigmoid": (16.0, 8.0), "HardSigmoid": (2.0, 0.0)}  # fmt: skip


def _fused_gemm(n: _Node, bld: Builder) -> NodeBound | None:
    act = n.attr("activation", b"")
    act = act.decode() if isinstance(act, bytes) else str(act)
    if act not in _ACTIVATIONS:
        return None
    found = _gemm(n, bld)
    if found is None:
        return None
    a, c = _ACTIVATIONS[act]
    then = f"{_HM}; then {act or 'no activation'} (1-Lipschitz) and its rounding"
    return replace(found, op=n.node.op_type, a=found.a + a, c=c, source=then)


def _gelu_like(b: float, a: float, source: str, bias: bool = False) -> Callable[[_Node, Builder], NodeBound]:
    def rule(n: _Node, bld: Builder) -> NodeBound:
        x = n.node.input[0]
        if bias and len(n.node.input) > 1 and n.node.input[1]:
            x = bld.op("Add", x, n.node.input[1])
        bld.final("Abs", x)
        return NodeBound(n.node.op_type, "elementwise", a=a, b=b, source=source)

    return rule


_CONTRIB: dict[str, Callable[[_Node, Builder], NodeBound | None]] = {
    "SkipLayerNormalization": _skip_norm,
    "SkipSimplifiedLayerNormalization": _skip_norm,
    "FusedMatMul": _fused_matmul,
    "FusedGemm": _fused_gemm,
    # the tanh form: Tanh's measured bound (16) beside Gelu's cancellation for x < 0 (16·|x|)
    "FastGelu": _gelu_like(32.0, 16.0, "as Gelu and Tanh (measured)", bias=True),
    # x·sigmoid(1.702·x): Sigmoid's relative 16 and absolute 8, the latter times |x|
    "QuickGelu": _gelu_like(8.0, 17.0, "as Sigmoid (measured), times x"),
    # Gelu(a + b): the add's rounding carried with gain at most 1.13, beside Gelu's own
    "BiasGelu": _gelu_like(18.0, 1.0, "as Gelu (measured), after an add", bias=True),
}

_RULES: dict[str, Callable[[_Node, Builder], NodeBound | None]] = {
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Conv": _conv,
    "ConvTranspose": _conv,
    "Einsum": _einsum,
    "ReduceSum": _reduce_sum,
    "ReduceMean": _reduce_sum,
    "ReduceL1": _reduce_sum,
    "ReduceSumSquare": _reduce_sum,
    "ReduceL2": _reduce_sum,
    "AveragePool": _pool,
    "GlobalAveragePool": _pool,
    "Sum": _variadic_sum,
    "Mean": _variadic_sum,
    "Softmax": _softmax,
    "LogSoftmax": _log_softmax,
    "LayerNormalization": _layer_norm,
    "InstanceNormalization": _instance_norm,
    "BatchNormalization": _batch_norm,
    "Gelu": _gelu,
    "Pow": _pow,
    "CumSum": _cumsum,
    "Resize": _resize,
    "ScatterND": _scatter,
    "ScatterElements": _scatter,
}


def node_bound(
    node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]], opset: int
) -> tuple[NodeBound, list[onnx.NodeProto], list[TensorProto]]:
    """The bound of `node`'s first output, and the nodes and constants that compute its magnitude
    (output AUX + output) in the judged graph. Later outputs: see `secondary_bound`."""
    op = node.op_type
    domain = node.domain or ""
    out = node.output[0] if node.output else ""
    if domain in ("", "ai.onnx") and op in EXACT:
        return NodeBound(op, "exact", source="exact: the op moves, selects or compares values"), [], []
    rule = (
        _RULES.get(op)
        if domain in ("", "ai.onnx")
        else _CONTRIB.get(op)
        if domain == "com.microsoft"
        else None
    )
    if rule is not None:
        bld = Builder(out, opset)
        try:
            found = rule(_Node(node, shapes, opset), bld)
        except (KeyError, TypeError, ValueError, IndexError):
            found = None
        if found is not None:
            return found, bld.nodes, bld.inits
    if domain in ("", "ai.onnx") and op in ELEMENTWISE:
        a, c, b, source = ELEMENTWISE[op]
        if b:
            bld = Builder(out, opset)
            bld.final("Abs", node.input[0])
            return NodeBound(op, "elementwise", a=a, b=b, c=c, source=source), bld.nodes, bld.inits
        return NodeBound(op, "elementwise", a=a, c=c, source=source), [], []
    return NodeBound(op, "default", scaled=DEFAULT[0], source=DEFAULT[1]), [], []


def secondary_bound(op: str) -> NodeBound:
    """A node's outputs after the first (LayerNormalization's mean, TopK's indices)."""
    if op in EXACT:
        return NodeBound(op, "exact", source="exact: the op moves, selects or compares values")
    return NodeBound(op, "default", scaled=DEFAULT[0], source=DEFAULT[1])


# ------------------------------------------------------------ composition through uncaptured nodes

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


def _sum(bld: Builder, parts: Sequence[str]) -> str | None:
    parts = [p for p in parts if p]
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
    e = [err.get(i, "") for i in ins]
    x = ins[0] if ins else ""
    v = node.output[0]
    if op in _MOVE and e and e[0]:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if op in ("Cast", "CastLike"):
            return e[0], ""
        if op == "Pad":
            return bld.op("Pad", e[0], *ins[1:2], **{k: w for k, w in attrs.items() if k == "mode"}), ""
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
        parts = [ei or bld.op("Mul", bld.abs(i), bld.const(0.0)) for i, ei in zip(ins, e, strict=True)]
        return bld.op("Concat", *parts, axis=int(next(a.i for a in node.attribute if a.name == "axis"))), ""
    gain = _derivative(op, x, v, bld)
    if gain is not None and e and e[0]:
        return bld.op("Mul", e[0], gain), ""
    if op == "MatMul":
        return _sum(bld, [bld.op("MatMul", e[0], bld.abs(ins[1])) if e[0] else "",
                          bld.op("MatMul", bld.abs(ins[0]), e[1]) if e[1] else ""]), ""  # fmt: skip
    if op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin") and e[0]:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        base = "ReduceMax" if op in ("ReduceMax", "ReduceMin") else op
        if base == "ReduceMax" and len(ins) > 1 and opset < 18:
            return None, "ReduceMax with axes as an input"
        return bld.op(base, e[0], *ins[1:2], **attrs), ""
    if op == "Softmax" and e[0] and opset >= 13:
        axis = next((int(a.i) for a in node.attribute if a.name == "axis"), -1)
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
