"""Where the model, not the engines, decides the accuracy: tensors that reorderings alone move
past half their precision, or that every engine computes that far from float64 while they agree
with each other, and the cause where the pattern is known (E[x²]−E[x]², a softmax over a huge
range, a normalization of rows far from zero)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from xbackend.files.modelref import np_dtype
from xbackend.files.run_values import CaptureFile
from xbackend.model.load import ModelSpec, NodeTensor
from xbackend.numerics.metrics import COMPUTE_FLOATS, float_info, ulp_at
from xbackend.numerics.values import value_name
from xbackend.results import CrossBackendResult
from xbackend.results.explanation import Amplifier, Explanation, IllConditioned, conditioning_limit

__all__ = ["AMPLIFYING", "amplifiers", "far_from_float64", "ill_conditioned"]

# f'(x) of the math functions whose input rounding they amplify most: |x| large for sin, cos, exp
AMPLIFYING: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Sin": np.cos,
    "Cos": np.sin,
    "Tan": lambda x: 1 / np.cos(x) ** 2,
    "Exp": np.exp,
}
AMPLIFIER_NOTE = 16.0  # scaled ULP: a gain past this is named in the verdict


def ill_conditioned(
    spec: ModelSpec, floors: Mapping[str, float], ref_capture: str
) -> tuple[IllConditioned, ...]:
    """Where conditioning is lost: tensors past their dtype's limit whose inputs are not."""
    by_name = {t.name: t for t in spec.tensors}
    modules = spec.modules()
    out = []
    with CaptureFile(ref_capture) as cap:
        dtypes = {n: d for n, (d, _) in cap.tensors().items()}
        for t in spec.tensors:
            f = floors.get(t.name)
            limit = _limit(t, dtypes)
            if f is None or f <= limit:
                continue
            if any(floors.get(i, 0.0) > conditioning_limit(dtypes.get(i, "float32")) for i in t.inputs):
                continue
            out.append(IllConditioned(t.name, modules.get(t.name, ""), f, _cause(t, by_name, floors, cap)))
    return tuple(out)


def _limit(t: NodeTensor, dtypes: Mapping[str, str]) -> float:
    """Half the precision `t` holds, in ULP of its dtype: a widening Cast (float16 to float32)
    holds its input's, so its limit is the input's scaled to its own ULP (8192 float32 ULP are
    one float16 ULP, not ill-conditioning)."""
    own = dtypes.get(t.name, "float32")
    limit = conditioning_limit(own)
    src = dtypes.get(t.inputs[0]) if t.op_type in ("Cast", "CastLike") and t.inputs else None
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
    engines = [c for c in oracle if c.status == "ok" and c.tensors]
    if len(engines) < 2:  # one engine agreeing with itself proves nothing
        return ex
    far: set[str] | None = None
    for c in engines:
        names = {
            value_name(d.name)
            for d in c.tensors
            if d.scaled_ulp is not None and d.scaled_ulp > conditioning_limit(d.dtype)
        }
        far = names if far is None else far & names
    if not far:
        return ex
    disagree = {value_name(d.name) for c in cross if c.status == "ok" for d in c.tensors if c.exceeds(d)}
    known = {t.tensor for t in ex.ill_conditioned}
    floors = ex.floor_map()
    by_name = {t.name: t for t in spec.tensors}
    modules = spec.modules()
    found = []
    with CaptureFile(ref_capture) as cap:
        for t in spec.tensors:
            if t.name not in far or t.name in disagree or t.name in known:
                continue
            if any(i in far for i in t.inputs):
                continue  # inherited: the onset is upstream
            cause = _cause(t, by_name, floors, cap)
            found.append(
                IllConditioned(
                    t.name, modules.get(t.name, ""), floors.get(t.name, 0.0), cause, "far from float64"
                )
            )
    return replace(ex, ill_conditioned=(*ex.ill_conditioned, *found)) if found else ex


_PASS_THROUGH = frozenset(
    {"Mul", "Pow", "Div", "Cast", "Identity", "Sqrt", "Neg", "Reshape", "Unsqueeze", "DequantizeLinear"}
)
_REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceSumSquare", "MatMul", "Gemm", "Einsum"})


def _reaches(name: str, by_name: Mapping[str, NodeTensor], want: frozenset[str], hops: int = 4) -> set[str]:
    """Op types in `want` reached going up from `name` through at most `hops` simple ops."""
    t = by_name.get(name)
    if t is None or hops == 0:
        return set()
    if t.op_type in want:
        return {t.op_type} | ({"square"} if _squares(t, by_name) else set())
    if t.op_type not in _PASS_THROUGH:
        return set()
    found = {"square"} if _is_square(t) else set()
    for i in t.inputs:
        found |= _reaches(i, by_name, want, hops - 1)
    return found


def _is_square(t: NodeTensor) -> bool:
    return (t.op_type == "Mul" and len(set(t.inputs)) == 1) or t.op_type == "Pow"


def _squares(t: NodeTensor, by_name: Mapping[str, NodeTensor]) -> bool:
    if t.op_type == "ReduceSumSquare":
        return True
    src = by_name.get(t.inputs[0]) if t.inputs else None
    return src is not None and _is_square(src)


def _cause(
    t: NodeTensor, by_name: Mapping[str, NodeTensor], floors: Mapping[str, float], cap: CaptureFile
) -> str:
    grow = max((floors.get(i, 0.0) for i in t.inputs), default=0.0)
    if t.op_type == "Sub" and len(t.inputs) == 2:
        a, b = (_reaches(i, by_name, _REDUCTIONS) for i in t.inputs)
        if a - {"square"} and b - {"square"}:
            if "square" in a | b:
                return (
                    "E[x²]−E[x]² cancels: compute the variance two-pass (the mean first, then the mean "
                    "of squared deviations) or with Welford's algorithm"
                )
            return "a subtraction of two nearly equal reductions cancels"
        return "a subtraction of nearly equal values cancels"
    if t.op_type in ("Softmax", "LogSoftmax") and t.inputs and t.inputs[0] in cap:
        x = np.asarray(cap[t.inputs[0]], dtype=np.float64)
        span = float(np.nanmax(x) - np.nanmin(x)) if x.size else 0.0
        return f"a softmax over logits spanning {span:.3g}: exp of their differences loses the small terms"
    if t.op_type in ("LayerNormalization", "GroupNormalization", "InstanceNormalization") and t.inputs:
        ratio = _mean_over_spread(cap, t.inputs[0], last=t.op_type == "LayerNormalization")
        if ratio is not None:
            return f"a normalization over rows whose mean is {ratio:.3g}x their spread"
    if (
        "QuantizeLinear" in _reaches(t.name, by_name, frozenset({"QuantizeLinear"}))
        or t.op_type == "QuantizeLinear"
    ):
        return (
            "QuantizeLinear rounds to steps of its scale: reorderings above it move values across a "
            "step (the quantized model's own resolution)"
        )
    if grow > 0:
        return f"{t.op_type} amplifies the reordering of its inputs {floors[t.name] / grow:.3g}x"
    return f"{t.op_type}'s own reductions are sensitive to their order"


def _mean_over_spread(cap: CaptureFile, name: str, last: bool) -> float | None:
    if name not in cap:
        return None
    x = np.asarray(cap[name], dtype=np.float64)
    if x.ndim < 2:
        return None
    rows = x.reshape(-1, x.shape[-1]) if last else x.reshape(x.shape[0] * x.shape[1], -1)
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
        for t in spec.tensors:
            f = AMPLIFYING.get(t.op_type)
            if f is None or not t.inputs or t.inputs[0] not in cap or t.name not in cap:
                continue
            x, y = cap[t.inputs[0]], cap[t.name]
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
                out.append(Amplifier(t.name, modules.get(t.name, ""), t.op_type, gain, span))
    return tuple(out)
