"""OpenVINO, CPU plugin, reading the ONNX file directly.

`import openvino` also imports the model converter (openvino.tools.ovc), which
starts openvino_telemetry and sends an "import" event unless the user opted out.
Only the runtime API is needed here, so the worker process refuses those two
imports before openvino loads (openvino tolerates a missing converter).
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import importlib.util
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from xbackend.errors import BackendUnavailableError, RunnerFailedError
from xbackend.files.atomic import write_atomic_bytes
from xbackend.files.modelref import ENGINE_DOMAINS, ModelRef
from xbackend.numerics.values import Value
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, Runner

__all__ = ["OpenVinoCpuDefaultRunner", "OpenVinoCpuRunner", "runtime_graph"]

PRECISIONS = ("f32", "bf16", "f16", "default")
EXECUTION_MODES = ("default", "performance", "accuracy")
_SKIP_TYPES = frozenset({"Parameter", "Result", "Constant"})


_BLOCKED = ("openvino.tools.ovc", "openvino_telemetry")


class _TelemetryBlocker(importlib.abc.MetaPathFinder):
    """Refuses the converter and telemetry packages in this (worker) process."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.startswith(_BLOCKED):
            raise ImportError(f"{name} is disabled by xbackend (telemetry stays off)")
        return None


def block_telemetry() -> None:
    """Install the blocker once; call before the first `import openvino`."""
    if not any(isinstance(f, _TelemetryBlocker) for f in sys.meta_path):
        sys.meta_path.insert(0, _TelemetryBlocker())


_COUNTER = re.compile(r"_\d+")


def normalize_name(name: str) -> str:
    """Drop OpenVINO's auto-generated counters ('Multiply_4187' -> 'Multiply'): they depend on
    how many nodes the process created before, not on what the engine decided."""
    return _COUNTER.sub("", name)


def runtime_layers(compiled: Any) -> list[tuple[str, str]]:
    """Per-layer implementation of a compiled model: ('index name', 'type primitive precision')."""
    out = []
    for index, op in enumerate(compiled.get_runtime_model().get_ordered_ops()):
        rt = op.get_rt_info()
        impl = " ".join(
            rt[k].astype(str) if k in rt else "?" for k in ("layerType", "primitiveType", "runtimePrecision")
        )
        out.append((f"{index:05d} {normalize_name(op.get_friendly_name())}", impl))
    return out


def runtime_graph(compiled: Any) -> list[dict[str, Any]]:
    """The nodes the CPU plugin executes, in order: each one's kernel type, precision, the nodes
    of the model it was read from that it computes (rt_info originalLayersNames: ONNX node names,
    or OpenVINO's own for ops a transformation made) and the runtime nodes it reads."""
    out = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        rt = op.get_rt_info()

        def text(key: str, rt: Any = rt) -> str:
            return str(rt[key].astype(str)) if key in rt else ""

        kind = text("layerType")
        if kind in ("Const", "Input", "Output"):
            continue
        out.append(
            {
                "name": op.get_friendly_name(),
                "type": kind,
                "precision": text("runtimePrecision"),
                "original": [n for n in text("originalLayersNames").split(",") if n],
                "inputs": [value.get_node().get_friendly_name() for value in op.input_values()],
            }
        )
    return out


def plain_words(value: Any) -> str:
    """A property as people write it: 'bf16' and 'f32', not "<Type: 'bfloat16'>"; 'ACCURACY'."""
    if hasattr(value, "get_type_name"):  # openvino.Type
        return str(value.get_type_name())
    if hasattr(value, "name") and not isinstance(value, str | int):  # enums such as ExecutionMode
        return str(value.name)
    return str(value)


_UNSUPPORTED_TYPE = re.compile(r"Unsupported value_info type: (\S+)")
_NO_RULE = re.compile(r"No conversion rule found for operations: (.+?)(?: -- |$)")


def _msg(base_exception: BaseException) -> str:
    lines = [ln.strip() for ln in str(base_exception).splitlines() if ln.strip()]
    # OpenVINO prefixes errors with source locations; the last lines carry the reason.
    useful = [ln for ln in lines if not ln.startswith(("Exception from", "Check '"))] or lines
    text = " ".join(useful)
    kind = _UNSUPPORTED_TYPE.search(text)
    if kind:
        return (
            f"{kind.group(1)} is a sequence or map (e.g. ZipMap's class probabilities), and OpenVINO "
            "takes tensors only; export without it (skl2onnx: options={'zipmap': False})"
        )
    rule = _NO_RULE.search(text)
    if rule:
        return f"OpenVINO has no conversion for {rule.group(1).strip()}"
    return text[:400] or type(base_exception).__name__


class OpenVinoCpuRunner(Runner):
    name = "openvino-cpu"
    description = "OpenVINO CPU plugin, fp32 inference precision (INFERENCE_PRECISION_HINT=f32)"
    default_precision = "f32"
    option_specs = (
        OptionSpec(
            "precision", str, "f32", "INFERENCE_PRECISION_HINT; 'default' = the CPU's own", PRECISIONS
        ),
        OptionSpec("threads", int, 0, "INFERENCE_NUM_THREADS (0 = OpenVINO's default)", threads=True),
        OptionSpec("execution_mode", str, "default", "EXECUTION_MODE_HINT", EXECUTION_MODES),
        OptionSpec(
            "save_optimized",
            str,
            "",
            "set by xbackend's explanation only: write the runtime graph the CPU plugin runs here (JSON)",
            path=True,
        ),
    )
    saves_optimized_graph = True
    optimized_format = "runtime"
    optimized_label = "OpenVINO's runtime graph"
    domains = ENGINE_DOMAINS

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._compiled: Any = None
        self._request: Any = None
        self._ports: list[tuple[int, list[str]]] = []
        self._missing: dict[str, str] = {}

    build_bytes = 48 << 20  # its CPU plugin loads with the first compile (measured: 47 MiB)

    @classmethod
    def load_engine(cls) -> None:
        block_telemetry()
        import openvino  # noqa: F401  # engine: openvino

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("openvino") is None:
            return Availability.missing("openvino not installed (pip install openvino)")
        return Availability.ok(importlib.metadata.version("openvino"))

    def config(self) -> dict[str, str]:
        """The compile_model properties these options ask for."""
        cfg: dict[str, str] = {}
        if self.options["precision"] != "default":
            cfg["INFERENCE_PRECISION_HINT"] = self.options["precision"]
        if self.options["threads"]:
            cfg["INFERENCE_NUM_THREADS"] = str(self.options["threads"])
        if self.options["execution_mode"] != "default":
            cfg["EXECUTION_MODE_HINT"] = self.options["execution_mode"].upper()
        return cfg

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        block_telemetry()
        import openvino as ov  # engine: openvino

        core = ov.Core()
        try:
            ov_model = core.read_model(model.path)
        except Exception as error:
            raise BackendUnavailableError(f"OpenVINO cannot read the model: {_msg(error)}") from error
        self._expose(ov_model, tensors)
        try:
            self._compiled = core.compile_model(ov_model, "CPU", self.config())
        except Exception as error:
            raise RunnerFailedError(f"OpenVINO cannot compile the model: {_msg(error)}") from error
        self._request = self._compiled.create_infer_request()
        if self.options["save_optimized"]:
            write_atomic_bytes(
                Path(self.options["save_optimized"]),
                json.dumps(runtime_graph(self._compiled), indent=1).encode(),
                "OpenVINO runtime graph",
            )
        wanted = set(tensors)
        self._ports = [
            (index, sorted(set(output.get_names()) & wanted))
            for index, output in enumerate(self._compiled.outputs)
        ]
        items = [(f"option {key}", value) for key, value in sorted(self.info().items())]
        if self.detailed_fingerprint:
            items = runtime_layers(self._compiled) + items
        return BuildFingerprint.from_items(self.name, items)

    def _expose(self, ov_model: Any, tensors: tuple[str, ...]) -> None:
        """Add a model output for every requested ONNX tensor name OpenVINO still carries."""
        wanted = set(tensors)
        have = {get_name for output in ov_model.outputs for get_name in output.get_names()}
        found: set[str] = set(have & wanted)
        extra = []
        for op in ov_model.get_ordered_ops():
            if op.get_type_name() in _SKIP_TYPES:
                continue
            for out in op.outputs():
                names = set(out.get_names()) & wanted
                if names - found:
                    extra.append(out)
                    found |= names
        if extra:
            ov_model.add_outputs(extra)
        self._missing = {
            tensor: "no OpenVINO tensor carries this name (folded or fused when the ONNX model was read)"
            for tensor in tensors
            if tensor not in found
        }

    def run_impl(self, feeds: Mapping[str, Value]) -> dict[str, Value]:
        try:
            self._request.infer(dict(feeds))
        except Exception as error:
            raise RunnerFailedError(f"OpenVINO failed while running: {_msg(error)}") from error
        out: dict[str, Value] = {}
        for i, names in self._ports:
            data = np.array(self._request.get_output_tensor(i).data, copy=True)
            for name in names:
                out[name] = data
        return out

    def not_exposed(self) -> dict[str, str]:
        return dict(self._missing)

    def info(self) -> dict[str, str]:
        out = super().info()
        out["openvino"] = importlib.metadata.version("openvino")
        out["telemetry"] = (
            "off (openvino.tools.ovc and openvino_telemetry not loaded)"
            if not any(module.startswith(_BLOCKED) for module in sys.modules)
            else "ON: openvino_telemetry was loaded"
        )
        if self._compiled is not None:
            for prop in ("INFERENCE_PRECISION_HINT", "EXECUTION_MODE_HINT", "INFERENCE_NUM_THREADS"):
                out[f"in_force.{prop}"] = plain_words(self._compiled.get_property(prop))
        return dict(sorted(out.items()))

    def close(self) -> None:
        self._request = None
        self._compiled = None


class OpenVinoCpuDefaultRunner(OpenVinoCpuRunner):
    """What users get out of the box: the CPU's default inference precision (bf16 on many CPUs)."""

    name = "openvino-cpu-default"
    description = "OpenVINO CPU plugin at its default precision (bf16 on avx512_bf16/AMX CPUs)"
    option_specs = (
        OptionSpec(
            "precision", str, "default", "INFERENCE_PRECISION_HINT; 'default' = the CPU's own", PRECISIONS
        ),
        *OpenVinoCpuRunner.option_specs[1:],
    )
