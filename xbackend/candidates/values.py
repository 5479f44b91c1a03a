"""A candidate's values against its original's, tensor by tensor (scaled ULP at the candidate's
dtype and SQNR, the figure ONNX Runtime's qdq_loss_debug gives), and the numerical events of the
candidate's own: float16 overflow to inf, int8 activations clipped by their scale, and scales so
coarse that most of a tensor falls in a few levels."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import onnx
from onnx import numpy_helper

from xbackend.candidates.match import Pair
from xbackend.files.storage import ValueFile
from xbackend.numerics.metrics import is_float_dtype, ulp_at
from xbackend.results.candidates import SENTINEL, NumericalEvent, TensorMatch

__all__ = ["COARSE_SHARE", "decision_tensors", "findings", "measure"]

COARSE_SHARE = 0.9  # a scale is coarse when this share of a varied tensor falls in 3 levels
_INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}


def measure(pairs: Sequence[Pair], original: ValueFile, candidate: ValueFile) -> list[TensorMatch]:
    """Each pair's candidate value against the original's (read one tensor at a time)."""
    out = []
    for pair in pairs:
        base = TensorMatch(
            original=pair.original,
            candidate=pair.candidate,
            how=pair.how,
            depth=pair.depth,
            dtype="",
            op=pair.op,
        )
        if pair.original not in original or pair.candidate not in candidate:
            who = "the original's" if pair.original not in original else "the candidate's"
            out.append(replace(base, status="not-compared", reason=f"not in {who} capture"))
            continue
        o, c = original[pair.original], candidate[pair.candidate]
        if not isinstance(o, np.ndarray) or not isinstance(c, np.ndarray):
            out.append(replace(base, status="not-compared", reason="not a tensor"))
            continue
        out.append(_one(base, o, c))
    return out


def _one(base: TensorMatch, o: np.ndarray, c: np.ndarray) -> TensorMatch:
    dtype = str(c.dtype)
    if o.shape != c.shape:
        return replace(
            base,
            dtype=dtype,
            status="not-compared",
            reason=f"shapes differ: the original's {list(o.shape)}, the candidate's {list(c.shape)}",
        )
    if o.dtype.kind not in "fiub" and not is_float_dtype(o.dtype):
        return replace(base, dtype=dtype, elements=int(o.size))
    a, b = o.astype(np.float64), c.astype(np.float64)
    # a mask's fill (float32's limit) stands for inf: a candidate's -inf or -65504 there is no move
    finite = np.isfinite(a) & (np.abs(a, where=np.isfinite(a), out=np.zeros_like(a)) < SENTINEL)
    nonfinite = int(np.count_nonzero(finite & ~np.isfinite(b)))
    both = finite & np.isfinite(b)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(b - a, where=both, out=np.zeros_like(a))
    max_abs = float(d.max()) if d.size else 0.0
    top = float(np.abs(a, where=finite, out=np.zeros_like(a)).max()) if a.size else 0.0
    scaled = None
    if is_float_dtype(c.dtype) and a.size:
        scaled = max_abs / ulp_at(top, c.dtype)
    noise = float(np.sum(d * d))
    signal = float(np.sum(np.square(a, where=both, out=np.zeros_like(a))))
    sqnr = None if noise == 0 else 10.0 * math.log10(max(signal, 1e-300) / noise)
    return replace(
        base,
        dtype=dtype,
        elements=int(o.size),
        scaled_ulp=scaled,
        sqnr_db=sqnr,
        max_abs=max_abs,
        nonfinite=nonfinite,
    )


def findings(
    graph: onnx.GraphProto, values: ValueFile, feeds: Mapping[str, object], original: ValueFile | None = None
) -> list[NumericalEvent]:
    """The candidate's overflows, NaNs, clipped and coarse quantized tensors, in its graph's order.
    A quantized tensor is held against the original's value of it where the original has one (a
    QDQ tool folds a Relu into the range, so its input is the value before the Relu)."""
    weights = {initializer.name: initializer for initializer in graph.initializer}
    out: list[NumericalEvent] = []
    inf_seen: set[str] = set()
    nan_seen: set[str] = set()
    for node in graph.node:
        if node.op_type == "QuantizeLinear":
            with np.errstate(invalid="ignore"):
                out += _quantized(node, values, weights, feeds, original)
        for output_name in node.output:
            y = values.get(output_name) if output_name in values else None
            if not isinstance(y, np.ndarray) or not is_float_dtype(y.dtype) or not y.size:
                continue
            wide = y.astype(np.float32) if y.dtype.itemsize < 4 else y
            nans = int(np.count_nonzero(np.isnan(wide)))
            if nans:
                nan_seen.add(output_name)
                if not any(
                    input_name in nan_seen or _has(feeds.get(input_name), np.isnan)
                    for input_name in node.input
                    if input_name
                ):
                    made = node.name or node.op_type
                    out.append(
                        NumericalEvent(
                            kind="nan",
                            tensor=output_name,
                            node=made,
                            count=nans,
                            of=int(y.size),
                            detail=f"{nans} of {y.size} element(s) NaN from inputs holding none "
                            f"({node.op_type})",
                        )
                    )
            if str(y.dtype) not in ("float16", "bfloat16"):
                continue
            bad = int(np.count_nonzero(np.isinf(wide)))
            if not bad:
                continue
            inf_seen.add(output_name)
            if any(
                input_name in inf_seen or _has(feeds.get(input_name), np.isinf)
                for input_name in node.input
                if input_name
            ):
                continue  # carried from above, not made here
            big = float(np.finfo(np.float16).max) if str(y.dtype) == "float16" else 3.39e38
            out.append(
                NumericalEvent(
                    kind="overflow",
                    tensor=output_name,
                    node=node.name or node.op_type,
                    count=bad,
                    of=int(y.size),
                    detail=(
                        f"{bad} of {y.size} element(s) overflowed to inf from finite inputs ({y.dtype}'s "
                        f"largest finite value is {big:.6g}); keep {node.name or node.op_type} in float32"
                    ),
                )
            )
    return out


def _has(v: object, test: np.ufunc) -> bool:
    return isinstance(v, np.ndarray) and v.dtype.kind == "f" and bool(test(v).any())


def _quantized(
    node: onnx.NodeProto,
    values: ValueFile,
    weights: Mapping[str, onnx.TensorProto],
    feeds: Mapping[str, object],
    original: ValueFile | None,
) -> list[NumericalEvent]:
    """A QuantizeLinear's clipped elements (its input past what scale and zero point cover) and
    a scale so coarse that a varied input lands in a few levels."""
    t = node.input[0]
    x = values.get(t) if t in values else feeds.get(t)
    theirs = original.get(t) if original is not None and t in original else None
    if isinstance(theirs, np.ndarray) and isinstance(x, np.ndarray) and theirs.shape == x.shape:
        x = theirs
    s = _const(node.input[1], values, weights)
    zp = _const(node.input[2], values, weights) if len(node.input) > 2 and node.input[2] else None
    if not isinstance(x, np.ndarray) or s is None or s.size != 1:
        return []  # per-channel scales, or an input the capture lacks: not judged here
    qtype = str(zp.dtype) if zp is not None else "uint8"
    if qtype not in _INT_RANGE or not x.size:
        return []
    lo, hi = _INT_RANGE[qtype]
    scale = float(s.reshape(-1)[0])
    zero = float(zp.reshape(-1)[0]) if zp is not None else 0.0
    xf = x.astype(np.float64)
    levels = np.rint(xf / scale) + zero
    name = node.name or node.op_type
    out = []
    clipped = int(np.count_nonzero((levels < lo) | (levels > hi)))
    if clipped:
        finite = xf[np.isfinite(xf)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (math.nan, math.nan)
        out.append(
            NumericalEvent(
                kind="saturation",
                tensor=node.input[0],
                node=name,
                count=clipped,
                of=int(x.size),
                detail=(
                    f"{clipped} of {x.size} element(s) clipped to [{lo}, {hi}]: "
                    f"the input spans {low:.4g} to {high:.4g}, "
                    f"the scale {scale:.4g} (zero point {zero:g}) covers {(lo - zero) * scale:.4g} to "
                    f"{(hi - zero) * scale:.4g}"
                ),
            )
        )
    varied = xf[np.isfinite(xf) & (xf != 0)]
    if varied.size > 16 and np.unique(varied).size > 16:
        q = np.clip(np.rint(varied / scale) + zero, lo, hi).astype(np.int64)
        counts = np.bincount(q - lo, minlength=hi - lo + 1)
        share = float(np.sort(counts)[-3:].sum()) / varied.size
        if share >= COARSE_SHARE:
            spread = float(varied.std())
            size = (
                f"the scale {scale:.4g} is {scale / max(spread, 1e-300):.3g}x the values' standard deviation "
                f"{spread:.4g}"
                if math.isfinite(scale)
                else "the scale is infinite (calibrated on values that reach float32's limit, a mask's "
                "fill): every value lands on the zero point"
            )
            out.append(
                NumericalEvent(
                    kind="coarse-scale",
                    tensor=node.input[0],
                    node=name,
                    count=int(np.sort(counts)[-3:].sum()),
                    of=int(varied.size),
                    detail=f"{share:.0%} of its {varied.size} nonzero element(s) fall in 3 of "
                    f"{hi - lo + 1} levels: {size}",
                )
            )
    return out


def _const(name: str, values: ValueFile, weights: Mapping[str, onnx.TensorProto]) -> np.ndarray | None:
    if name in weights:
        weight = weights[name]
        if weight.data_location == onnx.TensorProto.EXTERNAL:
            return None  # a scale is small; one stored outside the file is not read here
        return np.asarray(numpy_helper.to_array(weight))
    v = values.get(name) if name in values else None
    return v if isinstance(v, np.ndarray) else None


def decision_tensors(
    graph: onnx.GraphProto,
    outputs: Mapping[str, float | None],
    original: ValueFile,
    events: Sequence[NumericalEvent],
    words: str,
) -> list[NumericalEvent]:
    """Each output the answers are read from (`outputs`: its name, and the original's margin
    where the candidate's answer left it, None where none did) that the candidate quantizes or
    rounds to float16, where that clips it or its step reaches the margin: a finding of its own,
    whatever share of the tensor it touches."""
    weights = {initializer.name: initializer for initializer in graph.initializer}
    made = {output_name: node for node in graph.node for output_name in node.output}
    half = {
        initializer.name
        for initializer in graph.initializer
        if initializer.data_type == onnx.TensorProto.FLOAT16
    }
    half |= {
        v.name
        for v in (*graph.value_info, *graph.output)
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    }
    out = []
    for name, margin in outputs.items():
        last = made.get(name)
        src = made.get(last.input[0]) if last is not None and last.input else None
        x = original.get(name) if name in original else None
        top = float(np.max(np.abs(x[np.isfinite(x)]))) if isinstance(x, np.ndarray) and x.size else 0.0
        if (
            last is not None
            and last.op_type == "DequantizeLinear"
            and src is not None
            and src.op_type == "QuantizeLinear"
        ):
            s = weights.get(src.input[1])
            step = float(np.max(numpy_helper.to_array(s))) if s is not None else 0.0
            how, node = f"int8 (scale {step:.4g})", src
        elif last is not None and (name in half or (last.op_type == "Cast" and last.input[0] in half)):
            step = float(2.0 ** (math.floor(math.log2(top)) - 10)) if top > 0 else 0.0
            how, node = f"float16 (a step of {step:.4g} at its largest value, {top:.4g})", src or last
        else:
            continue
        clip = next(
            (event for event in events if event.kind == "saturation" and event.node == node.name), None
        )
        lost = margin is not None and step >= margin
        if not lost and (clip is None or margin is None):  # clipped, every answer the original's: a note
            continue
        said = [f"{clip.count} of {clip.of} element(s) clipped"] if clip is not None else []
        if lost:
            said.append(f"its step reaches the original's margin {margin:.3g} where the {words} left it")
        out.append(
            NumericalEvent(
                kind="decision-tensor",
                tensor=name,
                node=node.name or node.op_type,
                count=clip.count if clip is not None else 0,
                of=clip.of if clip is not None else int(x.size) if isinstance(x, np.ndarray) else 0,
                detail=f"the {words} are read from {name}, held as {how}: {'; '.join(said)}",
            )
        )
    return out
