"""Reductions' per-element allowances (Higham & Mary's probabilistic bound for n terms, its
deterministic twin beside), and the float nodes that compute their magnitude M = the same op on
|operands| in the judged graph: products, convolutions, Einsum, Reduce*, pools, variadic sums,
running sums."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from xbackend.bounds.element import HM, U32, Builder, NodeBound, NodeView, lam

__all__ = ["REDUCTIONS", "gemm", "red"]


def red(node_view: NodeView, terms: int, source: str = HM, a: float = 1.0) -> NodeBound:
    """The bound of a reduction of `terms` terms per output element (Higham & Mary's λ·sqrt(n)), its
    deterministic worst case beside it; `a` scales the rounding of the result itself."""
    lm = lam(terms, node_view.out_elements)
    b = lm * math.sqrt(terms + 1) + 1
    det = terms / (1 - terms * U32) + 1
    return NodeBound(
        node_view.node.op_type,
        "reduction",
        a=a,
        b=b,
        terms=terms,
        lam=lm,
        source=source,
        deterministic_b=det,
        prob_b=b - 1,
    )


def _matmul(node_view: NodeView, bld: Builder) -> NodeBound | None:
    sa = node_view.shape(0)
    if sa is None:
        return None
    bld.final("MatMul", bld.abs(node_view.node.input[0]), bld.abs(node_view.node.input[1]))
    return red(node_view, int(sa[-1]))


def gemm(node_view: NodeView, bld: Builder) -> NodeBound | None:
    """Gemm's bound: its dot products over K (transA read), the bias one more term; None where the input's
    shape is unknown."""
    sa = node_view.shape(0)
    if sa is None:
        return None
    k = int(sa[0] if node_view.attr("transA", 0) else sa[-1])
    ins = [bld.abs(input_name) if input_name else "" for input_name in node_view.node.input]
    attrs = {
        "transA": int(node_view.attr("transA", 0)),
        "transB": int(node_view.attr("transB", 0)),
        "alpha": abs(float(node_view.attr("alpha", 1.0))),
        "beta": abs(float(node_view.attr("beta", 1.0))),
    }
    bld.final("Gemm", *ins, **attrs)
    return red(node_view, k + (1 if len(node_view.node.input) > 2 and node_view.node.input[2] else 0))


def _conv(node_view: NodeView, bld: Builder) -> NodeBound | None:
    sw = node_view.shape(1)
    if sw is None:
        return None
    # Conv's weight is [M, C/group, k...]: n = C/group·prod(k); ConvTranspose's is [C, M/group, k...]
    if node_view.node.op_type == "Conv":
        terms = int(np.prod(sw[1:]))
    else:
        sx = node_view.shape(0)
        group = int(node_view.attr("group", 1))
        if sx is None:
            return None
        terms = int(sx[1] // group * np.prod(sw[2:]))
    ins = [bld.abs(input_name) if input_name else "" for input_name in node_view.node.input]
    attrs = node_view.attrs
    bld.final(node_view.node.op_type, *ins, **attrs)
    return red(node_view, terms + (1 if len(node_view.node.input) > 2 and node_view.node.input[2] else 0))


def _einsum(node_view: NodeView, bld: Builder) -> NodeBound | None:
    eq = str(node_view.attr("equation", b"")).replace(" ", "")
    if isinstance(node_view.attr("equation"), bytes):
        eq = node_view.attr("equation").decode().replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, rhs = eq.split("->")
    sizes: dict[str, int] = {}
    for term, i in zip(lhs.split(","), range(len(node_view.node.input)), strict=False):
        s = node_view.shape(i)
        if s is None or len(s) != len(term):
            return None
        sizes.update(zip(term, s, strict=True))
    terms = int(np.prod([sizes[c] for c in set(lhs) - set(rhs) - {","}] or [1]))
    bld.final("Einsum", *(bld.abs(input_name) for input_name in node_view.node.input), equation=eq)
    return red(node_view, terms)


def _axes(node_view: NodeView, rank: int) -> list[int] | None:
    """The reduced axes of a Reduce* node (attribute or constant input), all when none."""
    axes = node_view.attr("axes")
    if axes is None and len(node_view.node.input) > 1 and node_view.node.input[1]:
        return None  # axes from a tensor: resolved by the caller's shapes instead
    if axes is None:
        return [] if int(node_view.attr("noop_with_empty_axes", 0)) else list(range(rank))
    return [int(axis) % rank for axis in axes]


def _reduced_terms(node_view: NodeView) -> int | None:
    sx, sy = node_view.shape(0), node_view.shapes.get(node_view.node.output[0])
    if sx is None or sy is None:
        return None
    return max(1, int(np.prod(sx)) // max(1, int(np.prod(sy))))


def _reduce_sum(node_view: NodeView, bld: Builder) -> NodeBound | None:
    terms = _reduced_terms(node_view)
    if terms is None:
        return None
    op = node_view.node.op_type
    attrs = node_view.attrs
    if op in ("ReduceSumSquare", "ReduceL2"):  # positive terms: the magnitude is the value
        lm = lam(terms, node_view.out_elements)
        a, pa = lm * math.sqrt(terms + 1) + 2, lm * math.sqrt(terms + 1)
        l2 = op == "ReduceL2"
        return NodeBound(
            op,
            "reduction",
            a=a / 2 + 1 if l2 else a,
            terms=terms,
            lam=lm,
            source=HM,
            prob_a=pa / 2 if l2 else pa,
        )
    base = "ReduceSum" if op == "ReduceL1" else op
    bld.final(base, bld.abs(node_view.node.input[0]), *node_view.node.input[1:2], **attrs)
    return red(node_view, terms, a=2.0 if op == "ReduceMean" else 1.0)


def _pool(node_view: NodeView, bld: Builder) -> NodeBound | None:
    sx = node_view.shape(0)
    if sx is None:
        return None
    if node_view.node.op_type == "GlobalAveragePool":
        terms = int(np.prod(sx[2:]))
    else:
        terms = int(np.prod(node_view.attr("kernel_shape", [1])))
    attrs = node_view.attrs
    bld.final(node_view.node.op_type, bld.abs(node_view.node.input[0]), **attrs)
    return red(node_view, terms, a=2.0)


def _variadic_sum(node_view: NodeView, bld: Builder) -> NodeBound | None:
    ins = [bld.abs(input_name) for input_name in node_view.node.input]
    bld.final("Sum", *ins)
    return red(node_view, len(ins), a=2.0 if node_view.node.op_type == "Mean" else 1.0)


def _cumsum(node_view: NodeView, bld: Builder) -> NodeBound | None:
    sx = node_view.shape(0)
    if sx is None:
        return None
    attrs = node_view.attrs
    bound = red(node_view, max(sx) if sx else 1)
    x = bld.abs(node_view.node.input[0])
    mag = bld.op("CumSum", x, node_view.node.input[1], **attrs)
    # a constant input (a running count, a fixed step): every partial sum rounds alike, the
    # errors are correlated, and only the deterministic bound γ_n·Σ|x| holds
    same = bld.op("Equal", bld.op("ReduceMax", x, keepdims=1), bld.op("ReduceMin", x, keepdims=1))
    factor = bld.op("Where", same, bld.const(bound.deterministic_b / bound.b), bld.const(1.0))
    bld.final("Mul", mag, factor)
    # prob_b 0: a constant input's sums are not independent roundings
    return replace(bound, source=HM + "; a constant input's running sum: γ_n·Σ|x|, deterministic", prob_b=0.0)


REDUCTIONS = {
    "MatMul": _matmul,
    "Gemm": gemm,
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
    "CumSum": _cumsum,
}
