"""Runner options other flags expand into: --modes (each determinism mode of a runner as a
backend instance), --threads and the torch backends' --torch-module / --trust-model-code."""

from __future__ import annotations

from typing import Any

from xbackend.errors import UsageError
from xbackend.results.flags import count
from xbackend.runners.registry import get_runner

__all__ = ["TORCH_BACKENDS", "expand_modes", "thread_options", "torch_options"]

TORCH_BACKENDS = (
    "torch",
    "torch-compile",
    "torch-compile-autotune",
    "torch-cuda",
    "executorch",
    "executorch-xnnpack",
)  # the backends that run the module a model was exported from (--torch-module)


def expand_modes(
    backends: tuple[str, ...], modes: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]]:
    """`backends` plus each runner in `modes` under its default and each determinism mode it
    declares (NAME, NAME@LABEL...), and the options that set each mode."""
    out = list(backends)
    sets: list[tuple[str, str, str]] = []
    for name in modes:
        cls = get_runner(name)
        declared_modes = cls.determinism_modes()
        if not declared_modes:
            raise UsageError(
                f"{name} declares no determinism modes; compare its settings as instances instead, "
                f"e.g. --backends {name},{name}@other --set {name}@other.OPTION=VALUE"
            )
        for label, options in {"": {}, **declared_modes}.items():
            instance = f"{name}@{label}" if label else name
            if instance not in out:
                out.append(instance)
            sets += [(instance, key, option) for key, option in options.items()]
    return tuple(out), tuple(sets)


def torch_options(
    backends: tuple[str, ...], module: str | None, trust: bool
) -> tuple[tuple[str, str, str], ...]:
    """--torch-module and --trust-model-code as runner options of each torch backend listed."""
    chosen = [backend for backend in backends if backend.partition("@")[0] in TORCH_BACKENDS]
    if (module or trust) and not chosen:
        flag_name = "--torch-module" if module else "--trust-model-code"
        raise UsageError(
            f"{flag_name} applies to the torch backends; add torch (or {TORCH_BACKENDS[1]}) to --backends"
        )
    out: tuple[tuple[str, str, str], ...] = ()
    for backend_result in chosen:
        if module:
            out += ((backend_result, "module", str(module)),)
        if trust:
            out += ((backend_result, "trust_model_code", "true"),)
    return out


def thread_options(backends: tuple[str, ...], threads: Any) -> tuple[tuple[str, str, str], ...]:
    """--threads N as the threads option of each backend whose runner has one."""
    if threads is None:
        return ()
    count(1, 4096)("--threads", int(threads))
    chosen = [
        backend
        for backend in backends
        if any(option.name == "threads" for option in get_runner(backend).option_specs)
    ]
    if not chosen:
        raise UsageError(
            f"--threads applies to backends with a threads option, and none of {','.join(backends)} has "
            "one; add ort-cpu (or openvino-cpu, torch) to --backends"
        )
    return tuple((backend, "threads", str(int(threads))) for backend in chosen)
