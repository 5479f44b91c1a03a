"""TorchInductor (`torch.compile`) on the module an ONNX model was exported from.

Two runners: `torch-compile` (Inductor's default mode, no autotuning) and
`torch-compile-autotune` (`mode="max-autotune"`: each tunable op is benchmarked between
candidate kernels and the fastest kept, so builds can differ). Both freeze the weights
(`torch._inductor.config.freezing`), which is what lets Inductor tune a Linear on CPU.

Every build is a fresh process with its own, empty Inductor cache folder, so it compiles
and tunes from scratch. `pin=FILE` records the first build's choices to FILE and replays
them in every later build (see xbackend.inductor_pin). Graph outputs only: forward hooks
inside a compiled module would change what Inductor compiles.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from xbackend.errors import RunnerFailedError, first_line
from xbackend.inductor_pin import PinMiss, Tuning, code_digest, load_pin, write_pin
from xbackend.model import ModelRef
from xbackend.runners.base import BuildFingerprint, OptionSpec
from xbackend.runners.torch_eager import TorchRunner

__all__ = ["TorchCompileAutotuneRunner", "TorchCompileRunner"]

DEVICES = ("cpu", "cuda")


class TorchCompileRunner(TorchRunner):
    name = "torch-compile"
    description = "TorchInductor (torch.compile), default mode, frozen weights: no autotuning"
    mode: ClassVar[str] = "default"
    instrumentation_changes_engine = False  # one build: graph outputs only (hooks would recompile)
    option_specs = (
        *TorchRunner.option_specs,
        OptionSpec("device", str, "cpu", "where the compiled module runs (cuda: Triton kernels)", DEVICES),
        OptionSpec("freezing", bool, True, "torch._inductor.config.freezing (weights as constants)"),
        OptionSpec(
            "pin",
            str,
            "",
            "FILE: the first build records its kernel choices there, later builds replay them "
            "(an op it does not record fails the build)",
        ),
    )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._compiled: Any = None
        self._cache = ""
        self._tuning = Tuning()
        self._pin_state = "none"
        self._code = ""  # the generated code's digest, once the first run has compiled

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        # An empty cache of its own: a build that found kernels (or tuning results) on disk
        # would not be a fresh build.
        self._cache = tempfile.mkdtemp(prefix="xbackend-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = self._cache
        os.environ["TRITON_CACHE_DIR"] = os.path.join(self._cache, "triton")
        import torch
        from torch._inductor import config

        config.freezing = bool(self.options["freezing"])
        config.fx_graph_cache = False
        config.autotune_local_cache = False
        device = self.options["device"]
        if device == "cuda" and not torch.cuda.is_available():
            raise RunnerFailedError("device=cuda but torch sees no CUDA device here; use device=cpu")
        fp = super().prepare_impl(model, tensors)
        pin = self.options["pin"]
        if pin and Path(pin).exists():
            self._tuning = Tuning(load_pin(pin), pin)
            self._pin_state = f"replayed from {pin}"
        elif pin:
            self._pin_state = f"recorded to {pin}"
        self._tuning.install()
        self._module = self._module.to(device).eval()
        options = dict(torch._inductor.list_mode_options(self.mode))
        if pin:
            # Timing-driven choices a pin file does not record: with them off, the recorded kernel
            # choices are the only ones timings make, in the recording build and every replay.
            options.update(coordinate_descent_tuning=False, benchmark_epilogue_fusion=False)
        self._compiled = torch.compile(self._module, options=options or None)
        return fp

    def _hook(self) -> None:
        self._map = {}  # graph outputs only

    def _forward(self, args: list[Any]) -> Any:
        import torch

        device = self.options["device"]
        args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
        first = not self._code
        try:
            with torch.no_grad():
                out = self._compiled(*args)
        except Exception as e:
            miss = _pin_miss(e)
            if miss is not None:
                raise miss from None
            raise RunnerFailedError(f"torch.compile failed: {type(e).__name__}: {first_line(e)}") from e
        if first:  # the first call compiles (and tunes)
            self._code = code_digest(self._cache, _read(self._tuning.modules))
            if self.options["pin"] and self._tuning.pin is None:
                write_pin(self.options["pin"], self._tuning.choices, importlib.metadata.version("torch"))
        return out

    def fingerprint(self) -> BuildFingerprint:
        """Per tuned op, the kernel chosen; plus a digest of the generated code. Complete once the
        first run has compiled the module."""
        if not self._code:
            return super().fingerprint()
        items = [
            (f"tuned {c.op}" + (f" ({c.module})" if c.module else ""), c.chosen) for c in self._tuning.choices
        ]
        items.append(("generated code", self._code))
        items += [(f"option {k}", v) for k, v in sorted(self.info().items()) if k not in ("pin_state", "pin")]
        return BuildFingerprint.from_items(self.name, items)

    def not_exposed(self) -> dict[str, str]:
        outputs = set(self._outputs)
        return {
            t: f"{self.name} compares graph outputs only (hooks in a compiled module change what it compiles)"
            for t in self._tensors
            if t not in outputs
        }

    def info(self) -> dict[str, str]:
        out = super().info()
        out["inductor_mode"] = self.mode
        out["pin_state"] = self._pin_state
        if self._code:
            out["tuned_ops"] = str(len(self._tuning.choices))
        return dict(sorted(out.items()))

    def close(self) -> None:
        super().close()
        self._compiled = None
        if self._cache:
            shutil.rmtree(self._cache, ignore_errors=True)


class TorchCompileAutotuneRunner(TorchCompileRunner):
    name = "torch-compile-autotune"
    description = "TorchInductor, mode max-autotune, frozen weights: kernels chosen by timing, per build"
    mode = "max-autotune"

    @classmethod
    def autotune_family(cls, pin_path: str) -> dict[str, tuple[str, dict[str, str]]]:
        return {
            "off": (TorchCompileRunner.name, {"pin": ""}),
            "on": (cls.name, {"pin": ""}),
            "pinned": (cls.name, {"pin": pin_path}),
        }


def _pin_miss(e: BaseException) -> PinMiss | None:
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, PinMiss):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    inner = getattr(e, "inner_exception", None)  # torch._dynamo's BackendCompilerFailed
    return inner if isinstance(inner, PinMiss) else None


def _read(paths: list[str]) -> list[str]:
    return [Path(p).read_text(errors="replace") for p in paths if os.path.exists(p)]
