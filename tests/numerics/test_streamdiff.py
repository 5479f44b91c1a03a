"""The streaming comparator against the whole-array definition (tests/oracle_diff.py).

Every TensorDiff field must equal the oracle exactly: ULPs, counts, scaled ULP, max
abs/rel, p99 (np.percentile) and V_ermv (an exactly rounded sum: math.fsum(rel) / n).
"""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from oracle_diff import oracle

from xbackend.numerics import streamdiff
from xbackend.numerics.metrics import TensorDiff

pytestmark = pytest.mark.unit  # the unit tier: make check

FLOATS = [np.float32, np.float16, np.float64, ml_dtypes.bfloat16]
NARROW = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float4_e2m1fn]
F32_MAX = float(np.finfo(np.float32).max)  # float16's and float32's largest: saturated fill
SPECIALS = np.array(
    [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1e-40,
        -1e-40,
        6e-8,
        1.0,
        -1.0,
        3.0,
        65504.0,
        -65504.0,
        F32_MAX,
        -F32_MAX,
    ]
)


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: IEEE floats through the compiled kernels, and through numpy (small tensors)."""
    monkeypatch.setattr(streamdiff, "SMALL", 0 if request.param == "compiled" else 1 << 40)
    return str(request.param)


def assert_same(a: np.ndarray, b: np.ndarray) -> TensorDiff:
    d = TensorDiff.from_arrays("t", a, b)
    want = oracle(a, b)
    got = {k: getattr(d, k) for k in want}
    assert got == want, {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    return d


def perturbed(dtype: type, n: int, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = (rng.standard_normal(n) * 3).astype(dtype)
    cand = ref.copy()
    m = rng.random(n) < frac
    cand[m] = (ref[m].astype(np.float64) * (1 + rng.standard_normal(int(m.sum())) * 1e-2)).astype(dtype)
    return cand, ref


@pytest.mark.parametrize("dtype", FLOATS + NARROW)
@pytest.mark.parametrize("frac", [0.0, 0.001, 0.01, 0.3, 1.0])
def test_random_arrays_match_the_definition(dtype: type, frac: float) -> None:
    for n in (1, 7, 5000, 70_001):
        assert_same(*perturbed(dtype, n, frac, seed=n))


@pytest.mark.parametrize("dtype", FLOATS + NARROW)
def test_nan_inf_zero_subnormal_mixtures(dtype: type) -> None:
    rng = np.random.default_rng(7)
    with np.errstate(all="ignore"):
        for n in (3, 300, 9000):  # 9000: several blocks, dense and sparse
            ref = rng.choice(SPECIALS, n).astype(dtype)
            cand = rng.choice(SPECIALS, n).astype(dtype)
            keep = rng.random(n) < 0.5
            cand[keep] = ref[keep]
            assert_same(cand, ref)


def test_known_special_counts() -> None:
    f4 = np.float32
    ref = np.array([1.0, np.nan, np.inf, 1e-40, 0.0, np.nan, 2.0], f4)
    cand = np.array([1.0, 1.0, -np.inf, 0.0, -0.0, np.nan, np.nextafter(f4(2), f4(3))], f4)
    cand_bits = cand.view(np.uint32).copy()
    cand_bits[5] = 0x7FC00001  # a NaN with another payload
    d = assert_same(cand_bits.view(f4), ref)
    assert (d.nan_mismatch, d.inf_mismatch, d.ftz_mismatch) == (1, 1, 1)
    assert (d.zero_sign_mismatch, d.nan_payload_mismatch, d.max_ulp, d.mismatches) == (1, 1, 1, 6)


@pytest.mark.parametrize("dtype", FLOATS)
def test_masked_scores_are_fill_not_scale(dtype: type) -> None:
    """Attention scores with an additive mask of finfo.min (transformers' convention): the
    fill is compared for equality and left out of the scale, so the scaled ULP is the one of
    the unmasked elements alone."""
    rng = np.random.default_rng(3)
    lo = ml_dtypes.finfo(dtype).min
    ref = (rng.standard_normal((4, 64, 64)) * 4).astype(dtype)
    ref[:, np.triu_indices(64, 1)[0], np.triu_indices(64, 1)[1]] = lo  # causal mask
    cand = ref.copy()
    live = ref != lo
    eps = float(ml_dtypes.finfo(dtype).eps)
    wobble = 1 + 8 * eps * rng.standard_normal(int(live.sum()))
    cand[live] = (ref[live].astype(np.float64) * wobble).astype(dtype)
    d = assert_same(cand, ref)
    alone = TensorDiff.from_arrays("t", cand[live], ref[live])
    assert d.scaled_ulp == alone.scaled_ulp and d.scaled_ulp > 1
    assert d.fill_mismatch == 0 and not d.exceeds(2 * d.scaled_ulp)
    cand[0, 0, 63] = -np.inf  # a fill of -Inf where the reference used finfo.min
    cand[0, 0, 62] = lo / 2
    d = assert_same(cand, ref)
    assert (d.fill_mismatch, d.inf_mismatch, d.scaled_ulp) == (2, 0, alone.scaled_ulp)
    assert d.exceeds(1e30)  # a fill that differs is a violation whatever the tolerance


def test_float8_saturation_is_a_value() -> None:
    """float8 has no Inf: its casts saturate at finfo.max, a real value, compared as one."""
    f8 = ml_dtypes.float8_e4m3fn
    ref = np.array([448.0, 1.0], f8)
    cand = np.array([416.0, 1.0], f8)
    d = assert_same(cand, ref)
    assert (d.fill_mismatch, d.max_ulp, d.scaled_ulp) == (0, 1, 1.0)


def test_sign_flip_is_the_sum_of_magnitudes_in_every_width() -> None:
    for dtype, mag in ((np.float16, 0x3C00), (np.float32, 0x3F800000), (np.float64, 0x3FF0000000000000)):
        d = assert_same(np.array([1.0, 2.0], dtype), np.array([-1.0, 2.0], dtype))
        assert d.max_ulp == 2 * mag  # +1 to -1 across zero


@pytest.mark.parametrize(
    "dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64, ml_dtypes.int4, np.bool_]
)
def test_integers_and_bools(dtype: type) -> None:
    rng = np.random.default_rng(3)
    for n in (5, 40_000):
        if dtype is np.bool_:
            ref = rng.random(n) < 0.5
            cand = ref.copy()
            cand[: n // 3] = ~cand[: n // 3]
        else:
            info = ml_dtypes.iinfo(dtype) if dtype is ml_dtypes.int4 else np.iinfo(dtype)
            wide = np.int64 if info.min < 0 else np.uint64
            ref = rng.integers(int(info.min), int(info.max), n, endpoint=True, dtype=wide).astype(dtype)
            cand = ref.copy()
            m = rng.random(n) < 0.2
            cand[m] = rng.integers(
                int(info.min), int(info.max), int(m.sum()), endpoint=True, dtype=wide
            ).astype(dtype)
        assert_same(cand, ref)


def test_int64_extremes_do_not_wrap() -> None:
    i8 = np.iinfo(np.int64)
    d = assert_same(np.array([i8.max], np.int64), np.array([i8.min], np.int64))
    assert d.max_abs == float(2**64 - 1)


def test_p99_is_zero_below_one_percent_and_exact_above() -> None:
    cand, ref = perturbed(np.float32, 200_000, 0.005, seed=1)
    assert assert_same(cand, ref).p99_abs == 0.0
    cand, ref = perturbed(np.float32, 200_000, 0.05, seed=2)
    d = assert_same(cand, ref)
    err = np.abs(cand.astype(np.float64) - ref.astype(np.float64))
    assert d.p99_abs == float(np.percentile(err, 99)) > 0


def test_v_ermv_is_the_exact_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    cand, ref = perturbed(np.float32, 300_000, 1.0, seed=5)
    d = assert_same(cand, ref)
    rel = np.abs(cand.astype(np.float64) - ref.astype(np.float64)) / np.abs(ref.astype(np.float64))
    assert d.v_ermv == math.fsum(rel) / rel.size
    assert d.v_ermv == pytest.approx(float(rel.mean()), rel=4e-16)  # numpy's pairwise mean, to rounding


@pytest.mark.parametrize("dtype", FLOATS)
def test_v_ermv_exact_for_narrow_and_wide_ranges_of_relative_error(dtype: type) -> None:
    """Blocks whose relative errors lie within 11 binades are summed as single integers; wider
    ones in three parts: both exact."""
    rng = np.random.default_rng(3)
    ref = (rng.standard_normal(10_000) * 3).astype(dtype)
    one_ulp = np.nextafter(ref, np.array(np.inf, dtype))  # relative errors within 2 binades
    mant = {np.float16: 10, np.float32: 23, np.float64: 52}.get(dtype, 7)
    scale = np.exp2(-rng.integers(1, mant, ref.size).astype(np.float64))  # spread over every binade
    wide = (ref.astype(np.float64) * (1 + scale)).astype(dtype)
    for cand in (one_ulp, wide):
        d = assert_same(cand, ref)
        c, r = cand.astype(np.float64), ref.astype(np.float64)
        keep = (c != r) & (r != 0)
        assert d.v_ermv == math.fsum(np.abs(c - r)[keep] / np.abs(r[keep])) / (r != 0).sum()


def test_results_do_not_depend_on_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    cand, ref = perturbed(np.float16, 50_003, 0.4, seed=9)  # odd size: the last chunk is padded
    whole = TensorDiff.from_arrays("t", cand, ref)
    monkeypatch.setattr(streamdiff, "JIT_CHUNK", 4096)
    assert TensorDiff.from_arrays("t", cand, ref) == whole


def test_first_difference_in_a_late_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streamdiff, "JIT_CHUNK", 4096)
    monkeypatch.setattr(streamdiff, "CHUNK_BYTES", 4096)  # chunks before the difference are skipped
    ref = np.random.default_rng(0).standard_normal(30_001).astype(np.float32)
    ref[100] = np.inf  # the reference figures of the skipped chunks still count
    cand = ref.copy()
    cand[-3:] += np.float32(1e-3)
    d = assert_same(cand, ref)
    assert d.mismatches == 3


def test_radix_selection_when_the_largest_errors_do_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streamdiff, "HOLD_MAX", 64)
    for dtype in (np.float32, np.float16, ml_dtypes.float8_e5m2, np.int32):
        if dtype is np.int32:
            ref = np.arange(120_000, dtype=np.int32)
            cand = ref + (np.arange(120_000) % 7 == 0).astype(np.int32) * 3
        else:
            cand, ref = perturbed(dtype, 120_000, 0.3, seed=11)
        assert_same(cand, ref)


def test_non_contiguous_and_zero_d_inputs() -> None:
    cand, ref = perturbed(np.float32, 60_000, 0.1, seed=4)
    assert_same(cand.reshape(200, 300).T, ref.reshape(200, 300).T)
    assert_same(cand[::3], ref[::3])
    assert_same(np.array(1.0, np.float32), np.array(1.5, np.float32))
    assert TensorDiff.from_arrays("t", np.empty(0, np.float32), np.empty(0, np.float32)).bitwise_equal


@pytest.mark.parametrize("frac", [0.01, 1.0])
def test_extra_memory_is_bounded(frac: float) -> None:
    # 2 x 64 MiB of float32: the whole-array comparator allocated ~10x the inputs here
    n = 16 * 2**20
    cand, ref = perturbed(np.float32, n, 0.0, seed=0)
    if frac == 1.0:
        cand = np.nextafter(ref, np.float32(np.inf))
    else:
        cand[:: int(1 / frac)] *= np.float32(1.001)
    TensorDiff.from_arrays("warm", cand[:5000], ref[:5000])  # compile outside the measurement
    tracemalloc.start()
    d = TensorDiff.from_arrays("t", cand, ref)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert d.mismatches >= n * frac * 0.99
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB"


def test_large_array_with_specials_across_chunks() -> None:
    # 3 Mi elements: several compiled chunks (the last one padded), specials sprinkled in
    cand, ref = perturbed(np.float32, 3 * 2**20 + 5, 0.05, seed=21)
    rng = np.random.default_rng(22)
    with np.errstate(all="ignore"):
        for x in (cand, ref):
            at = rng.choice(x.size, 300, replace=False)
            x[at] = rng.choice(SPECIALS, 300).astype(np.float32)
    d = assert_same(cand, ref)
    assert d.p99_abs > 0 and d.nan_mismatch > 0 and d.inf_mismatch > 0


def test_compiled_kernels_cache_somewhere_writable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from xbackend.numerics import jitdiff

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    assert jitdiff.cache_dir(package_writable=True) is None  # numba's default: next to the package
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert jitdiff.cache_dir(package_writable=False) == str(tmp_path / "xbackend" / "numba")
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/elsewhere")
    assert jitdiff.cache_dir(package_writable=False) is None  # the user's choice stands
