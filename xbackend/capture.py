"""Captures on disk: one run's tensors in an .npz, read back one tensor at a time."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from xbackend.metrics import TensorDiff

__all__ = ["CaptureFile", "capture_sha256", "common_names", "diff_captures", "save_capture"]


def _key(i: int) -> str:
    # Tensor names may hold '/', ':' and other characters zip members dislike.
    return f"t{i:06d}"


def save_capture(
    path: str | os.PathLike[str], names: Sequence[str], tensors: Mapping[str, np.ndarray]
) -> None:
    arrays: dict[str, Any] = {_key(i): tensors[n] for i, n in enumerate(names)}
    np.savez(str(path), **arrays)


def capture_sha256(names: Iterable[str], tensors: Mapping[str, np.ndarray]) -> str:
    """Hash of names, dtypes, shapes and bytes of the given tensors, in the given order."""
    h = hashlib.sha256()
    for n in names:
        a = np.ascontiguousarray(tensors[n])
        h.update(f"{n}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def common_names(a: CaptureFile, b: CaptureFile, names: Iterable[str]) -> list[str]:
    """The names, in order, that both captures hold."""
    return [n for n in names if n in a and n in b]


def diff_captures(
    a: CaptureFile, b: CaptureFile, names: Sequence[str], ops: Mapping[str, str]
) -> list[TensorDiff]:
    """a against b for each name; a name only one side holds is a 'missing' mismatch."""
    out = []
    for n in names:
        if n in a and n in b:
            out.append(TensorDiff.from_arrays(n, a[n], b[n], ops.get(n, "")))
        else:
            out.append(TensorDiff.mismatch(n, ops.get(n, ""), "missing", "exposed on one side only"))
    return out


class CaptureFile:
    """Read-only view of a saved capture; arrays load lazily, one per access."""

    def __init__(self, path: str | os.PathLike[str], names: Sequence[str]) -> None:
        self._npz = np.load(str(path), allow_pickle=False)
        self._index = {n: i for i, n in enumerate(names)}

    @property
    def names(self) -> list[str]:
        return list(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> np.ndarray:
        return np.asarray(self._npz[_key(self._index[name])])

    def close(self) -> None:
        self._npz.close()

    def __enter__(self) -> CaptureFile:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
