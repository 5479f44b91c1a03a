"""Input feeds: seeded generation from model metadata, or loaded from an .npz file.

Feeds are made once, hashed, and the same bytes go to every backend and run.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xbackend.errors import InputError
from xbackend.model import ModelSpec, TensorSpec, np_dtype

__all__ = ["Feeds", "feeds_sha256", "generate_feeds", "load_feeds", "parse_shape"]

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Feeds:
    """The arrays fed to every backend, their sha256 and where they came from."""

    arrays: Mapping[str, np.ndarray] = field(compare=False, repr=False)
    sha256: str
    seed: int | None
    source: str  # "generated" or the .npz path

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], seed: int | None, source: str) -> Feeds:
        fixed = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
        return cls(fixed, feeds_sha256(fixed), seed, source)

    def shapes(self) -> dict[str, Shape]:
        return {k: tuple(int(d) for d in v.shape) for k, v in self.arrays.items()}

    def save(self, path: str | os.PathLike[str]) -> None:
        arrays: dict[str, Any] = dict(self.arrays)
        np.savez(str(path), **arrays)


def feeds_sha256(arrays: Mapping[str, np.ndarray]) -> str:
    """Hash of names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def parse_shape(text: str) -> tuple[str, Shape]:
    """'NAME=1,3,224,224' -> ('NAME', (1, 3, 224, 224))."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise InputError(f"--shape expects NAME=D1,D2,... (e.g. x=1,3,224,224), got {text!r}")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip() != "")
    except ValueError as e:
        raise InputError(f"--shape {text!r}: dimensions must be integers, e.g. x=1,3,224,224") from e
    if any(d < 0 for d in shape):
        raise InputError(f"--shape {text!r}: dimensions must be >= 0")
    return name, shape


def _resolve_shape(spec: TensorSpec, override: Shape | None) -> Shape:
    if spec.shape is None:
        if override is None:
            raise InputError(
                f"input {spec.name!r} has no shape in the model; pass --shape {spec.name}=D1,D2,..."
            )
        return override
    if override is None:
        if spec.dynamic_dims:
            syms = ", ".join("?" if spec.shape[i] is None else str(spec.shape[i]) for i in spec.dynamic_dims)
            example = ",".join(str(d) if isinstance(d, int) else "1" for d in spec.shape)
            raise InputError(
                f"input {spec.name!r} has dynamic dimension(s) {syms} in shape {spec.shape_str()}; "
                f"pass --shape {spec.name}={example}"
            )
        return tuple(int(d) for d in spec.shape if isinstance(d, int))
    _check_shape(spec, override, "--shape")
    return override


def _check_shape(spec: TensorSpec, shape: Shape, where: str) -> None:
    if spec.shape is None:
        return
    if len(shape) != len(spec.shape) or any(
        isinstance(d, int) and d != s for d, s in zip(spec.shape, shape, strict=True)
    ):
        raise InputError(
            f"{where} gives input {spec.name!r} shape {list(shape)}, but the model expects "
            f"{spec.shape_str()}; fixed dimensions must match and the rank must be {len(spec.shape)}"
        )


def _seed_for(seed: int, name: str) -> np.random.Generator:
    # Per-input streams: adding an input to a model does not change the others' data.
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, key])


def _random_array(spec: TensorSpec, shape: Shape, seed: int) -> np.ndarray:
    rng = _seed_for(seed, spec.name)
    if spec.dtype in ("unknown", "object", "string"):
        raise InputError(
            f"input {spec.name!r} has type {spec.dtype}, which xbackend cannot generate; "
            "pass real data with --inputs FILE.npz"
        )
    dt = np_dtype(spec.dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dt, np.integer):
        # Small non-negative values: valid as indices or ids for most embedding-style inputs.
        return rng.integers(0, 16, size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def generate_feeds(spec: ModelSpec, seed: int = 0, shapes: Mapping[str, Shape] | None = None) -> Feeds:
    """Seeded random feeds for every model input."""
    shapes = dict(shapes or {})
    _check_known(spec, shapes.keys(), "--shape")
    arrays = {i.name: _random_array(i, _resolve_shape(i, shapes.get(i.name)), seed) for i in spec.inputs}
    return Feeds.from_arrays(arrays, seed, "generated")


def _check_known(spec: ModelSpec, names: object, where: str) -> None:
    unknown = sorted(set(names) - set(spec.input_names))  # type: ignore[call-overload]
    if unknown:
        raise InputError(
            f"{where} names {', '.join(map(repr, unknown))}, which the model does not take; "
            f"its inputs are {', '.join(spec.input_names)}"
        )


def load_feeds(path: str | os.PathLike[str], spec: ModelSpec) -> Feeds:
    """Feeds from an .npz file whose keys are the model's input names."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--inputs file not found: {p}")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:
        raise InputError(
            f"--inputs {p} is not a readable .npz ({type(e).__name__}); save it with numpy.savez"
        ) from e
    _check_known(spec, arrays.keys(), f"--inputs {p}")
    missing = [n for n in spec.input_names if n not in arrays]
    if missing:
        raise InputError(f"--inputs {p} lacks input(s) {', '.join(missing)}; add them to the .npz")
    for i in spec.inputs:
        a = arrays[i.name]
        if i.dtype != "unknown" and str(a.dtype) != i.dtype:
            raise InputError(
                f"--inputs {p}: input {i.name!r} is {a.dtype}, the model expects {i.dtype}; "
                f"save it with .astype('{i.dtype}')"
            )
        _check_shape(i, tuple(a.shape), f"--inputs {p}")
    return Feeds.from_arrays(arrays, None, str(p))
