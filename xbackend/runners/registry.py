"""Name -> runner class registry, filtered by importability.

Built-in runners are listed here; third-party hardware registers a
``module:Class`` under the ``xbackend.runners`` entry-point group.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import sys
from dataclasses import dataclass

from xbackend.errors import BackendUnavailableError, UsageError
from xbackend.runners.base import Availability, Runner

__all__ = ["RunnerEntry", "get_runner", "list_runners", "runner_names", "split_instance"]

ENTRY_POINT_GROUP = "xbackend.runners"

_BUILTIN: dict[str, str] = {
    "ort-cpu": "xbackend.runners.ort_cpu:OrtCpuRunner",
    "ort-cuda": "xbackend.runners.ort_cuda:OrtCudaRunner",
    "ort-trt": "xbackend.runners.ort_trt:OrtTrtRunner",
    "trt-autotune": "xbackend.runners.tensorrt:TrtAutotuneRunner",
    "trt-pinned": "xbackend.runners.tensorrt:TrtPinnedRunner",
    "torch-cuda": "xbackend.runners.torch_cuda:TorchCudaRunner",
    "reference": "xbackend.runners.reference:ReferenceRunner",
    "oracle": "xbackend.runners.oracle:OracleRunner",
    "openvino-cpu": "xbackend.runners.openvino_cpu:OpenVinoCpuRunner",
    "openvino-cpu-default": "xbackend.runners.openvino_cpu:OpenVinoCpuDefaultRunner",
    "torch": "xbackend.runners.torch_eager:TorchRunner",
    "torch-compile": "xbackend.runners.torch_compile:TorchCompileRunner",
    "torch-compile-autotune": "xbackend.runners.torch_compile:TorchCompileAutotuneRunner",
    "expected": "xbackend.runners.expected:ExpectedRunner",
    "groq": "xbackend.runners.groq:GroqRunner",
    "llama.cpp": "xbackend.runners.llama_cpp:LlamaCppRunner",
    "executorch": "xbackend.runners.executorch_rt:ExecuTorchRunner",
    "executorch-xnnpack": "xbackend.runners.executorch_rt:ExecuTorchXnnpackRunner",
}


@dataclass(frozen=True)
class RunnerEntry:
    """A registered runner: its name, where it lives and whether it can run here."""

    name: str
    target: str
    availability: Availability
    description: str = ""


def _targets() -> dict[str, str]:
    return dict(_plugins(_installed()))


def _installed() -> tuple[tuple[str, int], ...]:
    """Each folder imports come from, with the time it last changed (a package installed or
    removed changes its folder): what the plugins found there were found in."""
    out = []
    for folder in sys.path:
        try:
            out.append((folder, os.stat(folder or ".").st_mtime_ns))
        except OSError:
            out.append((folder, 0))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _plugins(_installed: tuple[tuple[str, int], ...]) -> tuple[tuple[str, str], ...]:
    """The built-in runners and the entry points' (scanning every installed distribution takes
    15 ms, asked several times a run)."""
    targets = dict(_BUILTIN)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        targets.setdefault(ep.name, ep.value)
    return tuple(targets.items())


def runner_names() -> list[str]:
    """Every runner's name, built in and installed (the xbackend.runners entry points), sorted."""
    return sorted(_targets())


def _load(name: str, target: str) -> type[Runner]:
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Runner)):
        raise TypeError(f"{target} is not a xbackend Runner subclass")
    return cls


def _entry(name: str, target: str) -> RunnerEntry:
    try:
        cls = _load(name, target)
    except Exception as error:  # a broken plugin is reported, not fatal
        return RunnerEntry(name, target, Availability.missing(f"cannot import {target}: {error}"))
    try:
        avail = cls.availability()
    except Exception as error:
        avail = Availability.missing(f"availability check failed: {error}")
    return RunnerEntry(name, target, avail, cls.description)


def list_runners() -> list[RunnerEntry]:
    """Every registered runner, available or not, sorted by name."""
    return [_entry(key, target) for key, target in sorted(_targets().items())]


_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def split_instance(name: str) -> tuple[str, str]:
    """'ort-cpu@1t' -> ('ort-cpu', '1t'); a plain name has the label ''."""
    base, at, label = name.partition("@")
    if at and not _LABEL.fullmatch(label):  # fullmatch: "$" would let a trailing newline in
        raise UsageError(
            f"backend {name!r}: a label after @ is letters, digits, '_', '.', '+' or '-' (e.g. ort-cpu@1t)"
        )
    return base, label


def runner_target(name: str) -> str:
    """'module:Class' of the runner `name` (an instance's base runner)."""
    base, _ = split_instance(name)
    get_runner(base)
    return _targets()[base]


def get_runner(name: str) -> type[Runner]:
    """The runner class for `name` (or the runner an instance NAME@LABEL is of);
    BackendUnavailableError listing the known ones otherwise."""
    name, _ = split_instance(name)
    targets = _targets()
    if name not in targets:
        known = [
            runner.name if runner.availability.available else f"{runner.name} (unavailable)"
            for runner in list_runners()
        ]
        raise BackendUnavailableError(
            f"unknown backend {name!r}; known backends: {', '.join(known)} (`xbackend backends` says why "
            "one is unavailable)"
        )
    try:
        return _load(name, targets[name])
    except Exception as error:
        raise BackendUnavailableError(f"backend {name!r} cannot be imported: {error}") from error
