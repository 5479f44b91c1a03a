"""Each op's per-element allowance (xbackend.bounds.element.NodeBound), and the float nodes that compute
its operands' magnitude M in the judged graph: reductions by Higham & Mary's probabilistic bound,
composites (Softmax, normalizations, Gelu) from their parts, ONNX Runtime's fused kernels
(com.microsoft) from their definitions, exact ops at 0, and a stated default for the rest."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from xbackend.bounds.element import (
    DEFAULT,
    ELEMENTWISE,
    EXACT,
    HM,
    Builder,
    NodeBound,
    NodeView,
    lam,
)
from xbackend.bounds.reductions import REDUCTIONS, gemm, red

__all__ = ["node_bound", "secondary_bound"]


def _softmax_axes(node_view: NodeView) -> list[int] | None:
    sx = node_view.shape(0)
    if sx is None:
        return None
    r = len(sx)
    axis = int(node_view.attr("axis", -1 if node_view.opset >= 13 else 1)) % r
    return [axis] if node_view.opset >= 13 else list(range(axis, r))


def _spread(bld: Builder, x: str, m: str) -> str:
    """|x - max|, 0 where x is infinite: a masked (-inf) logit's probability is exactly 0."""
    return bld.op("Where", bld.op("IsInf", x), bld.const(0.0), bld.abs(bld.op("Sub", x, m)))


def _softmax(node_view: NodeView, bld: Builder) -> NodeBound | None:
    """y_i = exp(x_i - m) / Σ_j exp(x_j - m). Relative to y_i: exp's own error, the rounding of
    x_i - m (|x_i - m|·u, amplified 1:1 by exp), the sum's (λ·sqrt(n)) and the terms' errors
    weighted by the probabilities (Σ_j y_j·|x_j - m|), and the division."""
    axes, sx = _softmax_axes(node_view), node_view.shape(0)
    if axes is None or sx is None:
        return None
    terms = int(np.prod([sx[axis] for axis in axes]))
    x, y = node_view.node.input[0], node_view.node.output[0]
    m = bld.reduce("ReduceMax", x, axes)
    s = _spread(bld, x, m)
    r = bld.reduce("ReduceSum", bld.op("Mul", y, s), axes)
    bld.final("Mul", bld.abs(y), bld.op("Add", s, r))
    lm = lam(terms, node_view.out_elements)
    a = ELEMENTWISE["Exp"][0] + lm * math.sqrt(terms) + 2
    source = "composed: Exp's measured bound, the sum of n positive terms (Higham & Mary), x - max's rounding"
    return NodeBound(
        node_view.node.op_type,
        "composite",
        a=a,
        b=1.0,
        c=0.0,
        terms=terms,
        lam=lm,
        source=source,
        prob_a=lm * math.sqrt(terms),
    )


def _log_softmax(node_view: NodeView, bld: Builder) -> NodeBound | None:
    """y_i = x_i - m - log S: absolute; x_i - m's rounding, log's, and S's relative error."""
    axes, sx = _softmax_axes(node_view), node_view.shape(0)
    if axes is None or sx is None:
        return None
    terms = int(np.prod([sx[axis] for axis in axes]))
    x, y = node_view.node.input[0], node_view.node.output[0]
    m = bld.reduce("ReduceMax", x, axes)
    s = _spread(bld, x, m)
    p = bld.op("Exp", y)
    r = bld.reduce("ReduceSum", bld.op("Mul", p, s), axes)
    bld.final("Add", bld.op("Add", s, r), bld.abs(bld.op("Sub", bld.op("Sub", x, m), y)))
    lm = lam(terms, node_view.out_elements)
    c = ELEMENTWISE["Exp"][0] + lm * math.sqrt(terms) + 2
    return NodeBound(
        node_view.node.op_type,
        "composite",
        a=1.0,
        b=2.0,
        c=c,
        terms=terms,
        lam=lm,
        source="composed as Softmax",
    )


def _normalization(
    node_view: NodeView,
    bld: Builder,
    axes: list[int],
    scale: str,
    bias: str,
    x: str = "",
    simplified: bool = False,
    carried: str = "",
    shape: tuple[int, ...] | None = None,
) -> NodeBound:
    """(x - μ)/σ·γ + β over `axes`, as a stable (two-pass) algorithm computes it: z = (x - μ)/σ
    is off by u·(|z|·(λ·sqrt(n)/2 + 3) + (λ·sqrt(n) + 2)·mean|x|/σ) (the mean's error, the
    variance's relative error halved by the square root, the subtraction and division), then
    scaled by |γ|, plus the rounding of z·γ + β. `carried`: an error the input already holds
    (in units of u; a fused residual add's), propagated to first order: (e + mean e + |z|·mean|z|e)/σ.
    `simplified`: RMS normalization (no mean); `shape`: x's, where x is not the node's first input."""
    sx = shape or node_view.shape(0)
    assert sx is not None
    terms = int(np.prod([sx[axis] for axis in axes]))
    eps = float(node_view.attr("epsilon", 1e-12 if node_view.node.domain == "com.microsoft" else 1e-5))
    x = x or node_view.node.input[0]
    d = x if simplified else bld.op("Sub", x, bld.reduce("ReduceMean", x, axes))
    var = bld.reduce("ReduceMean", bld.op("Mul", d, d), axes)
    sigma = bld.op("Sqrt", bld.op("Add", var, bld.const(eps)))
    z = bld.abs(bld.op("Div", d, sigma))
    lm = lam(terms, node_view.out_elements)
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
    return NodeBound(node_view.node.op_type, "composite", a=1.0, b=1.0, terms=terms, lam=lm, source=source)


def _layer_norm(node_view: NodeView, bld: Builder) -> NodeBound | None:
    sx = node_view.shape(0)
    if sx is None:
        return None
    axis = int(node_view.attr("axis", -1)) % len(sx)
    ins = [*node_view.node.input, "", ""]
    return _normalization(node_view, bld, list(range(axis, len(sx))), ins[1], ins[2])


def _instance_norm(node_view: NodeView, bld: Builder) -> NodeBound | None:
    sx = node_view.shape(0)
    if sx is None or len(sx) < 3:
        return None
    axes = list(range(2, len(sx)))
    spread = bld.const(list(range(1, len(sx) - 1)), ints=True)  # [C] -> [C, 1, ...] against [N, C, ...]
    scale = bld.op("Unsqueeze", node_view.node.input[1], spread) if bld.opset >= 13 else ""
    bias = bld.op("Unsqueeze", node_view.node.input[2], spread) if bld.opset >= 13 else ""
    if not scale:
        return None
    return _normalization(node_view, bld, axes, scale, bias)


def _batch_norm(node_view: NodeView, bld: Builder) -> NodeBound | None:
    """Inference: x·s' + (β - μ·s') with s' = γ/sqrt(var + eps), as engines fold it."""
    sx = node_view.shape(0)
    if sx is None or len(sx) < 2 or len(node_view.node.input) < 5:
        return None
    x, g, b, mu, var = node_view.node.input[:5]
    eps = float(node_view.attr("epsilon", 1e-5))
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


def _gelu(node_view: NodeView, bld: Builder) -> NodeBound | None:
    bld.final("Abs", node_view.node.input[0])
    a, c, b, source = ELEMENTWISE["Gelu"]
    return NodeBound("Gelu", "elementwise", a=a, b=b, c=c, source=source)


def _pow(node_view: NodeView, bld: Builder) -> NodeBound | None:
    """x^y through exp(y·log x) in most engines: relative u·|y·log x| beside the function's own."""
    x, y = node_view.node.input[0], node_view.node.input[1]
    # an integer exponent (int64, as exporters write x**2) in float: Mul takes one type
    y = bld.op("Cast", y, to=onnx.TensorProto.FLOAT)
    cond = bld.abs(bld.op("Mul", y, bld.op("Log", bld.abs(x))))
    bld.final("Mul", bld.abs(node_view.node.output[0]), cond)
    return NodeBound(
        "Pow", "elementwise", a=8.0, b=2.0, source="as Exp and Log: relative u·|y·log x| beside 8"
    )


# Resize's sample coordinates (x + 0.5)/scale - 0.5 and the like are rounded to float32: at a
# coordinate of size L, up to about 4 roundings of u·L move each tap's weight, and each weight's
# slope times the taps' largest magnitude moves the value (linear: 2 taps of slope 1; cubic: the
# Keys kernel's slopes sum to under 3).
_COORD = {"linear": 8.0, "cubic": 12.0}


def _resize(node_view: NodeView, bld: Builder) -> NodeBound | None:
    mode = node_view.attr("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode == "nearest":
        return NodeBound("Resize", "exact", source="nearest: selects values")
    attrs = node_view.attrs
    taps = 16 if mode == "cubic" else 4
    mag = bld.op("Resize", bld.abs(node_view.node.input[0]), *node_view.node.input[1:], **attrs)
    coord = _coordinates(node_view, bld, mode, attrs)
    if coord is None:
        bld.final("Identity", mag)
        source = f"{mode}: interpolation weights rounded, {taps}·u·Σ|w||x|"
    else:
        near, length = coord
        bld.final("Add", mag, bld.op("Mul", near, bld.const(_COORD[mode] * length / taps)))
        source = (
            f"{mode}: interpolation weights rounded, {taps}·u·Σ|w||x|, and the sample coordinates "
            f"rounded, {_COORD[mode]:g}·u·L·max|taps| (L: the resized axes' lengths, {length:g})"
        )
    return NodeBound("Resize", "reduction", a=2.0, b=float(taps), source=source)


def _coordinates(
    node_view: NodeView, bld: Builder, mode: str, attrs: dict[str, Any]
) -> tuple[str, float] | None:
    """Each output element's taps' largest magnitude (a max-pool of |x| over the taps, sampled at
    the coordinate's floor) and the resized axes' summed input lengths; None where the resized
    axes are not the trailing spatial ones of an N, C, ... input, or the resize is antialiased."""
    sx, so = node_view.shape(0), node_view.shapes.get(node_view.node.output[0])
    if sx is None or so is None or len(sx) < 3 or attrs.get("antialias") or attrs.get("axes"):
        return None
    changed = [k for k, (a, b) in enumerate(zip(sx, so, strict=False)) if a != b]
    if not changed or min(changed) < 2:
        return None
    spatial = len(sx) - 2
    k, before, after = (4, 1, 2) if mode == "cubic" else (2, 0, 1)
    # the edge taps repeated, as Resize clamps its indices (onnx's MaxPool mis-sizes uneven pads)
    pads = bld.const([0, 0, *[before] * spatial, 0, 0, *[after] * spatial], ints=True)
    edged = bld.op("Pad", bld.abs(node_view.node.input[0]), pads, mode="edge")
    pool = bld.op("MaxPool", edged, kernel_shape=[k] * spatial, strides=[1] * spatial)
    drop = ("mode", "cubic_coeff_a", "nearest_mode", "exclude_outside")
    keep = {key: attr for key, attr in attrs.items() if key not in drop}
    near = bld.op("Resize", pool, *node_view.node.input[1:], mode="nearest", nearest_mode="floor", **keep)
    return near, float(sum(int(sx[a]) for a in changed))


def _scatter(node_view: NodeView, bld: Builder) -> NodeBound | None:
    """A scatter that adds (or multiplies) sums its updates into each cell; others move values."""
    how = node_view.attr("reduction", b"none")
    how = how.decode() if isinstance(how, bytes) else str(how)
    if how in ("none", "max", "min"):
        return NodeBound(node_view.node.op_type, "exact", source=f"reduction {how}: moves or selects values")
    su = node_view.shape(2)
    if how != "add" or su is None:
        return None
    attrs = node_view.attrs
    bld.final(
        node_view.node.op_type,
        bld.abs(node_view.node.input[0]),
        node_view.node.input[1],
        bld.abs(node_view.node.input[2]),
        **attrs,
    )
    return red(node_view, int(np.prod(su)) + 1)


def _skip_norm(node_view: NodeView, bld: Builder) -> NodeBound | None:
    """ONNX Runtime's SkipLayerNormalization: LayerNormalization of s = input + skip (+ bias);
    the adds' rounding (u·|s| each) is carried through the normalization."""
    sx = node_view.shape(0)
    if sx is None:
        return None
    simplified = node_view.node.op_type == "SkipSimplifiedLayerNormalization"
    ins = [*node_view.node.input, "", "", ""]
    gamma, beta, bias = (ins[2], "", ins[3]) if simplified else (ins[2], ins[3], ins[4])
    s = bld.op("Add", ins[0], ins[1])
    adds = 1.0
    if bias:
        s, adds = bld.op("Add", s, bias), 2.0
    carried = bld.op("Mul", bld.abs(s), bld.const(adds))
    axes = [len(sx) - 1]
    found = _normalization(node_view, bld, axes, gamma, beta, x=s, simplified=simplified, carried=carried)
    source = "composed: the residual add's rounding carried through a LayerNormalization's bound"
    return replace(found, source=source)


def _simplified_norm(node_view: NodeView, bld: Builder) -> NodeBound | None:
    """ONNX Runtime's SimplifiedLayerNormalization (RMSNorm): x / sqrt(mean(x²) + ε) · γ."""
    sx = node_view.shape(0)
    if sx is None:
        return None
    axis = int(node_view.attr("axis", -1)) % len(sx)
    scale = node_view.node.input[1] if len(node_view.node.input) > 1 else ""
    return _normalization(node_view, bld, list(range(axis, len(sx))), scale, "", simplified=True)


def _fused_matmul(node_view: NodeView, bld: Builder) -> NodeBound | None:
    sa = node_view.shape(0)
    if sa is None or node_view.attr("transBatchA", 0) or node_view.attr("transBatchB", 0):
        return None
    k = int(sa[-2] if node_view.attr("transA", 0) else sa[-1])
    attrs = {"alpha": abs(float(node_view.attr("alpha", 1.0))), "transA": int(node_view.attr("transA", 0)),
             "transB": int(node_view.attr("transB", 0))}  # fmt: skip
    bld.final(
        "FusedMatMul",
        bld.abs(node_view.node.input[0]),
        bld.abs(node_view.node.input[1]),
        domain="com.microsoft",
        **attrs,
    )
    return red(node_view, k)


# an activation fused after a Gemm: (its own relative rounding a, absolute c); each is 1-Lipschitz
_ACTIVATIONS = {"": (0.0, 0.0), "Relu": (0.0, 0.0), "LeakyRelu": (1.0, 0.0), "Tanh": (16.0, 0.0),
                "Sigmoid": (16.0, 8.0), "HardSigmoid": (2.0, 0.0)}  # fmt: skip


def _fused_gemm(node_view: NodeView, bld: Builder) -> NodeBound | None:
    act = node_view.attr("activation", b"")
    act = act.decode() if isinstance(act, bytes) else str(act)
    if act not in _ACTIVATIONS:
        return None
    found = gemm(node_view, bld)
    if found is None:
        return None
    a, c = _ACTIVATIONS[act]
    then = f"{HM}; then {act or 'no activation'} (1-Lipschitz) and its rounding"
    return replace(found, op=node_view.node.op_type, a=found.a + a, c=c, source=then)


def _gelu_like(
    b: float, a: float, source: str, bias: bool = False
) -> Callable[[NodeView, Builder], NodeBound]:
    def rule(node_view: NodeView, bld: Builder) -> NodeBound:
        x = node_view.node.input[0]
        if bias and len(node_view.node.input) > 1 and node_view.node.input[1]:
            x = bld.op("Add", x, node_view.node.input[1])
        bld.final("Abs", x)
        return NodeBound(node_view.node.op_type, "elementwise", a=a, b=b, source=source)

    return rule


# Kernels whose bound xbackend.runners.contrib_transformer computes (BOUND_OP's output, in u):
# (a, b) of u·(a·|v| + b·M), and why
_COMPUTED = {
    "Attention": (1.0, 1.0, "composed: QKV projection, Q·Kᵀ, softmax and P·V (Higham & Mary per product)"),
    "MultiHeadAttention": (1.0, 1.0, "composed: Q·Kᵀ, softmax and P·V (Higham & Mary per product)"),
    "GroupQueryAttention": (1.0, 1.0, "composed: rotary, Q·Kᵀ, softmax and P·V (Higham & Mary per product)"),
    "RotaryEmbedding": (1.0, 2.0, "x1·cos ∓ x2·sin: two rounded products and their sum"),
    "BiasSplitGelu": (3.0, 17.2, "the bias add, Gelu (measured: u·(|g| + 16·|x|)) and the product"),
    "BiasAdd": (1.0, 1.0, "two rounded adds"),
    "MatMulNBits": (1.0, 1.0, "Higham & Mary over K, each weight's dequantization rounded once; "
                    "accuracy_level 4: its int8 activations' steps"),
}  # fmt: skip
BOUND_OP = "XbackendBound"  # xbackend.runners.contrib's magnitude of a kernel of _COMPUTED


def _computed(node_view: NodeView, bld: Builder) -> NodeBound | None:
    op = node_view.node.op_type
    a, b, source = _COMPUTED[op]
    bld.final(BOUND_OP, *node_view.node.input, domain="com.microsoft", of=op, **node_view.attrs)
    return NodeBound(op, "composite", a=a, b=b, source=source)


def _embed_norm(node_view: NodeView, bld: Builder) -> NodeBound | None:
    """EmbedLayerNormalization: LayerNormalization of the gathered embeddings' sum, its two adds'
    rounding carried through."""
    shape = node_view.shapes.get(node_view.node.output[0])
    if shape is None:
        return None
    ins = [*node_view.node.input, "", "", ""]
    s = bld.op(
        BOUND_OP, *node_view.node.input, domain="com.microsoft", of=node_view.node.op_type, **node_view.attrs
    )
    carried = bld.op("Mul", bld.abs(s), bld.const(2.0))
    found = _normalization(
        node_view, bld, [len(shape) - 1], ins[5], ins[6], x=s, carried=carried, shape=shape
    )
    return replace(found, source="composed: the embeddings' adds carried through LayerNormalization's bound")


def _gathers(node_view: NodeView, bld: Builder) -> NodeBound:
    """T5's buckets are integers; the table's values are gathered."""
    return NodeBound(node_view.node.op_type, "exact", source="gathers a table's rows")


_CONTRIB: dict[str, Callable[[NodeView, Builder], NodeBound | None]] = {
    **{op: _computed for op in _COMPUTED},
    "EmbedLayerNormalization": _embed_norm,
    "RelativePositionBias": _gathers,
    "SkipLayerNormalization": _skip_norm,
    "SkipSimplifiedLayerNormalization": _skip_norm,
    "SimplifiedLayerNormalization": _simplified_norm,
    "Gelu": _gelu,
    "FusedMatMul": _fused_matmul,
    "FusedGemm": _fused_gemm,
    # the tanh form: Tanh's measured bound (16) beside Gelu's cancellation for x < 0 (16·|x|)
    "FastGelu": _gelu_like(32.0, 16.0, "as Gelu and Tanh (measured)", bias=True),
    # x·sigmoid(1.702·x): Sigmoid's relative 16 and absolute 8, the latter times |x|
    "QuickGelu": _gelu_like(8.0, 17.0, "as Sigmoid (measured), times x"),
    # Gelu(a + b): the add's rounding carried with gain at most 1.13, beside Gelu's own
    "BiasGelu": _gelu_like(18.0, 1.0, "as Gelu (measured), after an add", bias=True),
}

_RULES: dict[str, Callable[[NodeView, Builder], NodeBound | None]] = {
    **REDUCTIONS,
    "Softmax": _softmax,
    "LogSoftmax": _log_softmax,
    "LayerNormalization": _layer_norm,
    "InstanceNormalization": _instance_norm,
    "BatchNormalization": _batch_norm,
    "Gelu": _gelu,
    "Pow": _pow,
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
            found = rule(NodeView(node, shapes, opset), bld)
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
