"""Where the model, not the engines, decides the accuracy: tensors whose rounding, composed from
the start of the model through each node's condition number (the float64 judge's value and
magnitude), passes half their precision, or that every engine computes that far from float64
while they agree with each other, and the cause where the pattern is known (E[x²]−E[x]², a
softmax over a huge range, a normalization of rows far from zero)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from xbackend.bounds.element import AUX, unit_roundoff
from xbackend.files.modelref import np_dtype
from xbackend.files.run_values import CaptureFile
from xbackend.judge.judged_graph import Judged
from xbackend.model.load import ModelSpec, NodeTensor
from xbackend.numerics.metrics import COMPUTE_FLOATS, float_info, ulp_at
from xbackend.numerics.values import value_name
from xbackend.results import CrossBackendResult
from xbackend.results.explanation import Amplifier, Explanation, IllConditioned, conditioning_limit

__all__ = [
    "AMPLIFYING",
    "NodeStat",
    "amplifiers",
    "composed_rounding",
    "far_from_float64",
    "ill_conditioned",
    "node_stats",
]

# f'(x) of the math functions whose input rounding they amplify most: |x| large for sin, cos, exp
AMPLIFYING: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Sin": np.cos,
    "Cos": np.sin,
    "Tan": lambda x: 1 / np.cos(x) ** 2,
    "Exp": np.exp,
}
AMPLIFIER_NOTE = 16.0  # scaled ULP: a gain past this is named in the verdict


@dataclass(frozen=True)
class NodeStat:
    """What conditioning needs of one judged node output: the largest |v| of its float64 value and
    of its magnitude M (0: none), below SENTINEL; its sum's terms n (0: not a reduction), its
    bound's kind (exact, reduction, ...) and the dtype it is judged at."""

    vmax: float
    mmax: float
    terms: int
    kind: str
    dtype: str


def node_stats(judge_capture: str, judged: Judged, order: Sequence[str]) -> dict[str, NodeStat]:
    """Each judged float node output's NodeStat, read from one evaluation of the judge."""
    out = {}
    with CaptureFile(judge_capture) as judge:
        for tensor in order:
            bound = judged.bounds.get(tensor)
            exact = judge.get(tensor) if bound is not None else None
            if bound is None or not isinstance(exact, np.ndarray) or exact.dtype != np.float64:
                continue  # an integer or boolean result: exact, it carries no rounding
            magnitude = judge.get(AUX + tensor)
            out[tensor] = NodeStat(
                _finite_max(exact),
                _finite_max(magnitude) if isinstance(magnitude, np.ndarray) else 0.0,
                bound.terms,
                bound.kind,
                judged.declared.get(tensor, "float32"),
            )
    return out


# |v| from here on is a mask's sentinel (a causal mask's float32 min), not an activation: its
# elements leave a softmax at exactly 0, so their rounding reaches nothing below
SENTINEL = 2.0**100


def _finite_max(values: np.ndarray) -> float:
    """The largest |x| below SENTINEL (0 for none)."""
    finite = np.abs(np.asarray(values, np.float64))
    top = float(finite.max(initial=0.0))
    if top < SENTINEL:
        return top
    return float(np.max(finite, where=finite < SENTINEL, initial=0.0))


# ops whose output moves with the relative error of their inputs (|d log f| <= sum |d log x|)
_RELATIVE = frozenset({"Mul", "Div", "Reciprocal", "Sqrt", "Pow", "Log"})
_SUMS = frozenset({"Add", "Sub", "Sum", "Mean"})
_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
_NORMS = frozenset(
    {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
     "SkipSimplifiedLayerNormalization"}
)  # fmt: skip
# Lipschitz ops, with the largest slope of each: the absolute error passes times it
_LIPSCHITZ: dict[str, float] = {
    **dict.fromkeys(
        ("Relu", "LeakyRelu", "PRelu", "Tanh", "Softsign", "Sin", "Cos", "Abs", "Neg", "Clip", "Floor",
         "Ceil", "Round", "Sign", "ThresholdedRelu", "Shrink", "Softplus", "Elu", "Celu"),
        1.0,
    ),
    "Sigmoid": 0.25,
    "HardSigmoid": 0.5,
    "QuickGelu": 1.1,  # x·sigmoid(1.702x): slope at most 1.1
    "Mish": 1.1,
    "HardSwish": 1.5,
    "Selu": 1.76,  # its scale times alpha
    **dict.fromkeys(("Erf", "Gelu", "FastGelu", "BiasGelu"), 1.13),  # 2/sqrt(pi); gelu's slope
}  # fmt: skip


def composed_rounding(spec: ModelSpec, stats: Mapping[str, NodeStat], ref_capture: str) -> dict[str, float]:
    """Each judged tensor's rounding error composed from the start of the model, in scaled ULP: every
    node's own rounding (half an ULP of its value; u·M for a sum of n terms) plus its inputs'
    errors carried through its condition number: relative errors through products, absolute
    errors through sums (cancellation: Σ max|x| / max|v|), a softmax's absolute logit error as a
    relative one, a normalization's divided by its rows' spread, and a sum of n terms' by
    M / sqrt(n) (independent errors add in quadrature); a node's own rounding and what it inherits
    add in quadrature too, as in a stretch's bound. The feeds and weights are exact."""
    err: dict[str, float] = {}  # tensor -> absolute error scale
    out: dict[str, float] = {}
    with CaptureFile(ref_capture) as cap:
        for tensor in spec.tensors:
            node_stat = stats.get(tensor.name)
            if node_stat is None:
                continue
            unit = unit_roundoff(np_dtype(node_stat.dtype))
            ins = [input_name for input_name in tensor.inputs if input_name in err]
            rel = [
                err[input_name] / stats[input_name].vmax if stats[input_name].vmax else 0.0
                for input_name in ins
            ]
            error = _carried(tensor, node_stat, ins, rel, err, cap)
            # a sum's rounding scales with its terms' magnitude (its value's, where M is the value)
            own = unit * (
                node_stat.mmax if node_stat.kind == "reduction" and node_stat.mmax else node_stat.vmax
            )
            if node_stat.kind == "exact":
                own = 0.0
            elif node_stat.kind == "elementwise":
                own /= 2  # correctly rounded: half an ULP
            # its own rounding is independent of what it inherits: root-sum-square, as in a stretch
            err[tensor.name] = math.hypot(error, own)
            out[tensor.name] = (
                err[tensor.name] / ulp_at(node_stat.vmax, np_dtype(node_stat.dtype))
                if node_stat.vmax
                else 0.0
            )
    return out


def _carried(
    node_tensor: NodeTensor,
    node_stat: NodeStat,
    ins: Sequence[str],
    rel: Sequence[float],
    err: Mapping[str, float],
    cap: CaptureFile,
) -> float:
    """What `node_tensor` inherits of its inputs' errors (`rel`: each relative to its input's largest
    value)."""
    if not ins:
        return 0.0
    op = node_tensor.op_type
    if node_stat.kind == "reduction" and node_stat.terms and node_stat.mmax:
        return node_stat.mmax / math.sqrt(node_stat.terms) * sum(rel)
    if op in _SUMS:
        return sum(err[i] for i in ins)
    if op in _RELATIVE:
        return node_stat.vmax * (2 * rel[0] if op == "Pow" else sum(rel))
    if op in _SOFTMAX:  # |δp| <= p·(|δs| + Σp|δs|): the logits' absolute error, relative in p
        return 2 * max(err[i] for i in ins) * (1.0 if op == "LogSoftmax" else node_stat.vmax)
    if op == "Exp":
        return node_stat.vmax * err[ins[0]]
    if op in _NORMS:
        summed = (
            node_tensor.inputs[:2] if op.startswith("Skip") else node_tensor.inputs[:1]
        )  # a skip norm's input + skip
        spread = _row_spread(cap, summed, "Simplified" in op) if node_tensor.inputs else None
        if spread is not None:
            return sum(err[i] for i in ins) * node_stat.vmax / spread
    if node_stat.kind == "exact" or op in _LIPSCHITZ:
        return max(err[i] for i in ins) * (1.0 if node_stat.kind == "exact" else _LIPSCHITZ[op])
    return node_stat.vmax * max(rel)


def _row_spread(cap: CaptureFile, names: Sequence[str], rms: bool) -> float | None:
    """The smallest spread of the rows normalized (of `names` summed: a skip norm normalizes its
    input plus its skip), times their largest |z|: what an absolute error of the input is divided
    by to give one of max |z|'s scale. `rms`: an RMS norm's (no mean subtracted)."""
    parts = [_rows(cap, name, last=True, ndim=1) for name in names]
    if any(part is None for part in parts) or len({part.shape for part in parts if part is not None}) != 1:
        return None
    rows = sum(part for part in parts if part is not None)
    assert isinstance(rows, np.ndarray)
    if not rows.size:
        return None
    with np.errstate(invalid="ignore"):  # a row holding inf (a float16 overflow): its spread is nan
        mean = 0.0 if rms else rows.mean(axis=1, keepdims=True)
        std = np.sqrt(((rows - mean) ** 2).mean(axis=1))
        zmax = np.abs(rows - mean).max(axis=1) / np.where(std > 0, std, np.inf)
    ok = std > 0
    if not ok.any():
        return None
    return float(std[ok].min() * max(float(zmax[ok].max()), 1.0))


def ill_conditioned(
    spec: ModelSpec, composed: Mapping[str, float], ref_capture: str
) -> tuple[IllConditioned, ...]:
    """Where conditioning is lost: tensors whose composed rounding passes their dtype's limit
    while their inputs' does not."""
    by_name = {tensor.name: tensor for tensor in spec.tensors}
    modules = spec.modules()
    out = []
    with CaptureFile(ref_capture) as cap:
        dtypes = {name: dtype for name, (dtype, _) in cap.tensors().items()}
        for tensor in spec.tensors:
            f = composed.get(tensor.name)
            limit = _limit(tensor, dtypes)
            if f is None or f <= limit:
                continue
            if any(
                composed.get(input_name, 0.0) > conditioning_limit(dtypes.get(input_name, "float32"))
                for input_name in tensor.inputs
            ):
                continue
            out.append(
                IllConditioned(
                    tensor.name, modules.get(tensor.name, ""), f, _cause(tensor, by_name, composed, cap)
                )
            )
    return tuple(out)


def _limit(node_tensor: NodeTensor, dtypes: Mapping[str, str]) -> float:
    """Half the precision `node_tensor` holds, in ULP of its dtype: a widening Cast (float16 to float32)
    holds its input's, so its limit is the input's scaled to its own ULP (8192 float32 ULP are
    one float16 ULP, not ill-conditioning)."""
    own = dtypes.get(node_tensor.name, "float32")
    limit = conditioning_limit(own)
    src = (
        dtypes.get(node_tensor.inputs[0])
        if node_tensor.op_type in ("Cast", "CastLike") and node_tensor.inputs
        else None
    )
    if src is None or src not in COMPUTE_FLOATS or own not in COMPUTE_FLOATS:
        return limit
    bits = float_info(np_dtype(own)).nmant - float_info(np_dtype(src)).nmant
    return max(limit, conditioning_limit(src) * 2.0**bits) if bits > 0 else limit


def far_from_float64(
    ex: Explanation,
    spec: ModelSpec,
    cross: Sequence[CrossBackendResult],
    oracle: Sequence[CrossBackendResult],
    ref_capture: str | None,
) -> Explanation:
    """The second kind of ill-conditioned tensor: every engine is past its dtype's conditioning
    limit from the float64 oracle while they agree with the reference within their tolerance, so
    no order of the float computation does better (the first place where that starts)."""
    if not ex.ok or ref_capture is None:
        return ex
    engines = [cross for cross in oracle if cross.status == "ok" and cross.tensors]
    if len(engines) < 2:  # one engine agreeing with itself proves nothing
        return ex
    far: set[str] | None = None
    for engine in engines:
        names = {
            value_name(tensor.name)
            for tensor in engine.tensors
            if tensor.scaled_ulp is not None and tensor.scaled_ulp > conditioning_limit(tensor.dtype)
        }
        far = names if far is None else far & names
    if not far:
        return ex
    disagree = {
        value_name(tensor.name)
        for compared in cross
        if compared.status == "ok"
        for tensor in compared.tensors
        if compared.exceeds(tensor)
    }
    known = {ill.tensor for ill in ex.ill_conditioned}
    floors = dict(ex.composed)
    by_name = {tensor.name: tensor for tensor in spec.tensors}
    modules = spec.modules()
    found = []
    with CaptureFile(ref_capture) as cap:
        for tensor in spec.tensors:
            if tensor.name not in far or tensor.name in disagree or tensor.name in known:
                continue
            if any(input_name in far for input_name in tensor.inputs):
                continue  # inherited: the onset is upstream
            cause = _cause(tensor, by_name, floors, cap)
            found.append(
                IllConditioned(
                    tensor.name,
                    modules.get(tensor.name, ""),
                    floors.get(tensor.name, 0.0),
                    cause,
                    "far from float64",
                )
            )
    return replace(ex, ill_conditioned=(*ex.ill_conditioned, *found)) if found else ex


_PASS_THROUGH = frozenset(
    {"Mul", "Pow", "Div", "Cast", "Identity", "Sqrt", "Neg", "Reshape", "Unsqueeze", "DequantizeLinear"}
)
_REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceSumSquare", "MatMul", "Gemm", "Einsum"})


def _reaches(name: str, by_name: Mapping[str, NodeTensor], want: frozenset[str], hops: int = 4) -> set[str]:
    """Op types in `want` reached going up from `name` through at most `hops` simple ops."""
    node_tensor = by_name.get(name)
    if node_tensor is None or hops == 0:
        return set()
    if node_tensor.op_type in want:
        return {node_tensor.op_type} | ({"square"} if _squares(node_tensor, by_name) else set())
    if node_tensor.op_type not in _PASS_THROUGH:
        return set()
    found = {"square"} if _is_square(node_tensor) else set()
    for input_name in node_tensor.inputs:
        found |= _reaches(input_name, by_name, want, hops - 1)
    return found


_STEPS = frozenset({"Cast", "Floor", "Ceil", "Round"})


def _stepped(
    node_tensor: NodeTensor, by_name: Mapping[str, NodeTensor], cap: CaptureFile, hops: int = 8
) -> NodeTensor | None:
    """The nearest float→int step above `node_tensor` (a Cast to an integer, Floor, Ceil, Round of floats)."""
    dtypes = {name: dtype for name, (dtype, _) in cap.tensors().items()}
    todo, seen = [(input_name, hops) for input_name in node_tensor.inputs], set()
    while todo:
        name, left = todo.pop(0)
        s = by_name.get(name)
        if s is None or name in seen or left == 0:
            continue
        seen.add(name)
        src = dtypes.get(s.inputs[0], "") if s.inputs else ""
        if (
            s.op_type in _STEPS
            and src.startswith(("float", "bfloat"))
            and not dtypes.get(name, "").startswith(("float", "bfloat"))
        ):
            return s
        todo += [(input_name, left - 1) for input_name in s.inputs]
    return None


def _is_square(node_tensor: NodeTensor) -> bool:
    return (
        node_tensor.op_type == "Mul" and len(set(node_tensor.inputs)) == 1
    ) or node_tensor.op_type == "Pow"


def _squares(node_tensor: NodeTensor, by_name: Mapping[str, NodeTensor]) -> bool:
    if node_tensor.op_type == "ReduceSumSquare":
        return True
    src = by_name.get(node_tensor.inputs[0]) if node_tensor.inputs else None
    return src is not None and _is_square(src)


def _cause(
    node_tensor: NodeTensor, by_name: Mapping[str, NodeTensor], floors: Mapping[str, float], cap: CaptureFile
) -> str:
    grow = max((floors.get(input_name, 0.0) for input_name in node_tensor.inputs), default=0.0)
    step = _stepped(node_tensor, by_name, cap) if node_tensor.op_type.startswith("Gather") else None
    if step is not None:
        return (
            f"its index comes from {step.name} ({step.op_type}), a float→int step: where a value lands on an "
            "integer boundary (T5's buckets: log 2 / log 16 · 8 is exactly 2), float32 and float64 land on "
            "either side of it"
        )
    if node_tensor.op_type == "Sub" and len(node_tensor.inputs) == 2:
        a, b = (_reaches(input_name, by_name, _REDUCTIONS) for input_name in node_tensor.inputs)
        if a - {"square"} and b - {"square"}:
            if "square" in a | b:
                return (
                    "E[x²]−E[x]² cancels: compute the variance two-pass (the mean first, then the mean "
                    "of squared deviations) or with Welford's algorithm"
                )
            return "a subtraction of two nearly equal reductions cancels"
        return "a subtraction of nearly equal values cancels"
    if (
        node_tensor.op_type in ("Softmax", "LogSoftmax")
        and node_tensor.inputs
        and node_tensor.inputs[0] in cap
    ):
        x = np.asarray(cap[node_tensor.inputs[0]], dtype=np.float64)
        span = float(np.nanmax(x) - np.nanmin(x)) if x.size else 0.0
        return f"a softmax over logits spanning {span:.3g}: exp of their differences loses the small terms"
    if (
        node_tensor.op_type in ("LayerNormalization", "GroupNormalization", "InstanceNormalization")
        and node_tensor.inputs
    ):
        ratio = _mean_over_spread(
            cap, node_tensor.inputs[0], last=node_tensor.op_type == "LayerNormalization"
        )
        if ratio is not None:
            return f"a normalization over rows whose mean is {ratio:.3g}x their spread"
    if (
        "QuantizeLinear" in _reaches(node_tensor.name, by_name, frozenset({"QuantizeLinear"}))
        or node_tensor.op_type == "QuantizeLinear"
    ):
        return (
            "QuantizeLinear rounds to steps of its scale: rounding above it moves values across a "
            "step (the quantized model's own resolution)"
        )
    if grow > 0 and node_tensor.name in floors:
        amplified = floors[node_tensor.name] / grow
        return f"{node_tensor.op_type} amplifies the rounding of its inputs {amplified:.3g}x"
    return f"{node_tensor.op_type}'s own rounding is amplified by its condition number"


def _rows(cap: CaptureFile, name: str, last: bool, ndim: int = 2) -> np.ndarray | None:
    """The reference's `name` in float64, a row per normalized group: over its last axis, or
    per sample and channel (None: not captured, or fewer than `ndim` axes)."""
    if name not in cap:
        return None
    x = np.asarray(cap[name], dtype=np.float64)
    if x.ndim < ndim:
        return None
    return x.reshape(-1, x.shape[-1]) if last else x.reshape(x.shape[0] * x.shape[1], -1)


def _mean_over_spread(cap: CaptureFile, name: str, last: bool) -> float | None:
    rows = _rows(cap, name, last)
    if rows is None:
        return None
    mean = np.abs(rows.mean(axis=1))
    std = rows.std(axis=1)
    ok = std > 0
    return float((mean[ok] / std[ok]).max()) if ok.any() else None


def amplifiers(spec: ModelSpec, ref_capture: str) -> tuple[Amplifier, ...]:
    """Math nodes where half an ULP of the input, the rounding it already carries, moves the
    output by more than AMPLIFIER_NOTE scaled ULP: max |f'(x)|·ulp(x)/2 in ULP of max |f(x)|.
    Rotary embeddings' cos and sin of float32 angles up to the sequence length are the common
    case: float64 keeps the angle's digits, float32 engines do not, and neither is an error."""
    out = []
    modules = spec.modules()
    with CaptureFile(ref_capture) as cap:
        for tensor in spec.tensors:
            f = AMPLIFYING.get(tensor.op_type)
            if f is None or not tensor.inputs or tensor.inputs[0] not in cap or tensor.name not in cap:
                continue
            x, y = cap[tensor.inputs[0]], cap[tensor.name]
            if not (
                isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.dtype == np.float32 and x.size
            ):
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                moved = np.abs(f(x.astype(np.float64))) * np.spacing(np.abs(x)).astype(np.float64) / 2
            top = float(np.nanmax(np.abs(y.astype(np.float64)))) if y.size else 0.0
            gain = float(np.nanmax(moved)) / ulp_at(top, y.dtype) if top else 0.0
            if gain > AMPLIFIER_NOTE:
                span = float(np.nanmax(np.abs(x)))
                out.append(Amplifier(tensor.name, modules.get(tensor.name, ""), tensor.op_type, gain, span))
    return tuple(out)
