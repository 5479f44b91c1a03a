"""The judged model: the severed graph with, per node, the float nodes that compute its operands'
magnitude, the errors it inherits from uncaptured nodes above it (first order), the results its
operands' errors reach where it is a step (a cast to an integer, a floor, a comparison), and where
its elements are undefined by ONNX. The oracle evaluates it in float64 (narrow=false)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from xbackend.bounds.element import AUX, U32, Builder, NodeBound, attributes, unit_roundoff
from xbackend.bounds.propagation import (
    PROP,
    independent,
    own_allowance,
    own_probabilistic,
    propagate,
    propagate_rest,
)
from xbackend.bounds.rules import node_bound, secondary_bound
from xbackend.model.sever import SEVERED
from xbackend.numerics.metrics import COMPUTE_FLOATS

__all__ = ["FLAT", "FLOAT_NAMES", "HI", "LO", "REACHABLE", "UNDEF", "Judged", "judged_model"]


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
        return tuple(tensor for tensor in self.tensors if tensor in self.bounds)


def _integers_exact(bld: Builder, t: str, e: str) -> str:
    """An integer cast to float32 is exact below 2^24: a mask's 0 and 1 carry no error (first
    order would multiply u by the -3.4e38 a mask is scaled to)."""
    return bld.op("Where", bld.op("Less", bld.abs(t), bld.const(2.0**24)), bld.const(0.0), e)


def _finite_only(bld: Builder, t: str, e: str) -> str:
    """`t`'s error `e`, 0 where t is infinite: an infinite value is judged by equality (a mask's
    -inf), so it carries no error to the nodes below; inf·0 there would make theirs NaN."""
    return bld.op("Where", bld.op("IsInf", t), bld.const(0.0), e)


def _opset(proto: onnx.ModelProto) -> int:
    return next((opset.version for opset in proto.opset_import if opset.domain in ("", "ai.onnx")), 1)


def judged_model(
    severed: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]],
    captured: Mapping[str, str],
    fill_shapes: bool = False,
    recomputed: Collection[str] = (),
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
    graph = out.graph
    opset = _opset(out)
    floats, inferred, declared = _inferred(severed)
    # the captured shapes first; shape inference's where nothing captured a tensor (--tensors)
    base = {**shapes, **inferred} if fill_shapes else {**inferred, **shapes}
    known = dict(base)
    known.update({SEVERED + key: value for key, value in base.items()})
    known.update(
        {initializer.name: tuple(int(dim) for dim in initializer.dims) for initializer in graph.initializer}
    )
    read = {input_name for node in graph.node for input_name in node.input}
    bounds: dict[str, NodeBound] = {}
    composed: dict[str, str] = {}
    extra_nodes: list[onnx.NodeProto] = []
    tensors: list[str] = []
    starts: list[int] = []  # where each node's tensors begin in `tensors`
    err: dict[str, str] = {}  # an uncaptured tensor -> its whole allowance
    errp: dict[str, str] = {}  # of that, the probabilistic part (λ·sqrt(n) terms, root-sum-square)
    made_by: dict[str, tuple[str, str]] = {}  # an uncaptured tensor -> the inexact node that made it
    blame: dict[str, tuple[str, str]] = {}
    poison: dict[str, str] = {}  # a tensor -> where its elements are undefined (bool, in the judged graph)
    reached: set[str] = set()  # integer results with a reach (LO/HI) in the judged graph
    wide = _read_wide(graph, captured, read, err, bld_w := Builder("xb.wide.", opset))
    folded = _folded(graph, recomputed, read, err, bld_w)
    extra_nodes.extend(bld_w.nodes)
    graph.initializer.extend(bld_w.inits)
    for node in list(graph.node):
        outs = [output_name for output_name in node.output if output_name]
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
            graph.initializer.extend(inits)
            tensors.append(AUX + outs[0])
            graph.output.append(_typed(AUX + outs[0], known.get(outs[0])))
        inherited = {input_name: err[input_name] for input_name in node.input if input_name in err}
        maker = next((made_by[input_name] for input_name in node.input if input_name in made_by), None)
        if bound.exact and maker is not None:
            blame[outs[0]] = maker
        made_by[outs[0]] = maker if bound.exact and maker is not None else (node.op_type, outs[0])
        undefined = _undefined(node, poison, floats, bld_u := Builder(UNDEF + outs[0], opset))
        if undefined:  # elements ONNX leaves undefined (a cast of inf to an integer), and what they reach
            poison[outs[0]] = undefined
            extra_nodes.extend(bld_u.nodes)
            graph.initializer.extend(bld_u.inits)
            extra_nodes.append(helper.make_node("Identity", [undefined], [UNDEF + outs[0]]))
            tensors.append(UNDEF + outs[0])
            vi = onnx.ValueInfoProto()
            vi.name = UNDEF + outs[0]
            vi.type.tensor_type.elem_type = TensorProto.BOOL
            graph.output.append(vi)
        bld_r = Builder(REACH + outs[0], opset)
        if node.op_type in _REQUANTIZED and len(node.input) > _REQUANTIZED[node.op_type] + 1:
            _requantized(node, bld_r, graph)  # the integer result within its output scale's rounding
            extra_nodes.extend(bld_r.nodes)
            graph.initializer.extend(bld_r.inits)
            tensors += [LO + outs[0], HI + outs[0]]
            reached.add(outs[0])
            composed[outs[0]] = "judged as reachable within float32's rounding of its requantization scale"
        elif (
            node.op_type == "DequantizeLinear" and node.input[0] in reached and node.input[0] not in captured
        ):
            # dequantizing a requantized result the engine computed itself: either level it reaches
            for end in (LO, HI):
                ins = [end + node.input[0], *node.input[1:]]
                bld_r.nodes.append(helper.make_node(node.op_type, ins, [end + outs[0]], **attributes(node)))
                graph.output.append(_typed(end + outs[0], known.get(outs[0])))
            extra_nodes.extend(bld_r.nodes)
            tensors += [LO + outs[0], HI + outs[0]]
            composed[outs[0]] = "judged as reachable from the levels its requantized input reaches"
        elif node.op_type == "QuantizeLinear" and node.input and floats.get(node.input[0], False):
            # requantization: an engine divides (or multiplies by 1/scale) in its input's type, so
            # a value within that rounding of a half step may round either way
            x = node.input[0]
            unit = 2 * (unit_roundoff(declared[x]) if declared.get(x) in _LOW else U32)
            own = bld_r.op("Mul", bld_r.abs(x), bld_r.const(unit))
            reach = {**inherited, x: bld_r.op("Add", inherited[x], own) if x in inherited else own}
            _reachable(node, reach, bld_r, graph)
            extra_nodes.extend(bld_r.nodes)
            graph.initializer.extend(bld_r.inits)
            tensors += [LO + outs[0], HI + outs[0]]
            reached.add(outs[0])
            composed[outs[0]] = (
                "judged as reachable within its input's rounding of x / scale (requantization)"
            )
        elif inherited and node.op_type in REACHABLE:  # a step of inexact floats: either side may be right
            _reachable(node, inherited, bld_r, graph)
            extra_nodes.extend(bld_r.nodes)
            graph.initializer.extend(bld_r.inits)
            tensors += [LO + outs[0], HI + outs[0]]
            composed[outs[0]] = "judged as reachable from its operands within their inherited errors"
        if not floats.get(outs[0], False):
            if inherited and outs[0] not in composed:  # an index, mask or shape computed from inexact values
                composed[outs[0]] = "its inputs' errors cannot be carried into a non-float output"
            continue
        bld = Builder(PROP + outs[0], opset)
        prop, assumption = None, ""
        if inherited:
            prop, assumption = propagate(node, inherited, bld, opset)
            composed[outs[0]] = assumption or (
                _WIDE
                if set(inherited) <= wide
                else _RECOMPUTED
                if set(inherited) <= folded
                else f"{len(inherited)} uncaptured input(s), propagated to first order"
            )
        # the probabilistic parts: what is inherited, carried by the same (linear) rules, and the
        # node's own add root-sum-square; a max or an assumed gain carries them as worst-case ones
        linear = prop is not None and not assumption and node.op_type not in _NOT_LINEAR
        carried = (
            {input_name: errp[input_name] for input_name in node.input if input_name in errp}
            if linear
            else {}
        )
        prop_p = propagate(node, carried, bld, opset)[0] if carried else None
        inner = outs[0] not in captured and outs[0] in read  # the nodes below inherit its error
        own_p = own_probabilistic(bound, outs[0], U32, bool(nodes), bld) if prop_p or inner else None
        rss, saved = independent(bld, prop_p, own_p)
        if saved is not None and prop is not None:
            prop = bld.op("Sub", prop, saved)
            composed[outs[0]] += _RSS
        if prop is not None:  # judged with it wherever a backend hands this tensor over
            _broadcast_to(bld, prop, outs[0], PROP + outs[0])
            tensors.append(PROP + outs[0])
            graph.output.append(_typed(PROP + outs[0], known.get(outs[0]), symbolic=True))
        if inner:  # uncaptured, so no dtype of its own was seen: float32's unit roundoff
            mine = own_allowance(bound, outs[0], U32, bool(nodes), bld)
            if node.op_type in ("Cast", "CastLike") and node.input and not floats.get(node.input[0], True):
                mine = _integers_exact(bld, outs[0], mine)
            err[outs[0]] = _finite_only(bld, outs[0], bld.op("Add", mine, prop) if prop is not None else mine)
            if rss is not None:
                errp[outs[0]] = _finite_only(bld, outs[0], rss)
        for o, (rest, why) in (propagate_rest(node, inherited, bld) if inherited else {}).items():
            if not floats.get(o, False):
                continue
            composed[o] = why or f"{len(inherited)} uncaptured input(s), propagated to first order"
            _broadcast_to(bld, rest, o, PROP + o)
            tensors.append(PROP + o)
            graph.output.append(_typed(PROP + o, known.get(o), symbolic=True))
            if o not in captured and o in read:
                mine = own_allowance(bounds[o], o, U32, False, bld)
                err[o] = _finite_only(bld, o, bld.op("Add", mine, rest))
        extra_nodes.extend(bld.nodes)
        graph.initializer.extend(bld.inits)
    graph.node.extend(extra_nodes)
    _flatten_unshaped(graph)
    ends = [*starts[1:], len(tensors)]
    groups = tuple(tuple(tensors[start:end]) for start, end in zip(starts, ends, strict=True))
    for t, value in captured.items():  # a tensor shape inference could not type: as the reference holds it
        if floats.get(t, False) and value in COMPUTE_FLOATS:
            declared.setdefault(t, value)
    return Judged(out, bounds, tuple(tensors), composed, blame, groups, declared)


# propagation rules that are not linear in the error (a max of errors): the parts of an error do
# not pass separately through them
_NOT_LINEAR = frozenset({"ReduceMax", "ReduceMin"})
_RSS = "; the roundings of its sums root-sum-square with those it inherits (Higham & Mary)"
_RECOMPUTED = (
    "a constant the exporter folded, which the backend computes again at run time: within 16·u of its "
    "value, propagated to first order"
)
_WIDE = (
    "its float16/bfloat16 inputs may be read before their rounding to that type (ONNX Runtime's CPU runs "
    "a float16 graph in float32 between casts): their rounding, u·|x|, propagated to first order"
)


def _read_wide(
    graph: onnx.GraphProto, captured: Mapping[str, str], read: set[str], err: dict[str, str], bld: Builder
) -> set[str]:
    """Each severed input of a float16 or bfloat16 tensor a node computed: an engine may hand its
    consumers the value before its rounding to that type, so each carries its own rounding
    (u·|x|) as an inherited error (into `err`); the names."""
    made = {output_name for node in graph.node for output_name in node.output}
    out = set()
    for key, dtype in captured.items():
        name = SEVERED + key
        if dtype in _LOW and name in read and name not in made:
            err[name] = bld.op("Mul", bld.abs(name), bld.const(unit_roundoff(dtype)))
            out.add(name)
    return out


def _folded(
    graph: onnx.GraphProto, recomputed: Collection[str], read: set[str], err: dict[str, str], bld: Builder
) -> set[str]:
    """Each folded constant the backend computes again at run time (`recomputed`): a rounded
    value, so the backend's own may differ from it within FOLDED·u of it (Exp's measured bound,
    the largest of the functions such constants come from), an inherited error (into `err`)."""
    have = {initializer.name for initializer in graph.initializer} | {
        output_name for node in graph.node if node.op_type == "Constant" for output_name in node.output
    }
    out = set()
    for t in recomputed:
        if t in have and t in read:
            err[t] = bld.op("Mul", bld.abs(t), bld.const(FOLDED * U32))
            out.add(t)
    return out


FOLDED = 16.0
_LOW = frozenset({"float16", "bfloat16"})


FLOAT_NAMES: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.DOUBLE: "float64",
}
_FLOAT_TYPES = frozenset(FLOAT_NAMES)


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
    graph = inferred.graph
    out: dict[str, bool] = {}
    declared: dict[str, str] = {}
    for vi in [*graph.value_info, *graph.input, *graph.output]:
        if vi.type.WhichOneof("value") in ("sequence_type", "map_type", "optional_type"):
            out[vi.name] = False  # not a float tensor: no magnitude, no inherited error of its own
        elif vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            elem = vi.type.tensor_type.elem_type
            out[vi.name] = elem in _FLOAT_TYPES
            if elem in _FLOAT_TYPES:
                declared[vi.name] = FLOAT_NAMES[elem]
    out.update({initializer.name: initializer.data_type in _FLOAT_TYPES for initializer in graph.initializer})
    for node in proto.graph.node:
        for index, output_name in enumerate(node.output):
            if not output_name or output_name in out:
                continue
            if node.op_type in ("Cast", "CastLike"):
                to = next((attribute.i for attribute in node.attribute if attribute.name == "to"), 0)
                out[output_name] = (
                    to in _FLOAT_TYPES if node.op_type == "Cast" else out.get(node.input[1], False)
                )
            elif node.op_type in _NON_FLOAT or (node.op_type == "TopK" and index == 1):
                out[output_name] = False
            else:
                out[output_name] = any(out.get(input_name, False) for input_name in node.input if input_name)
    shapes = {}
    for vi in graph.value_info:
        dims = vi.type.tensor_type.shape.dim
        if dims and all(dim.HasField("dim_value") for dim in dims):
            shapes[vi.name] = tuple(int(dim.dim_value) for dim in dims)
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
    type out of its range (inf, NaN: T5's log of a zero distance, which a Where then discards), a
    NaN quantized, and
    elementwise results of undefined elements; a Where's, where it selects one."""
    ins = list(node.input)
    mine = [
        poison.get(input_name[len(SEVERED) :] if input_name.startswith(SEVERED) else input_name, "")
        for input_name in ins
    ]
    out = node.output[0]
    if node.op_type == "Cast" and ins and floats.get(_bare(ins[0]), False):
        to = int(next((attribute.i for attribute in node.attribute if attribute.name == "to"), 0))
        if to in _INT_MAX:
            x = ins[0]
            bad = bld.op("Or", bld.op("IsNaN", x), bld.op("IsInf", x))
            bad = bld.op("Or", bad, bld.op("Greater", bld.abs(x), bld.const(float(_INT_MAX[to]))))
            return bld.op("Or", bad, mine[0]) if mine[0] else bad
    if node.op_type == "QuantizeLinear" and ins and floats.get(_bare(ins[0]), False):
        bad = bld.op("IsNaN", ins[0])  # ONNX does not say what NaN quantizes to (engines differ)
        return bld.op("Or", bad, mine[0]) if mine[0] else bad
    if not any(mine) or (node.op_type not in _ELEMENTWISE and node.op_type != "Where"):
        return ""
    # False everywhere, in the output's shape (whatever its type: labels may be strings)
    none = bld.op(
        "ConstantOfShape", bld.op("Shape", out), value=helper.make_tensor("", TensorProto.BOOL, [1], [False])
    )
    if node.op_type == "Where" and len(ins) == 3:
        picked = bld.op("Where", ins[0], mine[1] or none, mine[2] or none)
        return bld.op("Or", picked, mine[0]) if mine[0] else picked
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


def _reachable(node: onnx.NodeProto, err: Mapping[str, str], bld: Builder, graph: onnx.GraphProto) -> None:
    """The node evaluated at the ends of its operands' error intervals (outputs LO + out and HI +
    out): a backend's result between them is reachable from operands within their errors."""
    out, ins = node.output[0], list(node.input)
    attrs = {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}

    def at(shift: list[str]) -> list[str]:
        return [bld.op("Add" if sgn == "+" else "Sub", i, err[i]) if sgn and i in err else i
                for i, sgn in zip(ins, shift, strict=False)]  # fmt: skip

    if node.op_type in ("Less", "LessOrEqual"):  # a < b: least true at a high, b low
        lo, hi = at(["+", "-"]), at(["-", "+"])
    elif node.op_type in ("Greater", "GreaterOrEqual"):
        lo, hi = at(["-", "+"]), at(["+", "-"])
    else:  # monotone in its first input; the others (a scale, a zero point) as they are
        rest = [""] * (len(ins) - 1)
        lo, hi = at(["-", *rest]), at(["+", *rest])
    for name, args in ((LO + out, lo), (HI + out, hi)):
        bld.nodes.append(helper.make_node(node.op_type, args, [name], **attrs))
        vi = onnx.ValueInfoProto()
        vi.name = name
        vi.type.tensor_type.elem_type = _out_type(node, graph)
        graph.output.append(vi)


# quantized kernels that requantize an integer accumulation with a float scale: the index of their
# output scale (the zero point follows it)
_REQUANTIZED = {
    "QLinearMatMul": 6, "QLinearConv": 6, "QLinearAdd": 6, "QLinearMul": 6, "QLinearSigmoid": 3,
    "QLinearLeakyRelu": 3, "QLinearAveragePool": 3, "QLinearGlobalAveragePool": 3,
}  # fmt: skip


def _requantized(node: onnx.NodeProto, bld: Builder, graph: onnx.GraphProto) -> None:
    """LO + out and HI + out: the kernel with its output scale moved by float32's rounding of the
    multiplier an engine computes (scales' product and quotient, the accumulation as a float):
    a result between them rounds a value within that rounding of a half step."""
    k = _REQUANTIZED[node.op_type]
    out = node.output[0]
    ends = []
    for factor in (1 + 8 * U32, 1 - 8 * U32):
        moved = list(node.input)
        moved[k] = bld.op("Mul", node.input[k], bld.const(factor))
        made = bld.name()
        bld.nodes.append(
            helper.make_node(node.op_type, moved, [made], domain=node.domain, **attributes(node))
        )
        ends.append(made)
    elem = _out_type(node, graph)
    for name, op in ((LO + out, "Min"), (HI + out, "Max")):
        bld.nodes.append(helper.make_node(op, ends, [name]))
        vi = onnx.ValueInfoProto()
        vi.name = name
        vi.type.tensor_type.elem_type = elem
        graph.output.append(vi)


def _out_type(node: onnx.NodeProto, graph: onnx.GraphProto | None = None) -> int:
    if node.op_type == "Cast":
        return int(next(attribute.i for attribute in node.attribute if attribute.name == "to"))
    if node.op_type == "QuantizeLinear" or node.op_type in _REQUANTIZED:
        # the zero point's type, else output_dtype, else uint8
        k = _REQUANTIZED.get(node.op_type, 1) + 1
        zp = node.input[k] if len(node.input) > k else ""
        found = next(
            (
                initializer.data_type
                for initializer in (graph.initializer if graph is not None else ())
                if initializer.name == zp
            ),
            0,
        )
        attr = next((attribute.i for attribute in node.attribute if attribute.name == "output_dtype"), 0)
        return int(found or attr or TensorProto.UINT8)
    if node.op_type in ("Floor", "Ceil", "Round"):
        return TensorProto.FLOAT
    return TensorProto.BOOL


def _broadcast_to(bld: Builder, err: str, like: str, out: str) -> None:
    """`err` broadcast to the shape of `like` as output `out` (an inherited error of a smaller
    operand, or a scalar, has a rank of its own; the judged graph's outputs declare `like`'s)."""
    zero = bld.op("Mul", bld.abs(like), bld.const(0.0))
    bld.nodes.append(helper.make_node("Add", [zero, err], [out]))


FLAT = "/whole"  # an unshaped extra output's value before it is flattened


def _flatten_unshaped(graph: onnx.GraphProto) -> None:
    """Extra outputs whose shape nothing knows (past a node shape inference cannot follow) leave
    flattened, rank 1: a graph output must declare a rank, and the judge reshapes them back."""
    unshaped = {
        output_name.name
        for output_name in graph.output
        if output_name.type.WhichOneof("value") in (None, "tensor_type")
        and not output_name.type.tensor_type.HasField("shape")
    }  # a sequence or a map (ZipMap's) is no tensor: left alone
    if not unshaped:
        return
    flat = "xb.flat"
    graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), flat))
    for node in list(graph.node):  # the graph's nodes read the whole value; the output is its flat view
        for index, input_name in enumerate(node.input):
            if input_name in unshaped:
                node.input[index] = input_name + FLAT
        for index, o in enumerate(node.output):
            if o in unshaped:
                node.output[index] = o + FLAT
                graph.node.append(helper.make_node("Reshape", [o + FLAT, flat], [o]))
    for o in graph.output:
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
