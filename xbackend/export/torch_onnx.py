"""Export a PyTorch module to ONNX, recording where it came from.

The exported model carries, in its metadata, the module spec, the torch
version, the input declarations and a verified map from module names to the
ONNX tensors that hold their outputs, so the `torch` runner can later run the
source module eagerly and line its layers up with the ONNX graph.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
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

from xbackend.errors import ExportError, XbackendError, first_line
from xbackend.export.example_inputs import InputDecl, parse_dynamic, read_examples, with_data
from xbackend.export.failures import cut_words, root_cause, static_peers
from xbackend.files.atomic import write_atomic_bytes
from xbackend.files.runfolders import run_temp_folder
from xbackend.model.extdata import adopt_external, uses_external_data
from xbackend.model.inputs import META_RANGES
from xbackend.model.load import ModelRef, load_proto
from xbackend.model.torch_module import (
    META_INPUTS,
    META_MODULE,
    META_MODULE_OUTPUTS,
    META_SOURCE,
    META_TORCH_VERSION,
    import_torch,
    load_module,
    output_names_of,
    to_numpy,
    to_tensor,
)
from xbackend.model.torch_scopes import NAME_SCOPES, last_in_scope
from xbackend.numerics.metrics import is_float_dtype
from xbackend.runners.ort_cpu import OrtCpuRunner
from xbackend.runners.reference import ReferenceRunner

__all__ = ["DEFAULT_OPSET", "ExportResult", "InputDecl", "export_torch", "parse_dynamic", "read_examples"]

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
    torch = import_torch()
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
        for handle in handles:
            handle.remove()
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
    outputs = tuple(output_name.name for output_name in proto.graph.output)
    try:
        ref = ModelRef(str(path), proto.ir_version, tuple(feeds), outputs, uses_external_data(proto))
        runner.prepare(ref, outputs)
        runner.run(feeds)
    except Exception as error:
        axes = ", ".join(f"{key}={a}:{value}" for key, ax in dynamic.items() for a, value in ax.items())
        raise ExportError(
            f"the exported model declares --dynamic {axes} but fails at another size "
            f"({' '.join(str(error).split())[:200]}); the module bakes that size into the graph"
        ) from error
    finally:
        runner.close()


def _culprit(module: Any, inputs: Sequence[InputDecl], examples: Mapping[str, np.ndarray]) -> str | None:
    """The generated integer input whose values the module rejects: the first that, set to 0,
    lets forward run (an index past an embedding table, most often)."""
    torch = import_torch()
    for i in inputs:
        example = examples[i.name]
        if i.given or example.dtype.kind not in "iu":
            continue
        trial = {**examples, i.name: np.zeros_like(example)}
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
    torch = import_torch()
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
    except Exception as error:
        culprit = _culprit(module, inputs, examples)
        if culprit is not None:
            i = next(x for x in inputs if x.name == culprit)
            raise ExportError(
                f"the module's forward failed on input {i.describe(ranges.get(culprit))} "
                f"({type(error).__name__}: {first_line(error)[:160]}) and runs with {culprit} at 0: give it "
                f"its valid values with --range {culprit}=LO:HI, or real ones with --inputs FILE.npz"
            ) from error
        fed = ", ".join(i.describe(ranges.get(i.name)) for i in inputs)
        raise ExportError(
            f"the module's forward failed on the example inputs {fed}: {type(error).__name__}: "
            f"{first_line(error)[:200]}; give integer inputs their valid values with --range NAME=LO:HI "
            "(e.g. token_type_ids=0:2), or real ones with --inputs FILE.npz"
        ) from error
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
                dynamic_axes={key: dict(value) for key, value in (dynamic or {}).items()} or None,
                verbose=False,
            )
        except Exception as error:
            cause = root_cause(error)
            text = cut_words(str(cause), 400)
            peers = static_peers(inputs, dynamic or {})
            hint = ""
            if peers:  # torch.export specializes a size an input shares with a static one
                hint = (
                    f" (the inputs share the sizes --dynamic names, and the others stay static, so "
                    f"torch fixes them: name theirs too, {' '.join(peers)})"
                )
            elif dynamic:
                axes = " ".join(
                    f"--dynamic {key}={a}:{value}" for key, ax in dynamic.items() for a, value in ax.items()
                )
                hint = (
                    f" (asked for {axes}: the module fixes that size somewhere; make it size-agnostic "
                    "or export without --dynamic)"
                )
            raise ExportError(
                f"torch.onnx.export failed for {spec!r}{hint}: {type(cause).__name__}: {text}"
            ) from error
    candidates = _scope_outputs(program)
    stored = _stored_spec(spec, out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # Beside the output, so that weights past 2 GiB (saved by torch as external data, since one
    # proto cannot hold them) move into place by rename, never through memory.
    with tempfile.TemporaryDirectory(prefix=".xbackend-export-", dir=out_path.parent) as tmp:
        raw = Path(tmp) / "model.onnx"
        program.save(str(raw))
        proto = load_proto(raw, load_external=False)
        outputs = tuple(output_name.name for output_name in proto.graph.output)
        _check_dynamic(proto, raw, dynamic or {}, inputs, seed, ranges, examples)
        candidates = {key: candidate for key, candidate in candidates.items() if candidate not in outputs}
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
        onnx.helper.set_model_props(
            proto, {**{prop.key: prop.value for prop in proto.metadata_props}, **meta}
        )
        adopt_external(proto, Path(tmp), out_path)
        write_atomic_bytes(out_path, proto.SerializeToString())
    return ExportResult(str(out_path), stored, str(torch.__version__), opset, tuple(inputs), outputs, mapped)
