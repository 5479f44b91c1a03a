"""ONNX Runtime, CUDA execution provider.

Its nondeterminism lives in cuDNN's per-session algorithm search and in TF32. The
`autotune` option maps onto `cudnn_conv_algo_search`:

- on: EXHAUSTIVE (ONNX Runtime's default): every session times cuDNN's algorithms and
  keeps the fastest, so two sessions can pick different algorithms;
- off: HEURISTIC: cuDNN's heuristics choose, without timing;
- pinned: DEFAULT: cuDNN's fixed default algorithm (implicit precomputed GEMM), the same in
  every session. cuDNN has no record-and-replay for ONNX Runtime, so this is the pin.

TF32 is off by default (ONNX Runtime turns it on): float32 comparisons compare float32.
Everything the provider reports in force after the session is built goes into `info()`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from xbackend.errors import RunnerFailedError
from xbackend.files.modelref import ModelRef
from xbackend.host import gpu
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, promised_if
from xbackend.runners.ort_cpu import OrtCpuRunner, ort_version

__all__ = ["CONV_ALGO_SEARCH", "OrtCudaRunner", "cuda_provider_options", "preload_cuda_libraries"]

PROVIDER = "CUDAExecutionProvider"
CONV_ALGO_SEARCH = {"on": "EXHAUSTIVE", "off": "HEURISTIC", "pinned": "DEFAULT"}
AUTOTUNE = tuple(CONV_ALGO_SEARCH)


def cuda_provider_options(options: Mapping[str, Any]) -> dict[str, str]:
    """The CUDA execution provider's options for runner `options` (strings, as ORT takes them)."""
    return {
        "device_id": str(int(options["device_id"])),
        "cudnn_conv_algo_search": CONV_ALGO_SEARCH[options["autotune"]],
        "use_tf32": "1" if options["tf32"] else "0",
    }


@functools.cache
def preload_cuda_libraries() -> str:
    """Load CUDA and cuDNN from NVIDIA's pip packages (onnxruntime-gpu[cuda,cudnn]) before the
    first session, as onnxruntime.preload_dlls does; "" or why it could not."""
    import onnxruntime as ort  # engine: onnxruntime

    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return "onnxruntime has no preload_dlls: CUDA and cuDNN come from the loader's path"
    try:
        preload()
    except Exception as error:  # the session then says which library is missing
        return f"preload_dlls failed: {error}"
    return ""


class OrtCudaRunner(OrtCpuRunner):
    name = "ort-cuda"
    description = "ONNX Runtime, CUDA execution provider (cuDNN algorithm search as autotuning)"
    provider = PROVIDER
    # provider options read back from the session, for the report
    reported: tuple[str, ...] = (
        "cudnn_conv_algo_search",
        "use_tf32",
        "cudnn_conv_use_max_workspace",
        "enable_cuda_graph",
        "prefer_nhwc",
        "tunable_op_enable",
        "tunable_op_tuning_enable",
        "fuse_conv_bias",
    )
    option_specs: ClassVar[Sequence[OptionSpec]] = (
        *OrtCpuRunner.option_specs,
        OptionSpec("device_id", int, 0, "CUDA device"),
        OptionSpec(
            "autotune",
            str,
            "on",
            "cuDNN algorithm search: on = EXHAUSTIVE (ORT's default), off = HEURISTIC, pinned = DEFAULT",
            AUTOTUNE,
        ),
        OptionSpec("tf32", bool, False, "TF32 math for float32 (ORT's default is on; off compares float32)"),
    )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._in_force: dict[str, str] = {}

    @classmethod
    def promises_for(cls, options: Mapping[str, Any]) -> frozenset[str]:
        # pinned: the same algorithm in every session (cuDNN's default, or ORT-TRT's caches)
        pinned = promised_if(options.get("autotune") == "pinned", "build-to-build")
        return super().promises_for(options) | pinned

    @classmethod
    def determinism_modes(cls) -> dict[str, dict[str, str]]:
        det = {"deterministic_compute": "true"}
        return {"det": det, "pinned": {"autotune": "pinned"}, "det-pinned": {**det, "autotune": "pinned"}}

    @classmethod
    def availability(cls) -> Availability:
        package = gpu.ort_gpu_problem(cls.provider)
        libs = ""
        if not package:
            for lib, dist in (
                ("libcudart.so.13", "nvidia-cuda-runtime"),
                ("libcudnn.so.9", "nvidia-cudnn-cu13"),
            ):
                if not gpu.find_library(lib):
                    libs = f"{lib} not found: pip install {dist} (onnxruntime-gpu[cuda,cudnn] brings it)"
                    break
        problem = gpu.problems(package, libs, gpu.cuda_problem())
        if problem:
            return Availability.missing(problem)
        return Availability.ok(ort_version())

    @classmethod
    def autotune_family(cls, pin_path: str) -> dict[str, tuple[str, dict[str, str]]]:
        return {v: (cls.name, {"autotune": v}) for v in AUTOTUNE}

    def providers(self) -> list[Any]:
        return [(self.provider, cuda_provider_options(self.options)), "CPUExecutionProvider"]

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        note = preload_cuda_libraries()
        if note:
            self._notes["preload"] = note
        return super().prepare_impl(model, tensors)

    def _session(self, data: str | bytes, model: ModelRef, so: Any, disabled: Any = ()) -> Any:
        sess = super()._session(data, model, so, disabled)
        self._check_provider(sess)
        return sess

    def _check_provider(self, sess: Any) -> None:
        """ORT falls back to the CPU when a provider fails to load: that is a failure here."""
        if self.provider not in sess.get_providers():
            raise RunnerFailedError(
                f"onnxruntime could not start {self.provider} and fell back to "
                f"{', '.join(sess.get_providers())} (its log above says which library is missing); "
                "`xbackend backends` checks the set-up"
            )
        self._in_force = dict(sorted(sess.get_provider_options().get(self.provider, {}).items()))

    def info(self) -> dict[str, str]:
        out = super().info()
        for k in self.reported:
            if k in self._in_force:
                out[f"in_force.{k}"] = self._in_force[k]
        name = gpu.device_name(int(self.options["device_id"]))
        if name:
            out["gpu"] = name
        out["cudnn"] = gpu.cudnn_version() or "not found"
        out["cuda_runtime"] = gpu.cudart_version() or "not found"
        return dict(sorted(out.items()))
