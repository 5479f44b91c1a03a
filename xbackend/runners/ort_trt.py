"""ONNX Runtime's TensorRT execution provider (nodes TensorRT cannot take fall to CUDA, then CPU).

Its caches map onto the autotune variants:

- on: no timing cache, no engine cache: each session times TensorRT's tactics afresh;
- off: `trt_builder_optimization_level=0`: the first tactic that works, no timing;
- pinned: the timing cache and the engine cache in `cache` (a folder): the first session
  records both, later sessions load the engine it built (and time nothing).

FP16 stays off. ONNX Runtime's TensorRT provider has no TF32 switch: TensorRT's default (on)
applies to what it runs, which `info()` says; the CUDA fallback's TF32 follows `tf32`.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from xbackend.files.modelref import ModelRef
from xbackend.host import gpu
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec
from xbackend.runners.ort_cpu import ort_version
from xbackend.runners.ort_cuda import OrtCudaRunner, cuda_provider_options
from xbackend.runners.tensorrt_plan import cache_home

__all__ = ["OrtTrtRunner", "trt_provider_options"]

PROVIDER = "TensorrtExecutionProvider"
TRT_LIB = "libnvinfer.so.10"  # what onnxruntime-gpu 1.31 links against


def trt_provider_options(options: Mapping[str, Any], cache_dir: str) -> dict[str, str]:
    """The TensorRT provider's options for runner `options`; `cache_dir` holds pinned caches."""
    out = {
        "device_id": str(int(options["device_id"])),
        "trt_fp16_enable": "False",
        "trt_builder_optimization_level": "0"
        if options["autotune"] == "off"
        else str(int(options["opt_level"])),
        "trt_detailed_build_log": "True",
    }
    pinned = options["autotune"] == "pinned"
    for k in ("timing_cache", "engine_cache"):
        out[f"trt_{k}_enable"] = str(pinned)
        if pinned:
            out[f"trt_{k}_path"] = cache_dir
    return out


class OrtTrtRunner(OrtCudaRunner):
    name = "ort-trt"
    description = "ONNX Runtime, TensorRT execution provider (timing and engine caches as the pin)"
    provider = PROVIDER
    reported = ("trt_fp16_enable", "trt_builder_optimization_level", "trt_timing_cache_enable",
                "trt_engine_cache_enable", "trt_timing_cache_path", "trt_engine_cache_path")  # fmt: skip
    saves_optimized_graph = False  # TensorRT's engines are not in ORT's optimized model
    option_specs: ClassVar[Sequence[OptionSpec]] = (
        *OrtCudaRunner.option_specs[:-2],  # threads, opt level, ... and device_id
        OptionSpec(
            "autotune",
            str,
            "on",
            "on = no caches (tactics timed per session), off = builder optimization level 0, pinned = "
            "timing and engine caches in `cache`",
            ("on", "off", "pinned"),
        ),
        OptionSpec(
            "tf32", bool, False, "TF32 of the CUDA fallback (TensorRT's own stays at its default, on)"
        ),
        OptionSpec("trt_opt_level", int, 3, "trt_builder_optimization_level when autotune is on or pinned"),
        OptionSpec(
            "cache",
            str,
            "",
            "pinned: the folder for the timing and engine caches (default: per model under "
            "~/.cache/xbackend/ort-trt)",
            path=True,
        ),
    )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._cache_dir = ""

    @classmethod
    def availability(cls) -> Availability:
        package = gpu.ort_gpu_problem(PROVIDER)
        lib = ""
        if not package and not gpu.find_library(TRT_LIB):
            lib = (
                f"{TRT_LIB} not found: onnxruntime-gpu's TensorRT provider needs TensorRT 10 for CUDA 13 "
                "(NVIDIA's container, see docker/Dockerfile.gpu)"
            )
        problem = gpu.problems(package, lib, gpu.cuda_problem())
        if problem:
            return Availability.missing(problem)
        return Availability.ok(ort_version())

    @classmethod
    def autotune_family(cls, pin_path: str) -> dict[str, tuple[str, dict[str, str]]]:
        cache = pin_path.removesuffix(".json") + "-ort-trt"
        return {
            "off": (cls.name, {"autotune": "off"}),
            "on": (cls.name, {"autotune": "on"}),
            "pinned": (cls.name, {"autotune": "pinned", "cache": cache}),
        }

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        _preload_tensorrt()
        if self.options["autotune"] == "pinned":
            from xbackend.model.load import model_sha256  # onnx: only a pinned build's cache key needs it

            self._cache_dir = self.options["cache"] or os.path.join(
                cache_home(), "ort-trt", model_sha256(Path(model.path))[:16]
            )
            os.makedirs(self._cache_dir, exist_ok=True)
        return super().prepare_impl(model, tensors)

    def providers(self) -> list[Any]:
        trt = trt_provider_options(
            {**self.options, "opt_level": self.options["trt_opt_level"]}, self._cache_dir
        )
        cuda = cuda_provider_options({**self.options, "autotune": "on"})
        return [(PROVIDER, trt), ("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]

    def info(self) -> dict[str, str]:
        out = super().info()
        out["tensorrt_tf32"] = "TensorRT's default (on): ONNX Runtime's TensorRT provider has no switch"
        if self._cache_dir:
            out["cache_dir"] = self._cache_dir
        return dict(sorted(out.items()))


def _preload_tensorrt() -> None:
    """Load TensorRT's libraries from where xbackend found them (pip's tensorrt_libs included),
    globally, so the provider library's own dlopen finds them by soname."""

    for soname in (TRT_LIB, "libnvinfer_plugin.so.10", "libnvonnxparser.so.10"):
        path = gpu.find_library(soname)
        if path:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
