"""What this host offers GPU backends: driver, devices, CUDA runtime, cuDNN, TensorRT.

Everything here reads libraries through ctypes and never creates a CUDA context, so the
parent process may ask (for `xbackend backends` and the report's environment) and still
start workers that use the GPU. Each check says what is missing and how to get it.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass

__all__ = [
    "DriverInfo",
    "cuda_problem",
    "cudart_version",
    "cudnn_version",
    "device_name",
    "driver_info",
    "find_library",
    "gpu_environment",
    "ort_gpu_problem",
    "problems",
    "tensorrt_version",
]

NO_DRIVER_FIX = "run on a host with an NVIDIA GPU and its driver (or a container started with --gpus all)"


@dataclass(frozen=True)
class DriverInfo:
    """The NVIDIA driver as NVML reports it; `problem` says why not, when it cannot."""

    driver: str = ""
    cuda: str = ""  # the newest CUDA version the driver supports, e.g. "13.0"
    devices: tuple[str, ...] = ()  # "NVIDIA H100 80GB HBM3 (sm_90)"
    problem: str = ""


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


@functools.cache
def driver_info() -> DriverInfo:
    """Driver version, CUDA version and devices through NVML (libnvidia-ml), which the driver
    installs; no CUDA context is created."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return DriverInfo(problem=f"no NVIDIA driver here (libnvidia-ml.so.1 not found): {NO_DRIVER_FIX}")
    rc = nvml.nvmlInit_v2()
    if rc != 0:
        return DriverInfo(problem=f"the NVIDIA driver did not start (nvmlInit error {rc}): {NO_DRIVER_FIX}")
    try:
        buf = ctypes.create_string_buffer(96)
        nvml.nvmlSystemGetDriverVersion(buf, 96)
        driver = buf.value.decode()
        cuda = ctypes.c_int(0)
        nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda))
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        devices = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            nvml.nvmlDeviceGetName(handle, buf, 96)
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
            devices.append(f"{buf.value.decode()} (sm_{major.value}{minor.value})")
    finally:
        nvml.nvmlShutdown()
    info = DriverInfo(driver, _cuda_version(cuda.value) if cuda.value else "", tuple(devices))
    if not devices:
        return DriverInfo(driver, info.cuda, (), f"the NVIDIA driver {driver} sees no GPU: {NO_DRIVER_FIX}")
    return info


def device_name(index: int) -> str:
    """CUDA device `index` as NVML names it ("NVIDIA H100 80GB HBM3 (sm_90)"); "" when there is
    no such device."""
    devices = driver_info().devices
    return devices[index] if 0 <= index < len(devices) else ""


def _nvidia_dirs() -> list[str]:
    """Library folders of NVIDIA's pip packages (nvidia-cudnn-cu13, nvidia-cuda-runtime, ...)."""
    out = []
    for base in sys.path:
        for lib in sorted(glob.glob(os.path.join(base or ".", "nvidia", "*", "lib"))):
            out.append(lib)
        for lib in sorted(glob.glob(os.path.join(base or ".", "nvidia", "*", "*", "lib"))):
            out.append(lib)
        for lib in sorted(glob.glob(os.path.join(base or ".", "tensorrt_libs"))):
            out.append(lib)
    return out


@functools.cache
def find_library(soname: str) -> str:
    """A loadable path for `soname` (e.g. "libcudnn.so.9"): NVIDIA's pip packages first, then
    the loader's own search (LD_LIBRARY_PATH, ldconfig); "" when neither has it."""
    for folder in _nvidia_dirs():
        path = os.path.join(folder, soname)
        if os.path.exists(path):
            return path
    try:
        ctypes.CDLL(soname)
    except OSError:
        return ""
    return soname


def _load(soname: str) -> ctypes.CDLL | None:
    path = find_library(soname)
    if not path:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


@functools.cache
def cudart_version(major: int = 13) -> str:
    """The CUDA runtime library's version ("13.0"), or "" when libcudart is not found."""
    lib = _load(f"libcudart.so.{major}")
    if lib is None:
        return ""
    v = ctypes.c_int(0)
    if lib.cudaRuntimeGetVersion(ctypes.byref(v)) != 0:
        return ""
    return _cuda_version(v.value)


@functools.cache
def cudnn_version(major: int = 9) -> str:
    """cuDNN's version ("9.10.2"), or "" when libcudnn is not found."""
    lib = _load(f"libcudnn.so.{major}")
    if lib is None:
        return ""
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    v = int(lib.cudnnGetVersion())
    return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"


_TENSORRT_DISTS = (
    "tensorrt",
    "tensorrt-cu13",
    "tensorrt-cu12",
    "tensorrt_cu13_bindings",
    "tensorrt_cu12_bindings",
)


def tensorrt_version() -> str:
    """The installed TensorRT Python package's version, or ""."""
    if importlib.util.find_spec("tensorrt") is None:
        return ""
    for dist in _TENSORRT_DISTS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def cuda_problem() -> str:
    """Why no CUDA device can be used here ("" when one can)."""
    return driver_info().problem


ORT_GPU_INSTALL = (
    "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'onnxruntime-gpu[cuda,cudnn]==1.31.1'"
)


def problems(*found: str) -> str:
    """Every problem found, in order, as one line ("" when there is none)."""
    return "; and ".join(p for p in found if p)


def ort_gpu_problem(provider: str) -> str:
    """Why the installed ONNX Runtime lacks `provider` ("CUDAExecutionProvider"), "" when it has it
    (whether a GPU is there is cuda_problem's question)."""
    dists = set()
    for d in ("onnxruntime", "onnxruntime-gpu"):
        try:
            importlib.metadata.version(d)
            dists.add(d)
        except importlib.metadata.PackageNotFoundError:
            pass
    if importlib.util.find_spec("onnxruntime") is None:
        return f"onnxruntime-gpu is not installed ({ORT_GPU_INSTALL})"
    import onnxruntime as ort  # engine: onnxruntime

    if provider not in ort.get_available_providers():
        if "onnxruntime-gpu" in dists and "onnxruntime" in dists:
            return (
                "onnxruntime and onnxruntime-gpu are both installed and share one import package, and "
                f"the CPU build's files won ({ORT_GPU_INSTALL})"
            )
        build = f"the installed onnxruntime {ort.__version__} is a CPU build"
        return f"{build} without {provider} ({ORT_GPU_INSTALL})"
    return ""


def gpu_environment() -> dict[str, str]:
    """GPU facts for the report's environment; empty on a host with no NVIDIA driver."""
    info = driver_info()
    if not info.driver:
        return {}
    out = {"gpu.driver": info.driver, "gpu.driver_cuda": info.cuda}
    for index, device in enumerate(info.devices):
        out[f"gpu.{index}"] = device
    for key, version in (
        ("gpu.cuda_runtime", cudart_version()),
        ("gpu.cudnn", cudnn_version()),
        ("gpu.tensorrt", tensorrt_version()),
    ):
        out[key] = version or "not found"
    return out
