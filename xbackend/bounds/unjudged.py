"""What rounding allows a node to differ by between two correct engines, per op type, in ULP
of the result, each bound with its source: the noise floor's tolerance (4x the larger of the
floor and this bound) for a backend that could not be judged against float64. A judged backend's
nodes are held to xbackend.bounds.element and xbackend.bounds.rules instead.

A node fed the same inputs on two engines may still differ: the engines evaluate its math
functions with different approximations, and reductions sum in different orders (the
noise floor measures that part). The bounds below are the elementwise part. Those of the
math functions were measured by an earlier form of benchmarks/elementwise_bounds.py (each engine against the
correctly rounded float64 result over 2^18 inputs, in ULP of the result or of 1.0 for
smaller results; the bound is the two largest engines' errors added, doubled for other
instruction sets, rounded up to a power of 2); the rest follow from IEEE 754.
"""

from __future__ import annotations

import math

__all__ = ["DEFAULT_BOUND", "EXACT", "ROUNDING", "bound_for", "summation_bound"]

_MEASURED = "measured: numpy, ONNX Runtime and OpenVINO against the correctly rounded result"
_IEEE = "IEEE 754: correctly rounded; 1 ULP more for an engine that fuses or reassociates"
_IEEE_DIV = "IEEE 754: correctly rounded; 2 ULP for an engine that multiplies by a reciprocal"

# Ops that move, select or compare values: any difference is a real one.
EXACT = frozenset(
    {
        "Abs", "ArgMax", "ArgMin", "BitShift", "Cast", "CastLike", "Ceil", "Clip", "Compress",
        "Concat", "ConstantOfShape", "Constant", "DepthToSpace", "Equal", "Expand", "Flatten",
        "Floor", "Gather", "GatherElements", "GatherND", "Greater", "GreaterOrEqual", "Identity",
        "Less", "LessOrEqual", "Max", "MaxPool", "Min", "Neg", "NonZero", "Not", "OneHot", "Pad",
        "Range", "Relu", "Reshape", "Round", "Shape", "Sign",
        "Size", "Slice", "SpaceToDepth", "Split", "Squeeze", "Tile", "TopK", "Transpose",
        "Trilu", "Unsqueeze", "Where", "And", "Or", "Xor", "ReduceMax", "ReduceMin",
        "GlobalMaxPool", "LeakyRelu", "PRelu", "Dropout", "Mod",
    }
)  # fmt: skip

_REDUCTION = "the sum's order is the noise floor's; 1 ULP for a bias or scale fused into it"
_COMPOSITE = "its reductions are the noise floor's; the math functions' bounds added"

ROUNDING: dict[str, tuple[float, str]] = {
    "Add": (1, _IEEE),
    "Sub": (1, _IEEE),
    "Mul": (1, _IEEE),
    "Sum": (1, _IEEE),
    "Div": (2, _IEEE_DIV),
    "Reciprocal": (2, _IEEE_DIV),
    "Sqrt": (2, _IEEE_DIV),
    "Exp": (16, _MEASURED),
    "Log": (4, _MEASURED),
    "Tanh": (8, _MEASURED),
    "Sigmoid": (8, _MEASURED),
    "Erf": (16, _MEASURED),
    "Gelu": (32, _MEASURED),
    "Softplus": (32, _MEASURED),
    "Sin": (4, _MEASURED),
    "Cos": (4, _MEASURED),
    "MatMul": (1, _REDUCTION),
    "Gemm": (1, _REDUCTION),
    "Conv": (1, _REDUCTION),
    "ConvTranspose": (1, _REDUCTION),
    "Einsum": (1, _REDUCTION),
    "ScatterND": (1, _REDUCTION),
    "ScatterElements": (1, _REDUCTION),
    "ReduceSum": (1, _REDUCTION),
    "ReduceSumSquare": (1, _REDUCTION),
    "ReduceMean": (2, _IEEE_DIV),
    "ReduceL2": (2, _IEEE_DIV),
    "AveragePool": (2, _IEEE_DIV),
    "GlobalAveragePool": (2, _IEEE_DIV),
    "BatchNormalization": (4, "a multiply-add with a reciprocal square root folded in (IEEE 754)"),
    "LayerNormalization": (4, _COMPOSITE),
    "GroupNormalization": (4, _COMPOSITE),
    "InstanceNormalization": (4, _COMPOSITE),
    "Softmax": (18, _COMPOSITE),
    "LogSoftmax": (20, _COMPOSITE),
    "ReduceLogSumExp": (20, _COMPOSITE),
}

DEFAULT_BOUND = (32.0, "no stated bound for this op: the largest of the math functions'")


def bound_for(op_type: str) -> tuple[float, str]:
    """The ULP two correct engines may differ by at one node of `op_type`, and its source."""
    if op_type in EXACT:
        return 0.0, "exact: the op moves, selects or compares values"
    return ROUNDING.get(op_type, DEFAULT_BOUND)


def summation_bound(terms: int) -> float:
    """What two correct engines may differ by at a reduction of `terms` terms, in ULP of the
    result: sqrt(terms), Higham's probabilistic bound for recursive summation (error about
    sqrt(n) u sum|x_i|, with high probability) where sum|x_i| is about |sum|.

    The noise floor samples reorderings of one engine's algorithm, and a blocked or pairwise
    algorithm moves little under them: ONNX Runtime's ReduceSum over 6480 positive terms (the
    ONNX node test nllloss_NCd1d2d3d4d5_mean_weight_expanded) is 18 ULP from the correctly
    rounded sum while 8 reorderings of it move it by 4 at most. A long sum's legitimate spread
    is the algorithm's, not only the order's."""
    return math.sqrt(terms) if terms >= 2 else 0.0
