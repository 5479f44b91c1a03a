"""Captures: one run's values on disk, read back one value at a time, and compared."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence

from xbackend.files.storage import ValueFile, save_values
from xbackend.numerics.metrics import TensorDiff, diff_values
from xbackend.numerics.values import Value, value_sha256

__all__ = [
    "CaptureFile",
    "combined_digest",
    "common_names",
    "diff_captures",
    "save_capture",
    "tensor_digest",
]

CaptureFile = ValueFile


def save_capture(path: str | os.PathLike[str], names: Sequence[str], values: Mapping[str, Value]) -> None:
    """Save a run's captured `values` at `path`, in the order of `names`."""
    save_values(path, values, names)


def tensor_digest(name: str, value: Value) -> str:
    """One value's hash: its name, structure, dtype, shape and bytes (value_sha256 of it alone)."""
    return value_sha256({name: value})


def combined_digest(digests: Iterable[tuple[str, str]]) -> str:
    """A hash of many values from their tensor_digests, in the given order: a worker hashes
    each tensor once and combines, never hashing a whole capture again."""
    h = hashlib.sha256()
    for name, digest in digests:
        h.update(f"{name}|{digest}|".encode())
    return h.hexdigest()


def common_names(value_file: ValueFile, b: ValueFile, names: Iterable[str]) -> list[str]:
    """The names, in order, that both captures hold."""
    return [name for name in names if name in value_file and name in b]


def diff_captures(
    value_file: ValueFile, b: ValueFile, names: Sequence[str], ops: Mapping[str, str]
) -> list[TensorDiff]:
    """a against b for each name (element by element inside sequences and maps); a name only
    one side holds is a 'missing' mismatch."""
    out = []
    for name in names:
        if name in value_file and name in b:
            out.extend(diff_values(name, value_file[name], b[name], ops.get(name, "")))
        else:
            out.append(TensorDiff.mismatch(name, ops.get(name, ""), "missing", "exposed on one side only"))
    return out
