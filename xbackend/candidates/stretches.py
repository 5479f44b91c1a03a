"""A candidate's stretches through inserted casts, judged at the precision they declare.

A converter that keeps a node but casts around it (a float16 graph's inputs cast down, a node
kept in float32 between casts, one computed in bfloat16 inside a float16 model) makes, for the
original's node, a stretch of the candidate: casts, the same op, casts. The candidate's own nodes
are each judged on their own inputs; a stretch is judged whole: the original's node evaluated in
float64 on the candidate's values of its matched inputs, each rounded by the stretch's casts
that keep at least the precision its output declares (the conversion's own rounding), against
the candidate's output, allowed what that node's rule allows at the output's dtype. A cast to a
narrower type inside the stretch is not emulated: its rounding is an error of the stretch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from xbackend.bounds.element import AUX, Builder, NodeBound
from xbackend.bounds.propagation import PROP, propagate
from xbackend.bounds.rules import node_bound
from xbackend.candidates.match import Pair
from xbackend.files.modelref import np_dtype
from xbackend.files.storage import ValueFile
from xbackend.judge.judge_nodes import element_allowance
from xbackend.judge.judged_graph import FLOAT_NAMES
from xbackend.model.extdata import weight_array
from xbackend.numerics.metrics import is_float_dtype, ulp_at
from xbackend.results.candidates import declared_unit
from xbackend.results.explanation import Origin
from xbackend.runners.reference import locale_kept

__all__ = ["Stretch", "evaluate", "judge_stretches", "stretches", "value_of"]


@dataclass(frozen=True)
class Stretch:
    """The original's node `node`, computed by the candidate through casts."""

    node: onnx.NodeProto  # the original's
    output: str  # the candidate's tensor holding its output
    inputs: tuple[tuple[str, str, tuple[str, ...]], ...]  # (original input, its source, casts on the way)
    after: tuple[str, ...]  # casts after the candidate's op, in order
    made: str  # the candidate's op's own output


def _cast_to(node: onnx.NodeProto) -> str:
    to = next((attribute.i for attribute in node.attribute if attribute.name == "to"), 0)
    return FLOAT_NAMES.get(int(to), "")


def stretches(original: onnx.GraphProto, candidate: onnx.GraphProto, pairs: Sequence[Pair]) -> list[Stretch]:
    """The original's nodes the candidate computes through at least one inserted float cast."""
    produced = {output_name: node for node in candidate.node for output_name in node.output if output_name}
    weights = {initializer.name for initializer in candidate.initializer}
    sources = {*weights, *(input_name.name for input_name in candidate.input)}
    found = {pair.original: pair.candidate for pair in pairs if pair.how != "dequantized"}
    orig_weights = {initializer.name for initializer in original.initializer}
    orig_inputs = {input_name.name for input_name in original.input}
    out = []
    for node in original.node:
        outs = [output_name for output_name in node.output if output_name]
        if len(outs) != 1 or outs[0] not in found or node.op_type == "Cast":
            continue
        after: list[str] = []
        p = produced.get(found[outs[0]])
        while p is not None and p.op_type == "Cast" and _cast_to(p):
            after.insert(0, _cast_to(p))
            p = produced.get(p.input[0])
        if (
            p is None
            or p.op_type != node.op_type
            or p.domain != node.domain
            or len(p.input) != len(node.input)
        ):
            continue
        ins = []
        for mine, theirs in zip(p.input, node.input, strict=True):
            casts: list[str] = []
            t = mine
            while t not in sources and t != found.get(theirs) and (q := produced.get(t)) is not None:
                if q.op_type != "Cast" or not _cast_to(q):
                    break
                casts.insert(0, _cast_to(q))
                t = q.input[0]
            reached = t == found.get(theirs) or (t in sources and (t == theirs or theirs in orig_weights))
            if (
                not theirs
                or not reached
                or (theirs not in found and theirs not in orig_weights | orig_inputs)
            ):
                break
            ins.append((theirs, t, tuple(casts)))
        else:
            if after or any(c for _, _, c in ins):
                out.append(Stretch(node, found[outs[0]], tuple(ins), tuple(after), p.output[0]))
    return out


def judge_stretches(
    found: Sequence[Stretch],
    candidate: onnx.GraphProto,
    folder: Path,
    values: ValueFile,
    feeds: Mapping[str, object],
    opset: int,
    working: str,
) -> tuple[list[Origin], int]:
    """Each stretch's origin where its output passes its allowance; and how many were judged.
    A stretch declares the candidate's `working` float type (float16 for a float16 model), or its
    op's own type where that is wider (a node kept in float32)."""
    weights = {initializer.name: initializer for initializer in candidate.initializer}
    origins = []
    judged = 0
    for stretch in found:
        y = values.get(stretch.output) if stretch.output in values else None
        made = values.get(stretch.made) if stretch.made in values else None
        if not isinstance(y, np.ndarray) or not is_float_dtype(y.dtype) or not isinstance(made, np.ndarray):
            continue
        u = min(declared_unit(str(made.dtype)) or _U32, declared_unit(working) or _U32)
        at_type = next(k for k in _BY_UNIT if declared_unit(k) == u)
        fed = {}
        rounded: dict[str, float] = {}  # input -> the unit of a rounding an engine may skip
        narrow: list[str] = []
        for theirs, source, casts in stretch.inputs:
            x = value_of(source, values, feeds, weights, folder)
            if x is None:
                break
            own = declared_unit(str(x.dtype)) or 0.0
            if source not in weights and source not in feeds and own > _U32:
                rounded[theirs] = own  # computed and rounded to its type: read before that, maybe
            for to in casts:  # the conversion's own roundings are emulated; a narrower one is the error
                unit = declared_unit(to) or 0.0
                if unit <= u:
                    if unit > (declared_unit(str(x.dtype)) or 0.0):  # either side of it is allowed
                        rounded[theirs] = max(rounded.get(theirs, 0.0), unit)
                    x = x.astype(np_dtype(to))
                else:
                    narrow.append(to)
            fed[theirs] = x
        else:
            narrow += [to for to in stretch.after if (declared_unit(to) or 0.0) > u]
            got = _judge(stretch, fed, y, opset, rounded, at_type)
            if got is None:
                continue
            judged += 1
            ratio, local, allowed, at, rule = got
            if ratio > 1.0:
                why = (
                    f"computed through a cast to {', '.join(sorted(set(narrow)))} inside a {at_type} stretch"
                    if narrow
                    else f"computed through casts to {', '.join(sorted(_casts(stretch)))}"
                )
                origins.append(
                    Origin(
                        tensor=stretch.node.output[0],
                        module="",
                        op_type=stretch.node.op_type,
                        local_scaled_ulp=local,
                        allowed_scaled_ulp=allowed,
                        detail=f"{why}: {ratio:.3g}x its allowance at {at_type}",
                        element=at,
                        rule=rule,
                    )
                )
    return origins, judged


_U32 = 2.0**-24
_BY_UNIT = ("float32", "float16", "bfloat16", "float64")


def _casts(stretch: Stretch) -> set[str]:
    return {to for _, _, casts in stretch.inputs for to in casts} | set(stretch.after)


def value_of(
    name: str,
    values: ValueFile,
    feeds: Mapping[str, object],
    weights: Mapping[str, TensorProto] | None = None,
    folder: Path | None = None,
) -> np.ndarray | None:
    """A tensor's value: a weight (read from `folder`), a captured value, or a graph input."""
    if weights is not None and folder is not None and name in weights:
        return weight_array(weights[name], folder)
    v = values.get(name) if name in values else feeds.get(name)
    return v if isinstance(v, np.ndarray) else None


def _judge(
    stretch: Stretch,
    fed: Mapping[str, np.ndarray],
    y: np.ndarray,
    opset: int,
    rounded: Mapping[str, float],
    at_type: str,
) -> tuple[float, float, float, tuple[int, ...], str] | None:
    """(worst error / allowance, local and allowed scaled ULP there, the element, the rule). The
    inputs in `rounded` may be read before their rounding (of that unit): that rounding, u·|x|,
    propagated to first order, is allowed too."""
    node = stretch.node
    out = node.output[0]
    shapes = {key: tuple(int(size) for size in value.shape) for key, value in fed.items()}
    bound, extra, inits = node_bound(node, shapes, opset)
    outs = [out, *([AUX + out] if extra else [])]
    bld = Builder(PROP + out, opset)
    errs = {key: bld.op("Mul", bld.abs(key), bld.const(unit)) for key, unit in rounded.items()}
    prop = propagate(node, errs, bld, opset)[0] if errs else None
    if prop is not None:
        outs.append(prop)
    wide = {
        key: value.astype(np.float64) if is_float_dtype(value.dtype) else value for key, value in fed.items()
    }
    got = evaluate([node, *extra, *bld.nodes], wide, outs, opset, [*inits, *bld.inits])
    if got is None:
        return None
    v = got[0]
    mag = got[1] if extra else None
    inherited = got[-1] if prop is not None else None
    if v.shape != y.shape:
        return None
    return _ratio(bound, v, mag, y, inherited, at_type)


def evaluate(
    nodes: Sequence[onnx.NodeProto],
    fed: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    opset: int,
    inits: Sequence[TensorProto] = (),
) -> list[np.ndarray] | None:
    """`nodes` evaluated by onnx's evaluator on `fed` (float64 where float), `outputs` as float64
    (their float32 constants widened); None where the evaluator lacks an op or refuses operands."""
    g = helper.make_graph(
        list(nodes),
        "nodes",
        [
            helper.make_tensor_value_info(key, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
            for key, value in fed.items()
        ],
        [helper.make_tensor_value_info(output, TensorProto.UNDEFINED, None) for output in outputs],
        [_double(init) for init in inits],
    )
    try:
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        with np.errstate(all="ignore"), locale_kept():
            return [np.asarray(x, dtype=np.float64) for x in ReferenceEvaluator(m).run(None, dict(fed))]
    except Exception:  # an op the evaluator lacks, or operands it refuses: not judged here
        return None


def _double(tensor: TensorProto) -> TensorProto:
    if tensor.data_type != TensorProto.FLOAT:
        return tensor
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)


def _ratio(
    bound: NodeBound,
    v: np.ndarray,
    mag: np.ndarray | None,
    y: np.ndarray,
    inherited: np.ndarray | None,
    at_type: str,
) -> tuple[float, float, float, tuple[int, ...], str]:
    allow = element_allowance(bound, v, mag, inherited, np_dtype(at_type))
    yf = y.astype(np.float64)
    finite = np.isfinite(v) & np.isfinite(yf)
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.where(finite, np.abs(yf - v), 0.0)
        r = np.where(finite, err / np.where(allow > 0, allow, np.inf), 0.0)
        r = np.where(finite & (allow == 0) & (err > 0), np.inf, r)
    i = int(np.argmax(r)) if r.size else 0
    at = tuple(int(k) for k in np.unravel_index(i, r.shape)) if r.size else ()
    top = float(np.abs(np.where(np.isfinite(v), v, 0.0)).max()) if v.size else 0.0
    unit = ulp_at(top, np_dtype(at_type))
    ratio = float(r.flat[i]) if r.size else 0.0
    return ratio, float(err.flat[i]) / unit, float(allow.flat[i]) / unit, at, bound.describe()
