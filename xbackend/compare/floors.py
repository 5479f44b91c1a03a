"""The noise floor's arithmetic, and the severed model's feeds.

A tensor's floor is the largest scaled ULP any of K orders of every sum moved it from the
original order; the severed model is fed the reference's captured values under severed names,
read one at a time from its capture.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from xbackend.capture import CaptureFile
from xbackend.metrics import diff_values, saturated_fill, ulp_at
from xbackend.model import ModelSpec
from xbackend.sever import SEVERED
from xbackend.storage import save_values
from xbackend.values import Value, value_name

__all__ = ["SeveredFeeds", "floors_of", "save_severed_feeds"]


class SeveredFeeds(Mapping[str, Value]):
    """The feeds plus the reference's captured values under severed names, read one at a time
    (and `extra` values: a permuted model's index inputs)."""

    def __init__(
        self,
        feeds: Mapping[str, Value],
        cap: CaptureFile,
        severed: Sequence[str],
        extra: Mapping[str, Value] | None = None,
    ) -> None:
        self.feeds = feeds
        self.cap = cap
        self.severed = {SEVERED + n: n for n in severed}
        self.extra = dict(extra or {})

    def __getitem__(self, key: str) -> Value:
        if key in self.extra:
            return self.extra[key]
        return self.cap[self.severed[key]] if key in self.severed else self.feeds[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.extra
        yield from self.feeds
        yield from self.severed

    def __len__(self) -> int:
        return len(self.extra) + len(self.feeds) + len(self.severed)


def save_severed_feeds(
    path: Path,
    feeds: Mapping[str, Value],
    ref_capture: str,
    severed: Sequence[str],
    extra: Mapping[str, Value] | None = None,
) -> None:
    """Write a severed model's feeds to `path`: the model's feeds, the reference's captured
    values of `severed` under severed names (streamed from its capture), and `extra`."""
    with CaptureFile(ref_capture) as cap:
        save_values(path, SeveredFeeds(feeds, cap, severed, extra))


def floors_of(base: str, samples: Sequence[str], spec: ModelSpec) -> dict[str, float]:
    """Per float tensor, the largest scaled ULP any order moved it from the original order."""
    ops = spec.op_types()
    out: dict[str, float] = {}
    with CaptureFile(base) as b:
        names = [n for n in spec.tensor_order() if n in b]
        for path in samples:
            with CaptureFile(path) as a:
                for n in names:
                    if n not in a:
                        continue
                    for t, s in _scaled(n, a[n], b[n], ops.get(n, "")):
                        out[t] = max(out.get(t, 0.0), s)
    return out


_IEEE = (np.float16, np.float32, np.float64)


def _plain_ieee(a: Value, b: Value) -> bool:
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return False
    return a.dtype == b.dtype and a.shape == b.shape and a.dtype.type in _IEEE


def _scaled(name: str, a: Value, b: Value, op: str) -> list[tuple[str, float]]:
    """The scaled ULP of `a` against `b` (finite elements short of saturated fill only: the
    floor is about rounding); the full comparison only for values other than plain IEEE
    tensors of one shape."""
    if _plain_ieee(a, b):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
        if a.size == 0:
            return [(name, 0.0)]
        x, y = a.astype(np.float64), b.astype(np.float64)
        ay = np.abs(y)
        top = float(ay.max())
        # the usual case in one pass: every element finite and short of the dtype's largest
        if math.isfinite(top) and top < float(np.finfo(a.dtype).max) and np.isfinite(x).all():
            err = float(np.abs(x - y).max())
            return [(name, err / ulp_at(top, a.dtype) if err else 0.0)]
        ok = np.isfinite(x) & np.isfinite(y) & ~saturated_fill(x, a.dtype) & ~saturated_fill(y, b.dtype)
        if not ok.any():
            return []
        scale = float(ay[ok].max())
        err = float(np.abs(x[ok] - y[ok]).max())
        return [(name, err / ulp_at(scale, a.dtype) if err else 0.0)]
    return [
        (value_name(d.name), d.scaled_ulp) for d in diff_values(name, a, b, op) if d.scaled_ulp is not None
    ]
