"""Input feeds: seeded generation from model metadata, or loaded from an .npz file.

Feeds are made once, hashed, and the same bytes go to every backend and run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from xbackend.errors import InputError
from xbackend.files.capture_folder import CapturedInputs, captured_inputs, is_capture
from xbackend.files.npz import NpzError, read_npz
from xbackend.files.storage import ValueFile, save_values
from xbackend.files.untrusted import contained
from xbackend.model.dims import fill_dims, named_dims, split_shapes, unset_dims
from xbackend.model.extdata import read_external
from xbackend.model.load import ModelSpec, TensorSpec, np_dtype
from xbackend.numerics.values import Value, describe, normalize, value_sha256

__all__ = [
    "META_RANGES",
    "Feeds",
    "capture_feeds",
    "feeds_sha256",
    "generate_feeds",
    "load_expected",
    "load_feeds",
    "parse_range",
    "parse_shape",
    "recorded_ranges",
]

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Feeds:
    """The values fed to every backend, their sha256 and where they came from.

    `arrays` maps each input name to a value (see xbackend.numerics.values): a tensor, a
    sequence, a map or an empty optional.
    """

    arrays: Mapping[str, Value] = field(compare=False, repr=False)
    sha256: str
    seed: int | None
    source: str  # "generated" or the path the data came from
    ranges: tuple[tuple[str, str], ...] = ()  # input -> the range its generated values were drawn from
    made: tuple[tuple[str, str], ...] = ()  # input -> how it was made, in words (generated feeds)

    @classmethod
    def from_arrays(
        cls,
        arrays: Mapping[str, Any],
        seed: int | None,
        source: str,
        ranges: tuple[tuple[str, str], ...] = (),
        made: tuple[tuple[str, str], ...] = (),
    ) -> Feeds:
        """Feeds of `arrays` (made by `seed`, or given), `source` saying where they came from; their digest
        computed."""
        fixed = {key: normalize(array) for key, array in arrays.items()}
        return cls(fixed, feeds_sha256(fixed), seed, source, ranges, made)

    def shapes(self) -> dict[str, Shape]:
        """Each tensor feed's shape."""
        return {
            key: tuple(int(size) for size in array.shape)
            for key, array in self.arrays.items()
            if isinstance(array, np.ndarray)
        }

    def describe(self) -> list[tuple[str, str, str]]:
        """(name, dtype or kind, shape or structure) per input, sorted by name."""
        out = []
        for key, array in sorted(self.arrays.items()):
            if isinstance(array, np.ndarray):
                out.append((key, str(array.dtype), "[" + ",".join(map(str, array.shape)) + "]"))
            else:
                out.append((key, "value", describe(array)))
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the feeds at `path` in xbackend's value format."""
        save_values(path, self.arrays)


def feeds_sha256(arrays: Mapping[str, Value]) -> str:
    """Hash of names, structure, dtypes, shapes and bytes, in name order."""
    return value_sha256((name, arrays[name]) for name in sorted(arrays))


def parse_range(text: str) -> tuple[str, float, float]:
    """'ids=0:50257' -> ('ids', 0, 50257): generated values drawn from [LO, HI)."""
    name, sep, rest = text.rpartition("=")
    lo_text, colon, hi_text = rest.partition(":")
    try:
        lo, hi = float(lo_text), float(hi_text)
    except ValueError:
        lo = hi = math.nan
    if not sep or not name or not colon or not (lo < hi):
        raise InputError(f"--range expects NAME=LO:HI with LO < HI (e.g. input_ids=0:50257), got {text!r}")
    return name, lo, hi


def parse_shape(text: str) -> tuple[str, Shape]:
    """'NAME=1,3,224,224' -> ('NAME', (1, 3, 224, 224))."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise InputError(f"--shape expects NAME=D1,D2,... (e.g. x=1,3,224,224), got {text!r}")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip() != "")
    except ValueError as error:
        raise InputError(f"--shape {text!r}: dimensions must be integers, e.g. x=1,3,224,224") from error
    if any(d < 0 for d in shape):
        raise InputError(f"--shape {text!r}: dimensions must be >= 0")
    return name, shape


# a dimension an image model fixes at export (its channels, its size): no guess of 1 runs it
_IMAGE = re.compile(r"(?i)height|width|channel|image_size|(^|_)[hw]$")


def _resolve_shape(spec: TensorSpec, override: Shape | None) -> Shape:
    if spec.shape is None:
        if override is None:
            raise InputError(
                f"input {spec.name!r} has no shape in the model; pass --shape {spec.name}=D1,D2,..."
            )
        return override
    if override is None:
        if spec.dynamic_dims:
            syms = ", ".join(
                "?" if spec.shape[dim] is None else str(spec.shape[dim]) for dim in spec.dynamic_dims
            )
            image = [str(size) for size in spec.shape if isinstance(size, str) and _IMAGE.search(size)]
            if image:  # an image's channels and size are the model's, not any size: ask for them
                sizes = ",".join(
                    str(size) if isinstance(size, int) else str(size).upper() for size in spec.shape
                )
                raise InputError(
                    f"input {spec.name!r} has dynamic dimension(s) {syms} in shape {spec.shape_str()}; "
                    f"pass --shape {spec.name}={sizes} with the {', '.join(image)} it was exported for "
                    "(a size it was not built for fails in the model)"
                )
            example = ",".join(str(size) if isinstance(size, int) else "1" for size in spec.shape)
            raise InputError(
                f"input {spec.name!r} has dynamic dimension(s) {syms} in shape {spec.shape_str()}; "
                f"pass --shape {spec.name}={example}"
            )
        return tuple(int(size) for size in spec.shape if isinstance(size, int))
    _check_shape(spec, override, "--shape")
    return override


def _check_shape(spec: TensorSpec, shape: Shape, where: str) -> None:
    if spec.shape is None:
        return
    if len(shape) != len(spec.shape) or any(
        isinstance(size, int) and size != s for size, s in zip(spec.shape, shape, strict=True)
    ):
        raise InputError(
            f"{where} gives input {spec.name!r} shape {list(shape)}, but the model expects "
            f"{spec.shape_str()}; fixed dimensions must match and the rank must be {len(spec.shape)}"
        )


def _seed_for(seed: int, name: str) -> np.random.Generator:
    # Per-input streams: adding an input to a model does not change the others' data.
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, key])


DEFAULT_INT_RANGE = (0, 16)
# Ranges given at export (xbackend export torch --range), kept in the model for compare
META_RANGES = "xbackend.input_ranges"
TIMESTEPS = 1000  # diffusers' num_train_timesteps default: a timestep's plausible span
_POSITIONS = frozenset({"position_ids", "pos_ids", "positions", "position", "cache_position"})


def recorded_ranges(spec: ModelSpec) -> tuple[dict[str, tuple[float, float]], str]:
    """The ranges an export recorded in the model's metadata, and why they were ignored if they
    were (the model is someone else's file: anything but NAME: [LO, HI] pairs is not used)."""
    text = dict(spec.metadata).get(META_RANGES)
    if text is None:
        return {}, ""
    names = {i.name for i in spec.inputs}
    try:
        raw = json.loads(text) if len(text) <= 1 << 16 else None
        pairs = raw.items() if isinstance(raw, dict) else ()
        out = {str(k): (float(v[0]), float(v[1])) for k, v in pairs if str(k) in names and len(v) == 2}
        if not isinstance(raw, dict) or len(out) != len(raw):
            raise ValueError("not NAME: [LO, HI] pairs naming inputs")
        if not all(math.isfinite(lo) and math.isfinite(hi) and lo < hi for lo, hi in out.values()):
            raise ValueError("a range is not finite with LO < HI")
    except (ValueError, TypeError, AttributeError) as error:
        return {}, f"the model's {META_RANGES} metadata was ignored ({error})"
    return out, ""


def _conventional(
    spec: TensorSpec, shape: Shape, seed: int
) -> tuple[np.ndarray, str, tuple[float, float] | None] | None:
    """Inputs whose name says what they hold get what a model sees, not noise: a mask of ones,
    positions 0..N-1, a timestep in a diffusion schedule's span. (values, how, range drawn from)."""
    if spec.kind != "tensor" or spec.dtype in ("unknown", "object", "string"):
        return None
    dt = np_dtype(spec.dtype)
    integer = dt == np.bool_ or np.issubdtype(dt, np.integer)
    name = spec.name.lower()
    if integer and "mask" in name:
        return np.ones(shape, dt), "ones (a mask: no position padded)", None
    if integer and dt != np.bool_ and (name in _POSITIONS or name.endswith("position_ids")) and shape:
        values = np.broadcast_to(np.arange(shape[-1], dtype=dt), shape).copy()
        return values, f"0, 1, ..., {shape[-1] - 1} along the last axis (positions)", None
    if "timestep" in name and dt != np.bool_:
        lo_hi = (0.0, float(TIMESTEPS))
        values = _random_array(spec, shape, seed, lo_hi)
        kind = "integers" if integer else "uniform"
        return values, f"{kind} in [0, {TIMESTEPS}) (a diffusion timestep)", lo_hi
    return None


def _cannot_generate(spec: TensorSpec, what: str) -> InputError:
    return InputError(
        f"input {spec.name!r} is {what}, which xbackend cannot generate; pass real data with "
        f"--inputs DIR (ONNX test-data layout: input_0.pb, ... as TensorProto/SequenceProto/OptionalProto)"
        + (" or --inputs FILE.npz" if spec.kind == "tensor" else "")
    )


def _random_array(spec: TensorSpec, shape: Shape, seed: int, lo_hi: tuple[float, float]) -> np.ndarray:
    rng = _seed_for(seed, spec.name)
    if spec.kind not in ("tensor", "optional"):
        raise _cannot_generate(spec, f"a {spec.type_str or spec.kind}")
    if spec.dtype in ("unknown", "object", "string"):
        raise _cannot_generate(spec, f"a {spec.type_str or spec.dtype} tensor")
    dt = np_dtype(spec.dtype)
    lo, hi = lo_hi
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dt, np.integer) or str(dt) in ("int4", "uint4", "int2", "uint2"):
        return rng.integers(math.ceil(lo), math.ceil(hi), size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if (lo, hi) != DEFAULT_INT_RANGE:
        return rng.uniform(lo, hi, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def generate_feeds(
    spec: ModelSpec,
    seed: int = 0,
    shapes: Mapping[str, Shape] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
) -> Feeds:
    """Seeded random feeds for every model input.

    Each input's values come from the first that applies: --range; the range given at export
    (the model's xbackend.input_ranges metadata); its name (an integer *mask* is ones, position
    ids are 0..N-1, a *timestep* lies in [0, 1000)); for an input used directly as Gather indices
    into an N-row table (token ids into an embedding), [0, N); otherwise integers from [0, 16)
    and floats standard normal (uniform in a range where one was given).
    """
    shapes, dims = split_shapes(spec, dict(shapes or {}))
    ranges = dict(ranges or {})
    _check_known(spec, shapes.keys(), "--shape", named_dims(spec))
    _check_known(spec, ranges.keys(), "--range")
    unset = unset_dims(spec, shapes, dims)
    if unset is not None:
        raise unset
    recorded, ignored = recorded_ranges(spec)
    bounds = dict(spec.index_bounds)
    arrays = {}
    used: list[tuple[str, str]] = []
    made: list[tuple[str, str]] = []
    for i in spec.inputs:
        shape = _resolve_shape(i, shapes.get(i.name) or fill_dims(i, dims))
        _check_fits(i, shape)
        conv = None if i.name in ranges or i.name in recorded else _conventional(i, shape, seed)
        if conv is not None:
            arrays[i.name], how, drawn = conv
            made.append((i.name, how))
            if drawn is not None:
                used.append((i.name, f"[{drawn[0]:g}, {drawn[1]:g})"))
            continue
        if i.name in ranges:
            lo_hi, why = ranges[i.name], "--range"
        elif i.name in recorded:
            lo_hi, why = recorded[i.name], "the range given at export, kept in the model"
        elif i.name in bounds:
            lo_hi, why = (0, bounds[i.name]), f"indices into a table of {bounds[i.name]} rows"
        else:
            lo_hi, why = DEFAULT_INT_RANGE, "the default"
        if ignored and i.name not in ranges:
            why += f"; {ignored}"
        arrays[i.name] = _random_array(i, shape, seed, lo_hi)
        dt = arrays[i.name].dtype
        span = f"[{lo_hi[0]:g}, {lo_hi[1]:g})"
        if dt == np.bool_:
            made.append((i.name, "random booleans"))
        elif dt.kind in "iu" or lo_hi != DEFAULT_INT_RANGE or i.name in ranges:
            used.append((i.name, span))
            made.append((i.name, f"{'integers' if dt.kind in 'iu' else 'uniform'} in {span} ({why})"))
        else:
            made.append((i.name, "standard normal"))
    return Feeds.from_arrays(arrays, seed, "generated", tuple(used), tuple(made))


def _check_fits(spec: TensorSpec, shape: Shape) -> None:
    """An input too large to generate here is the shape's fault: one line, not a MemoryError."""
    import psutil  # optional in a foreign interpreter; the parent has it

    elements = math.prod(shape)
    # generation draws float64 (or int64) first, then casts
    need = elements * 8
    free = psutil.virtual_memory().available
    if need > free // 2:
        raise InputError(
            f"input {spec.name!r} of shape [{','.join(map(str, shape))}] has {elements:,} elements "
            f"({need / 2**30:,.1f} GiB to generate) but this machine has {free / 2**30:.1f} GiB free; "
            "give a smaller --shape"
        )


def _check_known(
    spec: ModelSpec, names: object, where: str, dims: Mapping[str, object] | None = None
) -> None:
    unknown = sorted(set(names) - set(spec.input_names))  # type: ignore[call-overload]
    if unknown:
        named = f"; its named dynamic dimensions are {', '.join(dims)}" if dims else ""
        raise InputError(
            f"{where} names {', '.join(map(repr, unknown))}, which the model does not take; "
            f"its inputs are {', '.join(spec.input_names)}{named}"
        )


def _npz_array(a: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """npz keeps ml_dtypes arrays (bfloat16, float8, int4, ...) as raw void bytes: type them back."""
    if a.dtype.kind == "V" and a.dtype.names is None and spec.dtype not in ("unknown", "object"):
        want = np_dtype(spec.dtype)
        if want.kind == "V" and want.itemsize == a.dtype.itemsize:  # never a plain number type
            return a.view(want)
    return a


def _check_value(spec: TensorSpec, value: Value, where: str) -> None:
    if spec.kind == "tensor" and not isinstance(value, np.ndarray):
        raise InputError(f"{where}: input {spec.name!r} is a {describe(value)}, the model expects a tensor")
    if spec.kind == "sequence" and not isinstance(value, list):
        raise InputError(f"{where}: input {spec.name!r} is a {describe(value)}, the model expects a sequence")
    if not isinstance(value, np.ndarray):
        return
    if spec.dtype != "unknown" and str(value.dtype) != spec.dtype:
        hint = (
            "save strings as np.array(values, dtype=str)"
            if spec.dtype == "object"
            else f"save it with .astype('{spec.dtype}')"
            if not spec.dtype.startswith(
                ("bfloat", "float8", "float4", "float6", "int4", "uint4", "int2", "uint2")
            )
            else f"save it with .astype(ml_dtypes.{spec.dtype})"
        )
        shown = "a string array" if value.dtype == object else value.dtype  # strings are kept as objects
        raise InputError(
            f"{where}: input {spec.name!r} is {shown}, the model expects "
            f"{'string' if spec.dtype == 'object' else spec.dtype}; {hint}"
        )
    _check_shape(spec, tuple(value.shape), where)


def load_feeds(path: str | os.PathLike[str], spec: ModelSpec) -> Feeds:
    """Feeds from an .npz file keyed by input name, or from a directory in ONNX's test-data
    layout (input_0.pb, input_1.pb, ...: TensorProto, SequenceProto, OptionalProto or MapProto,
    matched to the model's inputs by name, else by position)."""
    p = Path(path)
    if p.is_dir() and is_capture(p):
        return capture_feeds(captured_inputs(p), spec)
    if p.is_file() and p.suffix == ".xbv":
        values = _load_xbv(p, spec)
        source = str(p)
    elif p.is_dir():
        data_dir = test_data_dir(p)
        values = _load_pb_set(data_dir, "input", spec.inputs, f"--inputs {p}")
        source = str(data_dir)
    elif p.is_file():
        values = _load_npz(p, spec)
        source = str(p)
    else:
        raise InputError(
            f"--inputs not found: {p}; pass an .npz file, a directory of input_N.pb files, or a capture"
        )
    missing = [input_name for input_name in spec.input_names if input_name not in values]
    if missing:
        what = "input_N.pb files" if p.is_dir() else "arrays to the .npz"
        raise InputError(f"--inputs {p} lacks input(s) {', '.join(missing)}; add them as {what}")
    for i in spec.inputs:
        _check_value(i, values[i.name], f"--inputs {p}")
    return Feeds.from_arrays(values, None, source)


def capture_feeds(cap: CapturedInputs, spec: ModelSpec) -> Feeds:
    """A checked capture's inputs, with the seed and ranges it records."""
    values = _load_xbv(cap.path, spec)
    for i in spec.inputs:
        _check_value(i, values[i.name], f"--inputs {cap.folder}")
    return Feeds.from_arrays(values, cap.seed, f"capture {cap.folder}", cap.ranges)


def _load_xbv(path: Path, spec: ModelSpec) -> dict[str, Value]:
    try:
        with ValueFile(path) as value_file:
            values = value_file.load_all()
    except (OSError, ValueError, KeyError) as error:
        raise InputError(
            f"--inputs {path} is not a readable xbackend value file ({error}); capture it again"
        ) from error
    _check_known(spec, values.keys(), f"--inputs {path}")
    missing = [input_name for input_name in spec.input_names if input_name not in values]
    if missing:
        raise InputError(
            f"--inputs {path} lacks input(s) {', '.join(missing)}; it was made for another model"
        )
    return values


def _load_npz(path: Path, spec: ModelSpec) -> dict[str, Value]:
    by_name = {i.name: i for i in spec.inputs}

    def check(name: str, shape: tuple[int, ...], dtype: np.dtype[np.generic]) -> None:
        """Before any array is read: one the model does not take, or cannot take in that shape."""
        _check_known(spec, [name], f"--inputs {path}")
        _check_shape(by_name[name], shape, f"--inputs {path}")

    try:
        raw = read_npz(path, check)
    except NpzError as error:
        if "object array" in str(error):
            raise InputError(
                f"--inputs {path} holds an object array, which xbackend does not unpickle; save strings "
                "as np.array(values, dtype=str), or use --inputs DIR with input_N.pb files"
            ) from error
        raise InputError(f"--inputs {path}: {error}; save it with numpy.savez") from error
    except InputError:
        raise
    except Exception as error:  # a damaged archive: zipfile's and numpy's errors vary
        raise InputError(
            f"--inputs {path} is not a readable .npz ({type(error).__name__}); save it with numpy.savez"
        ) from error
    return {key: normalize(_npz_array(value, by_name[key])) for key, value in raw.items()}


def test_data_dir(path: Path) -> Path:
    """`path` itself when it holds input_N.pb files, else its first test_data_set_N."""
    if any(path.glob("input_*.pb")):
        return path
    sets = sorted(path.glob("test_data_set_*"), key=lambda path: _index(path.name))
    if sets and any(sets[0].glob("input_*.pb")):
        return sets[0]
    raise InputError(
        f"--inputs {path} holds no input_N.pb files (nor a test_data_set_N folder with them); "
        "write each input with onnx.numpy_helper.from_array(...).SerializeToString()"
    )


def _index(name: str) -> int:
    tail = name.rsplit("_", 1)[-1].split(".")[0]
    return int(tail) if tail.isdigit() else 1 << 30


def _parse_pb(data: bytes, spec: TensorSpec, folder: Path) -> tuple[str, Value]:
    """(name recorded in the proto, value) for one .pb file, read as the type `spec` declares;
    a tensor whose data lies in another file reads it from `folder` alone (onnx's helpers would
    read it from the working directory)."""
    proto, convert = _PB_KINDS.get(spec.kind, (onnx.TensorProto, numpy_helper.to_array))
    msg = proto.FromString(data)
    _inline_external(msg, folder)
    return msg.name, convert(msg)


_PB_KINDS: dict[str, tuple[Any, Any]] = {
    "sequence": (onnx.SequenceProto, numpy_helper.to_list),
    "optional": (onnx.OptionalProto, numpy_helper.to_optional),
    "map": (onnx.MapProto, numpy_helper.to_dict),
}


def _tensors_in(msg: Any) -> Iterator[onnx.TensorProto]:
    """Every TensorProto inside a test-data value, however nested."""
    if isinstance(msg, onnx.TensorProto):
        yield msg
    elif isinstance(msg, onnx.SequenceProto):
        for group in (msg.tensor_values, msg.sequence_values, msg.map_values, msg.optional_values):
            for m in group:
                yield from _tensors_in(m)
    elif isinstance(msg, onnx.MapProto):
        yield from _tensors_in(msg.values)
    elif isinstance(msg, onnx.OptionalProto):
        for field in ("tensor_value", "sequence_value", "map_value", "optional_value"):
            if msg.HasField(field):
                yield from _tensors_in(getattr(msg, field))


def _inline_external(msg: Any, folder: Path) -> None:
    """Each external tensor's bytes read into the proto, from a file inside `folder` (the links in
    it followed only while they stay inside; nothing outside is looked at)."""
    for initializer in _tensors_in(msg):
        if initializer.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in initializer.external_data}
        where = f"{folder}: tensor {initializer.name!r}'s external data"
        fix = "keep its data file in the same folder as the .pb file"
        path = contained(folder, info.get("location", ""), where, fix)
        if not path.is_file():
            raise InputError(
                f"{where} names {info.get('location', '')!r}, which is not a file in {folder}; {fix}"
            )
        read_external(initializer, folder)


def _read_pb(path: Path, f: Path, spec: TensorSpec, where: str) -> tuple[str, Value]:
    """One .pb file of folder `path` (never one a link leads to outside it), as `spec`'s type."""
    contained(path, f.name, f"{where}: {f.name}", "copy the file itself into the folder")
    if not f.is_file():
        raise InputError(f"{where}: {f.name} is not a file; write each value as a .pb file")
    try:
        return _parse_pb(f.read_bytes(), spec, path)
    except InputError:
        raise
    except Exception as error:
        raise InputError(
            f"{where}: {f.name} is not a readable {spec.type_str or 'TensorProto'} "
            f"({type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}); "
            "write it with onnx.numpy_helper (from_array, from_list, from_optional, from_dict)"
        ) from error


def _load_pb_set(path: Path, prefix: str, specs: Sequence[TensorSpec], where: str) -> dict[str, Value]:
    files = sorted(path.glob(f"{prefix}_*.pb"), key=lambda path: _index(path.name))
    by_name = {spec.name: spec for spec in specs}
    out: dict[str, Value] = {}
    for pos, file in enumerate(files):
        spec = specs[pos] if pos < len(specs) else None
        name, value = _read_pb(path, file, spec or TensorSpec(file.stem, "unknown", None), where)
        if name and name in by_name and (spec is None or name != spec.name):
            spec = by_name[name]
            name, value = _read_pb(path, file, spec, where)
        if spec is None:
            raise InputError(
                f"{where}: {file.name} has no matching model {prefix} (the model has {len(specs)}); remove it"
            )
        out[spec.name] = normalize(value)
    return out


def read_pb_tensors(path: Path, where: str) -> dict[str, Value]:
    """Every input_N.pb of folder `path` as a tensor, keyed by the name it records (else its file's
    stem), in file order: read as compare's --inputs reads them (files of the folder only, their
    external data from the folder alone)."""
    files = sorted(path.glob("input_*.pb"), key=lambda path: _index(path.name))
    if not files:
        raise InputError(
            f"{where}: no input_N.pb files in {path}; write each with onnx.numpy_helper.from_array"
        )
    out = {}
    for file in files:
        name, value = _read_pb(path, file, TensorSpec(file.stem, "unknown", None), where)
        out[name or file.stem] = value
    return out


def load_expected(path: str | os.PathLike[str], spec: ModelSpec) -> dict[str, Value] | None:
    """Expected outputs (output_N.pb) beside the inputs of an ONNX test-data directory, if any."""
    p = Path(path)
    if not p.is_dir() or is_capture(p):
        return None
    d = test_data_dir(p)
    if not any(d.glob("output_*.pb")):
        return None
    return _load_pb_set(d, "output", spec.outputs, f"--inputs {p}")
