"""Weights in external data files: finding them, checking they are whole, reading them, and
linking them beside rewritten models (never serializing them into one proto)."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data, write_external_data_tensors

from xbackend.errors import ModelLoadError, first_line
from xbackend.files.atomic import write_atomic_bytes
from xbackend.files.owned import file_digest, place
from xbackend.files.untrusted import contained

__all__ = [
    "IN_MEMORY",
    "adopt_external",
    "all_tensors",
    "check_external_files",
    "external_files",
    "load_external",
    "map_external",
    "model_files",
    "raw_size",
    "read_external",
    "uses_external_data",
    "weight_array",
    "write_rewritten",
]


def uses_external_data(proto: onnx.ModelProto) -> bool:
    """Whether any tensor of the model keeps its data in a file beside it."""
    return any(tensor.data_location == TensorProto.EXTERNAL for tensor in all_tensors(proto.graph))


def all_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Every tensor of `graph`: initializers, attribute tensors, and those of subgraphs, recursively."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from all_tensors(attr.g)
            for sub in attr.graphs:
                yield from all_tensors(sub)


def external_files(proto: onnx.ModelProto) -> list[str]:
    """The files the model's external data names (their locations as written), sorted."""
    files: set[str] = set()
    for tensor in all_tensors(proto.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            files.update(e.value for e in tensor.external_data if e.key == "location")
    return sorted(files)


_LISTED_LIMIT = 256 << 20  # a larger graph file holds its weights itself: it names no data file to list


def model_files(path: str | os.PathLike[str]) -> list[Path]:
    """The model file and every external data file it names (the files a run reads). Only a
    regular file is opened (a pipe or a device is the loader's to refuse, later, in one line), and
    only a graph small enough to hold names rather than weights; where it cannot be read, the
    model file alone."""
    p = Path(path)
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _LISTED_LIMIT:
            return [p]
        proto = onnx.load(str(p), load_external_data=False)
    except Exception:  # any damage: reported by the loader, with its own line
        return [p]
    return [p, *(p.parent / rel for rel in external_files(proto) if "\0" not in rel)]


def _link_external(proto: onnx.ModelProto, src: Path, dest: Path, copy: bool = False) -> None:
    """Link each external data file `proto` names from folder `src` into folder `dest`: a hard
    link where the file system allows (ONNX Runtime refuses a symlink that leaves the model's
    folder), else a symlink; `copy`: a file of its own (onnx.load refuses a data file with more
    than one hard link, or a symlink). Each is made under a name of its own, then renamed into
    place: threads staging the same weights at once never write one file."""
    for rel in external_files(proto):
        link = dest / rel
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            _place(Path(os.path.realpath(src / rel)), link, copy)


def _place(target: Path, link: Path, copy: bool) -> None:
    """`link` made to hold `target`'s bytes (a copy, a hard link or a symlink) at a temporary
    name unique to this writer, then renamed over `link` (a rival's identical file, if any)."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{link.name}.", suffix=".part", dir=link.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if copy:
            shutil.copyfile(target, tmp)
        else:
            tmp.unlink()
            try:
                os.link(target, tmp)
            except OSError:
                tmp.symlink_to(target)
        os.replace(tmp, link)
    finally:
        tmp.unlink(missing_ok=True)


def adopt_external(proto: onnx.ModelProto, src: Path, out: Path) -> None:
    """Move the external data files `proto` names, from folder `src` (on `out`'s file system)
    to sit beside `out` named after it (`out.onnx.data`, or `.data0`, `.data1`... for several),
    and point the proto at them."""
    files = external_files(proto)
    names = {
        rel: f"{out.name}.data" + (str(index) if len(files) > 1 else "") for index, rel in enumerate(files)
    }
    for rel, new in names.items():
        place(src / rel, out.parent / new, file_digest(src / rel), "exported weights")
    for tensor in all_tensors(proto.graph):
        for e in tensor.external_data:
            if e.key == "location":
                e.value = names[e.value]


def write_rewritten(
    proto: onnx.ModelProto, source: str | os.PathLike[str], path: Path, own_weights: bool = False
) -> None:
    """Write a rewrite of the model at `source` (weights left external) to `path`, atomically,
    its external data linked beside it (`own_weights`: copied, a file onnx.load reads): the
    weights are never serialized into one proto."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _link_external(proto, Path(source).parent, path.parent, own_weights)
    write_atomic_bytes(path, proto.SerializeToString(), "rewritten model")


def externalize(proto: onnx.ModelProto, folder: Path, name: str = "weights.bin") -> bool:
    """Move the proto's inline weights (past 1 KiB each) into one file `name` in `folder`, written
    once, the proto pointing at it: every rewrite of it then serializes without its weights, as a
    model with external data does. False (nothing moved) where the weights are external already
    or under 1 MiB in all."""
    if (
        uses_external_data(proto)
        or sum(len(initializer.raw_data) for initializer in proto.graph.initializer) < 1 << 20
    ):
        return False
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).unlink(missing_ok=True)  # written by append: a file left from an earlier run goes
    convert_model_to_external_data(proto, True, name, 1024, False)
    write_external_data_tensors(proto, str(folder))
    return True


def load_external(proto: onnx.ModelProto, path: Path) -> None:
    """Read every external tensor's bytes into the proto. Not onnx's loader: it refuses a data
    file with more than one hard link, and write_rewritten hard-links the weights of every
    rewritten model (the user's own file among them, while a rewrite exists)."""
    if not uses_external_data(proto):
        return
    check_external_files(proto, path)
    try:
        for tensor in all_tensors(proto.graph):
            if tensor.data_location == TensorProto.EXTERNAL:
                read_external(tensor, path.parent)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read external data of {path}: {first_line(error)}") from error


IN_MEMORY = "#"  # an external location held in memory (onnx.model_container's convention)


def map_external(proto: onnx.ModelProto, path: Path) -> dict[str, np.ndarray]:
    """The main graph's external weights memory-mapped from their files, read-only: each
    initializer's location becomes IN_MEMORY + its name, the key of its array in the dict
    returned (an onnx ModelContainer's large initializers). Nothing is copied: pages are read
    as the engine touches them, and the kernel can drop them again. Weights of other types
    (packed 4-bit, strings) and those in subgraphs are read into the proto as load_external
    does. Large weights stored in the proto itself move out of it the same way (one copy held,
    not the proto's and the engine's)."""
    external = uses_external_data(proto)
    if external:
        check_external_files(proto, path)
    out: dict[str, np.ndarray] = {}
    try:
        mapped = set()
        for initializer in proto.graph.initializer:
            arr = (
                _mapped(initializer, path.parent)
                if initializer.data_location == TensorProto.EXTERNAL
                else _lifted(initializer)
            )
            if arr is None:
                continue
            key = f"{IN_MEMORY}{len(out)}:{initializer.name}"
            out[key] = arr
            del initializer.external_data[:]
            initializer.external_data.add(key="location", value=key)
            mapped.add(initializer.name)
        for initializer in all_tensors(proto.graph) if external else ():
            if initializer.data_location == TensorProto.EXTERNAL and initializer.name not in mapped:
                read_external(initializer, path.parent)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read external data of {path}: {first_line(error)}") from error
    return out


_LIFT_BYTES = 1 << 16  # inline weights from this size on leave the proto (shape tensors stay)


def weight_array(tensor: TensorProto, base: Path) -> np.ndarray | None:
    """An initializer's values (external ones memory-mapped from their file in folder `base`), or
    None where they cannot be read one to one (a packed type, a file that is not there)."""
    try:
        if tensor.data_location == TensorProto.EXTERNAL:
            return _mapped(tensor, base)
        return numpy_helper.to_array(tensor) if _plain_dtype(tensor) is not None else None
    except (OSError, ValueError):
        return None


def _lifted(tensor: TensorProto) -> np.ndarray | None:
    """An inline weight's bytes as an array of their own, cleared from the proto; None where it
    is small or of a type numpy cannot hold one to one."""
    if not tensor.HasField("raw_data") or len(tensor.raw_data) < _LIFT_BYTES:
        return None
    dtype = _plain_dtype(tensor)
    if dtype is None:
        return None
    arr = np.frombuffer(tensor.raw_data, dtype=dtype).reshape(tuple(int(dim) for dim in tensor.dims))
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    return arr


def _plain_dtype(tensor: TensorProto) -> np.dtype[np.generic] | None:
    """The numpy dtype whose bytes are the tensor's raw bytes one to one, or None (packed 4- and
    2-bit types, strings, a big-endian host: ONNX's raw bytes are little-endian)."""
    if tensor.data_type in _PACKED or sys.byteorder != "little":
        return None
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        return None
    return None if dtype.kind == "O" else dtype


def _mapped(tensor: TensorProto, base: Path) -> np.ndarray | None:
    """A read-only map of the tensor's bytes, or None for a type numpy cannot map one to one."""
    dtype = _plain_dtype(tensor)
    if dtype is None:
        return None
    rel, offset, _ = _where(tensor)
    _safe(tensor, rel)
    shape = tuple(int(dim) for dim in tensor.dims)
    if int(np.prod(shape, dtype=np.int64)) == 0:
        return np.zeros(shape, dtype)
    return np.memmap(base / rel, dtype=dtype, mode="r", offset=offset, shape=shape)


def _safe(tensor: TensorProto, rel: str) -> None:
    if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise ValueError(
            f"tensor {tensor.name}: external data location {rel!r} is not a file beside the model"
        )


def _where(tensor: TensorProto) -> tuple[str, int, int | None]:
    """(file, offset, length or None for the rest of the file) of an external tensor."""
    info = {e.key: e.value for e in tensor.external_data}
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if info.get("length") is not None else None
    except ValueError:
        raise ModelLoadError(
            f"weight {tensor.name!r}: external data offset {info.get('offset')!r} / length "
            f"{info.get('length')!r} "
            "are not whole numbers; re-export the model"
        ) from None
    if offset < 0 or (length is not None and length < 0) or offset > 1 << 62:
        raise ModelLoadError(
            f"weight {tensor.name!r}: external data offset {offset} / length {length} are out of range; "
            "re-export the model"
        )
    return info.get("location", ""), offset, length


def read_external(tensor: TensorProto, base: Path) -> None:
    """The tensor's bytes into raw_data (check_external_files has checked the file is whole)."""
    rel, offset, length = _where(tensor)
    _safe(tensor, rel)
    with open(base / rel, "rb") as handle:
        handle.seek(offset)
        data = handle.read(length) if length is not None else handle.read()
    tensor.raw_data = data
    del tensor.external_data[:]
    tensor.data_location = TensorProto.DEFAULT


def check_external_files(proto: onnx.ModelProto, path: Path) -> None:
    """Every external data file beside the model, and long enough for every tensor it holds.
    Each location is first kept inside the model's folder from its path (and the links in that
    folder) alone: nothing outside is looked at, and the refusal is the same whatever is there."""
    for external_file in external_files(proto):
        contained(
            path.parent,
            external_file,
            f"{path}: external data",
            "keep the model's weights in its own folder and re-export it",
        )
    missing = [file for file in external_files(proto) if not (path.parent / file).is_file()]
    if missing:
        raise ModelLoadError(
            f"{path} stores weights in external data file(s) {', '.join(missing)} that are not "
            f"next to it in {path.parent}; copy them there"
        )
    sizes: dict[str, int] = {}
    for tensor in all_tensors(proto.graph):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        rel, offset, length = _where(tensor)
        if rel not in sizes:
            sizes[rel] = (path.parent / rel).stat().st_size
        end = offset + (length if length is not None else raw_size(tensor) or 0)
        if end > sizes[rel]:
            raise ModelLoadError(
                f"{path}: external data file {rel} ends at byte {sizes[rel]}, but weight {tensor.name!r} "
                f"needs bytes up to {end}: the file is truncated; copy it again in full"
            )


def raw_size(tensor: onnx.TensorProto) -> int | None:
    """Bytes a raw initializer of this type and shape holds (None for types without a fixed size)."""
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    if tensor.data_type in _PACKED:
        return None  # 4-bit and 2-bit types pack several elements per byte
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


_PACKED = {
    getattr(onnx.TensorProto, n)
    for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, n)
}
