"""Each node judged against its own float64 value, element by element.

The severed model (xbackend.model.sever) reads every node's inputs from graph inputs, fed the
reference's captured values. The judged model is that graph plus, per node, the float nodes
that compute its operands' magnitude (xbackend.bounds.rules.node_bound); the oracle runner evaluates
it in float64 without rounding back (narrow=false). So each node's float64 value is computed on
exactly the float inputs every backend's severed run was given, and every backend (the
reference included: its own capture is its severed run, since it was fed itself) is judged by
the same per-element allowance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xbackend.bounds.element import AUX, U32, Builder, NodeBound, allowance, unit_roundoff
from xbackend.bounds.propagation import PROP, own_allowance, propagate, propagate_rest
from xbackend.bounds.rules import node_bound, secondary_bound
from xbackend.files.modelref import np_dtype
from xbackend.files.run_values import CaptureFile
from xbackend.model.sever import SEVERED
from xbackend.numerics.metrics import COMPUTE_FLOATS, float_info, ulp_at
from xbackend.numerics.values import Value
from xbackend.results.explanation import LocalErrors, NodeJudgment, Origin, ReorderCheck

__all__ = ["JUDGE_PHASE", "Judged", "at_declared", "judge_backend", "judged_model", "reorder_check"]

JUDGE_PHASE = "judge"


@dataclass(frozen=True)
class Judged:
    """The judged model and how each node output is judged."""

    proto: onnx.ModelProto
    bounds: Mapping[str, NodeBound]  # node output -> its bound
    tensors: tuple[str, ...]  # node outputs and magnitudes the judge run exposes
    composed: Mapping[str, str] = field(default_factory=dict)  # node output -> how it inherits
    # an exact op's output that carries an uncaptured node's error -> (that node's op, its output)
    blame: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # each node's tensors (its outputs, magnitude and what it inherits), in `tensors` order: a
    # window of the judge holds whole nodes, so a node is judged with its own magnitude
    groups: tuple[tuple[str, ...], ...] = ()
    # each float node output's dtype as the model declares it: the precision it is judged at,
    # whatever dtype a backend hands back
    declared: Mapping[str, str] = field(default_factory=dict)

    @property
    def order(self) -> tuple[str, ...]:
        """The node outputs judged, in graph order."""
        return tuple(t for t in self.tensors if t in self.bounds)


def _opset(proto: onnx.ModelProto) -> int:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)


def judged_model(
    severed: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]],
    captured: Mapping[str, str],
    fill_shapes: bool = False,
) -> Judged:
    """`severed` with every node's magnitude as an extra output (AUX + output), and each node
    output's bound (`shapes`: tensor shapes by original name, as captured; `captured`: the
    tensors the reference holds, and their dtypes, which the severed model is fed;
    `fill_shapes`: shape inference's concrete shapes take precedence, for a graph whose own
    tensors the captures do not name: ORT's optimized one).

    A node that reads a tensor the reference did not capture (torch exposes module outputs)
    runs from above it: the errors allowed to the uncaptured nodes are propagated to first order
    through them (xbackend.bounds.propagation.propagate) and added to its allowance (output PROP + output)."""
    out = onnx.ModelProto()
    out.CopyFrom(severed)
    g = out.graph
    opset = _opset(out)
    floats, inferred, declared = _inferred(severed)
    # the captured shapes first; shape inference's where nothing captured a tensor (--tensors)
    base = {**shapes, **inferred} if fill_shapes else {**inferred, **shapes}
    known = dict(base)
    known.update({SEVERED + n: s for n, s in base.items()})
    known.update({t.name: tuple(int(d) for d in t.dims) for t in g.initializer})
    read = {i for n in g.node for i in n.input}
    bounds: dict[str, NodeBound] = {}
    composed: dict[str, str] = {}
    extra_nodes: list[onnx.NodeProto] = []
    tensors: list[str] = []
    starts: list[int] = []  # where each node's tensors begin in `tensors`
    err: dict[str, str] = {}  # an uncaptured tensor -> its whole allowance
    made_by: dict[str, tuple[str, str]] = {}  # an uncaptured tensor -> the inexact node that made it
    blame: dict[str, tuple[str, str]] = {}
    poison: dict[str, str] = {}  # a tensor -> where its elements are undefined (bool, in the judged graph)
    for node in list(g.node):
        outs = [o for o in node.output if o]
        if not outs:
            continue
        starts.append(len(tensors))
        bound, nodes, inits = node_bound(node, known, opset)
        bounds[outs[0]] = bound
        tensors.append(outs[0])
        for o in outs[1:]:
            bounds[o] = secondary_bound(node.op_type)
            tensors.append(o)
        if nodes and floats.get(outs[0], False):  # an integer result is compared exactly: no magnitude
            extra_nodes.extend(nodes)
            g.initializer.extend(inits)
            tensors.append(AUX + outs[0])
            g.output.append(_typed(AUX + outs[0], known.get(outs[0])))
        inherited = {i: err[i] for i in node.input if i in err}
        maker = next((made_by[i] for i in node.input if i in made_by), None)
        if bound.exact and maker is not None:
            blame[outs[0]] = maker
        made_by[outs[0]] = maker if bound.exact and maker is not None else (node.op_type, outs[0])
        undefined = _undefined(node, poison, floats, bld_u := Builder(UNDEF + outs[0], opset))
        if undefined:  # elements ONNX leaves undefined (a cast of inf to an integer), and what they reach
            poison[outs[0]] = undefined
            extra_nodes.extend(bld_u.nodes)
            g.initializer.extend(bld_u.inits)
            extra_nodes.append(helper.make_node("Identity", [undefined], [UNDEF + outs[0]]))
            tensors.append(UNDEF + outs[0])
            vi = onnx.ValueInfoProto()
            vi.name = UNDEF + outs[0]
            vi.type.tensor_type.elem_type = TensorProto.BOOL
            g.output.append(vi)
        if inherited and node.op_type in REACHABLE:  # a step of inexact floats: either side may be right
            _reachable(node, inherited, bld_r := Builder(REACH + outs[0], opset), g, floats)
            extra_nodes.extend(bld_r.nodes)
            g.initializer.extend(bld_r.inits)
            tensors += [LO + outs[0], HI + outs[0]]
            composed[outs[0]] = "judged as reachable from its operands within their inherited errors"
        if not floats.get(outs[0], False):
            if inherited and outs[0] not in composed:  # an index, mask or shape computed from inexact values
                composed[outs[0]] = "its inputs' errors cannot be carried into a non-float output"
            continue
        bld = Builder(PROP + outs[0], opset)
        prop = None
        if inherited:
            prop, assumption = propagate(node, inherited, bld, opset)
            composed[outs[0]] = (
                assumption or f"{len(inherited)} uncaptured input(s), propagated to first order"
            )
        if prop is not None:  # judged with it wherever a backend hands this tensor over
            _broadcast_to(bld, prop, outs[0], PROP + outs[0])
            tensors.append(PROP + outs[0])
            g.output.append(_typed(PROP + outs[0], known.get(outs[0]), symbolic=True))
        if outs[0] not in captured and outs[0] in read:  # the nodes below read it: they inherit its error
            # uncaptured, so no dtype of its own was seen: float32's unit roundoff
            mine = own_allowance(bound, outs[0], U32, bool(nodes), bld)
            err[outs[0]] = bld.op("Add", mine, prop) if prop is not None else mine
        for o, (rest, why) in (propagate_rest(node, inherited, bld) if inherited else {}).items():
            if not floats.get(o, False):
                continue
            composed[o] = why or f"{len(inherited)} uncaptured input(s), propagated to first order"
            _broadcast_to(bld, rest, o, PROP + o)
            tensors.append(PROP + o)
            g.output.append(_typed(PROP + o, known.get(o), symbolic=True))
            if o not in captured and o in read:
                mine = own_allowance(bounds[o], o, U32, False, bld)
                err[o] = bld.op("Add", mine, rest)
        extra_nodes.extend(bld.nodes)
        g.initializer.extend(bld.inits)
    g.node.extend(extra_nodes)
    _flatten_unshaped(g)
    ends = [*starts[1:], len(tensors)]
    groups = tuple(tuple(tensors[a:b]) for a, b in zip(starts, ends, strict=True))
    for t, d in captured.items():  # a tensor shape inference could not type: as the reference holds it
        if floats.get(t, False) and d in COMPUTE_FLOATS:
            declared.setdefault(t, d)
    return Judged(out, bounds, tuple(tensors), composed, blame, groups, declared)


_FLOAT_NAMES = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.DOUBLE: "float64",
}
_FLOAT_TYPES = frozenset(_FLOAT_NAMES)


# ops whose outputs are not float whatever their inputs (indices, shapes, masks)
_NON_FLOAT = frozenset(
    {
        "Shape", "Size", "ArgMax", "ArgMin", "NonZero", "Equal", "Less", "LessOrEqual", "Greater",
        "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf", "QuantizeLinear",
    }
)  # fmt: skip


def _inferred(
    proto: onnx.ModelProto,
) -> tuple[dict[str, bool], dict[str, tuple[int, ...]], dict[str, str]]:
    """One shape inference: whether each tensor is a float tensor, the concrete shapes it finds,
    and each float tensor's declared dtype. Where it has no answer (past a kernel onnx has no
    schema for: ORT's fused ones) a float input makes a float output, but for ops that make
    indices, shapes or masks, and casts to other types."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # a model shape inference cannot type: the rules below
        inferred = proto
    g = inferred.graph
    out: dict[str, bool] = {}
    declared: dict[str, str] = {}
    for vi in [*g.value_info, *g.input, *g.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            elem = vi.type.tensor_type.elem_type
            out[vi.name] = elem in _FLOAT_TYPES
            if elem in _FLOAT_TYPES:
                declared[vi.name] = _FLOAT_NAMES[elem]
    out.update({t.name: t.data_type in _FLOAT_TYPES for t in g.initializer})
    for node in proto.graph.node:
        for k, o in enumerate(node.output):
            if not o or o in out:
                continue
            if node.op_type in ("Cast", "CastLike"):
                to = next((a.i for a in node.attribute if a.name == "to"), 0)
                out[o] = to in _FLOAT_TYPES if node.op_type == "Cast" else out.get(node.input[1], False)
            elif node.op_type in _NON_FLOAT or (node.op_type == "TopK" and k == 1):
                out[o] = False
            else:
                out[o] = any(out.get(i, False) for i in node.input if i)
    shapes = {}
    for vi in g.value_info:
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
    return out, shapes, declared


UNDEF = "xb.undef."  # where a node output's elements are undefined by ONNX: UNDEF + t
_INT_MAX: dict[int, int] = {TensorProto.INT8: 2**7, TensorProto.INT16: 2**15, TensorProto.INT32: 2**31,
            TensorProto.INT64: 2**63, TensorProto.UINT8: 2**8, TensorProto.UINT16: 2**16,
            TensorProto.UINT32: 2**32, TensorProto.UINT64: 2**64}  # fmt: skip
# ops whose every output element is computed from the same elements of its inputs (broadcast)
_ELEMENTWISE = frozenset(
    {"Add", "Sub", "Mul", "Div", "Min", "Max", "Abs", "Neg", "Cast", "Clip", "Mod", "Sign", "Identity",
     "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Not", "And", "Or"}
)  # fmt: skip


def _undefined(
    node: onnx.NodeProto, poison: Mapping[str, str], floats: Mapping[str, bool], bld: Builder
) -> str:
    """A bool tensor of where `node`'s first output is undefined, or '': a float cast to an integer
    type out of its range (inf, NaN: T5's log of a zero distance, which a Where then discards), and
    elementwise results of undefined elements; a Where's, where it selects one."""
    ins = list(node.input)
    mine = [poison.get(i[len(SEVERED) :] if i.startswith(SEVERED) else i, "") for i in ins]
    out = node.output[0]
    if node.op_type == "Cast" and ins and floats.get(_bare(ins[0]), False):
        to = int(next((a.i for a in node.attribute if a.name == "to"), 0))
        if to in _INT_MAX:
            x = ins[0]
            bad = bld.op("Or", bld.op("IsNaN", x), bld.op("IsInf", x))
            bad = bld.op("Or", bad, bld.op("Greater", bld.abs(x), bld.const(float(_INT_MAX[to]))))
            return bld.op("Or", bad, mine[0]) if mine[0] else bad
    if not any(mine):
        return ""
    none = bld.op("Less", out, out)  # False everywhere, in the output's shape
    if node.op_type == "Where" and len(ins) == 3:
        picked = bld.op("Where", ins[0], mine[1] or none, mine[2] or none)
        return bld.op("Or", picked, mine[0]) if mine[0] else picked
    if node.op_type not in _ELEMENTWISE:
        return ""
    total = none
    for m in mine:
        if m:
            total = bld.op("Or", total, m)
    return total


def _bare(name: str) -> str:
    return name[len(SEVERED) :] if name.startswith(SEVERED) else name


# Steps of their float operands: a result an inexact operand can land on either side of.
# Cast, Floor, Ceil, Round are monotone in their input; the comparisons in both operands.
REACHABLE = frozenset({"Cast", "Floor", "Ceil", "Round", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
REACH, LO, HI = "xb.reach.", "xb.lo.", "xb.hi."  # the lowest and highest result reachable


def _reachable(
    node: onnx.NodeProto, err: Mapping[str, str], bld: Builder, g: onnx.GraphProto, floats: Mapping[str, bool]
) -> None:
    """The node evaluated at the ends of its operands' error intervals (outputs LO + out and HI +
    out): a backend's result between them is reachable from operands within their errors."""
    out, ins = node.output[0], list(node.input)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def at(shift: list[str]) -> list[str]:
        return [bld.op("Add" if sgn == "+" else "Sub", i, err[i]) if sgn and i in err else i
                for i, sgn in zip(ins, shift, strict=False)]  # fmt: skip

    if node.op_type in ("Less", "LessOrEqual"):  # a < b: least true at a high, b low
        lo, hi = at(["+", "-"]), at(["-", "+"])
    elif node.op_type in ("Greater", "GreaterOrEqual"):
        lo, hi = at(["-", "+"]), at(["+", "-"])
    else:
        lo, hi = at(["-"]), at(["+"])
    for name, args in ((LO + out, lo), (HI + out, hi)):
        bld.nodes.append(helper.make_node(node.op_type, args, [name], **attrs))
        vi = onnx.ValueInfoProto()
        vi.name = name
        vi.type.tensor_type.elem_type = _out_type(node, floats)
        g.output.append(vi)


def _out_type(node: onnx.NodeProto, floats: Mapping[str, bool]) -> int:
    if node.op_type == "Cast":
        return int(next(a.i for a in node.attribute if a.name == "to"))
    if node.op_type in ("Floor", "Ceil", "Round"):
        return TensorProto.FLOAT
    return TensorProto.BOOL


def _broadcast_to(bld: Builder, err: str, like: str, out: str) -> None:
    """`err` broadcast to the shape of `like` as output `out` (an inherited error of a smaller
    operand, or a scalar, has a rank of its own; the judged graph's outputs declare `like`'s)."""
    zero = bld.op("Mul", bld.abs(like), bld.const(0.0))
    bld.nodes.append(helper.make_node("Add", [zero, err], [out]))


FLAT = "/whole"  # an unshaped extra output's value before it is flattened


def _flatten_unshaped(g: onnx.GraphProto) -> None:
    """Extra outputs whose shape nothing knows (past a node shape inference cannot follow) leave
    flattened, rank 1: a graph output must declare a rank, and the judge reshapes them back."""
    unshaped = {o.name for o in g.output if not o.type.tensor_type.HasField("shape")}
    if not unshaped:
        return
    flat = "xb.flat"
    g.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), flat))
    for node in list(g.node):  # the graph's nodes read the whole value; the output is its flat view
        for k, i in enumerate(node.input):
            if i in unshaped:
                node.input[k] = i + FLAT
        for k, o in enumerate(node.output):
            if o in unshaped:
                node.output[k] = o + FLAT
                g.node.append(helper.make_node("Reshape", [o + FLAT, flat], [o]))
    for o in g.output:
        if o.name in unshaped:
            o.type.tensor_type.shape.dim.add().dim_param = f"{o.name}:flat"


def _typed(name: str, shape: tuple[int, ...] | None, symbolic: bool = False) -> onnx.ValueInfoProto:
    """A float output of the node output's shape (the checker wants a shape on every graph output);
    `symbolic`: its rank only (an inherited error may broadcast from a smaller operand)."""
    if shape is not None and symbolic:
        return helper.make_tensor_value_info(
            name, TensorProto.FLOAT, [f"{name}:{k}" for k in range(len(shape))]
        )
    if shape is None:  # its rank unknown too: no shape at all (an empty one would say scalar)
        vi = onnx.ValueInfoProto()
        vi.name = name
        vi.type.tensor_type.elem_type = TensorProto.FLOAT
        return vi
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _plain_float(v: Value) -> bool:
    return isinstance(v, np.ndarray) and str(v.dtype) in COMPUTE_FLOATS


# Flushing results below the smallest normal to zero is an engine's right; OpenVINO's exp flushes
# what its range reduction scales below 2^-126, results up to about 1.6e-38 (float32's smallest
# normal is 1.18e-38): twice the smallest normal, absolute, is allowed.
FLUSH = 2.0


def _tiny(dtype: np.dtype[np.generic]) -> float:
    return float(float_info(dtype).tiny)


def _flushed(y: np.ndarray, v: np.ndarray, dtype: np.dtype[np.generic]) -> int:
    """Elements the engine returned as zero whose value is a nonzero one below the flush line."""
    with np.errstate(invalid="ignore"):
        kept = v.astype(dtype) != 0  # nonzero in the dtype, subnormals included: not an underflow
        return int(np.count_nonzero((y == 0) & kept & (np.abs(v) < FLUSH * _tiny(dtype))))


def _max(dtype: np.dtype[np.generic]) -> float:
    return float(float_info(dtype).max)


@dataclass(frozen=True)
class _Measured:
    """One node output on one backend, against its float64 value."""

    ratio: float  # the largest error / allowance over the elements
    local_scaled: float | None  # at that element, in ULP of the tensor's largest float64 magnitude
    allowed_scaled: float
    element: tuple[int, ...]
    certain: bool  # past the deterministic bound too
    detail: str = ""
    vacuous: str = ""  # why the allowance judges nothing (not finite, or past the value's magnitude)
    flushed: int = 0  # elements flushed to zero below the normal range


def _fit(mag: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    """A magnitude broadcast to its node output's shape, or one that left flattened reshaped
    back (None where it cannot be)."""
    if mag is None or mag.shape == shape:
        return mag
    if mag.ndim == 1 and mag.size == math.prod(shape) and len(shape) != 1:
        return mag.reshape(shape)
    try:
        return np.broadcast_to(mag, shape)
    except ValueError:
        return None


def element_allowance(
    bound: NodeBound,
    v: np.ndarray,
    mag: np.ndarray | None,
    inherited: np.ndarray | None,
    dtype: np.dtype[np.generic],
) -> np.ndarray:
    """What decides, per element of a node output of `dtype` around its float64 value `v`: the
    bound (`mag`: its operands' magnitude M), flushed subnormals and v's own float64 rounding for
    an inexact op, and what the node inherits from uncaptured nodes above it."""
    allow = allowance(bound, v, _fit(mag, v.shape), unit_roundoff(dtype))
    if not bound.exact:  # v is itself rounded to float64 along its evaluation
        allow = allow * (1 + 2.0**-20) + FLUSH * _tiny(dtype)
    if inherited is not None:
        # flattened, or of a smaller operand: reshaped back, else its largest element everywhere
        fit = _fit(inherited, allow.shape)
        fit = fit if fit is not None else np.full(allow.shape, np.nanmax(np.abs(inherited), initial=0.0))
        allow = allow + np.nan_to_num(np.abs(fit), nan=np.inf)
    return allow


def _reach(y: np.ndarray, lo: Value, hi: Value) -> np.ndarray | None:
    """Per element, whether `y` lies between the lowest and highest results its operands' errors
    reach (None where there are none)."""
    if not (isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray)) or not lo.size == hi.size == y.size:
        return None
    a, b, x = (z.astype(np.float64).reshape(y.shape) for z in (lo, hi, y))  # they may leave flattened
    with np.errstate(invalid="ignore"):
        return (a <= x) & (x <= b)


def _defined(y: np.ndarray, v: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`y` with its undefined elements set to the judge's own values (so they compare equal)."""
    if free.size != y.size or y.shape != v.shape or not free.any():
        return y, v
    mask = free.reshape(y.shape).astype(bool)
    y = np.where(mask, v.astype(y.dtype, copy=False), y)
    return y, np.where(mask, y.astype(v.dtype, copy=False), v)


def _within(y: Value, lo: Value, hi: Value) -> bool:
    return isinstance(y, np.ndarray) and (r := _reach(y, lo, hi)) is not None and bool(r.all())


def _measure(
    y: np.ndarray,
    v: np.ndarray,
    mag: np.ndarray | None,
    bound: NodeBound,
    inherited: np.ndarray | None,
    reached: np.ndarray | None = None,
) -> _Measured:
    dtype = y.dtype
    if v.shape != y.shape:
        return _Measured(math.inf, None, 0.0, (), False, f"shape {y.shape} where float64 gives {v.shape}")
    if y.size == 0:
        return _Measured(0.0, 0.0, 0.0, (), False)
    mag = _fit(mag, v.shape)
    yv = y.astype(np.float64)
    u = unit_roundoff(dtype)
    allow = element_allowance(bound, v, mag, inherited, dtype)
    empty = _vacuous(allow, v, dtype)
    if empty:
        return _Measured(0.0, None, 0.0, (), False, vacuous=empty)
    top = _max(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(yv - v)
        # a float64 value past the dtype's range rounds to the infinity of its sign
        overflow = (np.abs(v) > top) & np.isinf(yv) & (np.sign(yv) == np.sign(v))
        both_nan = np.isnan(yv) & np.isnan(v)
        err = np.where(overflow | both_nan | (yv == v), 0.0, err)
        if reached is not None:  # a step its operands' errors reach
            err = np.where(reached, 0.0, err)
    if np.isnan(err).any():
        i = np.unravel_index(int(np.argmax(np.isnan(err))), err.shape)
        detail = "NaN where float64 gives a number" if np.isnan(yv[i]) else "a number where float64 gives NaN"
        return _Measured(math.inf, None, 0.0, tuple(int(k) for k in i), True, detail)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / allow)
    flat = int(np.argmax(ratio))
    i = np.unravel_index(flat, ratio.shape)
    finite = np.abs(v[np.isfinite(v)])
    scale = ulp_at(float(finite.max()) if finite.size else 0.0, dtype)
    e, a = float(err[i]), float(allow[i])
    certain = False
    if bound.deterministic_b and ratio[i] > 1 and mag is not None:
        det = u * (bound.a * abs(float(v[i])) + bound.deterministic_b * abs(float(mag[i])) + bound.c)
        certain = e > det
    elif ratio[i] > 1:
        certain = bound.kind in ("exact", "elementwise")
    detail = "Inf where float64 gives a number" if math.isinf(e) else ""
    flushed = _flushed(yv, v, dtype)
    return _Measured(
        float(ratio[i]), e / scale, a / scale, tuple(int(k) for k in i), certain, detail, flushed=flushed
    )


def at_declared(y: np.ndarray, declared: str | None) -> tuple[np.ndarray, str]:
    """`y` in the dtype the model declares, and the narrower dtype it came back in ('' if not
    narrower): a wider return is rounded to the declared dtype, a narrower one is widened exactly
    and judged at the declared precision."""
    if declared is None or str(y.dtype) == declared or str(y.dtype) not in COMPUTE_FLOATS:
        return y, ""
    want = np_dtype(declared)
    narrow = float_info(y.dtype).nmant < float_info(want).nmant
    with np.errstate(over="ignore"):
        return y.astype(want), (str(y.dtype) if narrow else "")


def _vacuous(allow: np.ndarray, v: np.ndarray, dtype: np.dtype[np.generic]) -> str:
    """Why an allowance judges nothing: not finite, or past the value's own largest magnitude
    (a result off by its whole size would pass); '' where it judges."""
    finite_v = np.isfinite(v)  # an infinite value (a mask's -inf) is judged by equality
    allow = allow[np.broadcast_to(finite_v, allow.shape)]
    if allow.size == 0:
        return ""
    if not np.isfinite(allow).all():
        return "its allowance is not finite"
    finite = np.abs(v[finite_v])
    top = float(finite.max()) if finite.size else 0.0
    widest = float(allow.max())
    if widest > max(top, _tiny(dtype)):
        return f"its allowance ({widest:.3g}) is larger than the value's own magnitude ({top:.3g})"
    return ""


def _rule(bound: NodeBound, composed: str) -> str:
    return bound.describe() + (f" + inherited ({composed})" if composed else "")


def _exact_differs(y: Value, v: Value) -> str:
    """For values other than float tensors: '' when equal, else why not."""
    if isinstance(y, np.ndarray) and isinstance(v, np.ndarray):
        if y.shape != v.shape:
            return f"shape {y.shape} where float64 gives {v.shape}"
        if y.dtype.kind in "fc" or v.dtype.kind in "fc":
            same = np.array_equal(y.astype(np.float64), v.astype(np.float64), equal_nan=True)
        else:
            same = np.array_equal(y, v)
        return "" if same else "exact values differ"
    if isinstance(y, list) and isinstance(v, list):
        if len(y) != len(v):
            return "a sequence of another length"
        return next((w for a, b in zip(y, v, strict=True) if (w := _exact_differs(a, b))), "")
    if y is None and v is None:
        return ""
    if isinstance(y, dict) and isinstance(v, dict):
        if set(y) != set(v):
            return "a map with other keys"
        return next((w for k in y if (w := _exact_differs(y[k], v[k]))), "")
    return "another kind of value"


BELOW_FLOAT64_ULP = 32  # what the evaluator's own rounding may be, where it computes an op below float64


def _below_float64(y: Value, v: Value) -> str:
    """The dtype of a float value the float64 evaluator computed below float64 (its op's kernel
    casts: onnx's AffineGrid), for a plain float result; '' otherwise."""
    if not (_plain_float(y) and isinstance(v, np.ndarray) and v.dtype.kind == "f"):
        return ""
    return "" if v.dtype == np.float64 else str(v.dtype)


def judge_backend(
    backend: str,
    local_capture: str,
    judge_capture: str,
    judged: Judged,
    order: Sequence[str],
    modules: Mapping[str, str],
    covers: Mapping[str, tuple[str, ...]] | None = None,
    graph: str = "",
) -> LocalErrors:
    """`backend`'s local errors (its severed run's capture) against the float64 judge, in `order`:
    origins where an element is past its allowance (element_allowance: a node run from above
    inputs the reference did not capture adds what it inherits, PROP). `covers`: a fused kernel's
    output -> the original nodes it computes."""
    origins: list[Origin] = []
    nodes: list[NodeJudgment] = []
    worst: tuple[float, str] = (-1.0, "")
    narrowed = False
    flushed = (0, "")  # elements flushed to zero, and the first node that flushed
    with CaptureFile(local_capture) as a, CaptureFile(judge_capture) as j:
        for t in order:
            bound = judged.bounds.get(t)
            if bound is None or t not in a or t not in j:
                continue
            y, v = a[t], j[t]
            module = modules.get(t, "")
            low = _below_float64(y, v)
            if low:  # the evaluator's own rounding is allowed too: 32 ULP of its largest element
                v = np.asarray(v, np.float64)
                finite = np.abs(v[np.isfinite(v)])
                own = BELOW_FLOAT64_ULP * unit_roundoff(low) * (float(finite.max()) if finite.size else 0.0)
                p = j.get(PROP + t)
                prop_low: np.ndarray | None = (p if isinstance(p, np.ndarray) else 0.0) + np.full(
                    v.shape, own
                )
            lo, hi = j.get(LO + t), j.get(HI + t)
            free = j.get(UNDEF + t)
            if isinstance(free, np.ndarray) and isinstance(y, np.ndarray) and isinstance(v, np.ndarray):
                y, v = _defined(y, v, free)  # ONNX leaves those elements undefined: any value is right
            if not (_plain_float(y) and isinstance(v, np.ndarray) and v.dtype == np.float64):
                why = _exact_differs(y, v)
                if why and _within(y, lo, hi):  # a step its operands' errors reach: not an error
                    why = ""
                nodes.append(
                    NodeJudgment(t, bound.op, 0.0 if not why else None, 0.0, 0.0 if not why else math.inf)
                )
                if why:
                    origins.append(
                        Origin(
                            t,
                            module,
                            bound.op,
                            None,
                            0.0,
                            why,
                            rule=_rule(bound, judged.composed.get(t, "")),
                            certain=True,
                        )
                    )
                continue
            assert isinstance(y, np.ndarray)
            y, narrow = at_declared(y, judged.declared.get(t))
            mag, prop = j.get(AUX + t), j.get(PROP + t)
            if low:
                prop = prop_low
            m = _measure(
                y,
                v,
                mag if isinstance(mag, np.ndarray) else None,
                bound,
                prop if isinstance(prop, np.ndarray) else None,
                _reach(y, lo, hi),
            )
            if m.vacuous:
                nodes.append(NodeJudgment(t, bound.op, None, 0.0, 0.0, not_judged=m.vacuous))
                continue
            nodes.append(NodeJudgment(t, bound.op, m.local_scaled, m.allowed_scaled, m.ratio))
            if m.flushed:
                flushed = (flushed[0] + m.flushed, flushed[1] or t)
            if m.ratio > worst[0] and not bound.exact:
                worst = (m.ratio, t)
            returned = f"handed back as {narrow} where the model declares {y.dtype}" if narrow else ""
            if m.ratio > 1 or (narrow and not narrowed):  # the first narrower return loses precision
                narrowed = narrowed or bool(narrow)
                op, detail = bound.op, "; ".join(w for w in (m.detail, returned) if w)
                if t in judged.blame:  # an exact op carries it: name the kernel that made it
                    op, made = judged.blame[t]
                    detail = detail or f"made by {op} at {made}, carried by {bound.op}"
                origins.append(
                    Origin(
                        t,
                        module,
                        op,
                        m.local_scaled,
                        m.allowed_scaled,
                        detail,
                        covers=(covers or {}).get(t, ()),
                        element=m.element,
                        rule=_rule(bound, judged.composed.get(t, ""))
                        + (
                            f"; its float64 value was computed in {low}: {BELOW_FLOAT64_ULP} ULP added"
                            if low
                            else ""
                        ),
                        certain=m.certain,
                    )
                )
    return LocalErrors(
        backend,
        "ok",
        origins=tuple(origins),
        compared=sum(1 for n in nodes if not n.not_judged),
        largest_ratio=worst[0] if worst[0] >= 0 else None,
        largest_at=worst[1],
        nodes=tuple(nodes),
        graph=graph,
        flushed=flushed[0],
        flushed_at=flushed[1],
    )


def reorder_check(
    judged: Judged,
    judge_capture: str,
    base: str,
    spread: str | None,
    samples: int,
    engine: str,
    order: Sequence[str] | None = None,
) -> ReorderCheck:
    """Per node (of `order`: the judge's whole order by default), the largest spread of the K
    orders (against the identity order, element by element: xbackend.numerics.spread) over its allowance:
    a correct engine's own reorderings must stay within."""
    worst: tuple[float, str] = (-1.0, "")
    over: list[str] = []
    if spread is None:
        return ReorderCheck("ok", engine=engine, samples=samples, largest_ratio=0.0)
    with CaptureFile(judge_capture) as j, CaptureFile(base) as b, CaptureFile(spread) as sp:
        held = b.tensors()
        for t in judged.order if order is None else order:
            bound = judged.bounds[t]
            d = sp.get(t)
            if t not in held or not isinstance(d, np.ndarray) or not d.any():
                continue
            dtype, shape = held[t]
            v = j.get(t)
            if not isinstance(v, np.ndarray) or v.shape != shape or d.shape != shape:
                continue
            mag, prop = j.get(AUX + t), j.get(PROP + t)
            allow = element_allowance(
                bound,
                v,
                mag if isinstance(mag, np.ndarray) else None,
                prop if isinstance(prop, np.ndarray) else None,
                np_dtype(dtype),
            )
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = float(np.max(np.where(d == 0, 0.0, d / allow)))
            if ratio > worst[0]:
                worst = (ratio, t)
            if ratio > 1:
                over.append(t)
    return ReorderCheck(
        "ok",
        engine=engine,
        samples=samples,
        largest_ratio=worst[0] if worst[0] >= 0 else 0.0,
        largest_at=worst[1],
        over=tuple(over),
    )
