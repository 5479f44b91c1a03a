"""Export a PyTorch module to ONNX, recording where it came from.

The exported model carries, in its metadata, the module spec, the torch
version, the input declarations and a verified map from module names to the
ONNX tensors that hold their outputs, so the `torch` runner can later run the
source module eagerly and line its layers up with the ONNX graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import shlex
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx.numpy_helper

from xbackend.errors import ExportError, InputError, XbackendError, first_line
from xbackend.export.example_inputs import InputDecl, parse_dynamic, read_examples, with_data
from xbackend.export.failures import cut_words, root_cause, static_peers
from xbackend.export.scopes import NAME_SCOPES, last_in_scope
from xbackend.files.atomic import write_atomic_bytes
from xbackend.files.runfolders import run_temp_folder
from xbackend.files.untrusted import contained
from xbackend.model.extdata import adopt_external, uses_external_data
from xbackend.model.inputs import META_RANGES
from xbackend.model.load import ModelRef, load_proto
from xbackend.numerics.metrics import is_float_dtype
from xbackend.runners.ort_cpu import OrtCpuRunner
from xbackend.runners.reference import ReferenceRunner

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
    "read_examples",
    "read_torch_metadata",
    "spec_from_cwd",
    "trusted_spec",
]

META_SOURCE = "xbackend.source"
META_MODULE = "xbackend.torch.module"
META_TORCH_VERSION = "xbackend.torch.version"
META_INPUTS = "xbackend.torch.inputs"
META_MODULE_OUTPUTS = "xbackend.torch.module_outputs"
DEFAULT_OPSET = 18  # the lowest opset torch's exporter implements directly


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
        import torch  # heavy: torch
    except ImportError as e:
        raise ExportError("torch is not installed; install it with: pip install 'xbackend[torch]'") from e
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


# Types numpy holds through ml_dtypes and torch natively: they cross as raw bits.
_BIT_TYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def to_tensor(a: np.ndarray) -> Any:
    """A torch tensor holding a copy of `a`, bfloat16 and float8 included."""
    torch = _torch()
    if a.dtype.name in _BIT_TYPES:
        bits = np.array(a, copy=True).view(np.int16 if a.dtype.itemsize == 2 else np.int8)
        return torch.from_numpy(bits).view(getattr(torch, a.dtype.name))
    return torch.from_numpy(np.array(a, copy=True))


def to_numpy(t: Any) -> np.ndarray:
    """A host copy of tensor `t`, bfloat16 and float8 as ml_dtypes arrays."""
    torch = _torch()
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
    torch = _torch()
    factory = _factory(spec, base_dir, search_cwd)
    try:
        module = factory() if callable(factory) and not isinstance(factory, torch.nn.Module) else factory
    except Exception as e:
        raise ExportError(f"module spec {spec!r}: the factory raised {type(e).__name__}: {e}") from e
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
        items = [(str(k), v) for k, v in out.items()]
    elif isinstance(out, list | tuple) and not hasattr(out, "_fields"):
        items = [(str(i), v) for i, v in enumerate(out)]
    elif hasattr(out, "_fields"):  # namedtuple
        items = [(str(k), getattr(out, k)) for k in out._fields]
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        items = [(f.name, getattr(out, f.name)) for f in dataclasses.fields(out)]
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
    return last_in_scope(
        (node.metadata_props.get(NAME_SCOPES), node.outputs[0].name)
        for node in program.model.graph
        if node.outputs
    )


def _hooked_outputs(module: Any, names: set[str], args: tuple[Any, ...]) -> dict[str, np.ndarray]:
    torch = _torch()
    captured: dict[str, np.ndarray] = {}
    handles = []
    for name, sub in module.named_modules():
        if name in names:

            def hook(_m: Any, _i: Any, out: Any, name: str = name) -> None:
                if isinstance(out, torch.Tensor):
                    captured[name] = to_numpy(out)

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
    proto: onnx.ModelProto,
    candidates: dict[str, str],
    module: Any,
    inputs: Sequence[InputDecl],
    examples: dict[str, np.ndarray],
    outputs: Sequence[str],
) -> dict[str, str]:
    """Keep only the module -> tensor pairs whose values agree when both are computed: ONNX
    Runtime computes the ONNX side, or ONNX's reference evaluator where ONNX Runtime has no
    kernel (bfloat16 Gemm on CPU)."""

    if not candidates:
        return {}
    args = tuple(to_tensor(examples[i.name]) for i in inputs)
    eager = _hooked_outputs(module, set(candidates), args)
    ref = ModelRef(
        str(path), proto.ir_version, tuple(i.name for i in inputs), tuple(outputs), uses_external_data(proto)
    )
    onnx_vals: Mapping[str, Any] = {}
    for runner in (OrtCpuRunner({"threads": "1"}), ReferenceRunner()):
        try:
            runner.prepare(ref, sorted(set(candidates.values())))
            onnx_vals = runner.run(examples)
            break
        except XbackendError:
            continue
        finally:
            runner.close()
    kept = {}
    for mod, tensor in candidates.items():
        a, b = eager.get(mod), onnx_vals.get(tensor)
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            continue
        if not is_float_dtype(b.dtype):
            if np.array_equal(a, b):
                kept[mod] = tensor
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        scale = float(np.abs(b64).max()) if b.size else 1.0
        tol = max(1e-3, float(ml_dtypes.finfo(b.dtype).eps) * 8)  # type: ignore[no-untyped-call]  # bfloat16 rounds at 4e-3
        if np.allclose(a64, b64, rtol=tol, atol=tol * 0.1 * max(scale, 1e-6)):
            kept[mod] = tensor
    return dict(sorted(kept.items()))


def _check_dynamic(
    proto: onnx.ModelProto,
    path: Path,
    dynamic: Mapping[str, Mapping[int, str]],
    inputs: Sequence[InputDecl],
    seed: int,
    ranges: Mapping[str, tuple[float, float]],
    examples: Mapping[str, np.ndarray],
) -> None:
    """Every --dynamic axis is symbolic in the exported model and really takes another size."""
    if not dynamic:
        return
    by_name = {vi.name: vi for vi in proto.graph.input}
    for name, axes in dynamic.items():
        if name not in by_name:
            raise ExportError(
                f"--dynamic names {name!r}, which is not an --input; inputs: "
                f"{', '.join(i.name for i in inputs)}"
            )
        dims = by_name[name].type.tensor_type.shape.dim
        for axis in axes:
            if axis >= len(dims) or not dims[axis].HasField("dim_param"):
                fixed = dims[axis].dim_value if axis < len(dims) else "absent"
                raise ExportError(
                    f"the exporter fixed axis {axis} of {name!r} to {fixed} although --dynamic {name}={axis}:"
                    f"{axes[axis]} asked for it dynamic (the module specializes on that size); give an "
                    "example size >= 2 on that axis in --input, or make the module size-agnostic"
                )
    _run_resized(path, proto, dynamic, inputs, seed, ranges, examples)


def _run_resized(
    path: Path,
    proto: onnx.ModelProto,
    dynamic: Mapping[str, Mapping[int, str]],
    inputs: Sequence[InputDecl],
    seed: int,
    ranges: Mapping[str, tuple[float, float]],
    examples: Mapping[str, np.ndarray],
) -> None:
    """Run the exported model with every dynamic axis one larger: a size baked into the graph
    (a Reshape to a literal batch) fails here, not on a user's first real batch. Values come
    from the same ranges as the examples (real examples: their own span)."""
    feeds = {}
    for i in inputs:
        shape = list(i.shape)
        for axis in dynamic.get(i.name, {}):
            shape[axis] += 1
        lo_hi = ranges.get(i.name)
        a = examples[i.name]
        if i.given and a.dtype.kind in "iu" and a.size:
            lo_hi = (float(a.min()), float(a.max()) + 1)
        feeds[i.name] = InputDecl(i.name, tuple(shape), i.dtype).example(seed, lo_hi)
    runner = OrtCpuRunner({"threads": "1"})
    outputs = tuple(o.name for o in proto.graph.output)
    try:
        ref = ModelRef(str(path), proto.ir_version, tuple(feeds), outputs, uses_external_data(proto))
        runner.prepare(ref, outputs)
        runner.run(feeds)
    except Exception as e:
        axes = ", ".join(f"{n}={a}:{d}" for n, ax in dynamic.items() for a, d in ax.items())
        raise ExportError(
            f"the exported model declares --dynamic {axes} but fails at another size "
            f"({' '.join(str(e).split())[:200]}); the module bakes that size into the graph"
        ) from e
    finally:
        runner.close()


def _culprit(module: Any, inputs: Sequence[InputDecl], examples: Mapping[str, np.ndarray]) -> str | None:
    """The generated integer input whose values the module rejects: the first that, set to 0,
    lets forward run (an index past an embedding table, most often)."""
    torch = _torch()
    for i in inputs:
        a = examples[i.name]
        if i.given or a.dtype.kind not in "iu":
            continue
        trial = {**examples, i.name: np.zeros_like(a)}
        try:
            with torch.no_grad():
                module(*(to_tensor(trial[x.name]) for x in inputs))
        except Exception:
            continue
        return i.name
    return None


def export_torch(*args: Any, **kwargs: Any) -> ExportResult:
    """Export the module built by `spec` to `output` (see _export_torch). Inductor's cache, which
    torch's exporter writes to $TMPDIR/torchinductor_USER, goes into a run folder of ours and
    leaves with it (unless TORCHINDUCTOR_CACHE_DIR says where the user keeps it)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") is not None:
        return _export_torch(*args, **kwargs)
    with run_temp_folder("xbackend-export-") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")
        try:
            return _export_torch(*args, **kwargs)
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


def _export_torch(
    spec: str,
    inputs: Sequence[InputDecl],
    output: str | os.PathLike[str],
    *,
    opset: int = DEFAULT_OPSET,
    dynamic: Mapping[str, Mapping[int, str]] | None = None,
    seed: int = 0,
    output_names: Sequence[str] = (),
    ranges: Mapping[str, tuple[float, float]] | None = None,
    data: Mapping[str, np.ndarray] | None = None,
) -> ExportResult:
    """Export the module built by `spec` to `output`; ExportError with a one-line reason on failure.

    `data` holds real example inputs (--inputs); `inputs` declares the rest (or orders them)."""
    torch = _torch()
    ranges = dict(ranges or {})
    data = dict(data or {})
    module = load_module(spec)
    inputs = with_data(list(inputs), data, module)
    if not inputs:
        raise ExportError("give at least one --input NAME=D1,D2,...[:DTYPE], or real ones with --inputs")
    unknown = sorted(set(ranges) - {i.name for i in inputs})
    if unknown:
        raise ExportError(
            f"--range names {', '.join(unknown)}, which is not an input (inputs: "
            f"{', '.join(i.name for i in inputs)})"
        )
    out_path = Path(output)
    examples = {i.name: data[i.name] if i.given else i.example(seed, ranges.get(i.name)) for i in inputs}
    args = tuple(to_tensor(examples[i.name]) for i in inputs)
    try:
        with torch.no_grad():
            result = module(*args)
    except Exception as e:
        culprit = _culprit(module, inputs, examples)
        if culprit is not None:
            i = next(x for x in inputs if x.name == culprit)
            raise ExportError(
                f"the module's forward failed on input {i.describe(ranges.get(culprit))} "
                f"({type(e).__name__}: {first_line(e)[:160]}) and runs with {culprit} at 0: give it "
                f"its valid values with --range {culprit}=LO:HI, or real ones with --inputs FILE.npz"
            ) from e
        fed = ", ".join(i.describe(ranges.get(i.name)) for i in inputs)
        raise ExportError(
            f"the module's forward failed on the example inputs {fed}: {type(e).__name__}: "
            f"{first_line(e)[:200]}; give integer inputs their valid values with --range NAME=LO:HI "
            "(e.g. token_type_ids=0:2), or real ones with --inputs FILE.npz"
        ) from e
    if not output_names:
        output_names = output_names_of(result)
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
            cause = root_cause(e)
            text = cut_words(str(cause), 400)
            peers = static_peers(inputs, dynamic or {})
            hint = ""
            if peers:  # torch.export specializes a size an input shares with a static one
                hint = (
                    f" (the inputs share the sizes --dynamic names, and the others stay static, so "
                    f"torch fixes them: name theirs too, {' '.join(peers)})"
                )
            elif dynamic:
                axes = " ".join(f"--dynamic {n}={a}:{d}" for n, ax in dynamic.items() for a, d in ax.items())
                hint = (
                    f" (asked for {axes}: the module fixes that size somewhere; make it size-agnostic "
                    "or export without --dynamic)"
                )
            raise ExportError(
                f"torch.onnx.export failed for {spec!r}{hint}: {type(cause).__name__}: {text}"
            ) from e
    candidates = _scope_outputs(program)
    stored = _stored_spec(spec, out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # Beside the output, so that weights past 2 GiB (saved by torch as external data, since one
    # proto cannot hold them) move into place by rename, never through memory.
    with tempfile.TemporaryDirectory(prefix=".xbackend-export-", dir=out_path.parent) as tmp:
        raw = Path(tmp) / "model.onnx"
        program.save(str(raw))
        proto = load_proto(raw, load_external=False)
        outputs = tuple(o.name for o in proto.graph.output)
        _check_dynamic(proto, raw, dynamic or {}, inputs, seed, ranges, examples)
        candidates = {m: t for m, t in candidates.items() if t not in outputs}
        mapped = _verify(raw, proto, candidates, module, inputs, examples, outputs)
        meta = {
            META_SOURCE: "torch",
            META_MODULE: stored,
            META_TORCH_VERSION: str(torch.__version__),
            META_INPUTS: json.dumps(
                [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype} for i in inputs]
            ),
            META_MODULE_OUTPUTS: json.dumps(mapped, sort_keys=True),
        }
        if ranges:  # compare draws these inputs from the same ranges
            meta[META_RANGES] = json.dumps({k: [lo, hi] for k, (lo, hi) in sorted(ranges.items())})
        onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props}, **meta})
        adopt_external(proto, Path(tmp), out_path)
        write_atomic_bytes(out_path, proto.SerializeToString())
    return ExportResult(str(out_path), stored, str(torch.__version__), opset, tuple(inputs), outputs, mapped)


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
    return {str(m): str(t) for m, t in mapped.items()} if isinstance(mapped, dict) else {}


def _canonical(spec: str, base: Path) -> str:
    target, _, attr = spec.rpartition(":")
    if not target.endswith(".py"):
        return spec
    path = Path(target) if Path(target).is_absolute() else base / target
    return f"{path.resolve()}:{attr}"


def read_torch_metadata(proto: onnx.ModelProto) -> dict[str, str]:
    """The xbackend.* metadata an export wrote (empty for other models)."""
    return {p.key: p.value for p in proto.metadata_props if p.key.startswith("xbackend.")}
