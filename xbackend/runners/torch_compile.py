"""TorchInductor (`torch.compile`) on the module an ONNX model was exported from.

Two runners: `torch-compile` (Inductor's default mode, no autotuning) and
`torch-compile-autotune` (`mode="max-autotune"`: each tunable op is benchmarked between
candidate kernels and the fastest kept, so builds can differ). Both freeze the weights
(`torch._inductor.config.freezing`), which is what lets Inductor tune a Linear on CPU.

Every build is a fresh process with its own, empty Inductor cache folder, so it compiles
and tunes from scratch. `pin=FILE` records the first build's choices to FILE and replays
them in every later build (see xbackend.runners.inductor_pin).

Per-layer capture: where the model records which submodule output is which ONNX tensor (an
`xbackend export torch` export), a second build compiles a wrapper that also returns those
submodules' outputs. Returning them keeps values Inductor would fuse away, so that compile is
another engine: graph outputs come from the plain build, and the observer effect measures the
difference. The instrumented compile reuses the plain compile's kernel choices where its tuned
ops match, so its layers explain the plain build rather than a re-tuned one.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from xbackend.errors import BackendUnavailableError, RunnerFailedError, first_line
from xbackend.files.modelref import ModelRef
from xbackend.model.torch_module import module_map, to_numpy
from xbackend.runners.base import BuildFingerprint, OptionSpec
from xbackend.runners.inductor_pin import (
    INSTRUMENTED,
    PinMiss,
    Tuning,
    code_digest,
    load_pin,
    triton_recording,
    write_pin,
)
from xbackend.runners.torch_eager import TorchRunner

__all__ = [
    "INDUCTOR_SWITCHES",
    "TorchCompileAutotuneRunner",
    "TorchCompileRunner",
    "inductor_in_force",
    "set_switches",
]

DEVICES = ("cpu", "cuda")


class TorchCompileRunner(TorchRunner):
    name = "torch-compile"
    description = "TorchInductor (torch.compile), default mode, frozen weights: no autotuning"
    mode: ClassVar[str] = "default"
    instrumentation_changes_engine = True  # returning intermediates changes what Inductor fuses
    severs_by_feeds = False  # compiled: a hook cannot hand a kernel another module's output
    op_grain = False  # its kernels are Inductor's, not the aten calls run one by one
    option_specs = (
        *(option for option in TorchRunner.option_specs if option.name != "grain"),
        OptionSpec("device", str, "cpu", "where the compiled module runs (cuda: Triton kernels)", DEVICES),
        OptionSpec("freezing", bool, True, "torch._inductor.config.freezing (weights as constants)"),
        OptionSpec("tf32", bool, False, "device=cuda: TF32 for matmuls and convolutions (Triton and cuBLAS)"),
        OptionSpec(
            "batch_invariant",
            bool,
            False,
            "torch._inductor.config.batch_invariant: a sample's kernels do not depend on the batch "
            "size (implies deterministic; promises batch-position too)",
        ),
        OptionSpec(
            "pin",
            str,
            "",
            "FILE: the first build records its kernel choices there, later builds replay them "
            "(an op it does not record fails the build)",
            path=True,
        ),
    )

    @classmethod
    def instruments(cls, metadata: Mapping[str, str], model_dir: Path, options: Mapping[str, Any]) -> bool:
        return bool(module_map(metadata, str(options.get("module", "")), model_dir))

    @classmethod
    def promises_for(cls, options: Mapping[str, Any]) -> frozenset[str]:
        """deterministic (Inductor's mode: no benchmarking that changes numerics, and
        torch.use_deterministic_algorithms) promises the same bits in every run and every build;
        batch_invariant implies it and promises batch-position; a pin promises build-to-build."""
        out = set(super().promises_for(options))
        if options.get("deterministic") or options.get("batch_invariant"):
            out |= {"run-to-run", "build-to-build"}
        if options.get("batch_invariant"):
            out.add("batch-position")
        if options.get("pin"):
            out.add("build-to-build")
        return frozenset(out)

    @classmethod
    def determinism_modes(cls) -> dict[str, dict[str, str]]:
        return {"det": {"deterministic": "true"}, "bi": {"batch_invariant": "true"}}

    def _deterministic_algorithms(self) -> bool:
        return bool(self.options["deterministic"] or self.options["batch_invariant"])

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._compiled: Any = None
        self._cache = ""
        self._tuning = Tuning()
        self._pin_state = "none"
        self._code = ""  # the generated code's digest, once the first run has compiled
        self._compile_options: dict[str, Any] = {}

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        # An empty cache of its own: a build that found kernels (or tuning results) on disk
        # would not be a fresh build.
        self._cache = tempfile.mkdtemp(prefix="xbackend-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = self._cache
        os.environ["TRITON_CACHE_DIR"] = os.path.join(self._cache, "triton")
        import torch  # heavy: torch
        from torch._inductor import config  # heavy: torch

        config.freezing = bool(self.options["freezing"])
        wanted = {
            "deterministic": self._deterministic_algorithms(),
            "batch_invariant": bool(self.options["batch_invariant"]),
        }
        set_switches(config, wanted, str(torch.__version__))
        config.fx_graph_cache = False
        config.autotune_local_cache = False
        device = self.options["device"]
        if device == "cuda" and not torch.cuda.is_available():
            raise RunnerFailedError("device=cuda but torch sees no CUDA device here; use device=cpu")
        if device == "cuda":  # CPU compiles keep torch's global switches untouched
            torch.backends.cuda.matmul.allow_tf32 = bool(self.options["tf32"])
            torch.backends.cudnn.allow_tf32 = bool(self.options["tf32"])
        torch._dynamo.reset()  # a second phase in this process compiles from nothing, too
        fp = super().prepare_impl(model, tensors)
        self._tuning = self._new_tuning(self.options["pin"])
        self._tuning.install()
        self._module = self._module.to(device).eval()
        target = _instrumented(self._module, tuple(self._map)) if self._map else self._module
        options = dict(torch._inductor.list_mode_options(self.mode))
        if self.options["pin"]:
            # Timing-driven choices a pin file does not record: with them off, the recorded kernel
            # choices are the only ones timings make, in the recording build and every replay.
            options.update(coordinate_descent_tuning=False, benchmark_epilogue_fusion=False)
        self._compile_options = options
        self._compiled = torch.compile(target, options=options or None)
        return fp

    def _new_tuning(self, pin: str) -> Tuning:
        """The plain compile replays the pin file, or records to it. The instrumented one
        replays the file's instrumented section, or else (recording it) carries over the plain
        compile's choices made earlier in this process, where its ops match."""
        if not self._map:
            if pin and Path(pin).exists():
                self._pin_state = f"replayed from {pin}"
                return Tuning(load_pin(pin), pin)
            self._pin_state = f"recorded to {pin}" if pin else "none"
            return Tuning()
        if pin and Path(pin).exists():
            recorded = load_pin(pin, INSTRUMENTED)
            if recorded is not None:
                self._pin_state = f"replayed from {pin} (instrumented section)"
                return Tuning(recorded, pin, module_prefix=_INNER)
        self._pin_state = f"recorded to {pin} (instrumented section)" if pin else "none"
        return Tuning(dict(_PLAIN_CHOICES), pin, strict=False, module_prefix=_INNER)

    def _hook(self) -> None:
        pass  # the instrumented wrapper returns the mapped outputs instead (see prepare_impl)

    def _forward(self, args: list[Any]) -> Any:
        import torch  # heavy: torch

        device = self.options["device"]
        args = [arg.to(device) if isinstance(arg, torch.Tensor) else arg for arg in args]
        first = not self._code
        try:
            with torch.no_grad():
                out = self._compiled(*args)
        except Exception as error:
            miss = _pin_miss(error)
            if miss is not None:
                raise miss from None
            raise RunnerFailedError(
                f"torch.compile failed: {type(error).__name__}: {first_line(error)}"
            ) from error
        if self._map:
            out, layers = out
            for tensor, value in zip(self._map.values(), layers, strict=True):
                if isinstance(value, torch.Tensor):
                    self._captured[tensor] = to_numpy(value)
        if first:  # the first call compiles (and tunes)
            self._compiled_once()
        return out

    def _compiled_once(self) -> None:
        self._code = code_digest(self._cache, _read(self._tuning.modules))
        pin, tuning = self.options["pin"], self._tuning
        if not self._map:
            _PLAIN_CHOICES.clear()
            _PLAIN_CHOICES.update((choice.op, choice.chosen) for choice in tuning.choices)
            if pin and tuning.pin is None:
                write_pin(pin, tuning.choices, importlib.metadata.version("torch"))
        elif pin and not tuning.strict and Path(pin).exists():
            write_pin(pin, tuning.choices, importlib.metadata.version("torch"), INSTRUMENTED)

    def fingerprint(self) -> BuildFingerprint:
        """Per tuned op, the kernel chosen; plus a digest of the generated code. Complete once the
        first run has compiled the module."""
        if not self._code:
            return super().fingerprint()
        items = [
            (f"tuned {choice.op}" + (f" ({choice.module})" if choice.module else ""), choice.chosen)
            for choice in self._tuning.choices
        ]
        items.append(("generated code", self._code))
        items += [
            (f"option {key}", value)
            for key, value in sorted(self.info().items())
            if key not in ("pin_state", "pin")
        ]
        return BuildFingerprint.from_items(self.name, items)

    def info(self) -> dict[str, str]:
        out = super().info()
        out["inductor_mode"] = self.mode
        if self._compiled is not None:  # read back from Inductor's config, not assumed
            out.update(inductor_in_force(self._compile_options))
        if self.options["device"] != "cuda":
            out["tf32"] = "n/a (cpu)"
        elif self._compiled is not None:
            out["triton_choices"] = triton_recording() or "recorded: in the fingerprint and the pin file"
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


_INNER = "inner"  # the user's module inside the instrumented wrapper
# The plain compile's choices, for the instrumented compile that follows it in this process.
_PLAIN_CHOICES: dict[str, str] = {}


def _instrumented(module: Any, names: tuple[str, ...]) -> Any:
    """`module`, returning (its output, the outputs of the submodules `names`, in order).

    Forward hooks stash each output and forward returns them: Dynamo traces the hooks into the
    graph, so they become graph outputs (a hook that copied to numpy would break the graph)."""
    import torch  # heavy: torch

    class Instrumented(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module
            self.names = names
            self.stash: dict[str, Any] = {}
            subs = dict(module.named_modules())
            for name in names:
                subs[name].register_forward_hook(self._keep(name))

        def _keep(self, name: str) -> Any:
            def hook(_m: Any, _i: Any, out: Any) -> None:
                self.stash[name] = out

            return hook

        def forward(self, *args: Any) -> Any:
            out = self.inner(*args)
            return out, tuple(self.stash.pop(name, None) for name in self.names)

    return Instrumented().eval()


def set_switches(config: Any, wanted: Mapping[str, bool], version: str) -> None:
    """Inductor's switches as asked, feature-detected: a torch without one (batch_invariant is
    new; the GPU hosts' images carry an older torch) compiles without it unless it is asked for."""
    for key, want in wanted.items():
        if hasattr(config, key):
            setattr(config, key, want)
        elif want:
            raise BackendUnavailableError(
                f"unavailable in torch {version}: it has no torch._inductor.config.{key}, and "
                f"{key}=true needs a torch that has it (xbackend pins 2.13.0)"
            )


def inductor_in_force(compile_options: Mapping[str, Any]) -> dict[str, str]:
    """The Inductor settings that decide determinism, as the compile ran with them: its options
    over Inductor's config as it holds them now."""
    from torch._inductor import config  # heavy: torch

    return {
        f"in_force.inductor.{k}": str(compile_options.get(k, getattr(config, k, "absent")))
        for k in INDUCTOR_SWITCHES
    }


# Inductor's settings that change which kernels run or how they are chosen.
INDUCTOR_SWITCHES = (
    "deterministic",
    "batch_invariant",
    "freezing",
    "max_autotune",
    "coordinate_descent_tuning",
)


def _pin_miss(base_exception: BaseException) -> PinMiss | None:
    seen: set[int] = set()
    cur: BaseException | None = base_exception
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, PinMiss):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    inner = getattr(base_exception, "inner_exception", None)  # torch._dynamo's BackendCompilerFailed
    return inner if isinstance(inner, PinMiss) else None


def _read(paths: list[str]) -> list[str]:
    return [Path(path).read_text(errors="replace") for path in paths if os.path.exists(path)]
