"""Captures: one run's values on disk, read back one value at a time, and compared."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from xbackend.metrics import TensorDiff, diff_values
from xbackend.storage import ValueFile, save_values
from xbackend.values import Value, value_sha256

__all__ = ["CaptureFile", "capture_sha256", "common_names", "diff_captures", "save_capture"]

CaptureFile = ValueFile


def save_capture(path: str | os.PathLike[str], names: Sequence[str], values: Mapping[str, Value]) -> None:
    save_values(path, values, names)


def capture_sha256(names: Iterable[str], values: Mapping[str, Value]) -> str:
    """Hash of names, structure, dtypes, shapes and bytes of the given values, in the given order."""
    return value_sha256((n, values[n]) for n in names)


def common_names(a: ValueFile, b: ValueFile, names: Iterable[str]) -> list[str]:
    """The names, in order, that both captures hold."""
    return [n for n in names if n in a and n in b]


def diff_captures(
    a: ValueFile, b: ValueFile, names: Sequence[str], ops: Mapping[str, str]
) -> list[TensorDiff]:
    """a against b for each name (element by element inside sequences and maps); a name only
    one side holds is a 'missing' mismatch."""
    out = []
    for n in names:
        if n in a and n in b:
            out.extend(diff_values(n, a[n], b[n], ops.get(n, "")))
        else:
            out.append(TensorDiff.mismatch(n, ops.get(n, ""), "missing", "exposed on one side only"))
    return out
