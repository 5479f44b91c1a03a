"""ExecuTorch: the PyTorch module the ONNX model was exported from, exported as a phone would ship
it (`torch.export`, `to_edge_transform_and_lower`, a `.pte` program) and run by ExecuTorch's own
runtime (its Python bindings): `executorch` with its portable kernels, `executorch-xnnpack` with
what XNNPACK takes delegated (the rest on portable kernels).

The module comes as for the `torch` runner (`--torch-module`, or the one `xbackend export torch`
recorded, with `--trust-model-code`). The program is built on the first feeds' shapes (ExecuTorch
programs have static shapes) and again for other shapes. Where intermediate tensors are asked
for, each run is a fresh instance with ETDump on, and its logged values are matched to the ONNX
model's tensors (`executorch_dump`): a portable kernel call is an operator's value; an XNNPACK
delegate call is one piece, as a fused kernel is: its output only.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from xbackend.errors import BackendUnavailableError, ExportError, RunnerFailedError, first_line
from xbackend.files.modelref import ModelRef
from xbackend.model.torch_module import META_MODULE, flatten_outputs, read_torch_metadata, to_numpy, to_tensor
from xbackend.model.torch_ops import OpGraph, onnx_calls
from xbackend.numerics.values import Value
from xbackend.runners.base import Availability, OptionSpec
from xbackend.runners.buildinfo import BuildFingerprint
from xbackend.runners.executorch_dump import Dump
from xbackend.runners.torch_eager import TorchRunner, check_weights

__all__ = ["ExecuTorchRunner", "ExecuTorchXnnpackRunner"]

_NO_CALLS = (
    "the model records no aten call (it was not exported by torch.onnx's dynamo exporter, as "
    "`xbackend export torch` does): ExecuTorch's operators cannot be matched to its tensors"
)
_NOT_MATCHED = "no operator of the exported program that ExecuTorch ran maps to this tensor"


class ExecuTorchRunner(TorchRunner):
    name = "executorch"
    description = "ExecuTorch's runtime, portable kernels: the module exported to a .pte program"
    instrumentation_changes_engine = False  # one program: its outputs
    severs_by_feeds = False
    op_grain: ClassVar[bool] = False
    xnnpack: ClassVar[bool] = False
    # the module as the torch runner finds it; threads are ExecuTorch's threadpool's
    option_specs: ClassVar[Sequence[OptionSpec]] = (
        *(
            option
            for option in TorchRunner.option_specs
            if option.name in ("module", "trust_model_code", "check_weights")
        ),
        OptionSpec(
            "threads",
            int,
            1,
            "ExecuTorch's threadpool (XNNPACK's threads; portable kernels use one)",
            threads=True,
        ),
    )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._program: Any = None
        self._buffer = b""
        self._shapes: tuple[Any, ...] | None = None
        self._delegated = 0
        self._portable_ops = 0
        self._pte_sha = ""
        self._why = ""
        self._aten: dict[str, str] = {}  # aten call (FX text) -> ONNX tensor
        self._dump: Dump | None = None
        self._wanted: set[str] = set()

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("executorch") is None:
            return Availability.missing("executorch not installed (pip install 'xbackend[executorch]')")
        if importlib.util.find_spec("torch") is None:
            return Availability.missing("torch not installed (pip install 'xbackend[torch]')")
        return Availability.ok(importlib.metadata.version("executorch"))

    @classmethod
    def load_engine(cls) -> None:
        import executorch.extension.pybindings.portable_lib  # noqa: F401  # engine: executorch

    @classmethod
    def promises_for(cls, options: Mapping[str, Any]) -> frozenset[str]:
        return cls.promises

    @classmethod
    def determinism_modes(cls) -> dict[str, dict[str, str]]:
        return {}

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        import torch  # heavy: torch
        from executorch.extension.pybindings import portable_lib  # engine: executorch

        from xbackend.model.load import load_proto  # imports onnx: the model's recorded module

        self.close()

        proto = load_proto(model.path, load_external=True)
        recorded = read_torch_metadata(proto).get(META_MODULE, "")
        self._spec = self.options["module"] or recorded
        try:
            self._module = self._load(model, recorded)
        except ExportError as e:
            raise RunnerFailedError(f"{e} (set the module with --torch-module)") from e
        if self.options["check_weights"]:
            self._weights = check_weights(self._module, proto)
        self._wanted = set(tensors) - set(model.outputs)
        self._aten = onnx_calls(proto) if self._wanted else {}
        self._why = _NO_CALLS if self._wanted and not self._aten else ""
        del proto
        self._module.eval()
        torch.set_num_threads(1)  # the export's own work; ExecuTorch's threads are its threadpool's
        portable_lib._unsafe_reset_threadpool(max(1, int(self.options["threads"])))
        self._outputs = model.outputs
        items = [("executorch", importlib.metadata.version("executorch")), ("module", self._spec)]
        items += [("xnnpack", str(self.xnnpack)), ("threads", str(self.options["threads"]))]
        return BuildFingerprint.from_items(self.name, items)

    def _build(self, args: list[Any]) -> None:
        """The program for these inputs' shapes: torch.export, lowered (XNNPACK's partitioner where
        asked), serialized and loaded by ExecuTorch's runtime from its bytes."""
        import torch  # heavy: torch
        from executorch.exir import to_edge_transform_and_lower  # engine: executorch
        from executorch.extension.pybindings import portable_lib  # engine: executorch

        parts: list[Any] = []
        if self.xnnpack:
            from executorch.backends.xnnpack.partition import xnnpack_partitioner as xp  # engine: executorch

            parts = [xp.XnnpackPartitioner()]
        dumping = bool(self._aten)
        try:
            with torch.no_grad():
                exported = torch.export.export(self._module, tuple(args))
            edge = to_edge_transform_and_lower(exported, partitioner=parts, generate_etrecord=dumping)
            program = edge.to_executorch()
        except Exception as error:  # the module cannot be exported or lowered: this backend only
            raise RunnerFailedError(
                f"ExecuTorch could not export the module: {type(error).__name__}: {first_line(error)}"
            ) from error
        self._drop_dump()
        if dumping:
            try:  # torch.onnx's aten calls, by the names torch.export gives them
                names = OpGraph.build(self._module, args, self._aten, {}).roots
            except Exception as error:
                self._why = (
                    f"torch.export failed for the operator map ({type(error).__name__}: {first_line(error)})"
                )
            else:
                self._dump = Dump.build(program, exported, names)
        nodes = [node for node in edge.exported_program().graph.nodes if node.op == "call_function"]
        self._delegated = sum(1 for node in nodes if "executorch_call_delegate" in str(node.target))
        self._portable_ops = len(nodes) - self._delegated
        # the runtime reads the program from these bytes as it runs: they live as long as it does
        self._buffer = program.buffer
        self._pte_sha = hashlib.sha256(self._buffer).hexdigest()
        self._program = portable_lib._load_for_executorch_from_buffer(self._buffer)

    def run_impl(self, feeds: Mapping[str, Value]) -> dict[str, Value]:
        args = [to_tensor(np.asarray(feeds[input_name])) for input_name in self._inputs]
        shapes = tuple((tuple(arg.shape), str(arg.dtype)) for arg in args)
        if shapes != self._shapes:
            self._build(args)
            self._shapes = shapes
        logged: dict[str, Value] = {}
        try:
            if self._dump is not None:
                out, values = self._dump.run(self._buffer, args)
                logged.update(values)
            else:
                out = self._program.run_method("forward", tuple(args))
        except Exception as error:
            raise RunnerFailedError(
                f"ExecuTorch's runtime failed: {type(error).__name__}: {first_line(error)}"
            ) from error
        flat = [v for _, v in flatten_outputs(list(out))]
        if len(flat) != len(self._outputs):
            raise RunnerFailedError(
                f"the ExecuTorch program returned {len(flat)} value(s), the ONNX model has "
                f"{len(self._outputs)}"
            )
        logged.update({output: to_numpy(v) for output, v in zip(self._outputs, flat, strict=True)})
        return logged

    def fingerprint(self) -> BuildFingerprint:
        base = super().fingerprint()
        if not self._pte_sha:
            return base
        return BuildFingerprint.from_items(self.name, [*base.layers, ("pte", self._pte_sha)])

    def not_exposed(self) -> dict[str, str]:
        dump = self._dump
        why = self._why or (dump.why if dump is not None else "")
        if why or dump is None:
            return {tensor: why or _NOT_MATCHED for tensor in self._tensors if tensor not in self._outputs}
        have = dump.exposed | set(self._outputs)
        return {
            tensor: dump.hidden.get(tensor, _NOT_MATCHED) for tensor in self._tensors if tensor not in have
        }

    def _drop_dump(self) -> None:
        if self._dump is not None:
            self._dump.close()
            self._dump = None

    def close(self) -> None:
        self._drop_dump()
        super().close()

    def info(self) -> dict[str, str]:
        out = {key: value for key, value in super().info().items() if key not in ("grain", "deterministic")}
        out["executorch"] = importlib.metadata.version("executorch")
        if self._program is not None:
            where = f", {self._delegated} XNNPACK delegate call(s)" if self.xnnpack else ""
            ops = f"{self._portable_ops} operator call(s) on portable kernels{where}"
            out["program"] = f"{ops}; .pte sha256 {self._pte_sha[:16]}"
        if self._dump is not None and self._dump.pieces:
            out["per operator"] = (
                f"ETDump: {self._dump.pieces} logged kernel call(s), {len(self._dump.exposed)} of them "
                "the model's tensors"
            )
        return out


class ExecuTorchXnnpackRunner(ExecuTorchRunner):
    name = "executorch-xnnpack"
    description = "ExecuTorch's runtime with XNNPACK: what its partitioner takes is one delegate call"
    xnnpack = True

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        from executorch.extension.pybindings import portable_lib  # engine: executorch

        if "XnnpackBackend" not in portable_lib._get_registered_backend_names():
            raise BackendUnavailableError("this executorch build registers no XNNPACK backend")
        return super().prepare_impl(model, tensors)
