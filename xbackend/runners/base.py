"""The runner contract every backend implements.

Public methods check the contract (state, feeds, results) and call the `*_impl`
hooks that subclasses write. Runner modules import their engine only inside
`prepare_impl`, so listing and validating runners stays cheap.
"""

from __future__ import annotations

import abc
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from xbackend.errors import BackendUnavailableError, RunnerFailedError, UsageError
from xbackend.files.modelref import ModelRef
from xbackend.numerics.values import Value, normalize
from xbackend.runners.buildinfo import BuildFingerprint, OptLevelRow

__all__ = ["Availability", "BuildFingerprint", "OptionSpec", "Runner", "promised_if", "thread_limit"]


@dataclass(frozen=True)
class Availability:
    """Whether a runner can run here, and if not, why."""

    available: bool
    reason: str = ""
    version: str = ""

    @classmethod
    def ok(cls, version: str = "") -> Availability:
        """The runner can run here (`version`: its engine's)."""
        return cls(True, "", version)

    @classmethod
    def missing(cls, reason: str) -> Availability:
        """The runner cannot run here, and `reason` says why."""
        return cls(False, reason, "")


INT_OPTION_MAX = 2**31 - 1


@dataclass(frozen=True)
class OptionSpec:
    """One runner option: its type, default, allowed values and help."""

    name: str
    kind: type
    default: Any
    help: str
    choices: tuple[str, ...] = field(default=())
    # a file or folder: a sweep file may name one only inside its own folder
    path: bool = False
    # a thread count: at most THREADS_PER_CPU x this machine's CPUs (a sweep file's, at most its CPUs)
    threads: bool = False

    def parse(self, runner: str, raw: str) -> Any:
        """The option's value from its text `raw` (its kind, its choices); a UsageError naming `runner`
        where it is not one."""
        if self.choices:
            if raw not in self.choices:
                raise UsageError(
                    f"{runner} option {self.name}={raw!r} is not one of {', '.join(self.choices)}"
                )
            return raw
        if self.kind is bool:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise UsageError(f"{runner} option {self.name} expects true or false, got {raw!r}")
            return raw.lower() in ("1", "true", "yes", "on")
        try:
            value = self.kind(raw)
        except ValueError as error:
            raise UsageError(
                f"{runner} option {self.name} expects {self.kind.__name__}, got {raw!r}"
            ) from error
        if self.kind is int and value < 0:
            raise UsageError(f"{runner} option {self.name} must be >= 0, got {value}")
        if self.kind is int and value > INT_OPTION_MAX:  # engines take a C int: past it they fail late
            raise UsageError(f"{runner} option {self.name} must be at most {INT_OPTION_MAX}, got {raw[:40]}")
        if self.threads and value > thread_limit():
            raise UsageError(
                f"{runner} option {self.name}={value} is past this machine's {os.cpu_count() or 1} CPUs (at "
                f"most {thread_limit()}); lower it"
            )
        if self.kind is float and not math.isfinite(value):
            raise UsageError(f"{runner} option {self.name} must be a finite number, got {raw[:40]!r}")
        return value


THREADS_PER_CPU = 4  # oversubscribed on purpose (the threads probe), never thousands of threads


def thread_limit() -> int:
    """The most threads an option may ask of this machine."""
    return THREADS_PER_CPU * (os.cpu_count() or 1)


def promised_if(condition: object, *properties: str) -> frozenset[str]:
    """`properties` when a mode's `condition` (its option) holds, else none."""
    return frozenset(properties) if condition else frozenset()


PYTHON_OPTION = OptionSpec(
    "python",
    str,
    "",
    "run the worker under this interpreter (another virtual environment's python): it needs "
    "Python >= 3.8, numpy and the engine",
    path=True,
)
COMMON_OPTIONS = (PYTHON_OPTION,)
# Options a report leaves out while unset: where the worker runs, where a graph is written.
QUIET_WHEN_UNSET = frozenset({PYTHON_OPTION.name, "save_optimized"})
# Options only xbackend sets, on jobs of its own: they write files (a command line or a replayed
# certificate naming one could overwrite any file, the model included).
INTERNAL_OPTIONS = frozenset({"save_optimized"})
# info key: the model's folded constants a runner computes again at run time (comma-separated),
# each judged as a rounded value of its own
RECOMPUTED = "recomputes_constants"
# Options that run code (an interpreter, a module, the grant to import one): only the command
# line sets them, never a file from someone else (a sweep file, a certificate).
CODE_OPTIONS = frozenset({PYTHON_OPTION.name, "module", "trust_model_code"})


class Runner(abc.ABC):
    """One backend configuration. Lives in its own worker process.

    Life cycle: ``prepare`` once, ``run`` any number of times, ``close``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    option_specs: ClassVar[Sequence[OptionSpec]] = ()
    # Exposing intermediates can change what the engine computes (it blocks fusions), so graph
    # outputs come from a separate, plain build. Interpreters that compute node by node say False.
    instrumentation_changes_engine: ClassVar[bool] = True
    # Variants differ only in per-engine state (e.g. ORT session options), so probe variants may
    # run one after another in one process. False where a knob is process-wide (torch threads).
    shares_process: ClassVar[bool] = False
    # Memory (--max-memory). windowed: the engine holds only the tensors it exposes, so they can
    # be exposed in windows, one build each. holds_every_intermediate: it keeps every tensor of a
    # run whatever it exposes. weight_copies: the weights' bytes it holds per byte stored;
    # value_width: the bytes it holds per byte of a tensor as the model types it.
    windowed: ClassVar[bool] = False
    holds_every_intermediate: ClassVar[bool] = False
    weight_copies: ClassVar[float] = 2.0
    value_width: ClassVar[float] = 1.0
    # build_bytes: what a build takes beside its libraries whatever the model (its graph, kernels,
    # plugins), as measured at the peak on a 1 MB model: 6 to 13 MiB for ONNX Runtime and onnx's
    # evaluator
    build_bytes: ClassVar[int] = 16 << 20
    # Determinism properties the hardware promises (xbackend.results.promises.PROPERTIES): every
    # comparison checks them, and one seen broken is a failure (exit 16).
    promises: ClassVar[frozenset[str]] = frozenset()
    # True: xbackend exposes the requested tensors as graph outputs (and lowers the IR) in its
    # own process, and the runner loads `model.path` as it is: a plugin needs no onnx package.
    # Workers in another interpreter (python=) always get staged models.
    stages_model: ClassVar[bool] = False
    # False: the runner computes from a source of its own (a torch module), not the ONNX graph
    # it is given, so rewrites of that graph (the severed model for local errors) mean nothing.
    executes_graph: ClassVar[bool] = True
    # For such a runner: it takes the reference's values of the tensors its steps read as extra
    # feeds (named xbackend.model.sever.SEVERED + tensor) and computes each step from them instead.
    severs_by_feeds: ClassVar[bool] = False
    # It can write the graph it really runs (option save_optimized=PATH: ONNX Runtime's optimized
    # model), so the explanation judges the kernels users ship rather than the unfused graph.
    saves_optimized_graph: ClassVar[bool] = False
    # What save_optimized writes: "onnx" (a model: ONNX Runtime), or "runtime" (OpenVINO: its
    # runtime graph's nodes as JSON, each with the ONNX nodes it fuses; see runtime_graph below).
    optimized_format: ClassVar[str] = "onnx"
    # How reports name that graph.
    optimized_label: ClassVar[str] = "its optimized graph"
    # The op domains the engine implements (None: not declared, so it is tried): a model using
    # another makes this backend unavailable for it, and the others run.
    domains: ClassVar[frozenset[str] | None] = None

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        self.options: dict[str, Any] = self.resolve_options(options or {})
        self._tensors: tuple[str, ...] = ()
        self._inputs: tuple[str, ...] = ()
        self._prepared = False
        self._fingerprint: BuildFingerprint | None = None
        # Set by the worker when builds are compared: worth a costlier, per-layer fingerprint.
        self.detailed_fingerprint = False

    # --- class-level queries (no engine import needed) --------------------------------

    @classmethod
    @abc.abstractmethod
    def availability(cls) -> Availability:
        """Available here, or why not (never raises)."""

    @classmethod
    def load_engine(cls) -> None:
        """Import the engine's libraries as a build would. The worker measures its resident memory
        after this, so the memory plan is held against what the model takes, not the libraries."""
        return None

    @classmethod
    def all_option_specs(cls) -> tuple[OptionSpec, ...]:
        """The runner's own options and those every runner takes (its own win a clash)."""
        own = {option.name for option in cls.option_specs}
        return (*cls.option_specs, *(s for s in COMMON_OPTIONS if s.name not in own))

    @classmethod
    def resolve_options(cls, raw: Mapping[str, str]) -> dict[str, Any]:
        """Defaults overridden by `raw`; UsageError naming the valid keys for a wrong one."""
        specs = {option.name: option for option in cls.all_option_specs()}
        unknown = sorted(set(raw) - set(specs))
        if unknown:
            valid = ", ".join(sorted(specs)) or "none"
            raise UsageError(f"{cls.name} has no option {', '.join(unknown)}; its options are: {valid}")
        out = {key: spec.default() if callable(spec.default) else spec.default for key, spec in specs.items()}
        out.update({key: specs[key].parse(cls.name, value) for key, value in raw.items()})
        return out

    @classmethod
    def crash_hint(cls, backend: str, options: Mapping[str, Any]) -> str:
        """What to try when a worker running `backend` (this runner, or a label of it) with
        `options` was ended by a signal ('' when nothing is known): a knob that avoids an engine
        path known to crash here, as the --set that turns it."""
        return ""

    @classmethod
    def process_env(cls, options: Mapping[str, Any]) -> dict[str, str]:
        """Environment variables the worker process needs before any import."""
        return {}

    @classmethod
    def instruments(cls, metadata: Mapping[str, str], model_dir: Path, options: Mapping[str, Any]) -> bool:
        """Whether this model's per-layer capture needs a build of its own (see
        instrumentation_changes_engine); runners that expose nothing beyond the graph outputs for
        some models say False for those, so no second build runs for nothing."""
        return cls.instrumentation_changes_engine

    @classmethod
    def autotune_family(cls, pin_path: str) -> dict[str, tuple[str, dict[str, str]]]:
        """For an engine that autotunes: the backend and options with autotuning "off", "on" and
        "pinned" (recording to and replaying from `pin_path`); empty for the rest."""
        return {}

    @classmethod
    def promises_for(cls, options: Mapping[str, Any]) -> frozenset[str]:
        """What this configuration promises (xbackend.results.promises.PROPERTIES): the hardware's
        (`promises`), plus what the determinism modes its resolved `options` turn on promise."""
        return cls.promises

    @classmethod
    def determinism_modes(cls) -> dict[str, dict[str, str]]:
        """The engine's determinism modes as instance label -> options (`--modes NAME`); the
        default configuration is the runner itself, under no label."""
        return {}

    @classmethod
    def max_ir_version(cls) -> int | None:
        """Highest ONNX IR version the engine loads; None when it reads whatever onnx reads."""
        return None

    # --- instance life cycle -------------------------------------------------------------

    def prepare(self, model: ModelRef, tensors: Sequence[str]) -> BuildFingerprint:
        """Build the engine for `model`, exposing `tensors` where it can."""
        if self._prepared:
            raise RunnerFailedError(f"{self.name}: prepare() called twice; make a new runner")
        self._tensors = tuple(tensors)
        self._inputs = tuple(model.inputs)
        fp = self.prepare_impl(model, self._tensors)
        self._prepared = True
        self._fingerprint = fp
        return fp

    def fingerprint(self) -> BuildFingerprint:
        """What this build decided; runners that learn more after the first run override it."""
        if self._fingerprint is None:
            raise RunnerFailedError(f"{self.name}: fingerprint() before prepare()")
        return self._fingerprint

    def optimization_levels(self, model: ModelRef, feeds: Mapping[str, Value]) -> list[OptLevelRow]:
        """Graph-optimization sensitivity probe; only engines with optimization levels implement it."""
        raise BackendUnavailableError(f"{self.name} has no graph optimization levels to probe")

    def run(self, feeds: Mapping[str, Value]) -> dict[str, Value]:
        """Host copies of every exposed value for one inference on `feeds`, normalized
        (xbackend.numerics.values): 0-d scalars stay 0-d, sequences are lists, an empty optional is None."""
        if not self._prepared:
            raise RunnerFailedError(f"{self.name}: run() before prepare()")
        if set(feeds) != set(self._inputs):
            raise RunnerFailedError(
                f"{self.name}: feeds {sorted(feeds)} do not match model inputs {sorted(self._inputs)}"
            )
        out = self.run_impl(feeds)
        wanted = set(self._tensors)
        return {key: normalize(value) for key, value in out.items() if key in wanted}

    def not_exposed(self) -> dict[str, str]:
        """Requested tensors this backend cannot expose, with the reason."""
        return {}

    def info(self) -> dict[str, str]:
        """Versions, precision and flags actually in force."""
        return {
            key: str(option)
            for key, option in sorted(self.options.items())
            if option != "" or key not in QUIET_WHEN_UNSET
        }

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine."""

    @abc.abstractmethod
    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        """Build the engine for `model`, exposing `tensors` (its outputs, or every layer's too); the
        build's fingerprint (what the engine decided: graph, kernels)."""
        ...

    @abc.abstractmethod
    def run_impl(self, feeds: Mapping[str, Value]) -> Mapping[str, Any]:
        """One run on `feeds`: every exposed tensor's value, by name."""
        ...
