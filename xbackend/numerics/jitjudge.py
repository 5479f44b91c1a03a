"""One compiled pass over a node output judged against its float64 value: each element's
allowance, its error, and the largest ratio between them, where numpy makes a dozen passes
(xbackend.judge.judge_nodes keeps the numpy form for the rest: infinities, NaN, broadcast
magnitudes, inherited errors, steps).

The allowance is built in the order numpy builds it (xbackend.bounds.element.allowance, then the
judge's float64 slack), so both give the same bits.
"""

from __future__ import annotations

import os

from xbackend.numerics.jitdiff import cache_dir

_where = cache_dir(os.access(os.path.dirname(__file__), os.W_OK))
if _where is not None:
    os.environ["NUMBA_CACHE_DIR"] = _where  # read by numba when it is imported, just below

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

__all__ = ["judge_pass", "warm"]


@njit(cache=True, nogil=True)
def _pass(
    y: np.ndarray,
    v: np.ndarray,
    m: np.ndarray,
    terms: np.ndarray,
    flush_line: float,
    narrow: bool,
) -> tuple[bool, float, int, float, float, float, int, float]:
    """(all finite, largest ratio, its index, the allowance there, widest allowance, largest |v|,
    elements flushed, the smallest allowance / |v|: the relative error on every element caught).
    `terms`: u·a, u·b (0: no magnitude), u·c (0: none), the scaled term (0: none), the slack's
    factor and its addend."""
    ka, kb, kc, ks, mult, add = terms[0], terms[1], terms[2], terms[3], terms[4], terms[5]
    best = 0.0
    at = 0
    at_al = 0.0  # the allowance at `at` (element 0 until an error passes 0)
    widest = 0.0
    top = 0.0
    flushed = 0
    tight_al, tight_av = 1.0, 0.0  # the least allowance / |v| so far, as a fraction (no division per element)
    for i in range(v.size):
        vi = v[i]
        yi = np.float64(y[i])
        av = abs(vi)
        if not (np.isfinite(vi) and np.isfinite(yi)):
            return False, 0.0, 0, 0.0, 0.0, 0.0, 0, 0.0
        al = av * ka
        if kb != 0.0:
            mi = np.float64(m[i])
            if not np.isfinite(mi):
                return False, 0.0, 0, 0.0, 0.0, 0.0, 0, 0.0
            al = al + abs(mi) * kb
        if kc != 0.0:
            al = al + kc
        if ks != 0.0:
            al = al + ks
        al = al * mult + add
        if i == 0:
            at_al = al
        widest = max(widest, al)
        top = max(top, av)
        if av > 0.0 and al * tight_av < tight_al * av:
            tight_al, tight_av = al, av
        e = abs(yi - vi)
        if e != 0.0:
            r = e / al if al != 0.0 else np.inf
            if r > best:
                best = r
                at = i
                at_al = al
            # zero where the value is nonzero below the flush line: counted only where the
            # dtype holds it as nonzero (a subnormal), not where it rounds to zero anyway
            if yi == 0.0 and av < flush_line and (not narrow or np.float32(vi) != 0.0):
                flushed += 1
    tight = tight_al / tight_av if tight_av > 0.0 else np.inf
    return True, best, at, at_al, widest, top, flushed, tight


def judge_pass(
    y: np.ndarray, v: np.ndarray, mag: np.ndarray | None, terms: tuple[float, ...], flush_line: float
) -> tuple[float, int, float, float, float, int, float] | None:
    """(largest ratio, its flat index, the allowance there, widest allowance, largest |v|,
    elements flushed, smallest allowance / |v|) of `y`
    (float32 or float64) against `v` (float64, same shape; `mag` its magnitude, same shape, or
    None); None where an element is not finite (numpy's form decides those)."""
    yf = np.ascontiguousarray(y).reshape(-1)
    vf = np.ascontiguousarray(v, dtype=np.float64).reshape(-1)
    mf = np.ascontiguousarray(mag).reshape(-1) if mag is not None else vf
    k = np.asarray(terms, np.float64)
    if mag is None:
        k[1] = 0.0
    ok, best, at, at_al, widest, top, flushed, tight = _pass(yf, vf, mf, k, flush_line, y.dtype == np.float32)
    return (best, at, at_al, widest, top, flushed, tight) if ok else None


def warm() -> None:
    """Load the compiled pass for every signature the judge uses (float32 or float64 outputs,
    magnitudes), so that judging does not wait for numba."""
    one = np.ones(1)
    for y in (one.astype(np.float32), one):
        for m in (one.astype(np.float32), one):
            judge_pass(y, one, m, (2.0**-24, 1.0, 0.0, 0.0, 1.0, 0.0), 1e-38)
