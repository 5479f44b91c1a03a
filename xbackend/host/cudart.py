"""The few CUDA runtime calls a TensorRT engine needs, through ctypes on libcudart.

TensorRT's Python API takes device pointers; this keeps xbackend free of a CUDA Python
binding. Every call checks its status and raises RunnerFailedError with CUDA's own text.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from xbackend.errors import RunnerFailedError
from xbackend.host.gpu import find_library

__all__ = ["DeviceBuffer", "Stream", "runtime"]

_H2D, _D2H = 1, 2


@functools.cache
def runtime() -> ctypes.CDLL:
    """The CUDA runtime library (13, else 12); a RunnerFailedError that says what to install."""
    for major in (13, 12):
        path = find_library(f"libcudart.so.{major}")
        if path:
            lib = ctypes.CDLL(path)
            lib.cudaGetErrorString.restype = ctypes.c_char_p
            return lib
    raise RunnerFailedError("libcudart.so.13 not found: pip install nvidia-cuda-runtime (CUDA 13)")


def check(status: int, what: str) -> None:
    """Raise a RunnerFailedError naming `what` and CUDA's own words where `status` is not success."""
    if status != 0:
        text = runtime().cudaGetErrorString(status).decode(errors="replace")
        raise RunnerFailedError(f"CUDA {what} failed: {text} (error {status})")


class Stream:
    def __init__(self) -> None:
        self.handle = ctypes.c_void_p()
        check(runtime().cudaStreamCreate(ctypes.byref(self.handle)), "cudaStreamCreate")

    @property
    def ptr(self) -> int:
        """The stream's handle as an integer (0 once closed)."""
        return int(self.handle.value or 0)

    def synchronize(self) -> None:
        """Wait until the work queued on the stream is done."""
        check(runtime().cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def close(self) -> None:
        """Destroy the stream (again: nothing)."""
        if self.handle.value:
            runtime().cudaStreamDestroy(self.handle)
            self.handle = ctypes.c_void_p()


class DeviceBuffer:
    """`nbytes` of device memory (at least one byte, so every tensor has an address)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)
        self.handle = ctypes.c_void_p()
        check(
            runtime().cudaMalloc(ctypes.byref(self.handle), ctypes.c_size_t(max(self.nbytes, 1))),
            "cudaMalloc",
        )

    @property
    def ptr(self) -> int:
        """The buffer's device address as an integer (0 once freed)."""
        return int(self.handle.value or 0)

    def upload(self, a: np.ndarray, stream: Stream) -> None:
        """Queue a copy of `a` (contiguous) into the buffer on `stream`; a RunnerFailedError where it does
        not fit."""
        a = np.ascontiguousarray(a)
        if a.nbytes > self.nbytes:
            raise RunnerFailedError(f"{a.nbytes} bytes do not fit a {self.nbytes}-byte device buffer")
        status = runtime().cudaMemcpyAsync(
            self.handle, ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(a.nbytes), _H2D, stream.handle
        )
        check(status, "cudaMemcpyAsync (host to device)")
        stream.synchronize()  # `a` may be a temporary

    def download(self, out: np.ndarray, stream: Stream) -> np.ndarray:
        """Queue a copy of the buffer into `out` on `stream`; `out`."""
        return download(self.ptr, out, stream)

    def close(self) -> None:
        """Free the buffer (again: nothing)."""
        if self.handle.value:
            runtime().cudaFree(self.handle)
            self.handle = ctypes.c_void_p()


def download(ptr: int, out: np.ndarray, stream: Stream | Any) -> np.ndarray:
    """Copy `out.nbytes` from device address `ptr` into `out`, on `stream` (a Stream or a raw
    stream handle), and wait for it."""
    handle = stream.handle if isinstance(stream, Stream) else ctypes.c_void_p(int(stream or 0))
    if out.nbytes:
        status = runtime().cudaMemcpyAsync(
            ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(ptr), ctypes.c_size_t(out.nbytes), _D2H, handle
        )
        check(status, "cudaMemcpyAsync (device to host)")
        check(runtime().cudaStreamSynchronize(handle), "cudaStreamSynchronize")
    return out
