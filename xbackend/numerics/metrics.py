"""Per-tensor difference metrics between two arrays, in the dtype's own bits.

ULP distance maps IEEE bits (sign-magnitude) to a monotonic signed integer and
subtracts in a wider integer. NaN, Inf and flush-to-zero mismatches are
classified first and counted apart, never as huge ULP numbers. Integer, bool and
string tensors compare exactly.

The scale-aware figure ("scaled ULP") is the largest absolute error expressed in
units of the ULP of the reference tensor's largest finite magnitude: raw max ULP
explodes near zero (a sign flip across 0 is ~1e9 ULP for fp32) even when the
error is tiny relative to the tensor.

A reference element at ±finfo(dtype).max in a format with infinities is saturated fill
(an additive attention mask of finfo.min, the transformers convention): like Inf it is
compared for equality, counted apart (`fill_mismatch`) and left out of the scale, else
the scale would be the fill's and no error elsewhere could ever show. Formats without
Inf (float8) saturate their casts at finfo.max, a real value: there it is compared as one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from xbackend.numerics import streamdiff
from xbackend.numerics.values import Value, describe

__all__ = [
    "COMPUTE_FLOATS",
    "DEFAULT_MAX_ULP",
    "FLOAT_BITS",
    "DiffStatus",
    "TensorDiff",
    "classify",
    "diff_values",
    "float_info",
    "is_float_dtype",
    "keep_worse",
    "ordered_bits",
    "saturated_fill",
    "summarize",
    "ulp_at",
    "ulp_distance",
    "worst_per_tensor",
]

# numpy dtype name -> (bits of the value, mantissa bits). Formats narrower than a byte
# (fp4, fp6) sit in the low bits of one byte each, as ml_dtypes stores them.
FLOAT_BITS: dict[str, tuple[int, int]] = {
    "float64": (64, 52),
    "float32": (32, 23),
    "float16": (16, 10),
    "bfloat16": (16, 7),
    "float8_e4m3fn": (8, 3),
    "float8_e4m3fnuz": (8, 3),
    "float8_e5m2": (8, 2),
    "float8_e5m2fnuz": (8, 2),
    "float8_e8m0fnu": (8, 0),
    "float6_e2m3fn": (6, 3),
    "float6_e3m2fn": (6, 2),
    "float4_e2m1fn": (4, 1),
}
# Scale-aware ULPs: engines that reorder float sums legitimately differ by a few units at a
# tensor's own scale; the default cross-backend tolerance.
DEFAULT_MAX_ULP = 64.0

# the float types engines compute in: what the judge and the floors hold to rounding
COMPUTE_FLOATS = frozenset({"float16", "float32", "float64", "bfloat16"})
UNSIGNED_FLOATS = frozenset({"float8_e8m0fnu"})  # no sign bit: the bits are already ordered
INT_LIKE = frozenset({"int4", "uint4", "int2", "uint2"})  # ml_dtypes integers (numpy kind 'V')

DiffStatus = Literal["ok", "shape_mismatch", "dtype_mismatch", "structure_mismatch", "missing"]


def is_float_dtype(dtype: np.dtype[np.generic]) -> bool:
    """Whether `dtype` is a floating-point type xbackend measures in ULP."""
    return str(dtype) in FLOAT_BITS


def float_info(dtype: np.dtype[np.generic]) -> Any:
    """numpy's finfo for its own float types, ml_dtypes' for the rest."""
    name = str(dtype)
    if name in ("float64", "float32", "float16"):
        return np.finfo(np.dtype(name))
    import ml_dtypes  # optional: a foreign environment may lack ml_dtypes

    return ml_dtypes.finfo(dtype)  # type: ignore[no-untyped-call]


_info = float_info


def _finfo(dtype: np.dtype[np.generic]) -> tuple[int, int]:
    """(minimum normal exponent, mantissa bits) for a float dtype."""
    fi = _info(dtype)
    return int(fi.minexp), int(fi.nmant)


def ordered_bits(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sign, magnitude) of each element's bit pattern, as (bool, uint) arrays."""
    width = FLOAT_BITS[str(a.dtype)][0]
    uint = streamdiff.UINT[a.dtype.itemsize]
    bits = np.require(a, requirements="C").view(uint)
    if str(a.dtype) in UNSIGNED_FLOATS:
        return np.zeros(bits.shape, bool), bits
    sign = ((bits >> (width - 1)) & 1).astype(bool)
    mag = bits & uint((1 << (width - 1)) - 1)
    return sign, mag


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise ULP distance of two same-dtype float arrays (uint64); +0 and -0 are 0 apart.

    Only meaningful on elements that are finite on both sides (see `classify`).
    """
    sa, ma = ordered_bits(a)
    sb, mb = ordered_bits(b)
    ma64 = ma.astype(np.uint64)
    mb64 = mb.astype(np.uint64)
    same = sa == sb
    # Same sign: |ma - mb|. Opposite signs: ma + mb (the path crosses zero).
    # For fp64 the sum of two finite magnitudes is < 2**64, so uint64 never wraps.
    diff_same = np.where(ma64 >= mb64, ma64 - mb64, mb64 - ma64)
    return np.where(same, diff_same, ma64 + mb64)


@dataclass(frozen=True)
class Classes:
    """Element classes for a pair of float arrays (boolean masks, flattened)."""

    nan_both: np.ndarray
    nan_mismatch: np.ndarray
    inf_mismatch: np.ndarray
    ftz_mismatch: np.ndarray
    fill_mismatch: np.ndarray  # the reference is saturated fill, the candidate another value
    comparable: np.ndarray  # finite on both sides, not a flush-to-zero pair nor fill


def classify(a: np.ndarray, b: np.ndarray) -> Classes:
    """Split elements into NaN, saturated fill, Inf, flush-to-zero and comparable classes."""
    fa = a.astype(np.float64).ravel()
    fb = b.astype(np.float64).ravel()
    na, nb = np.isnan(fa), np.isnan(fb)
    ia, ib = np.isinf(fa), np.isinf(fb)
    any_nan = na | nb
    fill = saturated_fill(fb, a.dtype) & ~any_nan
    any_inf = (ia | ib) & ~any_nan & ~fill
    with np.errstate(invalid="ignore"):
        inf_mismatch = any_inf & (fa != fb)
    minexp, _ = _finfo(a.dtype)
    tiny = math.ldexp(1.0, minexp)
    sub_a = (fa != 0) & (np.abs(fa) < tiny)
    sub_b = (fb != 0) & (np.abs(fb) < tiny)
    ftz = (sub_a & (fb == 0)) | (sub_b & (fa == 0))
    return Classes(
        nan_both=na & nb,
        nan_mismatch=na ^ nb,
        inf_mismatch=inf_mismatch,
        ftz_mismatch=ftz,
        fill_mismatch=fill & (_bits(a) != _bits(b)),
        comparable=~any_nan & ~(ia | ib) & ~ftz & ~fill,
    )


def _bits(x: np.ndarray) -> np.ndarray:
    return np.require(x, requirements="C").reshape(-1).view(streamdiff.UINT[x.dtype.itemsize])


def saturated_fill(fb: np.ndarray, dtype: np.dtype[np.generic]) -> np.ndarray:
    """Elements of the reference (as float64) at ±finfo(dtype).max, in a format with Inf."""
    if str(dtype) not in streamdiff.IEEE:
        return np.zeros(fb.shape, bool)
    out: np.ndarray = np.abs(fb) == float(_info(dtype).max)
    return out


def ulp_at(x: float, dtype: np.dtype[np.generic]) -> float:
    """Size of one ULP of `dtype` at magnitude |x| (the smallest subnormal step at 0)."""
    minexp, nmant = _finfo(dtype)
    ax = abs(float(x))
    exp = minexp if ax == 0 or not math.isfinite(ax) else max(math.frexp(ax)[1] - 1, minexp)
    return math.ldexp(1.0, exp - nmant)


@dataclass(frozen=True)
class TensorDiff:
    """How one tensor differs between a candidate (a) and a reference (b)."""

    name: str
    op_type: str
    dtype: str
    shape: tuple[int, ...]
    status: DiffStatus
    bitwise_equal: bool
    elements: int
    mismatches: int
    mismatch_fraction: float
    max_ulp: int | None
    scaled_ulp: float | None
    max_abs: float
    max_rel: float
    p99_abs: float
    v_ermv: float
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    ftz_mismatch: int = 0
    detail: str = ""
    constant: bool = False  # the reference (b) holds one value repeated: a comparison proves little
    zero_sign_mismatch: int = 0  # +0 vs -0: bits differ, 0 ULP apart
    nan_payload_mismatch: int = 0  # NaN on both sides with different bits
    fill_mismatch: int = 0  # the reference holds saturated fill (±finfo.max), the candidate not

    @classmethod
    def from_arrays(cls, name: str, a: np.ndarray, b: np.ndarray, op_type: str = "") -> TensorDiff:
        """The difference of `a` against `b` (the reference) for tensor `name`: ULP and relative figures,
        or what makes them incomparable (dtype, shape)."""
        if a.dtype != b.dtype:
            return cls.mismatch(name, op_type, "dtype_mismatch", f"{a.dtype} vs {b.dtype}", a, b)
        if a.shape != b.shape:
            return cls.mismatch(name, op_type, "shape_mismatch", f"{list(a.shape)} vs {list(b.shape)}", a, b)
        base = replace(cls._equal(name, op_type, a), constant=is_constant(b))
        if a.dtype.kind == "O" or a.dtype.kind in "US":
            return _exact_object(base, a, b)
        if a.dtype.kind == "c":
            real = a.real.dtype
            a, b = np.require(a, requirements="C"), np.require(b, requirements="C")
            # measured per real component: elements counts both parts
            d = cls.from_arrays(name, a.view(real), b.view(real), op_type)
            return replace(d, dtype=str(a.dtype), shape=base.shape)
        return _streamed(base, a, b)

    @classmethod
    def _equal(cls, name: str, op_type: str, a: np.ndarray) -> TensorDiff:
        return cls(
            name,
            op_type,
            str(a.dtype),
            tuple(int(size) for size in a.shape),
            "ok",
            True,
            int(a.size),
            0,
            0.0,
            0 if is_float_dtype(a.dtype) else None,
            0.0 if is_float_dtype(a.dtype) else None,
            0.0,
            0.0,
            0.0,
            0.0,
        )

    @classmethod
    def empty(cls, name: str, op_type: str) -> TensorDiff:
        """Two empty optionals: equal, with nothing to measure."""
        return cls(name, op_type, "optional", (), "ok", True, 0, 0, 0.0, None, None, 0.0, 0.0, 0.0, 0.0)

    @classmethod
    def mismatch(
        cls,
        name: str,
        op_type: str,
        status: DiffStatus,
        detail: str,
        a: np.ndarray | None = None,
        b: np.ndarray | None = None,
    ) -> TensorDiff:
        """A tensor that cannot be compared element by element."""
        ref = b if b is not None else a
        dtype = str(ref.dtype) if ref is not None else ""
        shape = tuple(int(size) for size in ref.shape) if ref is not None else ()
        n = int(ref.size) if ref is not None else 0
        return cls(
            name,
            op_type,
            dtype,
            shape,
            status,
            False,
            n,
            n,
            1.0,
            None,
            None,
            math.inf,
            math.inf,
            math.inf,
            math.inf,
            detail=detail,
        )

    @property
    def comparable(self) -> bool:
        """Whether the two tensors could be compared element by element."""
        return self.status == "ok"

    def exceeds(self, max_ulp: float) -> bool:
        """Past the tolerance: scaled ULP above max_ulp, any NaN/Inf mismatch, or incomparable."""
        if not self.comparable or self.nan_mismatch or self.inf_mismatch or self.fill_mismatch:
            return True
        if self.scaled_ulp is None:  # exact types: any difference is a violation
            return not self.bitwise_equal
        return self.scaled_ulp > max_ulp

    def severity(self) -> tuple[int, float, int]:
        """Sort key: incomparable first, then scaled ULP, then mismatch count."""
        return (0 if self.comparable else 1, self.scaled_ulp or self.max_abs, self.mismatches)

    def zero_ulp_reason(self) -> str:
        """Why bits differ although no element is a ULP apart ('' when that is not the case)."""
        if self.bitwise_equal or self.max_ulp != 0 or not self.comparable:
            return ""
        why = []
        if self.zero_sign_mismatch:
            why.append(f"{self.zero_sign_mismatch} signed zero(s) (+0 vs -0)")
        if self.nan_payload_mismatch:
            why.append(f"{self.nan_payload_mismatch} NaN(s) with different payload bits")
        if self.nan_mismatch or self.inf_mismatch or self.ftz_mismatch or self.fill_mismatch:
            why.append("NaN/Inf/flush-to-zero/fill mismatches")
        return ", ".join(why) or "bit patterns that encode the same value"

    def worse(self, other: TensorDiff) -> TensorDiff:
        """Whichever of the two differences is the more severe."""
        return other if other.severity() > self.severity() else self


def keep_worse(worst: dict[str, TensorDiff], tensor_diff: TensorDiff) -> None:
    """Fold `tensor_diff` into `worst`, keeping per tensor the more severe diff."""
    worst[tensor_diff.name] = (
        worst[tensor_diff.name].worse(tensor_diff) if tensor_diff.name in worst else tensor_diff
    )


def worst_per_tensor(diffs: Iterable[TensorDiff], order: Mapping[str, int]) -> list[TensorDiff]:
    """The most severe diff of each tensor, sorted by `order` (unknown names last)."""
    worst: dict[str, TensorDiff] = {}
    for diff in diffs:
        keep_worse(worst, diff)
    return sorted(worst.values(), key=lambda tensor_diff: order.get(tensor_diff.name, len(order)))


def summarize(diffs: Sequence[TensorDiff]) -> tuple[bool, int | None, float | None, str | None]:
    """(all bitwise equal, max ULP, max scaled ULP, first divergent tensor)."""
    ulps = [diff.max_ulp for diff in diffs if diff.max_ulp is not None]
    scaled = [diff.scaled_ulp for diff in diffs if diff.scaled_ulp is not None]
    first = next((diff.name for diff in diffs if not diff.bitwise_equal), None)
    return first is None, (max(ulps) if ulps else None), (max(scaled) if scaled else None), first


def _exact_object(base: TensorDiff, a: np.ndarray, b: np.ndarray) -> TensorDiff:
    neq = int(np.count_nonzero(a != b))
    return _with_counts(base, neq) if neq else base


def _with_counts(base: TensorDiff, mismatches: int, **kw: object) -> TensorDiff:
    frac = mismatches / base.elements if base.elements else 0.0
    return replace(base, bitwise_equal=False, mismatches=mismatches, mismatch_fraction=frac, **kw)  # type: ignore[arg-type]


class _FloatKernel(streamdiff.Kernel):
    """Floats in numpy (the ml_dtypes formats, and IEEE ones up to streamdiff.SMALL elements):
    the differing elements are classified and measured by `classify` and `ulp_distance`."""

    def __init__(self, dtype: np.dtype[np.generic]) -> None:
        self.dtype = dtype
        self.uint = streamdiff.UINT[dtype.itemsize]

    def ref_stats(self, xb: np.ndarray) -> tuple[int, int, float]:
        f = xb.view(self.dtype).astype(np.float64)
        fin = np.isfinite(f) & ~saturated_fill(f, self.dtype)
        nonfinite = f.size - int(np.count_nonzero(fin))
        finite = np.abs(f[fin]) if nonfinite else np.abs(f)
        return nonfinite, int(np.count_nonzero(finite)), float(finite.max(initial=0.0))

    def part(self, da: np.ndarray, db: np.ndarray) -> streamdiff.Part:
        a, b = da.view(self.dtype), db.view(self.dtype)
        classes = classify(a, b)
        comparable = classes.comparable
        fb = b.astype(np.float64)
        cfa, cfb = a[comparable].astype(np.float64), fb[comparable]
        nz = cfb != 0
        with np.errstate(over="ignore", invalid="ignore"):
            err = np.abs(cfa - cfb)
            rel = err[nz] / np.abs(cfb[nz])
        fin_b = np.isfinite(fb) & ~saturated_fill(fb, self.dtype)
        return streamdiff.Part(
            err=err,
            rel=rel,
            mismatches=da.size,
            max_ulp=int(ulp_distance(a[comparable], b[comparable]).max(initial=0)),
            non_comparable=da.size - int(np.count_nonzero(comparable)),
            ref_nonfinite=da.size - int(np.count_nonzero(fin_b)),
            ref_nonzero_finite=int(np.count_nonzero(fin_b & (fb != 0))),
            nan_mismatch=int(np.count_nonzero(classes.nan_mismatch)),
            inf_mismatch=int(np.count_nonzero(classes.inf_mismatch)),
            ftz_mismatch=int(np.count_nonzero(classes.ftz_mismatch)),
            zero_sign_mismatch=int(np.count_nonzero((cfa == 0) & (cfb == 0))),  # bits differ: +0 vs -0
            nan_payload_mismatch=int(np.count_nonzero(classes.nan_both)),  # bits differ: other payloads
            fill_mismatch=int(np.count_nonzero(classes.fill_mismatch)),
        )


def _kernel(dtype: np.dtype[np.generic]) -> streamdiff.Kernel | None:
    name = str(dtype)
    if name in FLOAT_BITS:
        return _FloatKernel(dtype)
    if dtype == np.bool_:
        return streamdiff.BoolKernel()
    if dtype.kind in "iu" or name in INT_LIKE:
        return streamdiff.IntKernel(dtype, unsigned=dtype.kind == "u" or name in ("uint4", "uint2"))
    return None  # an opaque type: bytes only


def _streamed(base: TensorDiff, a: np.ndarray, b: np.ndarray) -> TensorDiff:
    """One pass, measuring only the elements whose bits differ (see streamdiff)."""
    if str(a.dtype) in streamdiff.IEEE and a.size > streamdiff.SMALL:
        summary = streamdiff.scan_ieee(a, b)  # compiled; smaller tensors spare a process numba's import
    else:
        kernel = _kernel(a.dtype)
        if kernel is None:
            neq = sum(
                int(np.count_nonzero(chunk.view(np.uint8) != y.view(np.uint8)))
                for chunk, y in zip(streamdiff.chunks(a), streamdiff.chunks(b))
            )
            return _with_counts(base, neq) if neq else base
        summary = streamdiff.scan(a, b, kernel)
        if isinstance(kernel, streamdiff.BoolKernel) and summary is not None:
            return _with_counts(base, summary.mismatches, max_abs=1.0)
    if summary is None:
        return base
    common = {
        "max_abs": summary.max_abs,
        "max_rel": summary.max_rel,
        "p99_abs": summary.p99_abs,
        "v_ermv": summary.v_ermv,
    }
    if not is_float_dtype(a.dtype):
        return _with_counts(base, summary.mismatches, **common)
    return _with_counts(
        base,
        summary.differing,
        max_ulp=summary.max_ulp,
        scaled_ulp=summary.max_abs / ulp_at(summary.ref_max_finite, a.dtype),
        nan_mismatch=summary.nan_mismatch,
        inf_mismatch=summary.inf_mismatch,
        ftz_mismatch=summary.ftz_mismatch,
        zero_sign_mismatch=summary.zero_sign_mismatch,
        nan_payload_mismatch=summary.nan_payload_mismatch,
        fill_mismatch=summary.fill_mismatch,
        **common,
    )


def is_constant(b: np.ndarray) -> bool:
    """Every element of b equals the first (numerically: +0 and -0 alike), e.g. all zeros."""
    if b.size < 2:
        return False
    opaque = b.dtype.kind == "V" and not is_float_dtype(b.dtype) and str(b.dtype) not in INT_LIKE
    first = b.reshape(-1)[:1]
    if opaque:
        first = first.view(np.uint8)
    for chunk in streamdiff.chunks(b):  # stops at the first chunk that varies
        if opaque:
            raw = chunk.view(np.uint8).reshape(chunk.size, -1)
            if not (raw == first).all():
                return False
        elif not (chunk == first).all():
            return False
    return True


def diff_values(name: str, value: Value, b: Value, op_type: str = "") -> list[TensorDiff]:
    """a against b, element by element for sequences and maps (`name[i]`, `name{key}`).

    Two empty optionals are equal; a value and an empty optional, a sequence of another
    length or a tensor against a sequence are one 'structure_mismatch' row. An element of a
    sequence or map is scaled as a tensor's element is: in ULPs of the largest value of its
    dtype in the whole output (a ZipMap's 1e-5 probability beside 0.99999 is not its own scale).
    """
    out = _diff_values(name, value, b, op_type)
    if not isinstance(b, list | dict):
        return out
    top = _largest(b, {})
    return [
        replace(d, scaled_ulp=d.max_abs / ulp_at(top[d.dtype], np.dtype(d.dtype)))
        if d.scaled_ulp is not None and top.get(d.dtype, 0.0) > 0
        else d
        for d in out
    ]


def _largest(value: Value, out: dict[str, float]) -> dict[str, float]:
    """Per float dtype, the largest finite |x| over every tensor inside `value`."""
    if isinstance(value, np.ndarray):
        if is_float_dtype(value.dtype) and value.size:
            x = np.abs(value.astype(np.float64, copy=False))
            fin = x[np.isfinite(x)]
            if fin.size:
                out[str(value.dtype)] = max(out.get(str(value.dtype), 0.0), float(fin.max()))
    elif isinstance(value, list):
        for v in value:
            _largest(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _largest(v, out)
    return out


def _diff_values(name: str, a: Value, b: Value, op_type: str = "") -> list[TensorDiff]:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return [TensorDiff.from_arrays(name, a, b, op_type)]
    if a is None and b is None:
        return [TensorDiff.empty(name, op_type)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            value
            for i, (x, y) in enumerate(zip(a, b))
            for value in _diff_values(f"{name}[{i}]", x, y, op_type)
        ]
    if isinstance(a, dict) and isinstance(b, dict) and set(a) == set(b):
        keys = sorted(a, key=repr)
        return [
            value for key in keys for value in _diff_values(f"{name}{{{key!r}}}", a[key], b[key], op_type)
        ]
    return [TensorDiff.mismatch(name, op_type, "structure_mismatch", f"{describe(a)} vs {describe(b)}")]
