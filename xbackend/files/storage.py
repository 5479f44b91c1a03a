"""xbackend's own value files: feeds and captures, every ONNX value kind, bit for bit.

npz cannot hold bfloat16, the float8/float4 formats or int4/int2 (numpy reads
them back as raw void bytes), nor strings without pickle, sequences or
optionals. This format stores each tensor's raw bytes with its dtype name and
shape, and a JSON index at the end:

    b"XBVALUE1" | tensor bytes ... | index (UTF-8 JSON) | index offset (8 bytes LE) | b"XBVALEND"

Readers seek to one value and read just its bytes, so a capture is read one
tensor at a time whatever its size.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np

from xbackend.files.modelref import np_dtype
from xbackend.files.untrusted import json_loads
from xbackend.numerics.values import Value, normalize

__all__ = ["ValueFile", "ValueWriter", "save_values"]

MAGIC = b"XBVALUE1"
END = b"XBVALEND"
FORMAT = "xbackend.values/1"


class _Writer:
    def __init__(self, binary_io: BinaryIO) -> None:
        self.f = binary_io
        self.offset = len(MAGIC)

    def blob(self, data: bytes | memoryview) -> tuple[int, int]:
        start = self.offset
        self.f.write(data)
        self.offset += len(data)
        return start, len(data)

    def record(self, value: Value) -> dict[str, Any]:
        if value is None:
            return {"kind": "empty"}
        if isinstance(value, list):
            return {"kind": "sequence", "items": [self.record(v) for v in value]}
        if isinstance(value, dict):
            keys = sorted(value, key=repr)
            return {
                "kind": "map",
                "keys": [key if isinstance(key, (int, str)) else repr(key) for key in keys],
                "values": [self.record(value[key]) for key in keys],
            }
        a = value
        if a.dtype == object:
            text = json.dumps([str(x) for x in a.reshape(-1)], ensure_ascii=False)
            off, n = self.blob(text.encode("utf-8", "surrogateescape"))
            return {"kind": "strings", "shape": list(a.shape), "offset": off, "nbytes": n}
        data = np.require(a, requirements="C")
        off, n = self.blob(data.reshape(-1).view(np.uint8).data if data.size else b"")
        return {"kind": "tensor", "dtype": str(a.dtype), "shape": list(a.shape), "offset": off, "nbytes": n}


def save_values(
    path: str | os.PathLike[str], values: Mapping[str, Any], names: Sequence[str] | None = None
) -> None:
    """Write `values` (in `names` order, default the mapping's) to `path`."""
    with ValueWriter(path) as w:
        for n in list(values) if names is None else list(names):
            w.add(n, values[n])


class ValueWriter:
    """A value file written one value at a time (a capture that arrives in windows), whose values
    can be read back before it is finished."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._f = open(self.path, "wb")  # noqa: SIM115 - closed by close()/__exit__
        self._f.write(MAGIC)
        self._w = _Writer(self._f)
        self.entries: dict[str, dict[str, Any]] = {}
        self._reader: ValueFile | None = None

    def add(self, name: str, value: Value) -> None:
        """Append the value `name` (normalized to xbackend's value kinds)."""
        self.entries[name] = self._w.record(normalize(value))

    def read(self, name: str) -> Value:
        """A value written before, read back from the file."""
        self._f.flush()
        if self._reader is None:
            self._reader = ValueFile.unfinished(self.path, self.entries)
        return self._reader[name]

    def close(self) -> None:
        """Write the index and close the file (again: nothing)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._f.closed:
            return
        entries = [[key, rec] for key, rec in self.entries.items()]
        self._f.write(json.dumps({"format": FORMAT, "entries": entries}, ensure_ascii=False).encode())
        self._f.write(self._w.offset.to_bytes(8, "little"))
        self._f.write(END)
        self._f.close()

    def __enter__(self) -> ValueWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_KINDS = ("empty", "sequence", "map", "strings", "tensor")


def _check_record(rec: Any, limit: int) -> None:
    """One index entry has what reading it needs, its bytes inside the data region."""
    kind = rec["kind"]
    if kind not in _KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    if kind == "sequence":
        for r in rec["items"]:
            _check_record(r, limit)
    elif kind == "map":
        if len(rec["keys"]) != len(rec["values"]):
            raise ValueError("a map with unequal keys and values")
        for r in rec["values"]:
            _check_record(r, limit)
    elif kind != "empty":
        shape = rec["shape"]
        if not isinstance(shape, list) or len(shape) > 32 or not all(_whole(d) and d >= 0 for d in shape):
            raise ValueError(f"shape {str(shape)[:80]} is not a list of sizes")
        offset, nbytes = rec["offset"], rec["nbytes"]
        if not _whole(offset) or not _whole(nbytes) or offset < 0 or nbytes < 0 or offset + nbytes > limit:
            raise ValueError(f"bytes {offset}..{offset}+{nbytes} lie outside the data")
        count = math.prod(shape)
        if kind == "tensor":
            dtype = _number_dtype(rec["dtype"])
            if count * dtype.itemsize != nbytes:  # sized before anything is allocated
                raise ValueError(
                    f"shape {shape} of {dtype} needs {count * dtype.itemsize} bytes, not {nbytes}"
                )
        elif count > nbytes:  # strings: one JSON item takes at least a byte
            raise ValueError(f"shape {shape} holds more strings than its {nbytes} bytes can")


def _whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number_dtype(name: object) -> np.dtype[Any]:
    """The numpy dtype of a tensor's record: a number type (ml_dtypes' bfloat16 and float8
    included), never object, string, structured or raw void."""
    try:
        dtype = np_dtype(name) if isinstance(name, str) and len(name) <= 40 else None
    except Exception:  # numpy's and ml_dtypes' refusals differ by name and version
        dtype = None
    if dtype is None or not (dtype.kind in "biufc" or dtype.type.__module__.startswith("ml_dtypes")):
        raise ValueError(f"dtype {str(name)[:40]!r} is not a number type")
    return dtype


class ValueFile:
    """Read-only view of a value file; each value is read from disk when asked for."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._f = open(self.path, "rb")  # noqa: SIM115 - closed by close()/__exit__
        try:
            self._index = self._read_index()
        except Exception:
            self._f.close()
            raise

    @classmethod
    def unfinished(cls, path: str | os.PathLike[str], entries: dict[str, Any]) -> ValueFile:
        """A file a ValueWriter is still writing, read through the writer's index so far."""
        self = cls.__new__(cls)
        self.path = Path(path)
        self._f = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        self._index = entries  # the writer's own index: values it adds later are found too
        return self

    def _read_index(self) -> dict[str, Any]:
        size = self._f.seek(0, os.SEEK_END)
        self._f.seek(0)
        if size < len(MAGIC) + 16 or self._f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{self.path} is not an xbackend value file")
        self._f.seek(size - 16)
        tail = self._f.read(16)
        if tail[8:] != END:
            raise ValueError(f"{self.path} is truncated")
        start = int.from_bytes(tail[:8], "little")
        if not len(MAGIC) <= start <= size - 16:
            raise ValueError(f"{self.path} has a damaged index (its offset points outside the file)")
        self._f.seek(start)
        try:
            index = json_loads(self._f.read(size - 16 - start))
            entries = {str(n): rec for n, rec in index["entries"]}
            for rec in entries.values():
                _check_record(rec, start)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            raise ValueError(f"{self.path} has a damaged index ({type(error).__name__}: {error})") from error
        return entries

    @property
    def names(self) -> list[str]:
        """Every value's name, in the file's order."""
        return list(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __iter__(self) -> Iterable[str]:
        return iter(self._index)

    def __getitem__(self, name: str) -> Value:
        return self._value(self._index[name])

    def get(self, name: str, default: Value = None) -> Value:
        """The value `name`, or `default` where the file has none of that name."""
        return self[name] if name in self._index else default

    def kind(self, name: str) -> str:
        """The kind the value `name` was stored as (tensor, strings, sequence, map, empty)."""
        return str(self._index[name]["kind"])

    def tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name -> (dtype name, shape) of every plain tensor, read from the index alone."""
        return {
            key: (str(value["dtype"]), tuple(int(d) for d in value["shape"]))
            for key, value in self._index.items()
            if value["kind"] == "tensor"
        }

    def _bytes(self, rec: Mapping[str, Any]) -> bytes:
        self._f.seek(int(rec["offset"]))
        return self._f.read(int(rec["nbytes"]))

    def _value(self, rec: Mapping[str, Any]) -> Value:
        kind = rec["kind"]
        if kind == "empty":
            return None
        if kind == "sequence":
            return [self._value(item) for item in rec["items"]]
        if kind == "map":
            return {key: self._value(value) for key, value in zip(rec["keys"], rec["values"])}
        shape = tuple(int(d) for d in rec["shape"])
        if kind == "strings":
            items = json_loads(self._bytes(rec).decode("utf-8", "surrogateescape"))
            out = np.empty(len(items), dtype=object)
            out[:] = items
            return out.reshape(shape)
        out = np.empty(shape, dtype=np_dtype(rec["dtype"]))
        self._f.seek(int(rec["offset"]))
        if out.size and self._f.readinto(out.reshape(-1).view(np.uint8).data) != int(rec["nbytes"]):
            raise ValueError(f"{self.path} is truncated")
        return out

    def load_all(self) -> dict[str, Value]:
        """Every value, loaded, by name."""
        return {n: self[n] for n in self._index}

    def close(self) -> None:
        """Close the file (its mapped values are read no more)."""
        self._f.close()

    def __enter__(self) -> ValueFile:
        return self

    def __exit__(
        self, t: type[BaseException] | None, base_exception: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
