"""TorchInductor's autotuning choices: record them, replay them (pin), fingerprint them.

With `mode="max-autotune"` Inductor benchmarks each tunable op (a frozen Linear's
`packed_linear`, `mm`, `addmm`, convolutions) between candidate kernels (C++ micro-GEMM
templates, ATen/MKL, Triton configs on GPU) and keeps the fastest: timing noise picks
different kernels on different builds, and different kernels give different bits.

Every selection goes through `AlgorithmSelectorCache.do_autotuning`, which returns each
candidate's time; the caller keeps the minimum. `Tuning.install()` wraps it:

- recording: the candidates are benchmarked as usual; the op, the chosen kernel and every
  candidate's time are noted;
- replaying (a pin file): nothing is benchmarked; the recorded kernel gets time 0 and every
  other candidate infinity, so Inductor keeps the recorded one. An op the file does not
  record, or a recorded kernel that is not among the candidates, fails the build (PinMiss),
  as TensorRT's editable timing cache does with error-on-miss.

On a GPU, Triton's own runtime autotuner makes choices too: the first launch of a kernel with
several configurations (block sizes, warps) times each and keeps the fastest
(`CachingAutotuner.autotune_to_one_config`). Those choices are recorded and replayed the same way,
as ops named `triton KIND KERNEL [size hints]`: a reduction's block size changes its order of
summation, so two builds that chose differently compute different bits under one generated code.

The fingerprint's code digest covers the output code of the compiled graphs (their kernels
are inline in it), not the candidate kernels compiled only to be timed, which a replayed
build never compiles.

Kernel names carry per-build counters (`cpp_CppMicroGemmFP32Vec_3`): a choice is named by
its kernel name without the counter, plus Inductor's description of it (Triton's block
sizes), plus its rank among same-named candidates when that is still ambiguous.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xbackend.errors import RunnerFailedError
from xbackend.files.atomic import write_atomic
from xbackend.files.untrusted import json_loads

__all__ = [
    "INSTRUMENTED",
    "PIN_VERSION",
    "PLAIN",
    "Choice",
    "PinMiss",
    "Tuning",
    "code_digest",
    "load_pin",
    "triton_config_name",
    "triton_key",
    "triton_recording",
    "write_pin",
]

PIN_VERSION = 1
_COUNTER = re.compile(r"_\d+$")


class PinMiss(RunnerFailedError):
    """A pinned build met an op (or a kernel) its pin file does not record."""


@dataclass(frozen=True)
class Choice:
    """One tuned op: where it is, what was chosen, and every candidate's time (ms; None when
    replayed from a pin file, which benchmarks nothing)."""

    op: str  # e.g. "packed_linear(64x512) -> 64x1024 float32 #0"
    module: str  # nn.Module path of the op, "" when Inductor did not keep it
    chosen: str
    timings_ms: tuple[tuple[str, float | None], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The choice as the pin file records it."""
        return {
            "op": self.op,
            "module": self.module,
            "chosen": self.chosen,
            "timings_ms": {k: v for k, v in self.timings_ms},
        }


def choice_names(choices: Sequence[Any]) -> list[str]:
    """A stable name per candidate of one op (see the module docstring)."""
    bases = []
    for choice in choices:
        base = _COUNTER.sub("", str(getattr(choice, "name", type(choice).__name__)))
        desc = str(getattr(choice, "description", "") or "").strip()
        bases.append(f"{base} [{desc}]" if desc else base)
    out, seen = [], dict.fromkeys(bases, 0)
    for b in bases:
        out.append(b if bases.count(b) == 1 else f"{b} #{seen[b]}")
        seen[b] += 1
    return out


def _op_key(name: str, input_nodes: Sequence[Any], layout: Any) -> str:
    """The op, its first input's and its output's shapes: not the other inputs', which can be
    weights in a library's packed format whose size depends on the CPU."""

    def shape(x: Any) -> str:
        try:
            return "x".join(str(d) for d in (x.get_size() if hasattr(x, "get_size") else x.size))
        except Exception:  # symbolic or sizeless: still a stable key
            return "?"

    first = input_nodes[0] if input_nodes else None
    try:
        dtype = str(layout.dtype).replace("torch.", "")
    except Exception:
        dtype = "?"
    return f"{name}({shape(first) if first is not None else ''}) -> {shape(layout)} {dtype}"


def _module_path() -> str:
    """nn.Module path of the FX node being lowered (Inductor keeps Dynamo's module stack)."""
    try:
        from torch._inductor.virtualized import V  # heavy: torch

        node = V.graph.current_node
        stack = node.meta.get("nn_module_stack") if node is not None else None
    except Exception:
        return ""
    if not stack:
        return ""
    return module_path(str(list(stack.values())[-1][0]))


def module_path(raw: str) -> str:
    """Dynamo's source for a submodule ("L['self'].blocks[0].fc1", "L['fn']._modules['0']")
    as the dotted path named_modules() uses ("blocks.0.fc1", "0")."""
    path = re.sub(r"^L\['[^']*'\]", "", raw)
    path = re.sub(
        r"\._modules\['([^']+)'\]|\['([^']+)'\]|\[(\d+)\]",
        lambda judged: "." + next(group for group in judged.groups() if group),
        path,
    )
    return path.strip(".")


@dataclass
class Tuning:
    """Records the autotuning decisions of one compile; replays `pin` when given.

    strict: an op or kernel `pin` lacks fails the build (a pin file); otherwise it is tuned as
    usual (`pin` then only carries another compile's choices over, where they apply).
    module_prefix: the attribute path of the user's module inside the compiled one, dropped
    from module paths.
    """

    pin: dict[str, str] | None = None  # op -> chosen kernel
    pin_path: str = ""
    strict: bool = True
    module_prefix: str = ""
    choices: list[Choice] = field(default_factory=list)
    # the compiled graphs' output code (kernels inline), not the candidates built to be timed
    modules: list[str] = field(default_factory=list)
    _seen: dict[str, int] = field(default_factory=dict)

    def install(self) -> None:
        """Make this the tuning Inductor's selections go through, from now on in this process;
        RunnerFailedError when this torch selects some other way."""
        global _ACTIVE
        _patch()
        _ACTIVE = self
        _LOWERED_AT.clear()

    def _select(self, original: Any, bound: dict[str, Any], args: Any, kwargs: Any) -> Any:
        choices = bound["choices"]
        key = _op_key(bound["name"], bound["input_nodes"], bound["layout"])
        index = self._seen.get(key, 0)
        self._seen[key] = index + 1
        op = f"{key} #{index}"
        names = choice_names(choices)
        module = self._module(bound["input_nodes"])
        if self.pin is not None and (self.strict or self.pin.get(op) in names):
            return self._replay(op, module, choices, names)
        timings = original(*args, **kwargs)
        self._record(op, module, choices, names, timings)
        return timings

    def _module(self, input_nodes: Any) -> str:
        # Selection can be deferred (epilogue-fusion benchmarks on GPU) until the scheduler runs,
        # where no FX node is current: then the path noted when the op was lowered stands.
        path = self._within(_module_path() or _LOWERED_AT.get(id(input_nodes), (None, ""))[1])
        return path

    def _record(
        self, op: str, module: str, choices: Sequence[Any], names: Sequence[str], timings: dict[Any, float]
    ) -> None:
        by_choice = {id(choice): name for choice, name in zip(choices, names, strict=True)}
        measured = {
            by_choice[id(key)]: float(timing) for key, timing in timings.items() if id(key) in by_choice
        }
        chosen = min(measured, key=measured.__getitem__) if measured else (names[0] if names else "")
        self.choices.append(Choice(op, module, chosen, tuple(sorted(measured.items()))))

    def _replay(self, op: str, module: str, choices: Sequence[Any], names: Sequence[str]) -> dict[Any, float]:
        want = self._pinned(op, names)
        self.choices.append(Choice(op, module, want, tuple((name, None) for name in names)))
        return {
            choice: (0.0 if name == want else float("inf"))
            for choice, name in zip(choices, names, strict=True)
        }

    def _pinned(self, op: str, names: Sequence[str]) -> str:
        """The pin file's choice for `op`, which must be among `names`; PinMiss otherwise."""
        assert self.pin is not None
        want = self.pin.get(op)
        if want is None:
            raise PinMiss(
                f"the pin file {self.pin_path} records no kernel for {op}; it was recorded for another "
                "model or shape: delete it and build once to record it again"
            )
        if want not in names:
            raise PinMiss(
                f"the pin file {self.pin_path} chose {want!r} for {op}, which this build does not offer "
                f"(another torch or GPU; candidates: {', '.join(names)}); delete it and build once to "
                "record it again"
            )
        return want

    def select_triton(self, tuner: Any, original: Any, args: Any, kwargs: Any) -> Any:
        """Triton's runtime choice among one kernel's configurations (block sizes, warps), made at
        the kernel's first launch by timing each: recorded, or replayed from the pin without
        timing anything (see `triton_key`)."""
        key = triton_key(tuner)
        index = self._seen.get(key, 0)
        self._seen[key] = index + 1
        op = f"{key} #{index}"
        names = [triton_config_name(launcher.config) for launcher in tuner.launchers]
        module = self._within(KERNEL_MODULES.get(_kernel_name(tuner), ""))
        if self.pin is not None and (self.strict or self.pin.get(op) in names):
            want = self._pinned(op, names)
            tuner.launchers = [tuner.launchers[names.index(want)]]
            self.choices.append(Choice(op, module, want, tuple((name, None) for name in names)))
            return None
        out = original(tuner, *args, **kwargs)
        timed = getattr(tuner, TIMINGS_ATTR, {})
        measured = tuple(
            sorted((triton_config_name(key.config), float(value)) for key, value in timed.items())
        )
        self.choices.append(Choice(op, module, triton_config_name(tuner.launchers[0].config), measured))
        return out

    def _within(self, path: str) -> str:
        """A module path inside the compiled wrapper as the user's module names it."""
        if self.module_prefix and (path + ".").startswith(self.module_prefix + "."):
            return path[len(self.module_prefix) + 1 :]
        return path


def _kernel_name(tuner: Any) -> str:
    meta = getattr(tuner, "inductor_meta", None) or {}
    return str(meta.get("kernel_name") or getattr(getattr(tuner, "fn", None), "__name__", ""))


# Triton kernel name -> the nn.Module path of the first op it computes, noted when Inductor
# defines the kernel (its schedule still knows the FX nodes); read when Triton tunes it.
KERNEL_MODULES: dict[str, str] = {}


def schedule_module(node_schedule: Any) -> str:
    """The module path of the first op in a kernel's schedule that Dynamo's module stack names."""
    for snode in node_schedule if isinstance(node_schedule, list | tuple) else ():
        for origin in _origins(snode):
            stack = getattr(origin, "meta", {}).get("nn_module_stack")
            if stack:
                return module_path(str(list(stack.values())[-1][0]))
    return ""


def _origins(snode: Any) -> list[Any]:
    """The FX nodes a scheduler node computes, in a fixed order (markers have none)."""
    nodes = snode.get_nodes() if callable(getattr(snode, "get_nodes", None)) else [snode]
    out: list[Any] = []
    for node in nodes:
        origins = getattr(getattr(node, "node", None), "origins", None) or ()
        out += sorted(origins, key=lambda origin: str(getattr(origin, "name", "")))
    return out


def triton_key(tuner: Any) -> str:
    """A Triton kernel as a pin file names it: its kind, its name (Inductor numbers kernels in
    the order it generates them, the same in every compile of one graph) and its size hints."""
    kind = getattr(getattr(tuner, "heuristic_type", None), "name", "kernel").lower()
    meta = getattr(tuner, "inductor_meta", None) or {}
    name = meta.get("kernel_name") or getattr(getattr(tuner, "fn", None), "__name__", "?")
    hints = getattr(tuner, "size_hints", None) or {}
    sizes = (
        ",".join(f"{key}={value}" for key, value in sorted(dict(hints).items()))
        if isinstance(hints, dict)
        else str(hints)
    )
    return f"triton {kind} {name} [{sizes}]"


def triton_config_name(config: Any) -> str:
    """A Triton configuration by its block sizes and launch parameters, in a fixed order."""
    kwargs = dict(getattr(config, "kwargs", {}) or {})
    parts = [f"{key}={kwarg}" for key, kwarg in sorted(kwargs.items())]
    for attr in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        if getattr(config, attr, None) is not None:
            parts.append(f"{attr}={getattr(config, attr)}")
    return ", ".join(parts) or str(config)


TIMINGS_ATTR = "_xbackend_timings"  # a kernel's measured configurations, for the record
_ACTIVE: Tuning | None = None
_PATCHED = False
TRITON_RECORDING = ""  # why Triton's choices cannot be recorded in this torch ("" once they can)
# id(input_nodes) -> (input_nodes, module path) for each selection, noted when its op is lowered
_LOWERED_AT: dict[int, tuple[Any, str]] = {}


def _patch() -> None:
    """Route Inductor's kernel selection and output-code compiles through the active Tuning;
    once per process, so builds made one after another in it never stack wrappers."""
    global _PATCHED
    if _PATCHED:
        return

    from torch._inductor import select_algorithm as sa  # heavy: torch
    from torch._inductor.graph import GraphLowering  # heavy: torch

    original: Any = getattr(sa.AlgorithmSelectorCache, "do_autotuning", None)
    params = set(inspect.signature(original).parameters) if callable(original) else set()
    if not {"name", "input_nodes", "layout", "choices"} <= params:
        raise RunnerFailedError(
            "this torch's Inductor has no AlgorithmSelectorCache.do_autotuning(name, input_nodes, "
            "layout, choices, ...) to record kernel choices from; use torch 2.11 to 2.13"
        )
    signature = inspect.signature(original)

    def do_autotuning(*args: Any, **kwargs: Any) -> Any:
        if _ACTIVE is None:
            return original(*args, **kwargs)
        return _ACTIVE._select(original, signature.bind(*args, **kwargs).arguments, args, kwargs)

    call = sa.AlgorithmSelectorCache.__call__
    call_signature = inspect.signature(call)

    def select(*args: Any, **kwargs: Any) -> Any:
        try:
            nodes = call_signature.bind(*args, **kwargs).arguments["input_nodes"]
            _LOWERED_AT[id(nodes)] = (nodes, _module_path())  # the list keeps its id while held
        except (TypeError, KeyError):
            pass
        return call(*args, **kwargs)

    compile_to_module = GraphLowering.compile_to_module

    def collect(graph: Any) -> Any:
        mod = compile_to_module(graph)
        path = getattr(mod, "__file__", None)
        if path and _ACTIVE is not None:
            _ACTIVE.modules.append(str(path))
        return mod

    _patch_triton()
    sa.AlgorithmSelectorCache.do_autotuning = do_autotuning  # type: ignore[method-assign]
    sa.AlgorithmSelectorCache.__call__ = select  # type: ignore[method-assign]
    GraphLowering.compile_to_module = collect  # type: ignore[method-assign,assignment]
    _PATCHED = True


def triton_recording() -> str:
    """Why Triton's configuration choices are not recorded in this process; "" when they are."""
    return TRITON_RECORDING if _PATCHED else "no compile has installed the recording yet"


def _patch_triton() -> None:
    """Route Triton's runtime configuration choice (CachingAutotuner.autotune_to_one_config, the
    one place it times configurations and keeps the fastest) through the active Tuning."""
    global TRITON_RECORDING
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner  # heavy: torch
    except Exception as error:  # a torch without Triton support: CPU compiles never need it
        TRITON_RECORDING = f"torch has no Triton autotuner to record from ({type(error).__name__})"
        return
    choose = getattr(CachingAutotuner, "autotune_to_one_config", None)
    bench = getattr(CachingAutotuner, "benchmark_all_configs", None)
    if not callable(choose) or not callable(bench):
        TRITON_RECORDING = (
            "this torch's CachingAutotuner has no autotune_to_one_config/benchmark_all_configs: "
            "Triton's configuration choices are not recorded (use torch 2.11 to 2.13)"
        )
        return

    def autotune_to_one_config(tuner: Any, *args: Any, **kwargs: Any) -> Any:
        if _ACTIVE is None:
            return choose(tuner, *args, **kwargs)
        return _ACTIVE.select_triton(tuner, choose, args, kwargs)

    def benchmark_all_configs(tuner: Any, *args: Any, **kwargs: Any) -> Any:
        timings = bench(tuner, *args, **kwargs)
        setattr(tuner, TIMINGS_ATTR, dict(timings))
        return timings

    CachingAutotuner.autotune_to_one_config = autotune_to_one_config  # type: ignore[method-assign,assignment]
    CachingAutotuner.benchmark_all_configs = benchmark_all_configs  # type: ignore[method-assign,assignment]
    _patch_define_kernel()


def _patch_define_kernel() -> None:
    """Note each Triton kernel's module path when Inductor names it (see KERNEL_MODULES)."""
    try:
        from torch._inductor.codegen.triton import TritonScheduling  # heavy: torch
    except Exception:  # no Triton codegen in this torch: no Triton kernels to name
        return
    define = getattr(TritonScheduling, "define_kernel", None)
    if not callable(define):
        return

    def define_kernel(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = define(self, *args, **kwargs)
        path = schedule_module(args[1] if len(args) > 1 else kwargs.get("node_schedule"))
        if path and isinstance(name, str):
            KERNEL_MODULES[name] = path
        return name

    TritonScheduling.define_kernel = define_kernel  # type: ignore[method-assign]


# A pin file's sections: the plain compile users ship, and the instrumented compile that also
# returns the mapped submodules' outputs (its own graph, so its own choices).
PLAIN, INSTRUMENTED = "choices", "instrumented"


def load_pin(path: str, section: str = PLAIN) -> dict[str, str] | None:
    """op -> kernel from a pin file's section (None when the file has no instrumented section);
    a one-line RunnerFailedError for a file that is not a pin file."""
    data = _read_pin(path)
    try:
        if section not in data and section != PLAIN:
            return None
        return {str(c["op"]): str(c["chosen"]) for c in data[section]}
    except (KeyError, TypeError, AttributeError) as error:
        raise RunnerFailedError(
            f"cannot read the pin file {path}: no valid {section!r} list ({type(error).__name__}: {error}); "
            "delete it and build once to record it again"
        ) from error


def _read_pin(path: str) -> dict[str, Any]:
    try:
        data = json_loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("version") != PIN_VERSION:
            raise ValueError(f"version {data.get('version')!r}, this xbackend reads {PIN_VERSION}")
        return data
    except (OSError, ValueError) as error:
        raise RunnerFailedError(
            f"cannot read the pin file {path}: {error}; delete it and build once to record it again"
        ) from error


def write_pin(path: str, choices: Iterable[Choice], torch_version: str, section: str = PLAIN) -> None:
    """The choices as plain, diffable JSON, written atomically. The plain section starts a new
    file; the instrumented section is added to the file the plain one recorded."""
    data: dict[str, Any] = (
        {"version": PIN_VERSION, "torch": torch_version} if section == PLAIN else _read_pin(path)
    )
    data[section] = [choice.to_json() for choice in choices]
    # the instrumented section goes into the pin file the user named, just read as a pin (one
    # committed to their repository too): an update the user asked for, not someone's file
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n", "pin file", force=section != PLAIN)


_HASHES = re.compile(r"\b[a-z0-9]{20,}\b")
_NUMBERED = re.compile(
    r"\b(buf|arg|primals|tangents|_frozen_param|cpp_fused_\w+?|triton_\w+?|kernel)_?(\d+)\b"
)


def code_digest(cache_dir: str, sources: Iterable[str]) -> str:
    """sha256 of the generated code, with the cache folder, content hashes and per-build counters
    normalized, so that two builds making the same decisions give the same digest."""
    digest = hashlib.sha256()
    for text in sorted(_normalize(source, cache_dir) for source in sources):
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


_ADDRESSES = re.compile(r"\b(?:0x)?[0-9a-f]{12}\b")


def _normalize(text: str, cache_dir: str) -> str:
    if cache_dir:
        text = text.replace(cache_dir, "<cache>")
    text = _ADDRESSES.sub("<addr>", text)  # data pointers in comments
    text = _HASHES.sub("<hash>", text)
    return _NUMBERED.sub(lambda m: f"{m.group(1)}<n>", text)
