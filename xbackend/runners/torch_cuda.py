"""PyTorch eager on CUDA: the module an ONNX model was exported from, on the GPU.

cuDNN's benchmark mode is its autotuning: each new input shape times cuDNN's convolution
algorithms and keeps the fastest, so two processes can run different algorithms. TF32 is
off by default for both cuBLAS matmuls and cuDNN convolutions (PyTorch's own default turns
it on for convolutions), so float32 comparisons compare float32.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from xbackend.errors import RunnerFailedError
from xbackend.files.modelref import ModelRef
from xbackend.host import gpu
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, promised_if
from xbackend.runners.torch_eager import TorchRunner

__all__ = ["CUBLAS_WORKSPACE", "TorchCudaRunner", "apply_switches", "cuda_switches", "read_switches"]

# cuBLAS is deterministic only with a fixed workspace configuration, set before CUDA starts.
CUBLAS_WORKSPACE = ":4096:8"


def cuda_switches(options: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """(torch.backends attribute, value) pairs for runner `options`."""
    tf32 = bool(options["tf32"])
    return [
        ("cuda.matmul.allow_tf32", tf32),
        ("cudnn.allow_tf32", tf32),
        ("cudnn.benchmark", options["autotune"] == "on"),
        ("cudnn.deterministic", options["autotune"] == "pinned" or bool(options["deterministic"])),
    ]


def _attr(path: str) -> tuple[Any, str]:
    import torch  # heavy: torch

    obj: Any = torch.backends
    *parents, last = path.split(".")
    for parent in parents:
        obj = getattr(obj, parent)
    return obj, last


def apply_switches(switches: Sequence[tuple[str, bool]]) -> None:
    """Set each torch switch (a dotted path such as backends.cudnn.benchmark) to its value."""
    for path, value in switches:
        obj, attr = _attr(path)
        setattr(obj, attr, value)


def read_switches(switches: Sequence[tuple[str, bool]]) -> dict[str, str]:
    """What torch reports in force for each switch, read back rather than assumed."""
    out = {}
    for path, _ in switches:
        obj, attr = _attr(path)
        out[f"torch.backends.{path}"] = str(getattr(obj, attr))
    return out


class TorchCudaRunner(TorchRunner):
    name = "torch-cuda"
    description = "PyTorch eager on CUDA (cuDNN benchmark mode as autotuning)"
    op_grain = False  # judged at module grain on the device (op grain runs on the CPU only)
    option_specs: ClassVar[Sequence[OptionSpec]] = (
        *(option for option in TorchRunner.option_specs if option.name != "grain"),
        OptionSpec("device_id", int, 0, "CUDA device"),
        OptionSpec(
            "autotune",
            str,
            "off",
            "cuDNN algorithm choice: on = cudnn.benchmark (timed per process), off = heuristics (PyTorch's "
            "default), pinned = cudnn.deterministic (the same deterministic algorithm every time)",
            ("on", "off", "pinned"),
        ),
        OptionSpec("tf32", bool, False, "TF32 for cuBLAS matmuls and cuDNN convolutions"),
    )

    @classmethod
    def availability(cls) -> Availability:
        avail = super().availability()
        if not avail.available:
            return avail

        version = importlib.metadata.version("torch")
        build = ""
        if "+cpu" in version:
            build = (
                f"torch {version} is a CPU build (pip install 'torch=={version.split('+')[0]}' "
                "--index-url https://download.pytorch.org/whl/cu130)"
            )
        problem = gpu.problems(build, gpu.cuda_problem())
        return Availability.missing(problem) if problem else avail

    @classmethod
    def process_env(cls, options: Mapping[str, Any]) -> dict[str, str]:
        return {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE} if options["deterministic"] else {}

    @classmethod
    def autotune_family(cls, pin_path: str) -> dict[str, tuple[str, dict[str, str]]]:
        return {v: (cls.name, {"autotune": v}) for v in ("off", "on", "pinned")}

    @classmethod
    def promises_for(cls, options: Mapping[str, Any]) -> frozenset[str]:
        # cudnn.deterministic: the same algorithm in every process, so every build computes alike
        pinned = promised_if(options.get("autotune") == "pinned", "build-to-build")
        return super().promises_for(options) | pinned

    @classmethod
    def determinism_modes(cls) -> dict[str, dict[str, str]]:
        return {**super().determinism_modes(), "pinned": {"autotune": "pinned"}}

    def _device(self) -> str:
        return f"cuda:{int(self.options['device_id'])}"

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        import torch  # heavy: torch

        if not torch.cuda.is_available():
            raise RunnerFailedError(
                f"torch {torch.__version__} sees no CUDA device here; `xbackend backends` says why"
            )
        apply_switches(cuda_switches(self.options))
        fp = super().prepare_impl(model, tensors)
        self._module = self._module.to(self._device())
        return fp

    def _forward(self, args: list[Any]) -> Any:
        import torch  # heavy: torch

        args = [arg.to(self._device()) if isinstance(arg, torch.Tensor) else arg for arg in args]
        return super()._forward(args)

    def info(self) -> dict[str, str]:
        out = super().info()
        try:
            import torch  # heavy: torch

            out.update(read_switches(cuda_switches(self.options)))
            out["in_force.CUBLAS_WORKSPACE_CONFIG"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "unset")
            if torch.cuda.is_available():
                out["gpu"] = torch.cuda.get_device_name(int(self.options["device_id"]))
                out["cuda_runtime"] = str(torch.version.cuda)
                out["cudnn"] = str(torch.backends.cudnn.version())  # type: ignore[no-untyped-call]
        except ImportError:
            pass
        return dict(sorted(out.items()))
