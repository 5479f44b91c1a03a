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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xbackend.numerics.metrics import float_info

__all__ = [
    "AUX",
    "DEFAULT",
    "DELTA",
    "ELEMENTWISE",
    "EXACT",
    "HM",
    "U32",
    "Builder",
    "NodeBound",
    "NodeView",
    "allowance",
    "attributes",
    "lam",
    "unit_roundoff",
]

U32 = 2.0**-24
DELTA = 1e-6  # per node: the chance that a correct engine's rounding passes the bound
AUX = "xb.mag."  # the judged graph's magnitude output of node output t: AUX + t

_MEASURED = "measured against float64 (benchmarks/elementwise_bounds.py): numpy, ONNX Runtime, OpenVINO"
_IEEE = "IEEE 754: correctly rounded"
_IEEE_DIV = "IEEE 754: correctly rounded; 2 for an engine that multiplies by a reciprocal"
HM = "Higham & Mary 2019: λ·sqrt(n+1)·u·Σ|a||b| per element, probabilistic"

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
    # start + i·delta: a multiply and an add (exact for integers, which are compared exactly)
    "Range": (2, 0, 0, _IEEE),
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
        "LessOrEqual", "Max", "MaxPool", "Min", "Neg", "NonZero", "Not", "OneHot", "Pad",
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
    # of a and b, the probabilistic part (Higham & Mary's λ·sqrt(n) of a sum's roundings): where
    # nodes compose, these parts of different nodes add root-sum-square (judged_graph)
    prob_a: float = 0.0
    prob_b: float = 0.0

    @property
    def exact(self) -> bool:
        """Whether the op is exact (its result the float64 value rounded once)."""
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
    # 0 · inf (an exact op on a mask's -inf) is nan, judged by equality; a magnitude near float64's
    # largest overflows to inf, an allowance that judges nothing (the vacuity check says so)
    with np.errstate(invalid="ignore", over="ignore"):
        out = np.multiply(av, u * bound.a, dtype=np.float64)  # a fresh array: added to in place
        if bound.b and mag is not None:
            am = np.abs(mag)  # float32 where the judge wrote it so: multiplied in float64
            if np.isnan(am.max(initial=0.0)):
                am = np.nan_to_num(am, nan=0.0, posinf=np.inf)
            out += np.multiply(am, u * bound.b, dtype=np.float64)
        if bound.c:
            out += u * bound.c
        if bound.scaled:
            finite = av[np.isfinite(av)]
            out += u * bound.scaled * (float(finite.max()) if finite.size else 0.0)
        return np.asarray(out, np.float64)


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes by name, as Python values."""
    return {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}


class Builder:
    """Adds float nodes (promoted to float64 with the judged graph) under unique names."""

    def __init__(self, out: str, opset: int) -> None:
        self.out = out
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self._k = 0

    def name(self) -> str:
        """A fresh auxiliary tensor name under this node's output."""
        self._k += 1
        return f"{AUX}{self.out}/{self._k}"

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        """Append a node `op_type` reading `inputs` (with `attrs`); the name of its output."""
        o = self.name()
        self.nodes.append(helper.make_node(op_type, list(inputs), [o], **attrs))
        return o

    def const(self, value: float | Sequence[int], ints: bool = False) -> str:
        """A float32 constant (int64 with `ints`) as an initializer; its name."""
        o = self.name()
        arr = np.asarray(value, np.int64 if ints else np.float32)
        self.inits.append(numpy_helper.from_array(arr, o))
        return o

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        """A reduction over `axes` of `x`, the axes as an attribute or an input as the opset wants; its
        output's name."""
        attr_until = 18 if op_type in ("ReduceMax", "ReduceMean", "ReduceL1") else 13
        if op_type == "ReduceSum":
            attr_until = 13
        if self.opset < attr_until:
            return self.op(op_type, x, axes=list(axes), keepdims=keepdims)
        return self.op(op_type, x, self.const(list(axes), ints=True), keepdims=keepdims)

    def abs(self, x: str) -> str:
        """|x| as a node; its output's name."""
        return self.op("Abs", x)

    def final(self, op_type: str, *inputs: str, **attrs: Any) -> None:
        """The magnitude itself: output AUX + out."""
        self.nodes.append(helper.make_node(op_type, list(inputs), [AUX + self.out], **attrs))


@dataclass(frozen=True)
class NodeView:
    """What a rule sees of a node: op, inputs, outputs, attributes, shapes of its tensors."""

    node: onnx.NodeProto
    shapes: Mapping[str, tuple[int, ...]]
    opset: int

    def shape(self, i: int) -> tuple[int, ...] | None:
        """The shape of the node's input `i`, or None where it is absent or unknown."""
        if i >= len(self.node.input) or not self.node.input[i]:
            return None
        return self.shapes.get(self.node.input[i])

    def attr(self, name: str, default: Any = None) -> Any:
        """The node's attribute `name`, or `default`."""
        return self.attrs.get(name, default)

    @property
    def attrs(self) -> dict[str, Any]:
        """The node's attributes, to copy onto the same op over other inputs."""
        return attributes(self.node)

    @property
    def out_elements(self) -> int:
        """The element count of the node's first output (1 where its shape is unknown)."""
        s = self.shapes.get(self.node.output[0])
        return int(np.prod(s)) if s is not None else 1
