"""PyTorch eager: the module an ONNX model was exported from, run on the same feeds.

The module comes from the model's xbackend.torch.module metadata (written by
`xbackend export torch`) or from the `module` option (`--torch-module`).
Graph outputs are always compared; intermediate tensors where the export
recorded a verified module -> tensor map.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from xbackend.errors import BackendUnavailableError, ExportError, RunnerFailedError
from xbackend.model import ModelRef, load_proto
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, Runner
from xbackend.runners.ort_cpu import physical_cores

__all__ = ["TorchRunner"]


class TorchRunner(Runner):
    name = "torch"
    description = "PyTorch eager on CPU: the module the ONNX model was exported from"
    option_specs = (
        OptionSpec("module", str, "", "MODULE_SPEC (default: the one recorded at export)"),
        OptionSpec("threads", int, physical_cores, "torch.set_num_threads"),
        OptionSpec("deterministic", bool, False, "torch.use_deterministic_algorithms"),
    )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._module: Any = None
        self._map: dict[str, str] = {}  # module name -> ONNX tensor
        self._outputs: tuple[str, ...] = ()
        self._captured: dict[str, np.ndarray] = {}
        self._spec = ""

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("torch") is None:
            return Availability.missing("torch not installed (pip install 'xbackend[torch]')")
        return Availability.ok(importlib.metadata.version("torch"))

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        import torch

        from xbackend.torch_export import META_MODULE, META_MODULE_OUTPUTS, load_module, read_torch_metadata

        meta = read_torch_metadata(load_proto(model.path, load_external=False))
        self._spec = self.options["module"] or meta.get(META_MODULE, "")
        if not self._spec:
            raise BackendUnavailableError(
                "the model records no source module (it was not exported by `xbackend export torch`); "
                "pass --torch-module path/to/file.py:factory"
            )
        torch.set_num_threads(int(self.options["threads"]))
        torch.use_deterministic_algorithms(bool(self.options["deterministic"]))
        try:
            self._module = load_module(self._spec, base_dir=Path(model.path).parent)
        except ExportError as e:
            raise RunnerFailedError(str(e)) from e
        wanted = set(tensors)
        recorded = json.loads(meta.get(META_MODULE_OUTPUTS, "{}")) if not self.options["module"] else {}
        self._map = {m: t for m, t in recorded.items() if t in wanted}
        self._outputs = model.outputs
        self._hook()
        return BuildFingerprint.from_items(self.name, sorted(self.info().items()))

    def _hook(self) -> None:
        import torch

        for name, sub in self._module.named_modules():
            if name in self._map:

                def hook(_m: Any, _i: Any, out: Any, tensor: str = self._map[name]) -> None:
                    if isinstance(out, torch.Tensor):
                        self._captured[tensor] = out.detach().cpu().numpy().copy()

                sub.register_forward_hook(hook)

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        self._captured = {}
        args = [torch.from_numpy(np.array(feeds[n], copy=True)) for n in self._inputs]
        try:
            with torch.no_grad():
                result = self._module(*args)
        except Exception as e:
            raise RunnerFailedError(f"the torch module failed: {type(e).__name__}: {e}") from e
        flat = list(result) if isinstance(result, tuple | list) else [result]
        if len(flat) != len(self._outputs):
            raise RunnerFailedError(
                f"the torch module returned {len(flat)} output(s), the ONNX model has {len(self._outputs)}"
            )
        out = dict(self._captured)
        for name, value in zip(self._outputs, flat, strict=True):
            out[name] = value.detach().cpu().numpy().copy()
        return out

    def not_exposed(self) -> dict[str, str]:
        have = set(self._map.values()) | set(self._outputs)
        return {t: "no torch module output maps to this tensor" for t in self._tensors if t not in have}

    def info(self) -> dict[str, str]:
        out = super().info()
        out["torch"] = importlib.metadata.version("torch")
        out["module"] = self._spec
        out["mapped_intermediates"] = str(len(self._map))
        return dict(sorted(out.items()))

    def close(self) -> None:
        self._module = None
