"""A GGUF file's header, read in pure Python before llama.cpp sees the file.

The reader is iterative and total: every count is checked against the bytes left before anything
is read or allocated, nested arrays are walked with a stack (never recursion), and each way a
header can be wrong is one UsageError naming the file. `claims_problem` then holds the sizes the
header claims (layers, widths, heads, vocabulary) to the tensors it actually lists, so a header
cannot make llama.cpp allocate for a model that is not there.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from xbackend.errors import UsageError

__all__ = ["GGML_TYPE_NAMES", "GgufHeader", "GgufTensor", "claims_problem", "read_header"]

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_FORMAT = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_KEY_LIMIT = 1 << 16  # a key longer than this is not a GGUF header's
_VALUE_LIMIT = 1 << 20  # nor a string value
_ITEM_LIMIT = 1 << 24  # values walked one by one (a vocabulary of 256k tokens is 2^18)
_DEPTH_LIMIT = 8  # arrays of arrays: GGUF writers nest none
_MAX_DIMS = 4  # GGML_MAX_DIMS
_KEPT = 1024  # string values longer than this are not kept (chat templates are read elsewhere)

# ggml_type -> (name, elements per block, bytes per block) (ggml.h, ggml.c's type traits)
GGML_TYPE_NAMES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}  # fmt: skip
# sizes a header claims per architecture (ARCH.KEY), none past the tensors that hold them
_CLAIMED = ("embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv",
            "attention.key_length", "attention.value_length", "expert_count", "vocab_size",
            "rope.dimension_count")  # fmt: skip


@dataclass(frozen=True)
class GgufTensor:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def type_name(self) -> str:
        """The tensor's ggml type by name (`type N` for one xbackend does not know)."""
        return GGML_TYPE_NAMES.get(self.ggml_type, (f"type {self.ggml_type}", 0, 0))[0]

    def nbytes(self) -> int | None:
        """Its data's bytes, where its type's block size is known."""
        known = GGML_TYPE_NAMES.get(self.ggml_type)
        if known is None:
            return None
        count = 1
        for dim in self.dims:
            count *= dim
        return -(-count // known[1]) * known[2]


@dataclass(frozen=True)
class GgufHeader:
    version: int
    values: dict[str, int | float | bool | str] = field(default_factory=dict)  # scalars and short strings
    array_lengths: dict[str, int] = field(default_factory=dict)
    tensors: tuple[GgufTensor, ...] = ()
    file_size: int = 0

    def architecture(self) -> str:
        """The file's general.architecture ('' where it has none)."""
        arch = self.values.get("general.architecture", "")
        return arch if isinstance(arch, str) else ""


class _Reader:
    """Bytes of one file, each read checked against what is left."""

    def __init__(self, binary_io: BinaryIO, size: int, path: Path) -> None:
        self.f, self.size, self.path, self.pos = binary_io, size, path, 0

    def bad(self, what: str) -> UsageError:
        return UsageError(f"{self.path}: {what}: not a GGUF file xbackend reads")

    def take(self, n: int) -> bytes:
        if n > self.size - self.pos:
            raise UsageError(f"{self.path} ends inside its GGUF header: not a whole GGUF file")
        data = self.f.read(n)
        if len(data) != n:
            raise UsageError(f"{self.path} ends inside its GGUF header: not a whole GGUF file")
        self.pos += n
        return data

    def skip(self, n: int) -> None:
        if n > self.size - self.pos:
            raise UsageError(f"{self.path} ends inside its GGUF header: not a whole GGUF file")
        self.f.seek(n, os.SEEK_CUR)
        self.pos += n

    def number(self, fmt: str) -> int:
        value: int = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def string(self, limit: int, what: str) -> bytes:
        n = self.number("<Q")
        if n > limit:
            raise self.bad(f"a {what} of {n} bytes")
        return self.take(n)

    def count(self, n: int, each: int, what: str) -> int:
        """`n` items of at least `each` bytes: refused where the bytes left cannot hold them."""
        if n * each > self.size - self.pos:
            raise self.bad(f"{what} claims {n} items, more than its {self.size - self.pos} bytes left hold")
        return n


def _value(reader: _Reader, kind: int, key: str, out: GgufHeader) -> None:
    """One value of type `kind`, arrays walked with a stack; scalars and short strings kept."""
    if kind in _SCALAR:
        out.values[key] = struct.unpack(_FORMAT[kind], reader.take(_SCALAR[kind]))[0]
        return
    if kind == _STRING:
        text = reader.string(_VALUE_LIMIT, "string value")
        if len(text) <= _KEPT:
            out.values[key] = text.decode("utf-8", "replace")
        return
    if kind != _ARRAY:
        raise reader.bad(f"value type {kind} of {key!r} is unknown")
    walked = 0
    stack = [(_ARRAY, 1)]  # (item type, items left) per open array
    first = True
    while stack:
        item, left = stack[-1]
        if left == 0:
            stack.pop()
            continue
        stack[-1] = (item, left - 1)
        if item == _ARRAY:  # an array header: its items come next
            if len(stack) > _DEPTH_LIMIT:
                raise reader.bad(f"{key!r} nests arrays past {_DEPTH_LIMIT} levels")
            inner, n = reader.number("<I"), reader.number("<Q")
            if first:
                out.array_lengths[key] = n
                first = False
            if inner in _SCALAR:
                reader.skip(reader.count(n, _SCALAR[inner], key) * _SCALAR[inner])
            elif inner == _STRING:
                stack.append((inner, reader.count(n, 8, key)))
            elif inner == _ARRAY:
                stack.append((inner, reader.count(n, 12, key)))
            else:
                raise reader.bad(f"array item type {inner} of {key!r} is unknown")
            continue
        walked += 1
        if walked > _ITEM_LIMIT:
            raise reader.bad(f"{key!r} holds more than {_ITEM_LIMIT} values")
        reader.string(_VALUE_LIMIT, "string value")


def read_header(path: str | os.PathLike[str]) -> GgufHeader:
    """The header of the GGUF file at `path`: its values, array lengths and tensor list, every
    count checked against the file's size. A file that is not a whole GGUF file is a UsageError."""
    p = Path(path)
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        reader = _Reader(handle, size, p)
        if size < 4 or reader.take(4) != b"GGUF":
            raise UsageError(f"{p} is not a GGUF file (it does not start with GGUF)")
        version = reader.number("<I")
        if version < 2:
            raise reader.bad(f"GGUF version {version}")
        n_tensors, n_kv = reader.number("<Q"), reader.number("<Q")
        reader.count(n_kv, 12, "its key-value count")
        out = GgufHeader(version, file_size=size)
        for _ in range(n_kv):
            key = reader.string(_KEY_LIMIT, "key").decode("utf-8", "replace")
            _value(reader, reader.number("<I"), key, out)
        reader.count(n_tensors, 24, "its tensor count")
        tensors = []
        for _ in range(n_tensors):
            name = reader.string(_KEY_LIMIT, "tensor name").decode("utf-8", "replace")
            n_dims = reader.number("<I")
            if n_dims > _MAX_DIMS:
                raise reader.bad(
                    f"tensor {name[:60]!r} has {n_dims} dimensions (ggml holds at most {_MAX_DIMS})"
                )
            dims = tuple(reader.number("<Q") for _ in range(n_dims))
            tensors.append(GgufTensor(name, dims, reader.number("<I"), reader.number("<Q")))
        header = GgufHeader(version, out.values, out.array_lengths, tuple(tensors), size)
    _check_data(header, reader.pos, p)
    return header


def _check_data(header: GgufHeader, end: int, path: Path) -> None:
    """Every tensor's data lies inside the file."""
    align = header.values.get("general.alignment", 32)
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
        raise UsageError(f"{path}: general.alignment {align!r} is not a power of two: not a GGUF file")
    data = -(-end // align) * align
    for tensor in header.tensors:
        size = tensor.nbytes()
        if tensor.offset > header.file_size or (
            size is not None and data + tensor.offset + size > header.file_size
        ):
            raise UsageError(
                f"{path}: tensor {tensor.name[:60]!r} lies past the end of the file ({header.file_size} "
                "bytes): "
                "not a whole GGUF file"
            )


def claims_problem(header: GgufHeader) -> str:
    """'' where the sizes the header claims fit the tensors it lists; else what does not."""
    arch = header.architecture()
    widest = max((dim for tensor in header.tensors for dim in tensor.dims), default=0)
    blocks = header.values.get(f"{arch}.block_count")
    if isinstance(blocks, int) and blocks > len(header.tensors):
        return f"{arch}.block_count = {blocks}, more layers than its {len(header.tensors)} tensors hold"
    for name in _CLAIMED:
        value = header.values.get(f"{arch}.{name}")
        if isinstance(value, int) and not isinstance(value, bool) and value > max(widest, 1):
            return f"{arch}.{name} = {value}, wider than any of its tensors (at most {widest})"
    return ""
