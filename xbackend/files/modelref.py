"""What a runner is told about a model, and reading its file: no onnx import, so the worker
also runs in another interpreter that has only numpy and its engine (see xbackend.execution.foreign)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xbackend.errors import ModelLoadError
from xbackend.files.userfile import name_problem, os_problem

__all__ = ["ENGINE_DOMAINS", "KNOWN_DOMAINS", "ModelRef", "model_file", "np_dtype", "read_model_bytes"]

# Op domains some engine xbackend runs implements; a model-local function may define others.
# ai.onnx.preview (onnx 1.23's FlexAttention) runs on onnx's reference evaluator alone.
PREVIEW_DOMAIN = "ai.onnx.preview"
KNOWN_DOMAINS = frozenset(
    {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "com.microsoft", "com.microsoft.nchwc",
     "com.microsoft.experimental", "pkg.onnxscript.torch_lib", "pkg.onnxscript.torch_lib.common",
     PREVIEW_DOMAIN}
)  # fmt: skip
# What ONNX Runtime and OpenVINO implement: all but the preview domain.
ENGINE_DOMAINS = KNOWN_DOMAINS - {PREVIEW_DOMAIN}


@dataclass(frozen=True)
class ModelRef:
    """What a runner is told about the model it prepares, so it need not parse it again."""

    path: str
    ir_version: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    external_data: bool
    weight_bytes: int = 0  # for progress ("loading 3.1 GiB of weights"); 0: not known

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelRef:
        """The reference as to_dict wrote it."""
        return cls(
            str(d["path"]),
            int(d["ir_version"]),
            tuple(d["inputs"]),
            tuple(d["outputs"]),
            bool(d["external_data"]),
            int(d.get("weight_bytes", 0)),
        )


def np_dtype(name: str) -> np.dtype[np.generic]:
    """numpy dtype for a dtype name (ml_dtypes names included)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # optional: a foreign environment may lack ml_dtypes

        dt: np.dtype[np.generic] = np.dtype(getattr(ml_dtypes, name))
        return dt


def model_file(path: str | os.PathLike[str]) -> Path:
    """The model's path; ModelLoadError if it is missing or not a file."""
    p = Path(path)
    bad = name_problem(p)
    if bad:  # onnxruntime's bindings take UTF-8 paths alone; a report prints the name
        raise ModelLoadError(f"the model {str(p)!a} {bad}")
    try:
        os.stat(p)
    except FileNotFoundError:
        raise ModelLoadError(f"model file not found: {p}; check the path") from None
    except OSError as error:
        raise ModelLoadError(f"the model {p} {os_problem(error)}; check the path") from None
    if not p.is_file():
        raise ModelLoadError(f"{p} is not a file; pass the path of an .onnx model file")
    return p


def read_model_bytes(path: str | os.PathLike[str]) -> bytes:
    """The model file's bytes; ModelLoadError if it is missing or not a file."""
    p = model_file(path)
    try:
        return p.read_bytes()
    except OSError as error:
        raise ModelLoadError(f"cannot read {p}: {error.strerror}") from error
