"""Reading an .npz from others: every array's header is read and judged before any array is.

numpy's own np.load reads a member whole, so a 1 MB file whose header declares 268M elements
costs 1.1 GB before its shape can be refused. Here the zip's directory and each .npy header
(shape, dtype) come first: an array is refused when its bytes are not there, when its shape
cannot be what the model takes, or when its dtype is not a plain number or string type.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from xbackend.errors import first_line

__all__ = ["NpzError", "read_npz"]


# a deflated member past 64 MiB that inflates more than 200-fold is refused before it is read:
# real arrays compress a few-fold, and a bomb would hold its size in memory
BOMB_BYTES, BOMB_RATIO = 1 << 26, 200


class NpzError(ValueError):
    """Why the file is refused, in words that say what to do."""


def _header(
    zip_file: zipfile.ZipFile, info: zipfile.ZipInfo
) -> tuple[tuple[int, ...], np.dtype[np.generic], int]:
    """(shape, dtype, header bytes) of one member, read from its first bytes alone."""
    with zip_file.open(info) as handle:
        major, _ = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(handle, max_header_size=1 << 16)
        return tuple(int(d) for d in shape), dtype, handle.tell()


def read_npz(
    path: Path, check: Callable[[str, tuple[int, ...], np.dtype[np.generic]], None] = lambda *a: None
) -> dict[str, np.ndarray]:
    """Every array of the .npz at `path`, by name; `check(name, shape, dtype)` judges each header
    before anything is read (and raises to refuse it)."""
    if not zipfile.is_zipfile(path):
        raise NpzError("not an .npz (not a zip archive)")
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as archive:
        members = [i for i in archive.infolist() if i.filename.endswith(".npy")]
        headers = {}
        for info in members:
            name = info.filename[: -len(".npy")]
            if info.flag_bits & 0x1:
                raise NpzError(f"array {name!r} is encrypted, which numpy cannot read")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise NpzError(
                    f"array {name!r} is compressed with zip method {info.compress_type}, not one numpy "
                    "writes (stored or deflated)"
                )
            try:
                shape, dtype, start = _header(archive, info)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
                raise NpzError(f"array {name!r} has no readable .npy header ({error})") from None
            if dtype.hasobject:
                raise NpzError(f"array {name!r} is an object array, which xbackend does not unpickle")
            if dtype.names is not None or (dtype.kind == "V" and not _ml_dtype(dtype)):
                raise NpzError(f"array {name!r} is a structured or raw-bytes array ({dtype}), not numbers")
            need = math.prod(shape) * dtype.itemsize
            if need > info.file_size - start:
                raise NpzError(
                    f"array {name!r} declares shape {list(shape)} of {dtype} ({need} bytes), but holds "
                    f"{max(0, info.file_size - start)}"
                )
            check(name, shape, dtype)  # the caller's judgment first: it knows what fits
            if (
                info.compress_type == zipfile.ZIP_DEFLATED
                and need > BOMB_BYTES
                and need > BOMB_RATIO * max(info.compress_size, 1)
            ):
                raise NpzError(
                    f"array {name!r} inflates {info.compress_size} compressed bytes to {need}, as a zip "
                    "bomb does (numpy.savez stores arrays uncompressed)"
                )
            headers[info.filename] = name
        for info in members:
            try:
                with archive.open(info) as handle:
                    out[headers[info.filename]] = np.lib.format.read_array(handle, allow_pickle=False)
            except (zipfile.BadZipFile, EOFError, OSError, ValueError) as error:  # a bad CRC, a cut member
                raise NpzError(f"array {headers[info.filename]!r} is damaged ({first_line(error)})") from None
    return out


def _ml_dtype(dtype: np.dtype[np.generic]) -> bool:
    """npz keeps ml_dtypes arrays (bfloat16, float8, int4) as raw void bytes of their width."""
    return dtype.kind == "V" and dtype.itemsize in (1, 2) and dtype.names is None
