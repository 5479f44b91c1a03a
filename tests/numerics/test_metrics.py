"""ULP distance and tensor metrics against independent computations."""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
import pytest

from xbackend.numerics.metrics import TensorDiff, classify, ulp_at, ulp_distance

pytestmark = pytest.mark.unit  # the unit tier: make check


def walk(start: float, k: int, dtype: type) -> np.ndarray:
    """The value k nextafter steps up from `start` (-0 -> +0 is not a step)."""
    cur = np.array(start, dtype)
    n = 0
    while n < k:
        nxt = np.nextafter(cur, np.array(np.inf, dtype))
        if not (cur == 0 and nxt == 0):
            n += 1
        cur = nxt
    return cur


def ulp1(a: float, b: float, dtype: type) -> int:
    return int(ulp_distance(np.array([a], dtype), np.array([b], dtype))[0])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("start,k", [(1.0, 0), (1.0, 1), (1.0, 37), (-1.0, 5), (-2.0, 1000)])
def test_ulp_matches_nextafter_walk(dtype: type, start: float, k: int) -> None:
    end = walk(start, k, dtype)
    assert ulp1(start, end, dtype) == k
    assert ulp1(end, start, dtype) == k


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_walk_across_zero_and_the_subnormal_boundary(dtype: type) -> None:
    s = np.finfo(dtype).smallest_subnormal
    tiny = np.finfo(dtype).smallest_normal
    below = walk(-float(tiny), 0, dtype)
    for k in (1, 2, 10, 100):
        assert ulp1(float(below), float(walk(float(below), k, dtype)), dtype) == k
    assert ulp1(-3 * s, walk(-3 * s, 5, dtype), dtype) == 5
    assert walk(-3 * s, 5, dtype) == 2 * s


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_subnormals_and_opposite_signs(dtype: type) -> None:
    s = np.finfo(dtype).smallest_subnormal
    assert ulp1(-3 * s, 2 * s, dtype) == 5
    assert ulp1(s, -s, dtype) == 2
    assert ulp1(0.0, s, dtype) == 1
    assert ulp1(-0.0, s, dtype) == 1
    tiny = np.finfo(dtype).smallest_normal
    below = np.nextafter(dtype(tiny), dtype(0))
    assert ulp1(tiny, below, dtype) == 1


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_largest_finite(dtype: type) -> None:
    big = np.finfo(dtype).max
    k = dtype(big)
    for _ in range(7):
        k = np.nextafter(k, dtype(0))
    assert ulp1(big, k, dtype) == 7


def test_float64_opposite_extremes_do_not_overflow() -> None:
    big = np.finfo(np.float64).max
    bits = struct.unpack("<q", struct.pack("<d", big))[0]
    assert ulp1(big, -big, np.float64) == 2 * bits  # > 2**63: needs the split math


def _rank_distance(dtype: object, a: float, b: float) -> int:
    """Distance by ranking every finite value of an 8/16-bit format (independent of bit tricks)."""
    width = np.dtype(dtype).itemsize * 8
    raw = np.arange(2**width, dtype=np.uint16 if width == 16 else np.uint8).view(dtype)
    with np.errstate(invalid="ignore"):
        f64 = raw.astype(np.float64)
    vals = np.unique(f64[np.isfinite(f64)])  # -0 == +0 merge
    ia = int(np.searchsorted(vals, float(np.array(a).astype(dtype).astype(np.float64))))
    ib = int(np.searchsorted(vals, float(np.array(b).astype(dtype).astype(np.float64))))
    return abs(ia - ib)


@pytest.mark.parametrize(
    "dtype",
    [
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2fnuz,
        np.float16,
    ],
)
@pytest.mark.parametrize("a,b", [(1.0, 1.5), (-0.5, 0.25), (0.0, 0.001), (-3.0, -2.0), (-100.0, 100.0)])
def test_small_formats_match_rank_order(dtype: object, a: float, b: float) -> None:
    x = np.array([a]).astype(dtype)
    y = np.array([b]).astype(dtype)
    assert int(ulp_distance(x, y)[0]) == _rank_distance(dtype, a, b)


def test_classes_are_counted_apart() -> None:
    s = np.finfo(np.float32).smallest_subnormal
    a = np.array([np.nan, np.nan, 1.0, np.inf, np.inf, s, 0.0, 2.0], np.float32)
    b = np.array([np.nan, 1.0, np.nan, np.inf, -np.inf, 0.0, s, 2.0], np.float32)
    c = classify(a, b)
    assert c.nan_both.tolist() == [True, False, False, False, False, False, False, False]
    assert int(c.nan_mismatch.sum()) == 2
    assert int(c.inf_mismatch.sum()) == 1
    assert int(c.ftz_mismatch.sum()) == 2
    assert c.comparable.tolist() == [False] * 7 + [True]
    d = TensorDiff.from_arrays("t", a, b)
    assert (d.nan_mismatch, d.inf_mismatch, d.ftz_mismatch) == (2, 1, 2)
    assert d.max_ulp == 0  # the special cases never become huge ULP numbers
    assert d.exceeds(1e9)  # but NaN/Inf mismatches always break tolerance


def test_signed_zero_is_zero_ulp_but_not_bitwise_equal() -> None:
    d = TensorDiff.from_arrays("z", np.array([0.0, 1.0], np.float32), np.array([-0.0, 1.0], np.float32))
    assert d.max_ulp == 0
    assert not d.bitwise_equal
    assert d.mismatches == 1 and d.mismatch_fraction == 0.5


def test_scaled_ulp_is_error_in_ulps_of_largest_magnitude() -> None:
    ref = np.array([1e-30, 4.0, -3.0], np.float32)
    cand = ref.copy()
    cand[0] = -1e-30  # sign flip near zero: huge raw ULP, negligible at the tensor's scale
    cand[1] = np.nextafter(np.float32(4.0), np.float32(5.0))  # exactly 1 ULP at 4.0
    d = TensorDiff.from_arrays("t", cand, ref)
    assert d.max_ulp == 2 * int(np.array(1e-30, np.float32).view(np.int32))  # ~4.6e8
    assert d.scaled_ulp == pytest.approx(1.0, abs=1e-6)
    assert ulp_at(4.0, np.dtype(np.float32)) == 2.0**-21
    assert d.max_abs == pytest.approx(2.0**-21)
    assert not d.exceeds(1.0) and d.exceeds(0.5)


def test_relative_metrics() -> None:
    ref = np.array([1.0, 2.0, 0.0, 4.0])
    cand = np.array([1.5, 2.0, 0.0, 3.0])
    d = TensorDiff.from_arrays("t", cand, ref)
    assert d.max_abs == 1.0
    assert d.max_rel == 0.5
    assert d.v_ermv == pytest.approx((0.5 + 0 + 0.25) / 3)  # b == 0 excluded
    assert d.mismatch_fraction == 0.5


def test_dtype_and_shape_mismatch_are_reported_not_raised() -> None:
    a32 = np.zeros((2, 3), np.float32)
    d = TensorDiff.from_arrays("t", a32, np.zeros((2, 3), np.float64))
    assert d.status == "dtype_mismatch" and d.detail == "float32 vs float64" and d.exceeds(1e9)
    d = TensorDiff.from_arrays("t", a32, np.zeros((3, 2), np.float32))
    assert d.status == "shape_mismatch" and d.detail == "[2, 3] vs [3, 2]"


def test_integers_and_bools_compare_exactly() -> None:
    d = TensorDiff.from_arrays("i", np.array([1, 2, 3], np.int64), np.array([1, 7, 3], np.int64))
    assert d.max_ulp is None and d.scaled_ulp is None
    assert d.mismatches == 1 and d.max_abs == 5.0 and d.exceeds(1e9)
    d = TensorDiff.from_arrays(
        "u", np.array([0, 2**64 - 1], np.uint64), np.array([2**64 - 1, 2**64 - 1], np.uint64)
    )
    assert d.max_abs == float(2**64 - 1)
    d = TensorDiff.from_arrays("b", np.array([True, False]), np.array([True, True]))
    assert d.mismatches == 1
    same = TensorDiff.from_arrays("b", np.array([True]), np.array([True]))
    assert same.bitwise_equal and not same.exceeds(0)


def test_fp8_nan_is_classified_not_measured() -> None:
    nan = np.array([np.nan], np.float32).astype(ml_dtypes.float8_e4m3fn)
    one = np.array([1.0], np.float32).astype(ml_dtypes.float8_e4m3fn)
    d = TensorDiff.from_arrays("f8", nan, one)
    assert d.nan_mismatch == 1 and d.max_ulp == 0


def test_bf16_relative_error_near_its_epsilon() -> None:
    x = np.linspace(1, 2, 101).astype(np.float32)
    d = TensorDiff.from_arrays("bf", x.astype(ml_dtypes.bfloat16).astype(np.float32), x)
    assert 0 < d.max_rel <= 2.0**-8 + 1e-9  # round-to-nearest bf16: half of 2**-7
    assert math.isfinite(d.scaled_ulp or 0)
