"""PyTorch eager: the module an ONNX model was exported from, run on the same feeds.

The module comes from the model's xbackend.torch.module metadata (written by
`xbackend export torch`) or from the `module` option (`--torch-module`).
Graph outputs are always compared; intermediate tensors where the export
recorded a verified module -> tensor map.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from onnx import numpy_helper

from xbackend.errors import BackendUnavailableError, ExportError, InputError, RunnerFailedError, first_line
from xbackend.model.load import ModelRef, load_proto
from xbackend.model.sever import SEVERED
from xbackend.model.torch_module import (
    META_MODULE,
    flatten_outputs,
    load_module,
    module_map,
    read_torch_metadata,
    spec_from_cwd,
    to_numpy,
    to_tensor,
    trusted_spec,
)
from xbackend.model.torch_ops import OpGraph, folded_constants, onnx_calls
from xbackend.model.torch_scopes import aligned, name_scope_map, scope_map
from xbackend.numerics.metrics import is_float_dtype
from xbackend.numerics.values import Value
from xbackend.runners.base import RECOMPUTED, Availability, BuildFingerprint, OptionSpec, Runner, promised_if
from xbackend.runners.ort_cpu import physical_cores

__all__ = ["TorchRunner"]


class TorchRunner(Runner):
    name = "torch"
    description = "PyTorch eager on CPU: the module the ONNX model was exported from"
    instrumentation_changes_engine = False  # forward hooks read outputs; eager computes the same
    executes_graph = False
    severs_by_feeds = True  # forward hooks hand each module's successors the reference's output
    # its aten calls, run one by one, are its own computation (eager on the CPU): torch.compile's
    # and CUDA's are not, so they stay at module grain
    op_grain: ClassVar[bool] = True
    option_specs: ClassVar[Sequence[OptionSpec]] = (
        OptionSpec(
            "module",
            str,
            "",
            "MODULE_SPEC (default: the one recorded at export, with trust_model_code)",
            path=True,
        ),
        OptionSpec(
            "trust_model_code",
            bool,
            False,
            "import the Python file the model's metadata names (--trust-model-code)",
        ),
        OptionSpec("threads", int, physical_cores, "torch.set_num_threads", threads=True),
        OptionSpec(
            "deterministic",
            bool,
            False,
            "torch.use_deterministic_algorithms (promises run-to-run; an op without a deterministic "
            "implementation fails the build)",
        ),
        OptionSpec("check_weights", bool, True, "refuse a module whose weights differ from the model's"),
        OptionSpec(
            "grain",
            str,
            "auto",
            "what it exposes: op (each aten call the export mapped), module (module outputs), or auto "
            "(op where its aten graph computes the module's bits)",
            ("auto", "op", "module"),
        ),
    )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._module: Any = None
        self._map: dict[str, str] = {}  # module name -> ONNX tensor
        self._outputs: tuple[str, ...] = ()
        self._captured: dict[str, np.ndarray] = {}
        self._severed: dict[str, Value] = {}  # tensor -> the reference's value, handed on instead
        self._calls: dict[str, int] = {}  # module -> its calls in this forward
        self._repeated: dict[str, int] = {}  # modules called more than once in one forward
        self._counting = False
        self._counted = False
        self._spec = ""
        self._weights = ""
        self._unmapped = "no torch module output maps to this tensor"
        self._lost: set[str] = set()  # tensors whose recorded module --torch-module lacks
        self._map_source = ""
        self._stray: dict[str, str] = {}  # tensor -> the module an unverified map gave it, not its value
        self._calls_map: dict[str, str] = {}  # the model's aten calls (FX text) -> tensors
        self._folded: dict[str, np.ndarray] = {}  # the model's small constants, by name
        self._ops: OpGraph | None = None  # op grain, built on the first feeds' shapes
        self._ops_shapes: tuple[Any, ...] | None = None
        self._ops_why = ""  # why it stays at module grain
        self._wanted: set[str] = set()

    @classmethod
    def load_engine(cls) -> None:
        import torch  # noqa: F401  # heavy: torch

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("torch") is None:
            return Availability.missing("torch not installed (pip install 'xbackend[torch]')")
        return Availability.ok(importlib.metadata.version("torch"))

    def _load(self, model: ModelRef, recorded: str) -> Any:
        if self.options["module"]:
            return load_module(self.options["module"])
        if not recorded:
            raise BackendUnavailableError(
                "the model records no source module (it was not exported by `xbackend export torch`); "
                "pass --torch-module path/to/file.py:factory"
            )
        if not self.options["trust_model_code"]:
            try:  # --trust-model-code is suggested only where it would run that file
                beside = bool(trusted_spec(recorded, Path(model.path)))
            except InputError:
                beside = False
            raise BackendUnavailableError(
                f"the model names its source module {recorded!r}; xbackend never runs code a model points "
                f"to on its own: pass --torch-module {spec_from_cwd(recorded, Path(model.path))} "
                "(once you trust that file)" + (" or --trust-model-code" if beside else "")
            )
        # a recorded file lies in the model's folder (compare refused any other first; the API's
        # runners are checked here), never looked up from the working directory
        spec = trusted_spec(recorded, Path(model.path))
        return load_module(spec, base_dir=Path(model.path).parent, search_cwd=False)

    @classmethod
    def promises_for(cls, options: Mapping[str, Any]) -> frozenset[str]:
        return super().promises_for(options) | promised_if(options.get("deterministic"), "run-to-run")

    @classmethod
    def determinism_modes(cls) -> dict[str, dict[str, str]]:
        return {"det": {"deterministic": "true"}}

    @property
    def _grain(self) -> str:
        return str(self.options.get("grain", "module")) if self.op_grain else "module"

    def _deterministic_algorithms(self) -> bool:
        return bool(self.options["deterministic"])

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        import torch  # heavy: torch

        proto = load_proto(model.path, load_external=True)
        meta = read_torch_metadata(proto)
        recorded = meta.get(META_MODULE, "")
        self._spec = self.options["module"] or recorded
        torch.set_num_threads(int(self.options["threads"]))
        torch.use_deterministic_algorithms(self._deterministic_algorithms())
        try:
            self._module = self._load(model, recorded)
        except ExportError as error:
            raise RunnerFailedError(f"{error} (set the module with --torch-module)") from error
        if self.options["check_weights"]:
            self._weights = check_weights(self._module, proto)
        wanted = set(tensors)
        model_dir = Path(model.path).parent
        mapped = module_map(meta, self.options["module"], model_dir)
        if not mapped and not recorded:  # a plain torch.onnx export: its nodes' name scopes
            mapped = scope_map(proto)
            self._map_source = "the exporter's name scopes (unverified)" if mapped else ""
            if not mapped:  # TorchScript's (optimum's) node names: /model/layers.0/self_attn/...
                mapped = aligned(name_scope_map(proto), [n for n, _ in self._module.named_modules()])
                self._map_source = "the exporter's node names (unverified)" if mapped else ""
        self._calls_map = onnx_calls(proto) if self._grain != "module" else {}
        folded = folded_constants(proto)
        self._folded = folded if self._calls_map else {}
        self._recomputed = _recomputed(folded, self._module)
        del proto
        self._lost = set()
        recorded_map = module_map(meta, "", model_dir)
        if not mapped and self.options["module"] and recorded_map:
            mapped = self._by_name(recorded_map)
        self._map = {
            key: value for key, value in mapped.items() if value in wanted and value not in model.outputs
        }
        self._wanted = wanted - set(model.outputs)
        self._outputs = model.outputs
        self._hook()
        return BuildFingerprint.from_items(self.name, sorted(self.info().items()))

    def _by_name(self, recorded: Mapping[str, str]) -> dict[str, str]:
        """A --torch-module other than the file the model records: the recorded map kept for the
        modules of the same name in it (each checked against the reference's value, as an
        unverified map is), the others said."""
        names = {n for n, _ in self._module.named_modules()}
        kept = {key: value for key, value in recorded.items() if key in names}
        missing = sorted(set(recorded) - names)
        more = " ..." if len(missing) > 8 else ""
        self._map_source = (
            f"the recorded module's map, by name: the torch module (--torch-module) is not the file the "
            f"model records; {len(kept)} of {len(recorded)} of its modules found by name"
            + (f", not found: {', '.join(missing[:8])}{more}" if missing else "")
        )
        self._lost = {recorded[m] for m in missing}
        return kept

    def _hook(self) -> None:
        import torch  # heavy: torch

        for name, sub in self._module.named_modules():
            if name in self._map:

                def hook(_m: Any, _i: Any, out: Any, tensor: str = self._map[name], name: str = name) -> Any:
                    self._calls[name] = self._calls.get(name, 0) + 1
                    if self._counting or name in self._repeated or not isinstance(out, torch.Tensor):
                        return None
                    mine, given = to_numpy(out), self._severed.get(tensor)
                    ref = given if isinstance(given, np.ndarray) and given.shape == mine.shape else None
                    unlike = given is not None and (ref is None or not _near(mine, ref))
                    if self._map_source and (tensor in self._stray or unlike):
                        self._stray[tensor] = name  # an unverified map's module computes another tensor
                        return None
                    self._captured[tensor] = mine
                    return None if ref is None else to_tensor(ref).to(dtype=out.dtype, device=out.device)

                sub.register_forward_hook(hook)

    def _count_calls(self, args: list[Any]) -> None:
        """Modules called more than once in one forward (diffusers' ResnetBlock2D calls its one
        SiLU on several tensors): one tensor cannot stand for their calls, so they are neither
        captured nor fed the reference's values. Counted by a forward that changes nothing."""
        self._counting, self._calls = True, {}
        try:
            self._forward(args)
        finally:
            self._counting = False
        self._repeated = {key: call for key, call in self._calls.items() if call > 1}

    def run_impl(self, feeds: Mapping[str, Value]) -> dict[str, Value]:

        self._captured = {}
        self._severed = {key[len(SEVERED) :]: feed for key, feed in feeds.items() if key.startswith(SEVERED)}
        args = [_to_torch(feeds[n]) for n in self._inputs if not n.startswith(SEVERED)]
        ops = self._op_grain(args)
        if ops is None and self._grain == "op":
            raise RunnerFailedError(f"grain op cannot be had: {self._ops_why}; set grain auto or module")
        if ops is not None:
            return self._outputs_of(ops.run(args, self._severed, self._wanted), dict(ops.captured))
        if self._map and self.severs_by_feeds and not self._counted:
            self._count_calls(args)
            self._counted = True
        self._calls = {}
        result = self._forward(args)
        flat = flatten_outputs(result)
        if len(flat) != len(self._outputs):
            paths = ", ".join(p or "(tensor)" for p, _ in flat)
            raise RunnerFailedError(
                f"the torch module returned {len(flat)} value(s) ({paths}), the ONNX model has "
                f"{len(self._outputs)} output(s) ({', '.join(self._outputs)})"
            )
        return self._outputs_of([v for _, v in flat], dict(self._captured))

    def _outputs_of(self, values: Sequence[Any], out: dict[str, Value]) -> dict[str, Value]:
        import torch  # heavy: torch

        for name, value in zip(self._outputs, values, strict=True):
            out[name] = to_numpy(value) if isinstance(value, torch.Tensor) else np.asarray(value)
        return out

    def _op_grain(self, args: list[Any]) -> OpGraph | None:
        """The aten graph, built on these inputs' shapes the first time they are seen, where the
        grain allows and it computes the module's bits; None at module grain (the reason kept)."""
        if not self._calls_map:
            if self._grain != "module" and not self._ops_why:
                self._ops_why = (
                    "the model records no aten call (it was not exported by torch.onnx's dynamo exporter)"
                )
            return None
        shapes = tuple(tuple(arg.shape) if hasattr(arg, "shape") else None for arg in args)
        if shapes == self._ops_shapes:
            return self._ops
        self._ops_shapes, self._ops = shapes, None
        self._counting = True  # the module hooks stand aside while torch.export traces it
        try:
            ops = OpGraph.build(self._module, args, self._calls_map, self._folded)
            mine = ops.run(args, {}, set())
        except Exception as error:  # torch cannot export it: module grain, and why
            self._ops_why = f"torch.export failed ({type(error).__name__}: {first_line(error)})"
            return None
        finally:
            self._counting = False
        if not ops.names:
            self._ops_why = "none of its aten calls maps to a tensor of the model"
            return None
        self._counting = True
        try:
            eager = [v for _, v in flatten_outputs(self._forward(args))]
        finally:
            self._counting = False
        if len(mine) != len(eager) or not all(_same(a, b) for a, b in zip(mine, eager, strict=True)):
            self._ops_why = "its aten graph's outputs are not bitwise the module's"
            return None
        self._ops, self._ops_why = ops, ""
        return ops

    def _forward(self, args: list[Any]) -> Any:
        import torch  # heavy: torch

        try:
            with torch.no_grad():
                return self._module(*args)
        except Exception as error:
            raise RunnerFailedError(f"the torch module failed: {type(error).__name__}: {error}") from error

    def not_exposed(self) -> dict[str, str]:
        if self._ops is not None:
            have = set(self._ops.names.values()) | set(self._outputs)
            return {
                tensor: "no aten call of the module maps to this tensor"
                for tensor in self._tensors
                if tensor not in have
            }
        repeated = {self._map[key]: value for key, value in self._repeated.items() if key in self._map}
        have = (set(self._map.values()) - set(repeated)) | set(self._outputs)
        out = {
            tensor: self._unmapped
            for tensor in self._tensors
            if tensor not in have and tensor not in repeated
        }
        for t in self._lost & set(out):
            out[t] = (
                "the torch module (--torch-module) is not the one the model records, and no module of it "
                "has the name the recorded map gives this tensor (leave --torch-module out, with "
                "--trust-model-code)"
            )
        for t, n in repeated.items():
            if t in self._tensors and t not in self._outputs:
                out[t] = (
                    f"its module is called {n} times in one forward: one tensor cannot stand for its calls"
                )
        for t, m in self._stray.items():
            out[t] = f"module {m}, which the exporter's names map to it, computes another value (over 1% off)"
        return out

    def info(self) -> dict[str, str]:
        out = super().info()
        out["torch"] = importlib.metadata.version("torch")
        out["module"] = self._spec
        if self._module is not None:  # read back from torch, not assumed from the option
            import torch  # heavy: torch

            out["in_force.use_deterministic_algorithms"] = str(torch.are_deterministic_algorithms_enabled())
        out["mapped_intermediates"] = str(len(self._map))
        if self._ops is not None:
            out["grain"] = f"op ({len(self._ops.names)} aten calls mapped)"
        elif self._ops_why:
            out["grain"] = f"module ({self._ops_why})"
        if self._map_source:
            out["mapped_from"] = self._map_source
        if self._weights:
            out["weights_checked"] = self._weights
        if getattr(self, "_recomputed", ()):
            out[RECOMPUTED] = ",".join(self._recomputed)
        return dict(sorted(out.items()))

    def close(self) -> None:
        self._module = None


def _near(mine: np.ndarray, ref: np.ndarray) -> bool:
    """Whether a module's output is the tensor an unverified map names: within 1% of the
    reference's value (a precision loss is far smaller; another tensor is not)."""
    if mine.dtype.kind not in "fc" or ref.dtype.kind not in "fc":
        return bool(np.array_equal(mine, ref))
    with np.errstate(invalid="ignore", over="ignore"):
        a, b = mine.astype(np.float64), ref.astype(np.float64)
        top = float(np.max(np.abs(b), where=np.isfinite(b), initial=0.0))
        diff = np.abs(a - b)
        return bool(np.all((a == b) | (diff <= 0.01 * top)))


def _same(a: Any, b: Any) -> bool:
    """Bitwise the same values (NaN where NaN)."""
    import torch  # heavy: torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return bool(a == b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))
    return bool(torch.equal(a, b))


def _to_torch(value: Value) -> Any:
    if isinstance(value, list):
        return [_to_torch(x) for x in value]
    if value is None or not isinstance(value, np.ndarray):
        return value
    return to_tensor(value)


def _digests(a: np.ndarray) -> set[bytes]:
    out = {hashlib.sha256(np.require(a, requirements="C").tobytes()).digest()}
    if a.ndim == 2:
        out.add(hashlib.sha256(np.require(a.T, requirements="C").tobytes()).digest())
    return out


def _recomputed(folded: Mapping[str, np.ndarray], module: Any) -> tuple[str, ...]:
    """The model's folded float constants (`folded`, as xbackend.model.torch_ops.folded_constants
    reads them) that torch computes at run time (not among the module's parameters and buffers,
    transposed or not), whose values are not all halves: rounded results, a rounding or two from
    torch's own (rotary cos/sin, Mamba's -exp(A_log))."""
    state = module.state_dict()
    out = {}
    for name, a in folded.items():
        if name in state or not is_float_dtype(a.dtype) or not a.size:
            continue
        finite = a[np.isfinite(a)].astype(np.float64)
        if finite.size and not np.array_equal(finite * 2, np.round(finite * 2)):
            out[name] = a
    if out:  # a parameter the exporter transposed is the parameter itself
        weights: set[bytes] = set()
        for tensor in state.values():
            weights |= _digests(to_numpy(tensor))
        out = {key: value for key, value in out.items() if not _digests(value) & weights}
    return tuple(sorted(out))


def check_weights(module: Any, proto: Any) -> str:
    """Is this module the one the model was exported from? Its parameters and buffers are
    looked up among the model's initializers, by content (a transposed Linear weight counts).

    Exporters rename, transpose and fold weights (BatchNorm into the preceding Conv, keeping the
    Conv's name), so one missing tensor proves nothing; but a module none of whose non-constant
    float parameters appears in the model (a factory that draws new random weights on every
    call) cannot explain it. Returns a one-line account; raises RunnerFailedError on a mismatch.
    """
    digests: set[bytes] = set()
    for initializer in proto.graph.initializer:
        digests |= _digests(numpy_helper.to_array(initializer))
    for node in proto.graph.node:  # exporters also store folded weights as Constant nodes
        for attribute in node.attribute:
            if attribute.HasField("t"):
                digests |= _digests(numpy_helper.to_array(attribute.t))
    candidates, found = 0, 0
    for tensor in module.state_dict().values():
        value = to_numpy(tensor)
        flat = value.reshape(-1)
        if not is_float_dtype(value.dtype) or value.size < 2 or bool((flat == flat[0]).all()):
            continue  # constant tensors (LayerNorm's ones, zero biases) match any seed
        candidates += 1
        found += bool(_digests(value) & digests)
    if candidates and not found:
        raise RunnerFailedError(
            f"the torch module's weights differ from the model's: none of its {candidates} non-constant "
            "float parameters/buffers appears among the model's weights; the module is not the one this "
            "model was exported from (a factory without a seed makes new random weights on every call: "
            "seed it or load the trained state_dict), so torch is not to blame"
        )
    return f"{found} of {candidates} non-constant float tensors found in the model"
