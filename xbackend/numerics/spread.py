"""How far other orders of every sum move each tensor, measured in the worker as each order runs.

A permuted model (xbackend.model.reorder) runs once in its original order, then once per random
order. Per tensor this keeps the floor (the largest scaled ULP any order moved it) and, element
by element, the spread (the largest absolute move), so the K orders' captures are never written
or read back: one spread file stands for them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from xbackend.numerics.metrics import COMPUTE_FLOATS, diff_values, saturated_fill, ulp_at
from xbackend.numerics.values import Value, value_name

__all__ = ["Spread", "scaled"]

_IEEE = (np.float16, np.float32, np.float64)


def _plain_ieee(value: Value, b: Value) -> bool:
    if not (isinstance(value, np.ndarray) and isinstance(b, np.ndarray)):
        return False
    return value.dtype == b.dtype and value.shape == b.shape and value.dtype.type in _IEEE


def scaled(name: str, value: Value, b: Value, op: str) -> list[tuple[str, float]]:
    """The scaled ULP of `value` against `b` (finite elements short of saturated fill only: the
    floor is about rounding); the full comparison only for values other than plain IEEE
    tensors of one shape."""
    if _plain_ieee(value, b):
        assert isinstance(value, np.ndarray) and isinstance(b, np.ndarray)
        if value.size == 0:
            return [(name, 0.0)]
        x, y = value.astype(np.float64), b.astype(np.float64)
        ay = np.abs(y)
        top = float(ay.max())
        # the usual case in one pass: every element finite and short of the dtype's largest
        if math.isfinite(top) and top < float(np.finfo(value.dtype).max) and np.isfinite(x).all():
            err = float(np.abs(x - y).max())
            return [(name, err / ulp_at(top, value.dtype) if err else 0.0)]
        ok = np.isfinite(x) & np.isfinite(y) & ~saturated_fill(x, value.dtype) & ~saturated_fill(y, b.dtype)
        if not ok.any():
            return []
        scale = float(ay[ok].max())
        err = float(np.abs(x[ok] - y[ok]).max())
        return [(name, err / ulp_at(scale, value.dtype) if err else 0.0)]
    return [
        (value_name(diff.name), diff.scaled_ulp)
        for diff in diff_values(name, value, b, op)
        if diff.scaled_ulp is not None
    ]


class Spread:
    """Each order's tensors against the original order's, as they arrive."""

    def __init__(self, op_types: Mapping[str, str]) -> None:
        self.op_types = dict(op_types)
        self.floors: dict[str, float] = {}
        self.spread: dict[str, np.ndarray] = {}  # float32 (float64 for float64 tensors)

    def add(self, name: str, value: Value, base: Value) -> None:
        """Fold the spread of tensor `name`'s `value` against `base` into the per-tensor floors."""
        if _same_float(value, base):
            assert isinstance(value, np.ndarray) and isinstance(base, np.ndarray)
            self._add_float(name, value, base)
            return
        for t, s in scaled(name, value, base, self.op_types.get(name, "")):
            self.floors[t] = max(self.floors.get(t, 0.0), s)

    def _add_float(self, name: str, value: np.ndarray, base: np.ndarray) -> None:
        """One pass of subtraction serves both: the move, in float32 (float64 for float64
        tensors), is exact wherever the two values are within a factor 2 of each other."""
        wide = np.float64 if value.dtype == np.float64 else np.float32
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.asarray(np.abs(value.astype(wide, copy=False) - base.astype(wide, copy=False)))
        floor: float | None = None
        if value.dtype.type in _IEEE and value.size:
            top = float(np.abs(base).max())
            err = float(d.max())  # nan where either is nan: the careful path below
            if math.isfinite(top) and top < float(np.finfo(value.dtype).max) and math.isfinite(err):
                floor = err / ulp_at(top, value.dtype) if err else 0.0
        if floor is None:
            got = scaled(name, value, base, self.op_types.get(name, ""))
            floor = max((f for _, f in got), default=None)
        if floor is not None:
            self.floors[name] = max(self.floors.get(name, 0.0), floor)
        prev = self.spread.get(name)
        # fmax drops nan (a move between nans is no move); asarray: a 0-d tensor stays an array
        self.spread[name] = np.asarray(np.fmax(d, 0.0) if prev is None else np.fmax(prev, d))


def _same_float(value: Value, b: Value) -> bool:
    return (
        isinstance(value, np.ndarray)
        and isinstance(b, np.ndarray)
        and value.shape == b.shape
        and value.dtype == b.dtype
        and str(value.dtype) in COMPUTE_FLOATS
    )
