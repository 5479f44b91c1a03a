"""ONNX Runtime, CPU execution provider."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from xbackend.errors import RunnerFailedError
from xbackend.model import ModelRef, downgrade_ir, load_proto, read_model_bytes
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, Runner

__all__ = ["OrtCpuRunner", "ort_message"]

OPT_LEVELS = ("disable", "basic", "extended", "layout", "all")
_OPT_ENUM = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}


def physical_cores() -> int:
    """What ONNX Runtime uses by default for intra-op threads."""
    import psutil

    return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def ort_message(e: BaseException) -> str:
    """ONNX Runtime's error text without its '[ONNXRuntimeError] : 1 : FAIL : file:line fn(...)' prefix."""
    text = " ".join(str(e).split())
    text = re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", text)
    text = re.sub(r"^/\S+:\d+\s+(?:[\w:<>~]+\s+)*[\w:<>~]+\(.*?\)\s+", "", text)
    return text[:400]


@functools.lru_cache(maxsize=1)
def _probe_max_ir() -> int | None:
    # ORT exposes no constant for this; loading an impossible IR makes it say.
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 1000
    try:
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:
        found = re.search(r"max supported IR version:\s*(\d+)", str(e))
        return int(found.group(1)) if found else None
    return None


class OrtCpuRunner(Runner):
    name = "ort-cpu"
    description = "ONNX Runtime, CPU execution provider"
    option_specs = (
        OptionSpec("threads", int, physical_cores, "intra-op threads (default: physical cores)"),
        OptionSpec("inter_op_threads", int, 1, "inter-op threads (1 = sequential execution)"),
        OptionSpec("opt_level", str, "all", "graph optimization level", OPT_LEVELS),
        OptionSpec("deterministic_compute", bool, False, "SessionOptions.use_deterministic_compute"),
    )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._session: Any = None
        self._outputs: list[str] = []
        self._notes: dict[str, str] = {}

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("onnxruntime") is None:
            return Availability.missing("onnxruntime not installed (pip install onnxruntime)")
        return Availability.ok(importlib.metadata.version("onnxruntime"))

    @classmethod
    def max_ir_version(cls) -> int | None:
        return _probe_max_ir()

    def session_options(self) -> Any:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = int(self.options["threads"])
        so.inter_op_num_threads = int(self.options["inter_op_threads"])
        so.execution_mode = (
            ort.ExecutionMode.ORT_SEQUENTIAL
            if self.options["inter_op_threads"] <= 1
            else ort.ExecutionMode.ORT_PARALLEL
        )
        so.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, _OPT_ENUM[self.options["opt_level"]]
        )
        so.use_deterministic_compute = bool(self.options["deterministic_compute"])
        so.log_severity_level = 3
        return so

    def _suffix(self, model: ModelRef, tensors: tuple[str, ...]) -> bytes:
        """Serialized fields appended to the model bytes: protobuf merges them into the model.

        Appending a ModelProto whose graph holds only extra outputs exposes the
        intermediates without parsing and re-serializing the whole model.
        """
        have = set(model.outputs)
        extra = onnx.ModelProto(
            graph=onnx.GraphProto(output=[onnx.ValueInfoProto(name=t) for t in tensors if t not in have])
        )
        suffix: bytes = extra.SerializeToString()
        max_ir = self.max_ir_version()
        if max_ir is not None and model.ir_version > max_ir:
            downgrade_ir(load_proto(model.path, load_external=False), max_ir)  # raises if unsafe
            self._notes["ir_version"] = (
                f"{model.ir_version} -> {max_ir} (downgraded: the model uses nothing newer)"
            )
            suffix += onnx.ModelProto(ir_version=max_ir).SerializeToString()
        return suffix

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        import onnxruntime as ort

        data = read_model_bytes(model.path) + self._suffix(model, tensors)
        so = self.session_options()
        if model.external_data:
            # Bytes carry no directory: tell ORT where the external data lives.
            folder = str(Path(model.path).parent)
            so.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        try:
            self._session = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise RunnerFailedError(f"onnxruntime rejected the model: {ort_message(e)}") from e
        names = {o.name for o in self._session.get_outputs()}
        self._outputs = [t for t in tensors if t in names]
        return BuildFingerprint.from_items(self.name, sorted(self.info().items()))

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            values = self._session.run(self._outputs, dict(feeds))
        except Exception as e:
            raise RunnerFailedError(f"onnxruntime failed while running: {ort_message(e)}") from e
        return dict(zip(self._outputs, values, strict=True))

    def not_exposed(self) -> dict[str, str]:
        have = set(self._outputs)
        return {t: "not an output of the ONNX Runtime session" for t in self._tensors if t not in have}

    def info(self) -> dict[str, str]:
        out = super().info()
        out["onnxruntime"] = importlib.metadata.version("onnxruntime")
        out["execution_mode"] = "sequential" if self.options["inter_op_threads"] <= 1 else "parallel"
        if self._session is not None:
            out["providers"] = ",".join(self._session.get_providers())
        out.update(self._notes)
        return dict(sorted(out.items()))

    def close(self) -> None:
        self._session = None
