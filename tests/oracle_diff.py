"""The whole-array comparator xbackend used before the streaming one: the independent
computation every TensorDiff field is checked against. Plain numpy on full float64
copies, boolean-mask gathers and np.percentile; slow and memory-hungry on purpose.
"""

from __future__ import annotations

import math

import numpy as np

from xbackend.numerics.metrics import FLOAT_BITS, UNSIGNED_FLOATS, ulp_at

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _minexp(dtype: np.dtype) -> int:
    name = str(dtype)
    if name in ("float64", "float32", "float16"):
        return int(np.finfo(np.dtype(name)).minexp)
    import ml_dtypes

    return int(ml_dtypes.finfo(dtype).minexp)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    width = FLOAT_BITS[str(a.dtype)][0]
    uint = _UINT[a.dtype.itemsize]
    out = []
    for x in (a, b):
        bits = np.ascontiguousarray(x).view(uint)
        if str(x.dtype) in UNSIGNED_FLOATS:
            out.append((np.zeros(bits.shape, bool), bits.astype(np.uint64)))
        else:
            out.append(
                (
                    ((bits >> (width - 1)) & 1).astype(bool),
                    (bits & uint((1 << (width - 1)) - 1)).astype(np.uint64),
                )
            )
    (sa, ma), (sb, mb) = out
    return np.where(sa == sb, np.where(ma >= mb, ma - mb, mb - ma), ma + mb)


def oracle(a: np.ndarray, b: np.ndarray) -> dict[str, object]:
    """The TensorDiff fields of a (candidate) against b (reference), same dtype and shape."""
    a, b = np.ascontiguousarray(a).ravel(), np.ascontiguousarray(b).ravel()
    n = a.size
    out: dict[str, object] = {"elements": n}
    if a.tobytes() == b.tobytes():
        return {**out, "bitwise_equal": True, "mismatches": 0}
    if str(a.dtype) in FLOAT_BITS:
        return {**out, **_float(a, b)}
    if a.dtype == np.bool_:
        neq = int(np.count_nonzero(a != b))
        return {**out, "bitwise_equal": False, "mismatches": neq, "max_abs": 1.0 if neq else 0.0}
    wide = np.uint64 if a.dtype.kind == "u" or str(a.dtype) in ("uint4", "uint2") else np.int64
    aw, bw = a.astype(wide), b.astype(wide)
    # magnitudes in uint64: an int64 difference can overflow int64
    d = np.where(aw >= bw, (aw - bw).view(np.uint64), (bw - aw).view(np.uint64)).astype(np.float64)
    denom = np.abs(bw.astype(np.float64))
    rel = d[denom > 0] / denom[denom > 0]
    return {
        **out,
        "bitwise_equal": False,
        "mismatches": int(np.count_nonzero(d)),
        "max_abs": float(d.max(initial=0.0)),
        "max_rel": float(rel.max(initial=0.0)),
        "p99_abs": float(np.percentile(d, 99)),
        "v_ermv": math.fsum(rel) / rel.size if rel.size else 0.0,
    }


def _float(a: np.ndarray, b: np.ndarray) -> dict[str, object]:
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    na, nb = np.isnan(fa), np.isnan(fb)
    ia, ib = np.isinf(fa), np.isinf(fb)
    any_nan = na | nb
    # saturated fill: the reference at +-finfo.max, in the formats that have an Inf
    ieee = str(a.dtype) in ("float16", "bfloat16", "float32", "float64")
    import ml_dtypes

    big = float(ml_dtypes.finfo(a.dtype).max)
    saturated = (np.abs(fb) == big) if ieee else np.zeros(fb.shape, bool)
    fill = saturated & ~any_nan
    with np.errstate(invalid="ignore"):
        inf_mismatch = (ia | ib) & ~any_nan & ~fill & (fa != fb)
    tiny = math.ldexp(1.0, _minexp(a.dtype))
    sub_a = (fa != 0) & (np.abs(fa) < tiny)
    sub_b = (fb != 0) & (np.abs(fb) < tiny)
    ftz = (sub_a & (fb == 0)) | (sub_b & (fa == 0))
    m = ~any_nan & ~(ia | ib) & ~ftz & ~fill
    uint = _UINT[a.dtype.itemsize]
    ca, cb = a[m], b[m]
    ulps = _ulps(ca, cb)
    cfa, cfb = fa[m], fb[m]
    with np.errstate(over="ignore", invalid="ignore"):
        err = np.abs(cfa - cfb)
    finite = fb[np.isfinite(fb) & ~saturated]
    scale = float(np.abs(finite).max(initial=0.0))
    nz = cfb != 0
    rel = err[nz] / np.abs(cfb[nz])
    max_abs = float(err.max(initial=0.0))
    return {
        "bitwise_equal": False,
        "mismatches": int(np.count_nonzero(a.view(uint) != b.view(uint))),
        "max_ulp": int(ulps.max(initial=0)),
        "scaled_ulp": max_abs / ulp_at(scale, a.dtype),
        "max_abs": max_abs,
        "max_rel": float(rel.max(initial=0.0)),
        "p99_abs": float(np.percentile(err, 99)) if err.size else 0.0,
        "v_ermv": math.fsum(rel) / rel.size if rel.size else 0.0,
        "nan_mismatch": int(np.count_nonzero(na ^ nb)),
        "inf_mismatch": int(np.count_nonzero(inf_mismatch)),
        "ftz_mismatch": int(np.count_nonzero(ftz)),
        "zero_sign_mismatch": int(
            np.count_nonzero((cfa == 0) & (cfb == 0) & (ca.view(uint) != cb.view(uint)))
        ),
        "nan_payload_mismatch": int(np.count_nonzero(na & nb & (a.view(uint) != b.view(uint)))),
        "fill_mismatch": int(np.count_nonzero(fill & (a.view(uint) != b.view(uint)))),
    }
