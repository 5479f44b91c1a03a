"""Streaming comparison behind `TensorDiff.from_arrays`: one pass, bounded memory.

Bits are compared first; only elements whose bits differ are measured (in float64,
exactly as the whole-array definition says). Figures that need the whole reference
(its largest finite magnitude, how many elements are non-finite or zero) are folded in
as the pass goes, once a difference has been seen. IEEE-layout floats (float16,
bfloat16, float32, float64) go through compiled kernels (`jitdiff`); the rarer types
through numpy, chunk by chunk.

Two figures need more than a running maximum:
- the 99th percentile of |a - b| is exact: identical elements are implicit zeros and only
  the largest 1% of explicit errors is held (a radix selection over extra passes takes
  over when even that would exceed `HOLD_MAX` values);
- the mean relative error sums exactly (per-exponent integer accumulators), so it does
  not depend on chunking or order: it equals math.fsum(rel) / len(rel).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from xbackend.numerics.exactsum import ExactSum

CHUNK_BYTES = 1 << 18  # per side, for the numpy kernels: both sides and the mask fit in L2
SMALL = 1 << 18  # elements: smaller tensors that differ go through the numpy kernels
JIT_CHUNK = 1 << 20  # elements per compiled call (bounds copies of non-contiguous inputs)
HOLD_MAX = 1 << 20  # explicit errors held for the percentile (8 MiB, 16 MiB while growing)
_Q99 = np.true_divide(99, 100)  # as np.percentile computes q
UINT: dict[int, type[np.unsignedinteger[Any]]] = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass
class Summary:
    """What a compare found, for TensorDiff."""

    differing: int  # elements whose bits differ
    mismatches: int  # of those, elements whose values differ
    max_ulp: int
    max_abs: float
    max_rel: float
    p99_abs: float
    v_ermv: float
    ref_max_finite: float  # largest finite |b| below saturated fill
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    ftz_mismatch: int = 0
    zero_sign_mismatch: int = 0
    nan_payload_mismatch: int = 0
    fill_mismatch: int = 0  # the reference is saturated fill (±finfo.max), the candidate differs


def chunk_elements(dtype: np.dtype[np.generic]) -> int:
    """How many elements of `dtype` one chunk holds."""
    return max(1, CHUNK_BYTES // max(dtype.itemsize, 1))


def _flat(x: np.ndarray) -> Callable[[int, int], np.ndarray]:
    """x[start:stop] in flat C order: a view when x is C-contiguous, else a copy of that slice."""
    if x.flags.c_contiguous:
        flat = x.reshape(-1)
        return lambda s, e: flat[s:e]
    it = x.flat
    return lambda s, e: it[s:e]


def chunks(x: np.ndarray) -> Iterator[np.ndarray]:
    """Consecutive flat slices of x in C order."""
    get, size = _flat(x), chunk_elements(x.dtype)
    for s in range(0, x.size, size):
        yield get(s, s + size)


class TopErrors:
    """The largest explicit errors, enough for an exact 99th percentile."""

    def __init__(self, elements: int) -> None:
        self.k = elements // 100 + 16  # >= rank-from-top of both percentile neighbours
        self.overflow = self.k > HOLD_MAX  # too many to hold: radix selection afterwards
        self.held: list[np.ndarray] = []
        self.size = 0
        self.floor = math.inf if self.overflow else -math.inf  # errors <= floor are not needed

    def add(self, err: np.ndarray, max_abs: float) -> None:
        """Keep the errors of a chunk that may be among the largest k (`max_abs`: the chunk's largest)."""
        if not err.size or max_abs <= self.floor:
            return
        if self.floor > -math.inf:
            err = err[err > self.floor]
        self.held.append(err)
        self.size += err.size
        if self.size > 2 * self.k:
            held = np.concatenate(self.held)
            self.size = self.keep(held)
            self.held = [held[: self.size].copy()]

    def keep(self, buf: np.ndarray) -> int:
        """Move the k largest of `buf` to its front, in place, and raise the floor to the
        smallest of them; returns k."""
        buf.sort()  # not partition: with many ties (errors of one ULP are) it is up to 40x slower
        buf[: self.k] = buf[buf.size - self.k :].copy()
        self.floor = float(buf[: self.k].min())
        return self.k

    def descending(self) -> np.ndarray:
        """The errors held, largest first."""
        if not self.held:
            return np.empty(0, np.float64)
        v = np.concatenate(self.held)
        v.sort()
        return v[::-1]


def percentile99(comparable: int, value_at: Callable[[int], float]) -> float:
    """np.percentile(errs, 99) over `comparable` errors, `value_at(i)` the i-th smallest."""
    if comparable == 0:
        return 0.0
    virtual = (comparable - 1) * _Q99
    lo_i, hi_i = neighbour_ranks(comparable)
    # np.percentile's gamma: against index -1 when the virtual index is past the end
    gamma = np.float64(virtual + 1) if virtual >= comparable - 1 else np.float64(virtual - lo_i)
    lo, hi = np.float64(value_at(lo_i)), np.float64(value_at(hi_i))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = hi - lo
        return float(hi - diff * (1 - gamma) if gamma >= 0.5 else lo + diff * gamma)


def neighbour_ranks(comparable: int) -> tuple[int, int]:
    """The two ranks (0-based, among `comparable` sorted errors) whose values the 99th percentile
    interpolates between."""
    virtual = (comparable - 1) * _Q99
    if virtual >= comparable - 1:
        return comparable - 1, comparable - 1
    prev = math.floor(virtual)
    return prev, prev + 1


def radix_select(ranks: tuple[int, int], zeros: int, errs: Callable[[], Iterator[np.ndarray]]) -> list[float]:
    """Values at ascending `ranks` among the errors `errs()` yields plus `zeros` zeros.

    Errors are non-negative float64, so their bits order like the values: 4 passes of
    16-bit digits, each a histogram of the errors that share the prefix found so far.
    """
    out = []
    for rank in ranks:
        prefix, left = 0, rank
        for level in range(4):
            shift = 48 - 16 * level
            hist = np.zeros(1 << 16, np.int64)
            for err in errs():
                keys = err.view(np.uint64)
                if level:
                    keys = keys[(keys >> np.uint64(shift + 16)) == np.uint64(prefix)]
                digits = ((keys >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.intp)
                hist += np.bincount(digits, minlength=1 << 16)
            if prefix == 0:
                hist[0] += zeros
            cum = np.cumsum(hist)
            digit = int(np.searchsorted(cum, left, side="right"))
            left -= int(cum[digit - 1]) if digit else 0
            prefix = (prefix << 16) | digit
        out.append(float(np.array([prefix], np.uint64).view(np.float64)[0]))
    return out


def _population(
    n: int, ref: tuple[int, int], differing_ref: tuple[int, int], non_comparable: int, rel_measured: int
) -> tuple[int, int]:
    """(elements whose error counts, elements with a relative error) over the whole tensor.

    `ref` is (non-finite, finite nonzero) over every reference element, `differing_ref` the
    same over the differing ones. An identical element is comparable unless non-finite (then
    on both sides), and adds a relative error of 0 where its reference is finite and nonzero.
    """
    identical_nonfinite = ref[0] - differing_ref[0]
    identical_nonzero = ref[1] - differing_ref[1]
    return n - identical_nonfinite - non_comparable, identical_nonzero + rel_measured


def _p99(comparable: int, explicit: int, top: TopErrors, errs: Callable[[], Iterator[np.ndarray]]) -> float:
    if not comparable:
        return 0.0
    if top.overflow and explicit > top.k:
        ranks = neighbour_ranks(comparable)
        values = dict(zip(ranks, radix_select(ranks, comparable - explicit, errs)))
        return percentile99(comparable, values.__getitem__)
    desc = top.descending()

    def value_at(i: int) -> float:
        j = comparable - 1 - i  # rank from the top; past the held errors only zeros remain
        return float(desc[j]) if j < desc.size else 0.0

    return percentile99(comparable, value_at)


# --- IEEE floats: compiled kernels -------------------------------------------------------

IEEE = {"float16": (16, 10), "bfloat16": (16, 7), "float32": (32, 23), "float64": (64, 52)}
_TABLES: dict[str, np.ndarray] = {}


def _table(dtype: np.dtype[np.generic]) -> np.ndarray:
    """float64 value of every 16-bit pattern (faster than converting float16 in numpy)."""
    name = str(dtype)
    if name not in _TABLES:
        with np.errstate(invalid="ignore"):  # NaN patterns
            _TABLES[name] = np.arange(1 << 16, dtype=np.uint16).view(dtype).astype(np.float64)
    return _TABLES[name]


def _first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """Start of the first chunk whose bits differ (None: identical); numpy, stopping there."""
    uint = UINT[a.dtype.itemsize]
    get_a, get_b = _flat(a), _flat(b)
    size = max(1, (4 * CHUNK_BYTES) // a.dtype.itemsize)  # one streaming compare: larger chunks pay
    for s in range(0, a.size, size):
        if not np.array_equal(get_a(s, s + size).view(uint), get_b(s, s + size).view(uint)):
            return s
    return None


def scan_ieee(a: np.ndarray, b: np.ndarray) -> Summary | None:
    """Compare IEEE-layout floats a and b (same dtype and shape); None when their bits are identical."""
    start = _first_difference(a, b)
    if start is None:  # the usual run-to-run case: no compiled kernel (nor numba's import) needed
        return None
    # heavy: numba compiles the kernels, only for tensors that differ
    from xbackend.numerics import jitdiff as jd

    width, mant = IEEE[str(a.dtype)]
    uint = UINT[a.dtype.itemsize]
    per = 8 // a.dtype.itemsize  # elements per 64-bit word
    mag_mask = uint((1 << (width - 1)) - 1)
    inf_bits = uint(((1 << (width - 1 - mant)) - 1) << mant)
    sub_limit, sign_shift = uint(1 << mant), uint(width - 1)
    table = _table(a.dtype) if width == 16 else None
    size = a.size
    get_a, get_b = _flat(a), _flat(b)

    def piece(get: Callable[[int, int], np.ndarray], s: int) -> np.ndarray:
        """Bits of [s, s + JIT_CHUNK), zero-padded to whole words (zeros on both sides change nothing)."""
        x = get(s, min(s + JIT_CHUNK, size)).view(uint)
        if x.size % per:
            x = np.concatenate([x, np.zeros(per - x.size % per, uint)])
        return x

    counts = np.zeros(jd.COUNTERS, np.int64)
    figures = np.zeros(2, np.float64)
    max_ulp = np.zeros(1, np.uint64)
    total = ExactSum()
    top = TopErrors(size)
    errs = np.empty(min(2 * top.k, 2 * HOLD_MAX) + jd.SUPER, np.float64)

    def run(
        xa: np.ndarray, xb: np.ndarray, pos: int, state: np.ndarray, floor: float, out: np.ndarray
    ) -> int:
        fa, fb = (xa, xb) if table is not None else (xa.view(a.dtype), xb.view(a.dtype))
        return int(
            jd.measure(
                xa.view(np.uint64), xb.view(np.uint64), xa, xb, fa, fb, table, pos, mag_mask, inf_bits,
                sub_limit, sign_shift, mant, floor, state, figures, max_ulp, total.bins, out,
            )
        )  # fmt: skip

    for s in range(0, size, JIT_CHUNK):
        xb = piece(get_b, s)
        if s + xb.size <= start:  # identical: only the reference's figures
            jd.ref_stats(xb, 0, xb.size, mag_mask, inf_bits, counts)
            continue
        xa = piece(get_a, s)
        pos = max(0, start - s) // jd.BLOCK * jd.BLOCK
        jd.ref_stats(xb, 0, pos, mag_mask, inf_bits, counts)  # measure folds the rest
        while pos < xa.size:
            pos = run(xa, xb, pos, counts, top.floor, errs)
            if pos < xa.size:  # the error buffer is full: keep the largest
                counts[jd.FILL] = 0 if top.overflow else top.keep(errs[: counts[jd.FILL]])
    if not top.overflow:
        top.held, top.size = [errs[: counts[jd.FILL]].copy()], int(counts[jd.FILL])
    c = [int(counts[i]) for i in range(jd.COUNTERS)]
    comparable, rel_count = _population(
        size,
        (c[jd.REF_NONFINITE], c[jd.REF_NONZERO_FINITE]),
        (c[jd.DIFF_REF_NONFINITE], c[jd.DIFF_REF_NZF]),
        c[jd.NON_COMPARABLE],
        c[jd.REL_COUNT],
    )

    def all_errs() -> Iterator[np.ndarray]:
        out = np.empty(JIT_CHUNK + jd.SUPER, np.float64)
        saved = figures.copy(), max_ulp.copy(), total.bins.copy()
        for s in range(0, size, JIT_CHUNK):
            state = np.zeros(jd.COUNTERS, np.int64)
            run(piece(get_a, s), piece(get_b, s), 0, state, -math.inf, out)
            yield out[: state[jd.FILL]]
        figures[:], max_ulp[:], total.bins[:] = saved

    top_bits = np.array(counts[jd.REF_MAX_MAG], uint)
    differing = int(counts[jd.DIFFERING])
    p99 = _p99(comparable, int(counts[jd.EXPLICIT]), top, all_errs)
    return Summary(
        differing=differing,
        mismatches=differing,
        max_ulp=int(max_ulp[0]),
        max_abs=float(figures[jd.MAX_ABS]),
        max_rel=float(figures[jd.MAX_REL]),
        p99_abs=p99,
        v_ermv=total.value() / rel_count if rel_count else 0.0,
        ref_max_finite=abs(float(top_bits.view(a.dtype))),
        nan_mismatch=int(counts[jd.NAN]),
        inf_mismatch=int(counts[jd.INF]),
        ftz_mismatch=int(counts[jd.FTZ]),
        zero_sign_mismatch=int(counts[jd.ZERO_SIGN]),
        nan_payload_mismatch=int(counts[jd.NAN_PAYLOAD]),
        fill_mismatch=int(counts[jd.FILL_MISMATCH]),
    )


# --- other types: numpy, chunk by chunk ---------------------------------------------------


@dataclass
class Part:
    """Figures from the differing elements of one chunk."""

    err: np.ndarray  # |a - b| in float64 of the comparable differing elements
    rel: np.ndarray  # err / |b| where b is nonzero
    mismatches: int
    max_ulp: int = 0
    non_comparable: int = 0  # differing elements left out of err
    ref_nonfinite: int = 0  # differing elements whose reference is NaN/Inf (or saturated fill)
    ref_nonzero_finite: int = 0  # differing elements whose reference is finite and nonzero
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    ftz_mismatch: int = 0
    zero_sign_mismatch: int = 0
    nan_payload_mismatch: int = 0
    fill_mismatch: int = 0


_COUNTED = (
    "mismatches",
    "non_comparable",
    "ref_nonfinite",
    "ref_nonzero_finite",
    "nan_mismatch",
    "inf_mismatch",
    "ftz_mismatch",
    "zero_sign_mismatch",
    "nan_payload_mismatch",
    "fill_mismatch",
)


class Kernel:
    """How one dtype family is compared: bits to compare, differing elements to measure."""

    uint: type[np.unsignedinteger] = np.uint8
    measures_errors = True  # False: a count of differing elements is all there is

    def part(self, da: np.ndarray, db: np.ndarray) -> Part:
        """The figures of one chunk's elements whose bits differ: `da` against `db`."""
        raise NotImplementedError

    def ref_stats(self, xb: np.ndarray) -> tuple[int, int, float]:
        """(non-finite or saturated fill, finite nonzero, largest finite magnitude below the
        fill) of reference bits xb."""
        return 0, 0, 0.0


def scan(a: np.ndarray, b: np.ndarray, kernel: Kernel) -> Summary | None:
    """Compare a with b (same dtype and shape) chunk by chunk; None when their bits are identical."""
    n, size = a.size, chunk_elements(a.dtype)
    get_a, get_b = _flat(a), _flat(b)
    mask = np.empty(min(size, n), bool)
    top = TopErrors(n)
    rel_sum = ExactSum()
    counted = dict.fromkeys(_COUNTED, 0)
    ref = {"nonfinite": 0, "nonzero_finite": 0}
    ref_max = max_abs = max_rel = 0.0
    differing = explicit = rel_size = max_ulp = 0
    found = False

    def fold_ref(xb: np.ndarray) -> None:
        nonlocal ref_max
        nf, nz, mx = kernel.ref_stats(xb)
        ref["nonfinite"] += nf
        ref["nonzero_finite"] += nz
        ref_max = max(ref_max, mx)

    for s in range(0, n, size):
        e = min(s + size, n)
        xa, xb = get_a(s, e).view(kernel.uint), get_b(s, e).view(kernel.uint)
        m = mask[: e - s]
        np.not_equal(xa, xb, out=m)
        if not found:
            if not m.any():
                continue
            found = True
            for s0 in range(0, s, size):  # the reference figures of the identical chunks so far
                fold_ref(get_b(s0, min(s0 + size, n)).view(kernel.uint))
        fold_ref(xb)
        idx = np.flatnonzero(m)
        if not idx.size:
            continue
        part = kernel.part(xa[idx], xb[idx])
        differing += idx.size
        for k in _COUNTED:
            counted[k] += getattr(part, k)
        mx = float(part.err.max(initial=0.0))
        max_abs = max(max_abs, mx)
        max_rel = max(max_rel, float(part.rel.max(initial=0.0)))
        max_ulp = max(max_ulp, part.max_ulp)
        rel_sum.add(part.rel)
        rel_size += part.rel.size
        explicit += part.err.size
        top.add(part.err, mx)
    if not found:
        return None
    comparable, rel_count = _population(
        n,
        (ref["nonfinite"], ref["nonzero_finite"]),
        (counted["ref_nonfinite"], counted["ref_nonzero_finite"]),
        counted["non_comparable"],
        rel_size,
    )

    def all_errs() -> Iterator[np.ndarray]:
        for s in range(0, n, size):
            xa, xb = get_a(s, s + size).view(kernel.uint), get_b(s, s + size).view(kernel.uint)
            idx = np.flatnonzero(xa != xb)
            if idx.size:
                yield kernel.part(xa[idx], xb[idx]).err

    return Summary(
        differing=differing,
        mismatches=counted["mismatches"],
        max_ulp=max_ulp,
        max_abs=max_abs,
        max_rel=max_rel,
        p99_abs=_p99(comparable, explicit, top, all_errs) if kernel.measures_errors else 0.0,
        v_ermv=rel_sum.value() / rel_count if rel_count else 0.0,
        ref_max_finite=ref_max,
        nan_mismatch=counted["nan_mismatch"],
        inf_mismatch=counted["inf_mismatch"],
        ftz_mismatch=counted["ftz_mismatch"],
        zero_sign_mismatch=counted["zero_sign_mismatch"],
        nan_payload_mismatch=counted["nan_payload_mismatch"],
        fill_mismatch=counted["fill_mismatch"],
    )


class IntKernel(Kernel):
    """Integers (numpy and ml_dtypes int4/int2): exact; abs/rel from the integer difference."""

    def __init__(self, dtype: np.dtype[np.generic], unsigned: bool) -> None:
        self.dtype = dtype
        self.uint = UINT[dtype.itemsize]
        self.wide = np.uint64 if unsigned else np.int64

    def ref_stats(self, xb: np.ndarray) -> tuple[int, int, float]:
        return 0, int(np.count_nonzero(xb.view(self.dtype).astype(self.wide))), 0.0

    def part(self, da: np.ndarray, db: np.ndarray) -> Part:
        """One chunk of integers: the absolute differences (in uint64, never overflowing) and their
        relative size."""
        aw, bw = da.view(self.dtype).astype(self.wide), db.view(self.dtype).astype(self.wide)
        # the magnitude in uint64: a signed difference can overflow int64
        err = np.where(aw >= bw, (aw - bw).view(np.uint64), (bw - aw).view(np.uint64)).astype(np.float64)
        denom = np.abs(bw.astype(np.float64))
        nz = denom > 0
        return Part(
            err=err,
            rel=err[nz] / denom[nz],
            mismatches=int(np.count_nonzero(err)),
            ref_nonzero_finite=int(np.count_nonzero(nz)),
        )


class BoolKernel(Kernel):
    """Bools: a count of differing elements."""

    measures_errors = False

    def part(self, da: np.ndarray, db: np.ndarray) -> Part:
        """One chunk of booleans whose bits differ: each a mismatch, no ULP."""
        return Part(err=np.empty(0, np.float64), rel=np.empty(0, np.float64), mismatches=da.size)
