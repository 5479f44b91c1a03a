"""Exact sums of non-negative float64 values, in a layout that numpy code and the compiled
kernels (`jitdiff`) both add into; value() rounds once, as math.fsum."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["ACC_BIAS", "ACC_INF", "ACC_SIZE", "ExactSum"]

# Exact sums of non-negative float64 values: acc[p] counts units of 2**(p - ACC_BIAS), every
# addition below 2**26, so int64 holds 2**37 of them per slot; acc[ACC_INF] counts infinities.
ACC_BIAS = 1075 + 128
ACC_INF = 2048 + 256
ACC_SIZE = ACC_INF + 1


class ExactSum:
    """An exact sum of non-negative float64 values; value() rounds it once, as math.fsum."""

    def __init__(self) -> None:
        self.bins = np.zeros(ACC_SIZE, np.int64)

    def add(self, values: np.ndarray) -> None:
        """numpy, for the chunked kernels (the compiled ones add into `bins` themselves)."""
        v = np.ascontiguousarray(values[values > 0], np.float64)
        for s in range(0, v.size, 1 << 24):  # float64 bincount sums of < 2**26 each stay exact
            bits = v[s : s + (1 << 24)].view(np.uint64)
            ex = (bits >> np.uint64(52)).astype(np.int64)
            inf = ex == 2047
            self.bins[ACC_INF] += int(np.count_nonzero(inf))
            frac = bits & np.uint64((1 << 52) - 1)
            frac = np.where(ex != 0, frac | np.uint64(1 << 52), frac)[~inf]
            p = np.maximum(ex, 1)[~inf] + 128  # subnormals share the scale of exponent 1
            for shift in (0, 26, 52):
                part = ((frac >> np.uint64(shift)) & np.uint64((1 << 26) - 1)).astype(np.float64)
                self.bins += np.bincount(p + shift, weights=part, minlength=ACC_SIZE).astype(np.int64)

    def value(self) -> float:
        """The exact sum, correctly rounded to a float (inf where an infinity was added)."""
        if self.bins[ACC_INF]:
            return math.inf
        whole = 0
        for p in np.flatnonzero(self.bins[:ACC_INF]):
            whole += int(self.bins[p]) << int(p)
        return float(Fraction(whole, 1 << ACC_BIAS))  # correctly rounded, as math.fsum
