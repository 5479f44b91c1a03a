"""The environment a comparison ran in: what determinism is promised against.

Only stable facts go in (no hostnames, times or temp paths) so two reports from
the same machine and set-up are byte-identical, and two environments diff cleanly.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

from xbackend.host.gpu import gpu_environment

__all__ = ["DETERMINISM_ENV_PREFIXES", "ISA_FLAGS", "collect_environment", "cpu_flags"]

ISA_FLAGS = (
    "sse4_1",
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512dq",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
    "asimd",
    "sve",
    "bf16",
    "i8mm",
)
DETERMINISM_ENV_PREFIXES = (
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "BLIS_",
    "KMP_",
    "GOMP_",
    "ORT_",
    "CUBLAS_",
    "CUDA_",
    "CUDNN_",
    "NVIDIA_TF32",
    "TF_DETERMINISTIC",
    "TF_CUDNN_",
    "TF_ENABLE_ONEDNN",
    "TORCH_",
    "PYTORCH_",
    "OV_",
    "ONEDNN_",
    "DNNL_",
    "PYTHONHASHSEED",
)
# variables under those prefixes that change no bits (xbackend sets the telemetry one itself)
NOT_DETERMINISM = frozenset({"ORT_DISABLE_TELEMETRY"})
PACKAGES = (
    "xbackend",
    "numpy",
    "ml-dtypes",
    "onnx",
    "onnxruntime",
    "openvino",
    "torch",
    "tensorrt",
    "polygraphy",
    # where models come from: the exporters and model families a report's model may be built with
    "onnxscript",
    "transformers",
    "optimum",
    "torchvision",
    "timm",
    "diffusers",
    "scikit-learn",
    "skl2onnx",
    "onnxmltools",
    "xgboost",
    "lightgbm",
)


def _cpuinfo() -> tuple[str, list[str]]:
    model: str = platform.processor() or platform.machine()
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = value.split()
    except OSError:
        pass
    return model, flags


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (`avx512f`, `amx_int8`); empty where
    it cannot be read."""
    return frozenset(_cpuinfo()[1])


def _versions() -> dict[str, str]:
    out = {}
    for pkg in PACKAGES:
        try:
            out[f"package.{pkg}"] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def collect_environment() -> dict[str, str]:
    """Sorted key -> value facts about this machine and process."""
    model, flags = _cpuinfo()
    env = {
        "cpu.model": model,
        "cpu.isa": " ".join(f for f in ISA_FLAGS if f in flags) or "none of the tracked flags",
        "cpu.logical_cores": str(os.cpu_count()),
        "cpu.machine": platform.machine(),
        "os": f"{platform.system()} {platform.release()}",
        "os.libc": " ".join(platform.libc_ver()).strip() or "unknown",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "python.byteorder": sys.byteorder,
    }
    import psutil  # optional where a runner imports cpu_flags: a foreign environment may lack it

    env["cpu.physical_cores"] = str(psutil.cpu_count(logical=False))
    env.update(_versions())

    env.update(gpu_environment())
    for k in sorted(os.environ):
        if k.startswith(DETERMINISM_ENV_PREFIXES) and k not in NOT_DETERMINISM:
            env[f"env.{k}"] = os.environ[k]
    return dict(sorted(env.items()))
