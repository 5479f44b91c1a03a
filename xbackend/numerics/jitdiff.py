"""Compiled single-pass comparison of IEEE-layout floats (float16, bfloat16, float32, float64).

numpy alone cannot stream these at memory speed: converting float16 to float64 costs
about 1 ns per element, and every further whole-chunk operation is another pass. Numba
fuses the work. A vectorized pass folds the reference's figures (largest finite
magnitude, non-finite and nonzero counts) a super-block ahead; then, per block, the
64-bit words of both sides that differ are counted, the differing elements gathered
(word by word when few), and measured in straight-line loops that vectorize, or one by
one when a zero, subnormal, NaN or Inf is among them. The loop is resumable, so the
buffer of largest errors (for the exact 99th percentile) can be pruned between calls.

Arithmetic on narrow unsigned types is cast back to the array's own type (numba widens
it to 64 bits otherwise, which keeps the loops from vectorizing on 16-bit lanes), and
indices are unsigned (numba then drops its negative-index checks).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def cache_dir(package_writable: bool) -> str | None:
    """Where numba keeps the compiled kernels when the package folder is read-only (an
    installed wheel): the user's cache folder, else a per-user temporary one."""
    if package_writable or "NUMBA_CACHE_DIR" in os.environ:
        return None
    for base in (os.environ.get("XDG_CACHE_HOME"), str(Path.home() / ".cache")):
        if base:
            target = Path(base) / "xbackend" / "numba"
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue
            if os.access(target, os.W_OK):
                return str(target)
    return str(Path(tempfile.gettempdir()) / f"xbackend-numba-{os.getuid()}")


_where = cache_dir(os.access(Path(__file__).parent, os.W_OK))
if _where is not None:
    os.environ["NUMBA_CACHE_DIR"] = _where  # read by numba when it is imported, just below

import llvmlite.binding as llvm  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit  # noqa: E402
from numba.core import config, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from xbackend.numerics.exactsum import ACC_INF  # noqa: E402

BLOCK = 2048  # elements; a multiple of every elements-per-word count
SUPER = 16 * BLOCK  # the reference is folded this far ahead, while the data is in cache

# int64 counters (REF_* over every element, DIFF_REF_* over the differing ones)
DIFFERING, NON_COMPARABLE, REF_NONFINITE, REF_NONZERO_FINITE, DIFF_REF_NONFINITE, DIFF_REF_NZF = range(6)
NAN, INF, FTZ, ZERO_SIGN, NAN_PAYLOAD, REL_COUNT, EXPLICIT, FILL, REF_MAX_MAG, FILL_MISMATCH = range(6, 16)
COUNTERS = 16  # REF_MAX_MAG: the bits of the largest finite reference magnitude
# A reference element at the largest finite magnitude (inf_bits - 1) is saturated fill (an
# additive mask of finfo.min): counted with the non-finite ones, compared for equality only.
# float64 figures
MAX_ABS, MAX_REL = 0, 1


def _half_in_hardware() -> bool:
    """Whether the code numba generates converts float16 with an instruction (F16C) rather
    than a library call it may not link."""
    if config.CPU_NAME:  # a named target (e.g. generic, for portable caches): only its features
        return "+f16c" in (config.CPU_FEATURES or "")

    return bool(llvm.get_host_cpu_features().get("f16c"))


HALF_IN_HARDWARE = _half_in_hardware()  # a constant to numba: the branch is compiled away

_FLOATS = {types.uint16: ir.HalfType(), types.uint32: ir.FloatType(), types.uint64: ir.DoubleType()}


@intrinsic
def _to_f64(typingctx: Any, bits: Any) -> Any:
    """The float64 value of IEEE half (uint16), single (uint32) or double (uint64) bits: exact,
    and one vectorized conversion (vcvtph2ps, vcvtps2pd) rather than bit surgery."""
    if bits not in _FLOATS:
        return None
    src = _FLOATS[bits]

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        v = builder.bitcast(args[0], src)
        return v if isinstance(src, ir.DoubleType) else builder.fpext(v, ir.DoubleType())

    return types.float64(bits), codegen


@njit(cache=True, nogil=True)
def _ref_exact(ub: np.ndarray, s: int, e: int, mag_mask: Any, inf_bits: Any, counts: np.ndarray) -> Any:
    """A block with a NaN, Inf or saturated fill: count exactly; returns its largest finite
    magnitude below the fill."""
    zero = mag_mask ^ mag_mask
    fill_bits = inf_bits - (mag_mask & 1)
    top = zero
    for i in range(s, e):
        mag = ub[i] & mag_mask
        if mag >= fill_bits:
            counts[REF_NONFINITE] += 1
        else:
            top = mag if mag > top else top
            counts[REF_NONZERO_FINITE] += mag != zero
    return top


@njit(cache=True, nogil=True)
def ref_stats(
    ub: np.ndarray, start: int, stop: int, mag_mask: Any, inf_bits: Any, counts: np.ndarray
) -> None:
    """Fold the reference figures of ub[start:stop] into counts; vectorized when all is finite."""
    t = ub.dtype.type
    zero = t(0)
    fill_bits = t(inf_bits - t(1))
    for s in range(start, stop, BLOCK):
        e = min(s + BLOCK, stop)
        top = zero
        count = t(0)  # narrow: a block has fewer elements than any lane type's range
        for i in range(np.uint64(s), np.uint64(e)):  # unsigned: no negative-index checks
            mag = t(ub[i] & mag_mask)
            top = mag if mag > top else top  # a select, not max(): vectorizes
            count = t(count + t(mag != zero))
        if top >= fill_bits:
            top = t(_ref_exact(ub, s, e, mag_mask, inf_bits, counts))
        else:
            counts[REF_NONZERO_FINITE] += np.int64(count)
        if np.int64(top) > counts[REF_MAX_MAG]:
            counts[REF_MAX_MAG] = np.int64(top)


COMPARABLE = 0


@njit(cache=True, nogil=True)
def _special(ma: Any, mb: Any, inf_bits: Any, sub_limit: Any, fill_bits: Any) -> int:
    """For a differing pair with a zero, NaN, Inf or saturated fill: the counter it goes to,
    or COMPARABLE."""
    nan_a = ma > inf_bits
    nan_b = mb > inf_bits
    if nan_a or nan_b:
        return NAN if nan_a != nan_b else NAN_PAYLOAD
    if mb == fill_bits:
        return FILL_MISMATCH
    if ma == inf_bits or mb == inf_bits:
        return INF
    zero = ma ^ ma
    if (ma == zero and mb != zero and mb < sub_limit) or (mb == zero and ma != zero and ma < sub_limit):
        return FTZ
    return COMPARABLE


# One long kernel on purpose: the per-element loop keeps its counters and figures in locals;
# helpers called per element would pass a dozen arrays each time, in the hottest loop there is.
@njit(cache=True, nogil=True)
def measure(
    wa: np.ndarray,
    wb: np.ndarray,
    ua: np.ndarray,
    ub: np.ndarray,
    fa: np.ndarray,
    fb: np.ndarray,
    table: np.ndarray | None,
    start: int,
    mag_mask: Any,
    inf_bits: Any,
    sub_limit: Any,
    sign_shift: Any,
    mant_bits: int,
    floor: float,
    counts: np.ndarray,
    figures: np.ndarray,
    max_ulp: np.ndarray,
    sum_bins: np.ndarray,
    errs: np.ndarray,
) -> int:
    """Measure ua against ub from element `start` (a block start) to the end.

    The reference's figures are folded too (ref_stats), a super-block at a time. wa/wb
    are the same memory as 64-bit words. Values come from `table[bits]` when the table
    is not empty (16-bit types), else from the float views fa/fb. Errors above `floor`
    go to `errs`; relative errors are summed exactly into `sum_bins` (exactsum.ExactSum's layout).
    Returns where it stopped (a super-block start, when `errs` has no room for another
    super-block), or len(ua).
    """
    t = ub.dtype.type
    zero = t(0)
    one = t(1)
    fill_bits = t(inf_bits - one)
    normal_span = t(fill_bits - sub_limit)  # the largest finite magnitude is special too
    size = ua.size
    per = size // wa.size
    uper = np.uint64(per)
    cap = errs.size
    idx = np.empty(BLOCK, np.int64)  # the differing elements of a block: positions and bits
    ga = np.empty(BLOCK, ub.dtype)
    gb = np.empty(BLOCK, ub.dtype)
    rels = np.empty(BLOCK, np.float64)
    errb = np.empty(BLOCK, np.float64)
    block_bins = np.zeros(2048, np.uint64)
    wide_a = np.empty(BLOCK, np.uint64)
    wide_b = np.empty(BLOCK, np.uint64)
    vals_a = wide_a.view(np.float64)
    vals_b = wide_b.view(np.float64)
    # widening a normal, finite value's bits to float64: sign, rebased exponent, mantissa
    mant = np.uint64(mant_bits)
    exp_bits = np.int64(sign_shift) - mant_bits
    exp_adjust = np.uint64(1023 - ((1 << (exp_bits - 1)) - 1))  # float64 bias - own bias
    exp_mask = np.uint64((1 << exp_bits) - 1)
    frac_mask = np.uint64((1 << mant_bits) - 1)
    shift64 = np.uint64(sign_shift)
    top_bit = np.uint64(63)
    f64_mant = np.uint64(52)
    frac_shift = np.uint64(52 - mant_bits)
    sixteen = np.uint32(16)
    # hot counters live in locals (array slots would be reloaded after every store)
    differing = explicit = rel_count = diff_nonfinite = diff_nzf = 0
    fill = counts[FILL]
    top_ulp = max_ulp[0]
    max_abs = figures[MAX_ABS]
    max_rel = figures[MAX_REL]
    stopped = size
    for s in range(start, size, BLOCK):
        if (s - start) % SUPER == 0:
            if fill + SUPER > cap:  # stop only here: the reference is folded a super-block ahead
                stopped = s
                break
            ref_stats(ub, s, min(s + SUPER, size), mag_mask, inf_bits, counts)
        e = min(s + BLOCK, size)
        # indices are unsigned: numba then drops its negative-index checks
        us, ue = np.uint64(s), np.uint64(e)
        words = 0
        for w in range(us // uper, ue // uper):
            words += wa[w] != wb[w]
        if words == 0:
            continue
        # gather the differing elements: word by word when sparse, element by element when not
        m = np.uint64(0)
        whole = False
        if words * per == e - s:  # every word differs: perhaps every element (a plain copy, then)
            same_count = zero
            for i in range(us, ue):
                same_count = t(same_count + t(ua[i] == ub[i]))
            if same_count == zero:
                m = ue - us
                whole = True  # positions are us + j: no index list, and no copy
        da, db = (ua[us:ue], ub[us:ue]) if whole else (ga, gb)
        if m:
            pass
        elif words * 8 < (e - s) // per:
            for w in range(us // uper, ue // uper):
                if wa[w] != wb[w]:
                    for i in range(w * uper, w * uper + uper):
                        idx[m] = i
                        ga[m] = ua[i]
                        gb[m] = ub[i]
                        m += np.uint64(ua[i] != ub[i])
        else:
            for i in range(us, ue):
                idx[m] = i
                ga[m] = ua[i]
                gb[m] = ub[i]
                m += np.uint64(ua[i] != ub[i])
        differing += np.int64(m)
        # normal and finite on both sides (zero and subnormals wrap to the top)? And the ULP
        # distance, in the lane type: magnitudes are below half its range, so sums fit
        special = zero
        block_ulp = zero
        for j in range(m):
            xa = da[j]
            xb = db[j]
            ma = t(xa & mag_mask)
            mb = t(xb & mag_mask)
            plain_a = t(t(ma - sub_limit) < normal_span)
            plain_b = t(t(mb - sub_limit) < normal_span)
            special = t(special + (one ^ (plain_a & plain_b)))
            same = t((ma if ma > mb else mb) - (mb if ma > mb else ma))
            across = t(ma + mb)  # a path across zero
            ulp = same if t(xa >> sign_shift) == t(xb >> sign_shift) else across
            block_ulp = ulp if ulp > block_ulp else block_ulp
        if special == zero:
            # the usual case, in straight-line loops that vectorize (the conversion apart: in
            # the error loop it keeps that loop from vectorizing)
            top_ulp = np.uint64(block_ulp) if np.uint64(block_ulp) > top_ulp else top_ulp
            if mant_bits == 7:  # bfloat16: the top half of a float32
                for j in range(m):
                    vals_a[j] = _to_f64(np.uint32(np.uint32(da[j]) << sixteen))
                    vals_b[j] = _to_f64(np.uint32(np.uint32(db[j]) << sixteen))
            elif HALF_IN_HARDWARE or mant_bits != 10:
                for j in range(m):
                    vals_a[j] = _to_f64(da[j])
                    vals_b[j] = _to_f64(db[j])
            else:  # float16 with no conversion instruction: sign, rebased exponent, mantissa
                for j in range(m):
                    xa64 = np.uint64(da[j])
                    xb64 = np.uint64(db[j])
                    wide_a[j] = (
                        ((xa64 >> shift64) << top_bit)
                        | ((((xa64 >> mant) & exp_mask) + exp_adjust) << f64_mant)
                        | ((xa64 & frac_mask) << frac_shift)
                    )
                    wide_b[j] = (
                        ((xb64 >> shift64) << top_bit)
                        | ((((xb64 >> mant) & exp_mask) + exp_adjust) << f64_mant)
                        | ((xb64 & frac_mask) << frac_shift)
                    )
            block_max = 0.0
            block_rel = 0.0
            least_rel = np.inf
            for j in range(m):
                err = abs(vals_a[j] - vals_b[j])
                block_max = err if err > block_max else block_max
                rel = err / abs(vals_b[j])
                block_rel = rel if rel > block_rel else block_rel
                least_rel = rel if rel < least_rel else least_rel
                rels[j] = rel
                errb[j] = err
            max_rel = block_rel if block_rel > max_rel else max_rel
            max_abs = block_max if block_max > max_abs else max_abs
            if block_max > floor:  # candidates for the percentile
                for j in range(m):
                    errs[np.uint64(fill)] = errb[j]
                    fill += errb[j] > floor
            explicit += np.int64(m)
            diff_nzf += np.int64(m)
            rel_count += np.int64(m)
            _sum_block(rels, m, sum_bins, block_bins, block_rel, least_rel)
            continue
        # a zero, subnormal, NaN, Inf or saturated fill among them: element by element
        k = np.uint64(0)
        for j in range(m):
            i = us + j if whole else np.uint64(idx[j])
            xa = da[j]
            xb = db[j]
            ma = t(xa & mag_mask)
            mb = t(xb & mag_mask)
            if mb >= fill_bits:
                diff_nonfinite += 1
            elif mb != zero:
                diff_nzf += 1
            kind = _special(ma, mb, inf_bits, sub_limit, fill_bits)
            if kind != COMPARABLE:
                counts[NON_COMPARABLE] += 1
                counts[kind] += 1
                continue
            same = np.uint64(abs(np.int64(ma) - np.int64(mb)))
            across = np.uint64(ma) + np.uint64(mb)
            ulp = same if t(xa >> sign_shift) == t(xb >> sign_shift) else across
            top_ulp = ulp if ulp > top_ulp else top_ulp
            if table is None:
                va = np.float64(fa[i])
                vb = np.float64(fb[i])
            else:
                va = table[xa]
                vb = table[xb]
            err = abs(va - vb)
            explicit += 1
            max_abs = err if err > max_abs else max_abs
            if err > floor:
                errs[np.uint64(fill)] = err
                fill += 1
            if mb == zero:
                if ma == zero:
                    counts[ZERO_SIGN] += 1
                continue
            rel = err / abs(vb)
            max_rel = rel if rel > max_rel else max_rel
            rels[k] = rel
            k += np.uint64(1)
        rel_count += np.int64(k)
        _sum_exact(rels, k, sum_bins, block_bins)
    counts[DIFFERING] += differing
    counts[EXPLICIT] += explicit
    counts[REL_COUNT] += rel_count
    counts[DIFF_REF_NONFINITE] += diff_nonfinite
    counts[DIFF_REF_NZF] += diff_nzf
    counts[FILL] = fill
    max_ulp[0] = top_ulp
    figures[MAX_ABS] = max_abs
    figures[MAX_REL] = max_rel
    return stopped


@njit(cache=True, nogil=True)
def _acc_add(acc: np.ndarray, p: Any, v: Any) -> None:
    """acc += v * 2**(p - ACC_BIAS), v < 2**64, in 26-bit parts."""
    m26 = np.uint64(67108863)
    acc[p] += np.int64(v & m26)
    acc[p + 26] += np.int64((v >> np.uint64(26)) & m26)
    acc[p + 52] += np.int64(v >> np.uint64(52))


@njit(cache=True, nogil=True)
def _sum_exact(values: np.ndarray, count: Any, acc: np.ndarray, block_bins: np.ndarray) -> None:
    """Add values[:count] (at most BLOCK of them) exactly into acc (exactsum.ExactSum's layout):
    whole 53-bit mantissas into uint64 bins per exponent (BLOCK of them cannot overflow), then
    the touched bins to acc."""
    bits = values.view(np.uint64)
    lo = np.uint64(2047)
    hi = np.uint64(0)
    implicit = np.uint64(1) << np.uint64(52)
    for j in range(np.uint64(count)):
        bit = bits[j]
        ex = bit >> np.uint64(52)
        frac = bit & np.uint64(0xFFFFFFFFFFFFF)
        frac = frac | implicit if ex != 0 else frac
        ex = ex if ex != 0 else np.uint64(1)  # subnormals share the scale of exponent 1
        block_bins[ex] += frac
        lo = ex if ex < lo else lo
        hi = ex if ex > hi else hi
    if hi == 2047:  # an infinite relative error
        acc[ACC_INF] += 1
        block_bins[2047] = 0
        hi = np.uint64(2046)
    for ex in range(lo, hi + np.uint64(1)):
        block_bin = block_bins[ex]
        if block_bin:
            _acc_add(acc, ex + np.uint64(128), block_bin)
            block_bins[ex] = 0


@njit(cache=True, nogil=True)
def _sum_block(
    values: np.ndarray, count: Any, acc: np.ndarray, block_bins: np.ndarray, largest: float, smallest: float
) -> None:
    """Add values[:count] exactly, in 128-bit fixed point below the largest (`largest`;
    `smallest` is the smallest).

    Each value is frac * 2**(64 - shift) units of the block's top exponent less 64, cut
    into three 42-bit parts summed apart; values over 2**64 times smaller than the
    largest (rare) go through _sum_exact.
    """
    bits = values.view(np.uint64)
    n = np.uint64(count)
    big = np.empty(2, np.float64)
    big[0] = largest  # the block's largest value: its exponent is the top one
    big[1] = smallest
    top = big.view(np.uint64)[0] >> np.uint64(52)
    low = big.view(np.uint64)[1] >> np.uint64(52)
    if top == 2047:
        _sum_exact(values, count, acc, block_bins)
        return
    implicit = np.uint64(1) << np.uint64(52)
    if low != 0 and top - low <= 11:
        # all within 11 binades (relative errors often are): each value is one 64-bit integer
        # in units of 2**-11 of the top binade's, summed as two 32-bit halves
        m32 = np.uint64(0xFFFFFFFF)
        eleven = np.uint64(11)
        hi = lo = np.uint64(0)
        for j in range(n):
            bit = bits[j]
            v = ((bit & np.uint64(0xFFFFFFFFFFFFF)) | implicit) << (eleven - (top - (bit >> np.uint64(52))))
            hi += v >> np.uint64(32)
            lo += v & m32
        _acc_add(acc, top + np.uint64(117), lo)
        _acc_add(acc, top + np.uint64(149), hi)
        return
    top = top if top != 0 else np.uint64(1)
    m42 = np.uint64((1 << 42) - 1)
    zero = np.uint64(0)
    s0 = s1 = s2 = zero
    far = 0
    for j in range(n):
        bit = bits[j]
        ex = bit >> np.uint64(52)
        frac = bit & np.uint64(0xFFFFFFFFFFFFF)
        frac = frac | implicit if ex != 0 else frac
        ex = ex if ex != 0 else np.uint64(1)
        shift = top - ex
        near = shift <= 64
        far += (frac != 0) & ~near
        sh = shift if near else np.uint64(64)  # shifts >= 64 are undefined: clamp, then select
        up = np.uint64(64) - sh
        c0 = (frac << (up & np.uint64(63))) & m42 if (sh != 0 and near) else zero
        c1 = ((frac << (np.uint64(22) - sh)) if sh <= 22 else (frac >> (sh - np.uint64(22)))) & m42
        c1 = c1 if near else zero
        c2 = frac >> (sh + np.uint64(20)) if sh + 20 < 64 else zero
        c2 = c2 if near else zero
        s0 += c0
        s1 += c1
        s2 += c2
    p = top + np.uint64(64)
    _acc_add(acc, p, s0)
    _acc_add(acc, p + np.uint64(42), s1)
    _acc_add(acc, p + np.uint64(84), s2)
    if far:
        for j in range(n):
            bit = bits[j]
            ex = bit >> np.uint64(52)
            ex1 = ex if ex != 0 else np.uint64(1)
            if top - ex1 > 64 and (bit & np.uint64(0xFFFFFFFFFFFFF) or ex != 0):
                frac = bit & np.uint64(0xFFFFFFFFFFFFF)
                frac = frac | implicit if ex != 0 else frac
                _acc_add(acc, ex1 + np.uint64(128), frac)
