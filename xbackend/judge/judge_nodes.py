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
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from xbackend.bounds.element import AUX, NodeBound, allowance, unit_roundoff
from xbackend.bounds.propagation import PROP
from xbackend.files.modelref import np_dtype
from xbackend.files.run_values import CaptureFile
from xbackend.judge.judged_graph import HI, LO, UNDEF, Judged
from xbackend.numerics.metrics import COMPUTE_FLOATS, float_info, ulp_at
from xbackend.numerics.values import Value
from xbackend.results.explanation import LocalErrors, NodeJudgment, Origin, ReorderCheck

__all__ = ["JUDGE_PHASE", "at_declared", "judge_backend", "reorder_check", "warm_compiled"]

JUDGE_PHASE = "judge"


def _plain_float(value: Value) -> bool:
    return isinstance(value, np.ndarray) and str(value.dtype) in COMPUTE_FLOATS


# Flushing results below the smallest normal to zero is an engine's right; OpenVINO's exp flushes
# what its range reduction scales below 2^-126, results up to about 1.6e-38 (float32's smallest
# normal is 1.18e-38): twice the smallest normal, absolute, is allowed.
FLUSH = 2.0


_COMPILED = frozenset({"float32", "float64"})  # the dtypes xbackend.numerics.jitjudge judges


def _tiny(dtype: np.dtype[np.generic]) -> float:
    return float(float_info(dtype).tiny)


def _flushed(observed: np.ndarray, exact: np.ndarray, dtype: np.dtype[np.generic]) -> int:
    """Elements the engine returned as zero whose value is a nonzero one below the flush line."""
    zero = observed == 0
    if not zero.any():  # the common case: one pass
        return 0
    with np.errstate(invalid="ignore"):
        kept = exact.astype(dtype) != 0  # nonzero in the dtype, subnormals included: not an underflow
        return int(np.count_nonzero(zero & kept & (np.abs(exact) < FLUSH * _tiny(dtype))))


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
    threshold: float = 0.0  # the smallest allowance / |v|: a relative error on every element past it


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
    exact: np.ndarray,
    mag: np.ndarray | None,
    inherited: np.ndarray | None,
    dtype: np.dtype[np.generic],
) -> np.ndarray:
    """What decides, per element of a node output of `dtype` around its float64 value `exact`: the
    bound (`mag`: its operands' magnitude M), flushed subnormals and v's own float64 rounding for
    an inexact op, and what the node inherits from uncaptured nodes above it."""
    allow = allowance(bound, exact, _fit(mag, exact.shape), unit_roundoff(dtype))
    if not bound.exact:  # v is itself rounded to float64 along its evaluation
        allow *= 1 + 2.0**-20
        allow += FLUSH * _tiny(dtype)
    if inherited is not None:
        # flattened, or of a smaller operand: reshaped back, else its largest element everywhere
        fit = _fit(inherited, allow.shape)
        fit = fit if fit is not None else np.full(allow.shape, np.nanmax(np.abs(inherited), initial=0.0))
        allow = allow + np.nan_to_num(np.abs(fit), nan=np.inf)
    return allow


def _reach(observed: np.ndarray, lo: Value, hi: Value) -> np.ndarray | None:
    """Per element, whether `observed` lies between the lowest and highest results its operands' errors
    reach (None where there are none)."""
    if (
        not (isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray))
        or not lo.size == hi.size == observed.size
    ):
        return None
    low, high, values = (
        z.astype(np.float64).reshape(observed.shape) for z in (lo, hi, observed)
    )  # they may leave flattened
    with np.errstate(invalid="ignore"):
        return (low <= values) & (values <= high)


def _defined(observed: np.ndarray, exact: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`observed` with its undefined elements set to the judge's own values (so they compare equal)."""
    if free.size != observed.size or observed.shape != exact.shape or not free.any():
        return observed, exact
    mask = free.reshape(observed.shape).astype(bool)
    observed = np.where(mask, exact.astype(observed.dtype, copy=False), observed)
    return observed, np.where(mask, observed.astype(exact.dtype, copy=False), exact)


def _within(value: Value, lo: Value, hi: Value) -> bool:
    return (
        isinstance(value, np.ndarray)
        and (reached := _reach(value, lo, hi)) is not None
        and bool(reached.all())
    )


def _measure(
    observed: np.ndarray,
    exact: np.ndarray,
    mag: np.ndarray | None,
    bound: NodeBound,
    inherited: np.ndarray | None,
    reached: np.ndarray | None = None,
) -> _Measured:
    dtype = observed.dtype
    if exact.shape != observed.shape:
        return _Measured(
            math.inf, None, 0.0, (), False, f"shape {observed.shape} where float64 gives {exact.shape}"
        )
    if observed.size == 0:
        return _Measured(0.0, 0.0, 0.0, (), False)
    mag = _fit(mag, exact.shape)
    unit = unit_roundoff(dtype)
    if inherited is None and reached is None and str(dtype) in _COMPILED and exact.dtype == np.float64:
        fast = _measure_compiled(observed, exact, mag, bound, unit)
        if fast is not None:
            return fast
    yv = observed.astype(np.float64)
    allow = element_allowance(bound, exact, mag, inherited, dtype)
    empty = _vacuous(allow, exact, dtype)
    if empty:
        return _Measured(0.0, None, 0.0, (), False, vacuous=empty)
    top = _max(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(yv - exact)
        if not np.isfinite(err).all():  # infinities and NaN: the common case has none
            # a float64 value past the dtype's range rounds to the infinity of its sign
            overflow = (np.abs(exact) > top) & np.isinf(yv) & (np.sign(yv) == np.sign(exact))
            both_nan = np.isnan(yv) & np.isnan(exact)
            err = np.where(overflow | both_nan | (yv == exact), 0.0, err)
        if reached is not None:  # a step its operands' errors reach
            err = np.where(reached, 0.0, err)
    if np.isnan(err).any():
        worst = np.unravel_index(int(np.argmax(np.isnan(err))), err.shape)
        detail = (
            "NaN where float64 gives a number" if np.isnan(yv[worst]) else "a number where float64 gives NaN"
        )
        return _Measured(math.inf, None, 0.0, tuple(int(k) for k in worst), True, detail)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.divide(err, allow, out=np.zeros(err.shape), where=err != 0)
    flat = int(np.argmax(ratio))
    worst = np.unravel_index(flat, ratio.shape)
    scale = ulp_at(_finite_top(exact), dtype)
    worst_error, worst_allow = float(err[worst]), float(allow[worst])
    certain = _certain(
        bound,
        float(ratio[worst]),
        worst_error,
        float(exact[worst]),
        None if mag is None else float(mag[worst]),
        unit,
    )
    detail = "Inf where float64 gives a number" if math.isinf(worst_error) else ""
    flushed = _flushed(yv, exact, dtype)
    return _Measured(
        float(ratio[worst]), worst_error / scale, worst_allow / scale, tuple(int(k) for k in worst), certain,
        detail, flushed=flushed, threshold=_threshold(allow, exact),
    )  # fmt: skip


def _threshold(allow: np.ndarray, exact: np.ndarray) -> float:
    """The smallest relative error that, made on every element, passes some element's allowance."""
    av = np.abs(exact)
    with np.errstate(invalid="ignore"):
        relative = np.divide(allow, av, out=np.full(av.shape, np.inf), where=av > 0)
    low = float(np.nanmin(relative, initial=np.inf))
    return low if math.isfinite(low) else 0.0


def warm_compiled() -> threading.Thread:
    """The compiled pass loaded in the background while the explanation's workers run."""

    def load() -> None:
        try:
            # heavy: numba loads the compiled kernel from its cache
            from xbackend.numerics.jitjudge import warm

            warm()
        except Exception:  # judging loads it again, and says why if it cannot
            pass

    thread = threading.Thread(target=load, name="xbackend-warm-judge", daemon=True)
    thread.start()
    return thread


def _measure_compiled(
    observed: np.ndarray, exact: np.ndarray, mag: np.ndarray | None, bound: NodeBound, unit: float
) -> _Measured | None:
    """_measure in one compiled pass (xbackend.numerics.jitjudge), where every element is finite;
    None otherwise (the numpy form decides)."""
    # heavy: numba compiles the kernel once, cached on disk
    from xbackend.numerics.jitjudge import judge_pass

    dtype = observed.dtype
    magnitude = mag if bound.b and mag is not None else None
    ks = 0.0
    if bound.scaled:
        ks = unit * bound.scaled * _finite_top(exact)
    line = FLUSH * _tiny(dtype)  # flushed below it; the judge's slack above zero
    slack = (1.0, 0.0) if bound.exact else (1 + 2.0**-20, line)
    terms = (unit * bound.a, unit * bound.b, unit * bound.c if bound.c else 0.0, ks, *slack)
    got = judge_pass(observed, exact, magnitude, terms, line)
    if got is None:
        return None
    best, at, worst_allow, widest, top, flushed, tight = got
    empty = _vacuity(widest, top, dtype)
    if empty:
        return _Measured(0.0, None, 0.0, (), False, vacuous=empty)
    worst = tuple(int(k) for k in np.unravel_index(at, exact.shape))
    vi = float(exact[worst])
    worst_error = abs(float(observed[worst]) - vi)
    scale = ulp_at(top, dtype)
    certain = _certain(bound, best, worst_error, vi, None if mag is None else float(mag[worst]), unit)
    return _Measured(
        best, worst_error / scale, worst_allow / scale, worst, certain, flushed=flushed, threshold=tight
    )


def _certain(bound: NodeBound, ratio: float, error: float, vi: float, mi: float | None, unit: float) -> bool:
    """Whether an element past its allowance (`ratio` > 1, error `error`, value `vi`, magnitude `mi`)
    is past the deterministic bound too: an error at any confidence (an exact or correctly
    rounded op: at once)."""
    if bound.deterministic_b and ratio > 1 and mi is not None:
        det = unit * (bound.a * abs(vi) + bound.deterministic_b * abs(mi) + bound.c)
        return error > det
    return ratio > 1 and bound.kind in ("exact", "elementwise")


def at_declared(observed: np.ndarray, declared: str | None) -> tuple[np.ndarray, str]:
    """`observed` in the dtype the model declares, and the narrower dtype it came back in ('' if not
    narrower): a wider return is rounded to the declared dtype, a narrower one is widened exactly
    and judged at the declared precision."""
    if declared is None or str(observed.dtype) == declared or str(observed.dtype) not in COMPUTE_FLOATS:
        return observed, ""
    want = np_dtype(declared)
    narrow = float_info(observed.dtype).nmant < float_info(want).nmant
    with np.errstate(over="ignore"):
        return observed.astype(want), (str(observed.dtype) if narrow else "")


def _finite_top(exact: np.ndarray) -> float:
    """The largest finite |v| (0 for none)."""
    top = float(np.max(np.abs(exact), initial=0.0))
    if math.isfinite(top):
        return top
    finite = np.abs(exact[np.isfinite(exact)])
    return float(finite.max()) if finite.size else 0.0


def _vacuous(allow: np.ndarray, exact: np.ndarray, dtype: np.dtype[np.generic]) -> str:
    """Why an allowance judges nothing: not finite, or past the value's own largest magnitude
    (a result off by its whole size would pass); '' where it judges."""
    if allow.size == 0:
        return ""
    av = np.abs(exact)
    top = float(av.max(initial=0.0))
    if math.isfinite(top):  # the common case: one pass each
        widest = float(allow.max(initial=0.0))
    else:
        finite_v = np.isfinite(av)  # an infinite value (a mask's -inf) is judged by equality
        where = np.broadcast_to(finite_v, allow.shape)
        widest = float(np.max(allow, where=where, initial=0.0))  # nan where v is inf: left out
        top = float(np.max(av, where=finite_v, initial=0.0))
    return _vacuity(widest, top, dtype)


def _vacuity(widest: float, top: float, dtype: np.dtype[np.generic]) -> str:
    """Why the widest allowance `widest` judges nothing beside the value's largest |v| `top`."""
    if not math.isfinite(widest):
        return "its allowance is not finite"
    if widest > max(top, FLUSH * _tiny(dtype)) * (1 + 2.0**-10):  # a zero tensor's floor is the flush line
        return f"its allowance ({widest:.3g}) is larger than the value's own magnitude ({top:.3g})"
    return ""


def _rule(bound: NodeBound, composed: str) -> str:
    return bound.describe() + (f" + inherited ({composed})" if composed else "")


def _exact_differs(value: Value, exact: Value) -> str:
    """For values other than float tensors: '' when equal, else why not."""
    if isinstance(value, np.ndarray) and isinstance(exact, np.ndarray):
        if value.shape != exact.shape:
            return f"shape {value.shape} where float64 gives {exact.shape}"
        if value.dtype.kind in "fc" or exact.dtype.kind in "fc":
            same = np.array_equal(value.astype(np.float64), exact.astype(np.float64), equal_nan=True)
        else:
            same = np.array_equal(value, exact)
        return "" if same else "exact values differ"
    if isinstance(value, list) and isinstance(exact, list):
        if len(value) != len(exact):
            return "a sequence of another length"
        return next((w for a, b in zip(value, exact, strict=True) if (w := _exact_differs(a, b))), "")
    if value is None and exact is None:
        return ""
    if isinstance(value, dict) and isinstance(exact, dict):
        if set(value) != set(exact):
            return "a map with other keys"
        return next((w for k in value if (w := _exact_differs(value[k], exact[k]))), "")
    return "another kind of value"


BELOW_FLOAT64_ULP = 32  # what the evaluator's own rounding may be, where it computes an op below float64


def _below_float64(value: Value, exact: Value) -> str:
    """The dtype of a float value the float64 evaluator computed below float64 (its op's kernel
    casts: onnx's AffineGrid), for a plain float result; '' otherwise."""
    if not (_plain_float(value) and isinstance(exact, np.ndarray) and exact.dtype.kind == "f"):
        return ""
    return "" if exact.dtype == np.float64 else str(exact.dtype)


def judge_backend(
    backend: str,
    local_capture: str,
    judge_capture: str,
    judged: Judged,
    order: Sequence[str],
    modules: Mapping[str, str],
    covers: Mapping[str, tuple[str, ...]] | None = None,
    graph: str = "",
    unfused: bool = False,
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
    with CaptureFile(local_capture) as local, CaptureFile(judge_capture) as judge:
        for tensor in order:
            bound = judged.bounds.get(tensor)
            if bound is None or tensor not in local or tensor not in judge:
                continue
            observed, exact = local[tensor], judge[tensor]
            module = modules.get(tensor, "")
            low = _below_float64(observed, exact)
            if low:  # the evaluator's own rounding is allowed too: 32 ULP of its largest element
                exact = np.asarray(exact, np.float64)
                finite = np.abs(exact[np.isfinite(exact)])
                own = BELOW_FLOAT64_ULP * unit_roundoff(low) * (float(finite.max()) if finite.size else 0.0)
                propagated = judge.get(PROP + tensor)
                prop_low: np.ndarray | None = (
                    propagated if isinstance(propagated, np.ndarray) else 0.0
                ) + np.full(exact.shape, own)
            lo, hi = judge.get(LO + tensor), judge.get(HI + tensor)
            free = judge.get(UNDEF + tensor)
            if (
                isinstance(free, np.ndarray)
                and isinstance(observed, np.ndarray)
                and isinstance(exact, np.ndarray)
            ):
                observed, exact = _defined(
                    observed, exact, free
                )  # ONNX leaves those elements undefined: any value is right
            if not (_plain_float(observed) and isinstance(exact, np.ndarray) and exact.dtype == np.float64):
                why = _exact_differs(observed, exact)
                if why and _within(observed, lo, hi):  # a step its operands' errors reach: not an error
                    why = ""
                nodes.append(
                    NodeJudgment(
                        tensor, bound.op, 0.0 if not why else None, 0.0, 0.0 if not why else math.inf
                    )
                )
                if why:
                    origins.append(
                        Origin(
                            tensor,
                            module,
                            bound.op,
                            None,
                            0.0,
                            why,
                            rule=_rule(bound, judged.composed.get(tensor, "")),
                            certain=True,
                        )
                    )
                continue
            assert isinstance(observed, np.ndarray)
            observed, narrow = at_declared(observed, judged.declared.get(tensor))
            mag, prop = judge.get(AUX + tensor), judge.get(PROP + tensor)
            if low:
                prop = prop_low
            measured = _measure(
                observed,
                exact,
                mag if isinstance(mag, np.ndarray) else None,
                bound,
                prop if isinstance(prop, np.ndarray) else None,
                _reach(observed, lo, hi),
            )
            if measured.vacuous:
                nodes.append(NodeJudgment(tensor, bound.op, None, 0.0, 0.0, not_judged=measured.vacuous))
                continue
            nodes.append(
                NodeJudgment(
                    tensor,
                    bound.op,
                    measured.local_scaled,
                    measured.allowed_scaled,
                    measured.ratio,
                    threshold=measured.threshold,
                )
            )
            if measured.flushed:
                flushed = (flushed[0] + measured.flushed, flushed[1] or tensor)
            if measured.ratio > worst[0] and not bound.exact:
                worst = (measured.ratio, tensor)
            returned = f"handed back as {narrow} where the model declares {observed.dtype}" if narrow else ""
            if measured.ratio > 1 or (narrow and not narrowed):  # the first narrower return loses precision
                narrowed = narrowed or bool(narrow)
                op, detail = bound.op, "; ".join(w for w in (measured.detail, returned) if w)
                if tensor in judged.blame:  # an exact op carries it: name the kernel that made it
                    op, made = judged.blame[tensor]
                    detail = detail or f"made by {op} at {made}, carried by {bound.op}"
                origins.append(
                    Origin(
                        tensor,
                        module,
                        op,
                        measured.local_scaled,
                        measured.allowed_scaled,
                        detail,
                        covers=(covers or {}).get(tensor, ()),
                        element=measured.element,
                        rule=_rule(bound, judged.composed.get(tensor, ""))
                        + (
                            f"; its float64 value was computed in {low}: {BELOW_FLOAT64_ULP} ULP added"
                            if low
                            else ""
                        ),
                        certain=measured.certain,
                    )
                )
    return LocalErrors(
        backend,
        "ok",
        origins=tuple(origins),
        compared=sum(1 for node in nodes if not node.not_judged),
        largest_ratio=worst[0] if worst[0] >= 0 else None,
        largest_at=worst[1],
        nodes=tuple(nodes),
        graph=graph,
        unfused=unfused,
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
    with CaptureFile(judge_capture) as judge, CaptureFile(base) as base_capture, CaptureFile(spread) as sp:
        held = base_capture.tensors()
        for tensor in judged.order if order is None else order:
            bound = judged.bounds[tensor]
            spread_values = sp.get(tensor)
            if tensor not in held or not isinstance(spread_values, np.ndarray) or not spread_values.any():
                continue
            dtype, shape = held[tensor]
            exact = judge.get(tensor)
            if not isinstance(exact, np.ndarray) or exact.shape != shape or spread_values.shape != shape:
                continue
            mag, prop = judge.get(AUX + tensor), judge.get(PROP + tensor)
            allow = element_allowance(
                bound,
                exact,
                mag if isinstance(mag, np.ndarray) else None,
                prop if isinstance(prop, np.ndarray) else None,
                np_dtype(dtype),
            )
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = float(np.max(np.where(spread_values == 0, 0.0, spread_values / allow)))
            if ratio > worst[0]:
                worst = (ratio, tensor)
            if ratio > 1:
                over.append(tensor)
    return ReorderCheck(
        "ok",
        engine=engine,
        samples=samples,
        largest_ratio=worst[0] if worst[0] >= 0 else 0.0,
        largest_at=worst[1],
        over=tuple(over),
    )
