"""Compiled single-pass comparison of IEEE-layout floats (float16, bfloat16, float32, float64).

numpy alone cannot stream these at memory speed: converting float16 to float64 costs
about 1 ns per element, and every further whole-chunk operation is another pass. Numba
fuses the work: a vectorized pass folds the reference's figures (largest finite
magnitude, non-finite and nonzero counts); then, per block, 64-bit words of both sides
are XORed, and only words with a difference are measured element by element. The loop is
resumable, so the buffer of largest errors (for the exact 99th percentile) can be
pruned between calls.

Arithmetic on narrow unsigned types is cast back to the array's own type (numba widens
it to 64 bits otherwise, which keeps the loops from vectorizing on 16-bit lanes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

BLOCK = 2048  # elements; a multiple of every elements-per-word count
SUPER = 16 * BLOCK  # the reference is folded this far ahead, while the data is in cache

# int64 counters (REF_* over every element, DIFF_REF_* over the differing ones)
DIFFERING, NON_COMPARABLE, REF_NONFINITE, REF_NONZERO_FINITE, DIFF_REF_NONFINITE, DIFF_REF_NZF = range(6)
NAN, INF, FTZ, ZERO_SIGN, NAN_PAYLOAD, REL_COUNT, EXPLICIT, FILL, REF_MAX_MAG = range(6, 15)
COUNTERS = 15  # REF_MAX_MAG: the bits of the largest finite reference magnitude
# float64 figures
MAX_ABS, MAX_REL = 0, 1


@njit(cache=True, nogil=True)  # type: ignore[untyped-decorator]
def first_difference(wa: np.ndarray, wb: np.ndarray, per: int) -> int:
    """Element index of the start of the first block whose bits differ, or len(wa) * per."""
    n = wa.size
    step = BLOCK // per
    for s in range(0, n, step):
        e = min(s + step, n)
        acc = np.uint64(0)
        for i in range(s, e):
            acc |= wa[i] ^ wb[i]
        if acc != 0:
            return s * per
    return n * per


@njit(cache=True, nogil=True)  # type: ignore[untyped-decorator]
def _ref_exact(ub: np.ndarray, s: int, e: int, mag_mask: Any, inf_bits: Any, counts: np.ndarray) -> Any:
    """A block with a NaN or Inf: count exactly; returns its largest finite magnitude."""
    zero = mag_mask ^ mag_mask
    top = zero
    for i in range(s, e):
        mag = ub[i] & mag_mask
        if mag >= inf_bits:
            counts[REF_NONFINITE] += 1
        else:
            top = mag if mag > top else top
            counts[REF_NONZERO_FINITE] += mag != zero
    return top


@njit(cache=True, nogil=True)  # type: ignore[untyped-decorator]
def ref_stats(ub: np.ndarray, start: int, stop: int, mag_mask: Any, inf_bits: Any, counts: np.ndarray) -> None:
    """Fold the reference figures of ub[start:stop] into counts; vectorized when all is finite."""
    t = ub.dtype.type
    zero = t(0)
    for s in range(start, stop, BLOCK):
        e = min(s + BLOCK, stop)
        top = zero
        count = t(0)  # narrow: a block has fewer elements than any lane type's range
        for i in range(np.uint64(s), np.uint64(e)):  # unsigned: no negative-index checks
            mag = t(ub[i] & mag_mask)
            top = mag if mag > top else top  # a select, not max(): vectorizes
            count = t(count + t(mag != zero))
        if top >= inf_bits:
            top = t(_ref_exact(ub, s, e, mag_mask, inf_bits, counts))
        else:
            counts[REF_NONZERO_FINITE] += np.int64(count)
        if np.int64(top) > counts[REF_MAX_MAG]:
            counts[REF_MAX_MAG] = np.int64(top)


COMPARABLE = 0


@njit(cache=True, nogil=True)  # type: ignore[untyped-decorator]
def _special(ma: Any, mb: Any, inf_bits: Any, sub_limit: Any) -> int:
    """For a differing pair with a zero, NaN or Inf: the counter it goes to, or COMPARABLE."""
    nan_a = ma > inf_bits
    nan_b = mb > inf_bits
    if nan_a or nan_b:
        return NAN if nan_a != nan_b else NAN_PAYLOAD
    if ma == inf_bits or mb == inf_bits:
        return INF
    zero = ma ^ ma
    if (ma == zero and mb != zero and mb < sub_limit) or (mb == zero and ma != zero and ma < sub_limit):
        return FTZ
    return COMPARABLE


@njit(cache=True, nogil=True)  # type: ignore[untyped-decorator]
def measure(
    wa: np.ndarray,
    wb: np.ndarray,
    ua: np.ndarray,
    ub: np.ndarray,
    fa: np.ndarray,
    fb: np.ndarray,
    table: np.ndarray,
    start: int,
    mag_mask: Any,
    inf_bits: Any,
    sub_limit: Any,
    sign_shift: Any,
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
    go to `errs`; relative errors are summed exactly into `sum_bins` (see add_exact).
    Returns where it stopped (a super-block start, when `errs` has no room for another
    super-block), or len(ua).
    """
    t = ub.dtype.type
    zero = t(0)
    one = t(1)
    finite_top = t(inf_bits - one)
    n = ua.size
    per = n // wa.size
    cap = errs.size
    rels = np.empty(BLOCK, np.float64)
    # hot counters live in locals (array slots would be reloaded after every store)
    differing = explicit = rel_count = diff_nonfinite = diff_nzf = 0
    fill = counts[FILL]
    top_ulp = max_ulp[0]
    max_abs = figures[MAX_ABS]
    max_rel = figures[MAX_REL]
    stopped = n
    for s in range(start, n, BLOCK):
        if (s - start) % SUPER == 0:
            if fill + SUPER > cap:  # stop only here: the reference is folded a super-block ahead
                stopped = s
                break
            ref_stats(ub, s, min(s + SUPER, n), mag_mask, inf_bits, counts)
        e = min(s + BLOCK, n)
        # indices are unsigned below: numba then drops its negative-index checks
        k = np.uint64(0)
        for ww in range(s // per, e // per):
            w = np.uint64(ww)
            if wa[w] == wb[w]:
                continue
            for ii in range(ww * per, ww * per + per):
                i = np.uint64(ii)
                xa = ua[i]
                xb = ub[i]
                if xa == xb:
                    continue
                differing += 1
                ma = t(xa & mag_mask)
                mb = t(xb & mag_mask)
                # one unsigned test for "zero, NaN or Inf on either side" (zero wraps to the top)
                if t(ma - one) >= finite_top or t(mb - one) >= finite_top:
                    if mb >= inf_bits:
                        diff_nonfinite += 1
                    elif mb != zero:
                        diff_nzf += 1
                    kind = _special(ma, mb, inf_bits, sub_limit)
                    if kind != COMPARABLE:
                        counts[NON_COMPARABLE] += 1
                        counts[kind] += 1
                        continue
                else:
                    diff_nzf += 1
                # ULP distance on the magnitudes; a path across zero adds them (< 2**64 even for float64)
                same = np.uint64(abs(np.int64(ma) - np.int64(mb)))
                across = np.uint64(ma) + np.uint64(mb)
                ulp = same if t(xa >> sign_shift) == t(xb >> sign_shift) else across
                top_ulp = ulp if ulp > top_ulp else top_ulp
                if table.size:
                    va = table[xa]
                    vb = table[xb]
                else:
                    va = np.float64(fa[i])
                    vb = np.float64(fb[i])
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
        # the exact sum of this block's relative errors (see add_exact), inlined: a call costs more
        bits = rels.view(np.uint64)
        for j in range(k):
            b = bits[np.uint64(j)]
            ex = np.int64(b >> np.uint64(52))
            frac = np.int64(b & np.uint64(0xFFFFFFFFFFFFF))
            if ex == 2047:
                sum_bins[2, 0] += 1
                continue
            if ex == 0:
                ex = 1
            else:
                frac |= np.int64(1) << 52
            sum_bins[0, ex] += frac >> 26
            sum_bins[1, ex] += frac & 67108863
        rel_count += np.int64(k)
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


@njit(cache=True, nogil=True)  # type: ignore[untyped-decorator]
def add_exact(values: np.ndarray, sum_bins: np.ndarray) -> None:
    """Add non-negative float64 values exactly: 53-bit mantissas summed per binary exponent.

    sum_bins[0, E] and sum_bins[1, E] hold the sums of the high 27 and low 26 mantissa
    bits of values whose exponent field is E (subnormals with E = 1, without the implicit
    bit); sum_bins[2, 0] counts infinities. int64 holds 2**36 additions per bin.
    """
    bits = values.view(np.uint64)
    for i in range(bits.size):
        b = bits[i]
        ex = np.int64(b >> np.uint64(52))
        frac = np.int64(b & np.uint64(0xFFFFFFFFFFFFF))
        if ex == 2047:
            sum_bins[2, 0] += 1
            continue
        if ex == 0:
            ex = 1
        else:
            frac |= np.int64(1) << 52
        sum_bins[0, ex] += frac >> 26
        sum_bins[1, ex] += frac & 67108863
