"""Every kind of ONNX value, as engines' Python APIs hand them over, normalized.

A value is a tensor (`np.ndarray`, 0-d scalars kept as shape ()), a sequence
(`list` of values), a map (`dict` key -> value) or an empty optional (`None`).
A non-empty optional is its content: engines wrap optionals differently (ONNX
Runtime returns the bare tensor), so the wrapper carries no information.

String tensors are object arrays of `str` (bytes decoded as UTF-8, undecodable
bytes kept through surrogateescape) so that an engine returning `bytes` and one
returning `str` compare equal when their bytes are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

__all__ = [
    "Value",
    "describe",
    "is_tensor",
    "normalize",
    "value_name",
    "value_sha256",
    "walk",
]

if TYPE_CHECKING:
    from typing import TypeAlias  # novermin (type checking only)

    Value: TypeAlias = "np.ndarray | list[Any] | dict[Any, Any] | None"
else:  # typing.TypeAlias is Python >= 3.10; the worker also runs under 3.8
    Value = Any


def _text(x: object) -> str:
    if isinstance(x, (bytes, np.bytes_)):
        return bytes(x).decode("utf-8", "surrogateescape")
    return str(x)


def _tensor(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "USO":
        out = np.empty(a.shape, dtype=object)
        flat = out.reshape(-1)
        for index, x in enumerate(a.reshape(-1)):
            flat[index] = _text(x)
        return out
    # np.ascontiguousarray would turn a 0-d scalar into shape (1,).
    return np.require(a, requirements="C")


def normalize(value: Any) -> Value:
    """The canonical form of an engine's value (see module docstring)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return _tensor(value)
    if isinstance(value, np.generic):
        return _tensor(np.asarray(value))
    if isinstance(value, Mapping):
        return {_key(key): normalize(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    if isinstance(value, (int, float, bool, complex, str, bytes)):
        return _tensor(np.asarray(value))
    raise TypeError(f"cannot take a {type(value).__name__} as an ONNX value")


def _key(k: Any) -> Any:
    if isinstance(k, np.generic):
        return k.item()
    if isinstance(k, bytes):
        return _text(k)
    return k


def is_tensor(value: Value) -> bool:
    """Whether `value` is a tensor (not a sequence, map or None)."""
    return isinstance(value, np.ndarray)


def describe(value: Value) -> str:
    """A short structural description: 'float32[2,3]', 'sequence of 3', 'empty optional'."""
    if value is None:
        return "empty optional"
    if isinstance(value, np.ndarray):
        return f"{value.dtype}[{','.join(map(str, value.shape))}]"
    if isinstance(value, list):
        return f"sequence of {len(value)}"
    return f"map of {len(value)}"


def walk(name: str, value: Value) -> Iterator[tuple[str, Value]]:
    """(path, value) for the value and every element inside it, depth first.

    Paths: `name[i]` for sequence elements, `name{key}` for map entries (keys sorted).
    """
    yield name, value
    if isinstance(value, list):
        for index, v in enumerate(value):
            yield from walk(f"{name}[{index}]", v)
    elif isinstance(value, dict):
        for k in sorted(value, key=repr):
            yield from walk(f"{name}{{{k!r}}}", value[k])


def value_name(path: str) -> str:
    """The top-level value a `walk` path belongs to: 'rows[1]' -> 'rows', 'm{3}' -> 'm'."""
    return path.split("[")[0].split("{")[0]


def _update(h: Any, value: Value) -> None:
    if value is None:
        h.update(b"E|")
    elif isinstance(value, np.ndarray):
        h.update(f"T|{value.dtype}|{value.shape}|".encode())
        if value.dtype == object:
            for x in value.reshape(-1):
                b = str(x).encode("utf-8", "surrogateescape")
                h.update(len(b).to_bytes(8, "little") + b)
        else:
            h.update(np.require(value, requirements="C").reshape(-1).view(np.uint8))  # no copy
    elif isinstance(value, list):
        h.update(f"S|{len(value)}|".encode())
        for v in value:
            _update(h, v)
    else:
        h.update(f"M|{len(value)}|".encode())
        for k in sorted(value, key=repr):
            h.update(f"{k!r}|".encode())
            _update(h, value[k])


def value_sha256(items: Iterator[tuple[str, Value]] | Mapping[str, Value]) -> str:
    """Hash of names, structure, dtypes, shapes and bytes, in the given order."""
    digest = hashlib.sha256()
    pairs = items.items() if isinstance(items, Mapping) else items
    for name, value in pairs:
        digest.update(f"{name}|".encode())
        _update(digest, value)
    return digest.hexdigest()
