"""Example inputs for `xbackend export torch`: declared shapes, seeded data drawn from --range,
or real data from --inputs; and --dynamic axes."""

from __future__ import annotations

import inspect
import math
import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xbackend.errors import ExportError, InputError
from xbackend.files.npz import NpzError, read_npz
from xbackend.model.inputs import read_pb_tensors
from xbackend.model.load import np_dtype

__all__ = ["EXAMPLE_INT_RANGE", "InputDecl", "parse_dynamic", "read_examples", "with_data"]


@dataclass(frozen=True)
class InputDecl:
    """One example input: NAME=D1,D2,...[:DTYPE]."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    given: bool = False  # shape and dtype come from real example data (--inputs)

    @classmethod
    def parse(cls, text: str, data: Mapping[str, np.ndarray] | None = None) -> InputDecl:
        """An input from `NAME=D1,D2,...[:DTYPE]`, or NAME alone where `data` (--inputs) holds it; an
        ExportError that shows the form."""
        name, sep, rest = text.partition("=")
        if not sep and name and data is not None and name in data:  # NAME alone: --inputs has it
            return cls.of(name, data[name])
        if not sep or not name:
            raise ExportError(
                f"--input expects NAME=D1,D2,...[:DTYPE] (e.g. x=1,16,64:float32), got {text!r}"
                + ("; NAME alone takes the shape from --inputs" if data is not None else "")
            )
        dims, _, dtype = rest.partition(":")
        try:
            shape = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError as error:
            raise ExportError(f"--input {text!r}: dimensions must be integers") from error
        dtype = dtype or "float32"
        try:
            np_dtype(dtype)
        except TypeError as error:
            raise ExportError(
                f"--input {text!r}: unknown dtype {dtype!r} (e.g. float32, int64, bool)"
            ) from error
        if data is not None and name in data:
            raise ExportError(f"--input {text!r}: {name} is in --inputs too; give it once")
        return cls(name, shape, dtype)

    @classmethod
    def of(cls, name: str, value: np.ndarray) -> InputDecl:
        """The input `name` as the given array is (its shape and dtype)."""
        return cls(name, tuple(int(size) for size in value.shape), str(value.dtype), given=True)

    def example(self, seed: int, lo_hi: tuple[float, float] | None = None) -> np.ndarray:
        """Seeded example data: integers from [0, 16) and floats standard normal, or uniform
        in `lo_hi` (--range)."""
        rng = np.random.default_rng([seed, len(self.name), sum(map(ord, self.name))])
        dt = np_dtype(self.dtype)
        if dt == np.bool_:
            return rng.random(self.shape) < 0.5
        lo, hi = lo_hi or EXAMPLE_INT_RANGE
        if np.issubdtype(dt, np.integer):
            return rng.integers(math.ceil(lo), math.ceil(hi), size=self.shape).astype(dt)
        if lo_hi is not None:
            return rng.uniform(lo, hi, size=self.shape).astype(dt)
        return rng.standard_normal(self.shape).astype(dt)

    def describe(self, lo_hi: tuple[float, float] | None) -> str:
        """The input as the export's summary names it (where its values come from, an integer range)."""
        if self.given:
            return f"{self.name} (from --inputs)"
        if np.issubdtype(np_dtype(self.dtype), np.integer):
            lo, hi = lo_hi or EXAMPLE_INT_RANGE
            return f"{self.name} (integers in [{lo:g}, {hi:g}))"
        return self.name


EXAMPLE_INT_RANGE = (0.0, 16.0)


def read_examples(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Real example inputs: an .npz keyed by input name, or a directory of input_N.pb
    TensorProtos (ONNX's test-data layout), in the file's order."""
    p = Path(path)  # compare's readers: one per format
    try:
        if p.is_dir():
            return {
                key: np.asarray(read_pb_tensor)
                for key, read_pb_tensor in read_pb_tensors(p, f"--inputs {p}").items()
            }
        return read_npz(p)
    except InputError as error:
        raise ExportError(str(error)) from error
    except NpzError as error:
        raise ExportError(f"--inputs {p}: {error}; save it with numpy.savez") from error
    except (OSError, ValueError, zipfile.BadZipFile, NotImplementedError, RuntimeError) as error:
        raise ExportError(
            f"--inputs {p}: cannot read it ({type(error).__name__}: {error}); pass an .npz keyed by input "
            "name or a folder of input_N.pb"
        ) from error


def with_data(inputs: list[InputDecl], data: Mapping[str, np.ndarray], module: Any) -> list[InputDecl]:
    """Declared inputs plus those only --inputs holds, in forward()'s parameter order where the
    declarations do not give one."""
    if not data:
        return inputs
    named = {i.name for i in inputs}
    rest = [n for n in data if n not in named]
    if inputs:
        if rest:
            raise ExportError(
                f"--inputs holds {', '.join(rest)}, which no --input names; list every input with "
                "--input NAME (in forward() order), or leave --input out"
            )
        return inputs
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = []
    order = [param for param in params if param in data] + [n for n in data if n not in params]
    return [InputDecl.of(n, np.asarray(data[n])) for n in order]


def parse_dynamic(items: Sequence[str]) -> dict[str, dict[int, str]]:
    """['x=0:batch', 'x=1:seq'] -> {'x': {0: 'batch', 1: 'seq'}}."""
    out: dict[str, dict[int, str]] = {}
    for text in items:
        name, sep, rest = text.partition("=")
        axis, colon, dim = rest.partition(":")
        if not sep or not colon or not axis.strip().isdigit() or not dim:
            raise ExportError(f"--dynamic expects NAME=AXIS:DIMNAME (e.g. x=0:batch), got {text!r}")
        if not dim.isidentifier():
            hint = ""
            if "," in rest:  # x=0:batch,1:seq: one --dynamic per axis
                hint = "; one axis per --dynamic: " + " ".join(
                    f"--dynamic {name}={part}" for part in rest.split(",") if part
                )
            raise ExportError(
                f"--dynamic {text!r}: the dimension name {dim!r} must be an identifier (letters, digits "
                f"and _, e.g. x=0:batch){hint}"
            )
        out.setdefault(name, {})[int(axis)] = dim
    return out
