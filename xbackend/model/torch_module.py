"""A PyTorch module as a model's source: its factory loaded, its tensors converted, and what an
export recorded of it in the ONNX model's metadata.

The runners that run the source module (torch, torch.compile, ExecuTorch) and the exporter
both read it; nothing here runs an engine."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx.numpy_helper

from xbackend.errors import ExportError, InputError
from xbackend.files.untrusted import contained

__all__ = [
    "META_INPUTS",
    "META_MODULE",
    "META_MODULE_OUTPUTS",
    "META_SOURCE",
    "META_TORCH_VERSION",
    "flatten_outputs",
    "import_torch",
    "load_module",
    "module_map",
    "output_names_of",
    "read_torch_metadata",
    "spec_from_cwd",
    "to_numpy",
    "to_tensor",
    "trusted_spec",
]

# what an export records in the model's metadata
META_SOURCE = "xbackend.source"
META_MODULE = "xbackend.torch.module"
META_TORCH_VERSION = "xbackend.torch.version"
META_INPUTS = "xbackend.torch.inputs"
META_MODULE_OUTPUTS = "xbackend.torch.module_outputs"


def import_torch() -> Any:
    """torch, or an ExportError that says how to install it."""
    try:
        import torch  # heavy: torch
    except ImportError as error:
        raise ExportError("torch is not installed; install it with: pip install 'xbackend[torch]'") from error
    return torch


def _factory(spec: str, base_dir: Path | None, search_cwd: bool = True) -> Any:
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ExportError(f"module spec {spec!r} must be path/to/file.py:factory or package.module:factory")
    if target.endswith(".py"):
        candidates = (
            [Path(target)]
            if Path(target).is_absolute()
            else [*([base_dir / target] if base_dir else []), *([Path.cwd() / target] if search_cwd else [])]
        )
        path = next((candidate for candidate in candidates if candidate.is_file()), None)
        if path is None:
            raise ExportError(
                f"module spec {spec!r}: file {target} not found (looked in "
                f"{', '.join(str(candidate.parent) for candidate in candidates)})"
            )
        mod_name = f"xbackend_user_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ExportError(f"module spec {spec!r}: cannot import {path}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as error:
            raise ExportError(
                f"module spec {spec!r}: importing {path} failed: {type(error).__name__}: {error}"
            ) from error
    else:
        try:
            module = importlib.import_module(target)
        except Exception as error:
            raise ExportError(
                f"module spec {spec!r}: cannot import {target}: {type(error).__name__}: {error}"
            ) from error
    if not hasattr(module, attr):
        raise ExportError(f"module spec {spec!r}: {target} has no attribute {attr!r}")
    return getattr(module, attr)


# Types numpy holds through ml_dtypes and torch natively: they cross as raw bits.
_BIT_TYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def to_tensor(a: np.ndarray) -> Any:
    """A torch tensor holding a copy of `a`, bfloat16 and float8 included."""
    torch = import_torch()
    if a.dtype.name in _BIT_TYPES:
        bits = np.array(a, copy=True).view(np.int16 if a.dtype.itemsize == 2 else np.int8)
        return torch.from_numpy(bits).view(getattr(torch, a.dtype.name))
    return torch.from_numpy(np.array(a, copy=True))


def to_numpy(t: Any) -> np.ndarray:
    """A host copy of tensor `t`, bfloat16 and float8 as ml_dtypes arrays."""
    torch = import_torch()
    t = t.detach().cpu()
    name = str(t.dtype).removeprefix("torch.")
    if name in _BIT_TYPES:
        bits = t.view(torch.int16 if t.element_size() == 2 else torch.int8).numpy()
        return np.array(bits.view(getattr(ml_dtypes, name)), copy=True)
    return np.array(t.numpy(), copy=True)


def trusted_spec(recorded: str, model: Path) -> str:
    """The source module `model` records, where --trust-model-code may run it: a Python file in
    the model's own folder and a factory name. Anything else (a dotted module, an absolute path,
    `..`, a link out) is an InputError, one line, saying how to pass it with --torch-module."""
    target, _, attr = recorded.rpartition(":")
    shown = repr(recorded[:120])
    fix = f"pass it yourself with --torch-module {spec_from_cwd(recorded, model)} once you trust that code"
    if not target.endswith(".py") or not attr.isidentifier():
        raise InputError(
            f"{model}: the model records its source module {shown}, not a Python file beside it with a "
            f"factory name; --trust-model-code runs only a file in the model's own folder: {fix}"
        )
    contained(
        model.parent,
        target,
        f"{model}: the model's source module",
        f"--trust-model-code runs only a file in the model's own folder: {fix}",
    )
    return recorded


def spec_from_cwd(recorded: str, model: Path) -> str:
    """`recorded` (a file path relative to the model) as a path that works from the working folder."""
    target, _, attr = recorded.rpartition(":")
    if not target.endswith(".py") or Path(target).is_absolute():
        return shlex.quote(recorded)
    path = (model.parent / target).resolve()
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd().resolve())
    return shlex.quote(f"{path}:{attr}")


def load_module(spec: str, base_dir: Path | None = None, search_cwd: bool = True) -> Any:
    """Call the factory named by `spec` and check it returns an nn.Module (in eval mode).

    A file spec is looked up in `base_dir` (and the working directory when `search_cwd`)."""
    torch = import_torch()
    factory = _factory(spec, base_dir, search_cwd)
    try:
        module = factory() if callable(factory) and not isinstance(factory, torch.nn.Module) else factory
    except Exception as error:
        raise ExportError(
            f"module spec {spec!r}: the factory raised {type(error).__name__}: {error}"
        ) from error
    if not isinstance(module, torch.nn.Module):
        raise ExportError(
            f"module spec {spec!r} returned {type(module).__name__}, expected a torch.nn.Module"
        )
    return module.eval()


def flatten_outputs(out: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(path, leaf) for a module's output in the order torch's exporter flattens it: tensors,
    tuples and lists in order, dicts and model-output dataclasses by their keys (None skipped)."""
    if out is None:
        return []
    if isinstance(out, Mapping):  # dicts and HuggingFace ModelOutput (an OrderedDict)
        items = [(str(key), value) for key, value in out.items()]
    elif isinstance(out, list | tuple) and not hasattr(out, "_fields"):
        items = [(str(index), v) for index, v in enumerate(out)]
    elif hasattr(out, "_fields"):  # namedtuple
        items = [(str(field), getattr(out, field)) for field in out._fields]
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        items = [(field.name, getattr(out, field.name)) for field in dataclasses.fields(out)]
    else:
        return [(prefix, out)]
    return [leaf for k, v in items for leaf in flatten_outputs(v, f"{prefix}.{k}" if prefix else k)]


def output_names_of(out: Any) -> list[str]:
    """Graph output names a module's output structure suggests: dict keys (nested with '.'); none
    for a plain tensor or tuple, where the exporter's names stay."""
    if not _has_keys(out):
        return []
    return [path for path, _ in flatten_outputs(out)]


def _has_keys(out: Any) -> bool:
    if isinstance(out, Mapping) or hasattr(out, "_fields"):
        return True
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return True
    if isinstance(out, list | tuple):
        return any(_has_keys(v) for v in out)
    return False


def module_map(metadata: Mapping[str, str], given: str, model_dir: Path) -> dict[str, str]:
    """The export's verified module -> tensor map, when the module in use is the one recorded:
    `given` (--torch-module, relative to the working directory) empty or naming the same file
    and factory as the recorded spec (relative to the model's folder)."""
    recorded = metadata.get(META_MODULE, "")
    if not recorded or (given and _canonical(given, Path.cwd()) != _canonical(recorded, model_dir)):
        return {}
    try:
        mapped = json.loads(metadata.get(META_MODULE_OUTPUTS, "{}"))
    except ValueError:
        return {}
    return {str(key): str(value) for key, value in mapped.items()} if isinstance(mapped, dict) else {}


def _canonical(spec: str, base: Path) -> str:
    target, _, attr = spec.rpartition(":")
    if not target.endswith(".py"):
        return spec
    path = Path(target) if Path(target).is_absolute() else base / target
    return f"{path.resolve()}:{attr}"


def read_torch_metadata(proto: onnx.ModelProto) -> dict[str, str]:
    """The xbackend.* metadata an export wrote (empty for other models)."""
    return {prop.key: prop.value for prop in proto.metadata_props if prop.key.startswith("xbackend.")}
