"""Export a PyTorch module to ONNX, recording where it came from.

The exported model carries, in its metadata, the module spec, the torch
version, the input declarations and a verified map from module names to the
ONNX tensors that hold their outputs, so the `torch` runner can later run the
source module eagerly and line its layers up with the ONNX graph.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from xbackend.errors import ExportError
from xbackend.model import ModelRef, np_dtype
from xbackend.report.write import write_atomic_bytes

__all__ = [
    "META_INPUTS",
    "META_MODULE",
    "META_MODULE_OUTPUTS",
    "META_TORCH_VERSION",
    "ExportResult",
    "InputDecl",
    "export_torch",
    "load_module",
    "parse_dynamic",
    "read_torch_metadata",
]

META_SOURCE = "xbackend.source"
META_MODULE = "xbackend.torch.module"
META_TORCH_VERSION = "xbackend.torch.version"
META_INPUTS = "xbackend.torch.inputs"
META_MODULE_OUTPUTS = "xbackend.torch.module_outputs"
DEFAULT_OPSET = 18  # the lowest opset torch's exporter implements directly


@dataclass(frozen=True)
class InputDecl:
    """One example input: NAME=D1,D2,...[:DTYPE]."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @classmethod
    def parse(cls, text: str) -> InputDecl:
        name, sep, rest = text.partition("=")
        if not sep or not name:
            raise ExportError(
                f"--input expects NAME=D1,D2,...[:DTYPE] (e.g. x=1,16,64:float32), got {text!r}"
            )
        dims, _, dtype = rest.partition(":")
        try:
            shape = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError as e:
            raise ExportError(f"--input {text!r}: dimensions must be integers") from e
        dtype = dtype or "float32"
        try:
            np_dtype(dtype)
        except TypeError as e:
            raise ExportError(f"--input {text!r}: unknown dtype {dtype!r} (e.g. float32, int64, bool)") from e
        return cls(name, shape, dtype)

    def example(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng([seed, len(self.name), sum(map(ord, self.name))])
        dt = np_dtype(self.dtype)
        if dt == np.bool_:
            return rng.random(self.shape) < 0.5
        if np.issubdtype(dt, np.integer):
            return rng.integers(0, 16, size=self.shape).astype(dt)
        return rng.standard_normal(self.shape).astype(dt)


def parse_dynamic(items: Sequence[str]) -> dict[str, dict[int, str]]:
    """['x=0:batch', 'x=1:seq'] -> {'x': {0: 'batch', 1: 'seq'}}."""
    out: dict[str, dict[int, str]] = {}
    for text in items:
        name, sep, rest = text.partition("=")
        axis, colon, dim = rest.partition(":")
        if not sep or not colon or not axis.strip().isdigit() or not dim:
            raise ExportError(f"--dynamic expects NAME=AXIS:DIMNAME (e.g. x=0:batch), got {text!r}")
        out.setdefault(name, {})[int(axis)] = dim
    return out


@dataclass(frozen=True)
class ExportResult:
    """What was exported, and which module outputs map to which ONNX tensors."""

    path: str
    module_spec: str
    torch_version: str
    opset: int
    inputs: tuple[InputDecl, ...]
    outputs: tuple[str, ...]
    module_outputs: Mapping[str, str] = field(default_factory=dict)


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ExportError("torch is not installed; install it with: pip install 'xbackend[torch]'") from e
    return torch


def _factory(spec: str, base_dir: Path | None) -> Any:
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ExportError(f"module spec {spec!r} must be path/to/file.py:factory or package.module:factory")
    if target.endswith(".py"):
        candidates = (
            [Path(target)]
            if Path(target).is_absolute()
            else [*([base_dir / target] if base_dir else []), Path.cwd() / target]
        )
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            raise ExportError(
                f"module spec {spec!r}: file {target} not found (looked in "
                f"{', '.join(str(c.parent) for c in candidates)})"
            )
        mod_name = f"xbackend_user_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ExportError(f"module spec {spec!r}: cannot import {path}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:
            raise ExportError(
                f"module spec {spec!r}: importing {path} failed: {type(e).__name__}: {e}"
            ) from e
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:
            raise ExportError(f"module spec {spec!r}: cannot import {target}: {type(e).__name__}: {e}") from e
    if not hasattr(module, attr):
        raise ExportError(f"module spec {spec!r}: {target} has no attribute {attr!r}")
    return getattr(module, attr)


def load_module(spec: str, base_dir: Path | None = None) -> Any:
    """Call the factory named by `spec` and check it returns an nn.Module (in eval mode)."""
    torch = _torch()
    factory = _factory(spec, base_dir)
    try:
        module = factory() if callable(factory) and not isinstance(factory, torch.nn.Module) else factory
    except Exception as e:
        raise ExportError(f"module spec {spec!r}: the factory raised {type(e).__name__}: {e}") from e
    if not isinstance(module, torch.nn.Module):
        raise ExportError(
            f"module spec {spec!r} returned {type(module).__name__}, expected a torch.nn.Module"
        )
    return module.eval()


def _stored_spec(spec: str, output: Path) -> str:
    """File specs are stored relative to the model's directory when the file lies under it."""
    target, _, attr = spec.rpartition(":")
    if not target.endswith(".py"):
        return spec
    path = Path(target).resolve()
    try:
        return f"{path.relative_to(output.resolve().parent)}:{attr}"
    except ValueError:
        return f"{path}:{attr}"


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """torch.onnx logs registry warnings (e.g. torchvision missing) that are not the user's business."""
    log = logging.getLogger("torch.onnx")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old)


def _scope_outputs(program: Any) -> dict[str, str]:
    """Module name -> output of the last node the exporter attributed to that module."""
    last: dict[str, str] = {}
    for node in program.model.graph:
        raw = node.metadata_props.get("pkg.torch.onnx.name_scopes")
        if not raw or not node.outputs:
            continue
        try:
            scopes = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
        for scope in scopes[1:-1]:  # [root, modules..., fx node]
            last[scope] = node.outputs[0].name
    # A tensor reached by several nested modules belongs to the innermost one.
    by_tensor: dict[str, str] = {}
    for module_name, tensor in last.items():
        if tensor not in by_tensor or len(module_name) > len(by_tensor[tensor]):
            by_tensor[tensor] = module_name
    return {m: t for t, m in by_tensor.items()}


def _hooked_outputs(module: Any, names: set[str], args: tuple[Any, ...]) -> dict[str, np.ndarray]:
    torch = _torch()
    captured: dict[str, np.ndarray] = {}
    handles = []
    for name, sub in module.named_modules():
        if name in names:

            def hook(_m: Any, _i: Any, out: Any, name: str = name) -> None:
                if isinstance(out, torch.Tensor):
                    captured[name] = out.detach().cpu().numpy().copy()

            handles.append(sub.register_forward_hook(hook))
    try:
        with torch.no_grad():
            module(*args)
    finally:
        for h in handles:
            h.remove()
    return captured


def _verify(
    path: Path,
    ir_version: int,
    candidates: dict[str, str],
    module: Any,
    inputs: Sequence[InputDecl],
    examples: dict[str, np.ndarray],
    outputs: Sequence[str],
) -> dict[str, str]:
    """Keep only the module -> tensor pairs whose values agree when both are computed."""
    from xbackend.runners.ort_cpu import OrtCpuRunner

    torch = _torch()
    args = tuple(torch.from_numpy(examples[i.name]) for i in inputs)
    eager = _hooked_outputs(module, set(candidates), args)
    runner = OrtCpuRunner({"threads": "1"})
    runner.prepare(
        ModelRef(str(path), ir_version, tuple(i.name for i in inputs), tuple(outputs), False),
        sorted(set(candidates.values())),
    )
    onnx_vals = runner.run(examples)
    runner.close()
    kept = {}
    for mod, tensor in candidates.items():
        a, b = eager.get(mod), onnx_vals.get(tensor)
        if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
            continue
        scale = float(np.abs(b).max()) if b.size and b.dtype.kind == "f" else 1.0
        if b.dtype.kind != "f" or np.allclose(a, b, rtol=1e-3, atol=1e-4 * max(scale, 1e-6)):
            kept[mod] = tensor
    return dict(sorted(kept.items()))


def export_torch(
    spec: str,
    inputs: Sequence[InputDecl],
    output: str | os.PathLike[str],
    *,
    opset: int = DEFAULT_OPSET,
    dynamic: Mapping[str, Mapping[int, str]] | None = None,
    seed: int = 0,
    output_names: Sequence[str] = (),
) -> ExportResult:
    """Export the module built by `spec` to `output`; ExportError with a one-line reason on failure."""
    torch = _torch()
    if not inputs:
        raise ExportError("give at least one --input NAME=D1,D2,...[:DTYPE]")
    out_path = Path(output)
    module = load_module(spec)
    examples = {i.name: i.example(seed) for i in inputs}
    args = tuple(torch.from_numpy(examples[i.name]) for i in inputs)
    with warnings.catch_warnings(), _quiet_torch_logs():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                module,
                args,
                input_names=[i.name for i in inputs],
                opset_version=opset,
                dynamo=True,
                output_names=list(output_names) or None,
                dynamic_axes={k: dict(v) for k, v in (dynamic or {}).items()} or None,
                verbose=False,
            )
        except Exception as e:
            text = " ".join(str(e).split())[:400]
            raise ExportError(f"torch.onnx.export failed for {spec!r}: {type(e).__name__}: {text}") from e
    candidates = _scope_outputs(program)
    with tempfile.TemporaryDirectory(prefix="xbackend-export-") as tmp:
        raw = Path(tmp) / "model.onnx"
        program.save(str(raw), external_data=False)
        proto = onnx.load(str(raw))
        outputs = tuple(o.name for o in proto.graph.output)
        candidates = {m: t for m, t in candidates.items() if t not in outputs}
        mapped = _verify(raw, proto.ir_version, candidates, module, inputs, examples, outputs)
    stored = _stored_spec(spec, out_path)
    meta = {
        META_SOURCE: "torch",
        META_MODULE: stored,
        META_TORCH_VERSION: str(torch.__version__),
        META_INPUTS: json.dumps([{"name": i.name, "shape": list(i.shape), "dtype": i.dtype} for i in inputs]),
        META_MODULE_OUTPUTS: json.dumps(mapped, sort_keys=True),
    }
    onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props}, **meta})
    write_atomic_bytes(out_path, proto.SerializeToString())
    return ExportResult(str(out_path), stored, str(torch.__version__), opset, tuple(inputs), outputs, mapped)


def read_torch_metadata(proto: onnx.ModelProto) -> dict[str, str]:
    """The xbackend.* metadata an export wrote (empty for other models)."""
    return {p.key: p.value for p in proto.metadata_props if p.key.startswith("xbackend.")}
