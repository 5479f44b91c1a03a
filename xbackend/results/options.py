"""What a comparison is asked to do: CompareOptions, the one place every flag lands."""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from xbackend.errors import UsageError
from xbackend.files.capture_folder import NAME, default_name
from xbackend.model.footprint import parse_size
from xbackend.numerics.metrics import DEFAULT_MAX_ULP
from xbackend.results.gating import parse_policies
from xbackend.runners.registry import get_runner, split_instance

__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_MAX_ULP",
    "EXPECTED",
    "MODES_TIMED_RUNS",
    "CompareOptions",
    "Shape",
    "expand_modes",
    "load_spec",
    "parse_max_ulp",
]

DEFAULT_BACKENDS = ("ort-cpu", "reference")
EXPECTED = "expected"  # golden outputs read from --inputs DIR (output_N.pb), compared like a backend

Shape = tuple[int, ...]
# --modes asks what each mode costs: its runs are timed unless --timed-runs says otherwise
MODES_TIMED_RUNS = 10
MAX_COUNT = 1_000_000  # runs, builds, samples: past this a count is a typo, not a plan
MAX_SEED = 2**32 - 1


def expand_modes(
    backends: tuple[str, ...], modes: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]]:
    """`backends` plus each runner in `modes` under its default and each determinism mode it
    declares (NAME, NAME@LABEL...), and the options that set each mode."""
    out = list(backends)
    sets: list[tuple[str, str, str]] = []
    for name in modes:
        cls = get_runner(name)
        declared = cls.determinism_modes()
        if not declared:
            raise UsageError(
                f"{name} declares no determinism modes; compare its settings as instances instead, "
                f"e.g. --backends {name},{name}@other --set {name}@other.OPTION=VALUE"
            )
        for label, options in {"": {}, **declared}.items():
            instance = f"{name}@{label}" if label else name
            if instance not in out:
                out.append(instance)
            sets += [(instance, k, v) for k, v in options.items()]
    return tuple(out), tuple(sets)


@dataclass(frozen=True)
class CompareOptions:
    """Everything that decides what a comparison does; the CLI maps flags 1:1 onto it."""

    backends: tuple[str, ...] = DEFAULT_BACKENDS
    reference: str | None = None
    runs: int = 3
    builds: int = 1
    seed: int = 0
    shapes: tuple[tuple[str, Shape], ...] = ()
    inputs: str | None = None
    max_ulp: float | None = None  # None: auto, each tensor's noise floor x a margin
    outputs_only: bool = False
    timeout: float = 600.0
    runner_options: tuple[tuple[str, str, str], ...] = ()
    probes: tuple[str, ...] | None = None  # None: the cheap ones (plus batch when batch_invariance is set)
    batch_invariance: int = 0
    probe_threads: int = 0  # N for the thread probe; 0: twice the logical cores
    ranges: tuple[tuple[str, float, float], ...] = ()  # generated values of NAME drawn from [LO, HI)
    timings: bool = False  # wall times in the reports (off: identical runs give identical bytes)
    loads: tuple[tuple[str, str], ...] = ()  # (name, capture folder): backends that ran elsewhere
    save_captures: str | None = None  # folder: a portable capture per backend that ran
    baseline: str | None = None  # a previous capture, capture folder set or JSON report
    fail_on: tuple[str, ...] = ()  # --fail-on policies (xbackend.results.gating); () keeps the default gate
    noise_samples: int = 8  # K random orders of every reduction for the noise floor; 0: none
    timed_runs: int = 0  # more runs of the model users ship, timed (and compared) like the others
    tensors: str = "all"  # --tensors: all | modules | outputs | GLOB[,GLOB] over module paths or names
    max_memory: int | None = None  # --max-memory, bytes per backend process; None: a share of what is free

    @property
    def shows_times(self) -> bool:
        """Wall times go in the reports: asked for with --timings, or by asking for timed runs."""
        return self.timings or self.timed_runs > 0

    @classmethod
    def create(cls, **kwargs: Any) -> CompareOptions:
        """Build from friendly Python values (lists, dicts, comma strings) and validate."""
        names = {f.name for f in fields(cls)} | {"modes"}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise UsageError(
                f"unknown compare option(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}"
            )
        kw = dict(kwargs)
        modes = kw.pop("modes", None) or ()
        if isinstance(modes, str):
            modes = [m for m in modes.split(",") if m]
        if isinstance(kw.get("backends"), str):
            kw["backends"] = [b for b in kw["backends"].split(",") if b]
        if "backends" in kw:
            kw["backends"] = tuple(kw["backends"])
        if modes:
            given: tuple[str, ...] = tuple(kw.get("backends") or ())
            kw["backends"], sets = expand_modes(given, tuple(modes))
            kw["runner_options"] = sets + tuple(_pairs(kw.get("runner_options")))  # a --set overrides
        if kw.get("timed_runs") is None:
            kw["timed_runs"] = MODES_TIMED_RUNS if modes else 0
        if isinstance(kw.get("shapes"), Mapping):
            kw["shapes"] = tuple((k, tuple(v)) for k, v in kw["shapes"].items())
        if kw.get("runner_options") is not None:
            kw["runner_options"] = tuple(_pairs(kw["runner_options"]))
        if kw.get("inputs") is not None:
            kw["inputs"] = str(kw["inputs"])
        if "max_ulp" in kw:
            kw["max_ulp"] = parse_max_ulp(kw["max_ulp"])
        if isinstance(kw.get("probes"), str):
            kw["probes"] = tuple(x for x in kw["probes"].split(",") if x)
        if kw.get("probes") is not None:
            kw["probes"] = tuple(kw["probes"])
        if isinstance(kw.get("fail_on"), str):
            kw["fail_on"] = tuple(x for x in kw["fail_on"].split(",") if x)
        kw["fail_on"] = tuple(kw.get("fail_on") or ())
        if kw.get("loads") is None:
            kw.pop("loads", None)
        if isinstance(kw.get("loads"), Mapping):
            kw["loads"] = tuple((str(k), str(v)) for k, v in kw["loads"].items())
        elif kw.get("loads"):
            kw["loads"] = tuple(
                load_spec(x) if isinstance(x, str) else (str(x[0]), str(x[1])) for x in kw["loads"]
            )
        for k in ("save_captures", "baseline"):
            if kw.get(k) is not None:
                kw[k] = str(kw[k])
        if isinstance(kw.get("ranges"), Mapping):
            kw["ranges"] = tuple((k, float(lo), float(hi)) for k, (lo, hi) in kw["ranges"].items())
        if kw.get("tensors") is not None:
            kw["tensors"] = str(kw["tensors"]).strip() or "all"
        else:
            kw.pop("tensors", None)
        # one choice, one source: --outputs-only is the selection "outputs", resolved into the
        # model's exposed tensors like any other (outputs_only stays as its flag for reports)
        if kw.get("outputs_only") and kw.get("tensors", "all") not in ("all", "outputs"):
            raise UsageError(
                f"--outputs-only and --tensors {kw['tensors']} choose different tensors; give one of them"
            )
        if kw.get("outputs_only") or kw.get("tensors") == "outputs":
            kw["outputs_only"], kw["tensors"] = True, "outputs"
        if isinstance(kw.get("max_memory"), str):
            kw["max_memory"] = parse_size(kw["max_memory"])
        opts = cls(**kw)
        opts.validate()
        return opts.with_reference()

    def validate(self) -> None:
        if not self.backends and not self.loads:
            raise UsageError("no backends given; pass --backends, e.g. --backends ort-cpu,reference")
        if len(set(self.backends)) != len(self.backends):
            twice = next(b for b in self.backends if self.backends.count(b) > 1)
            other = f"{twice.partition('@')[0]}@other"
            raise UsageError(
                f"--backends lists {twice} twice; to run it under other settings list it again under "
                f"a label, e.g. {other}, and --set {other}.OPTION=VALUE"
            )
        for b in self.backends:
            split_instance(b)  # UsageError for a malformed label
        if self.runs < 1 or self.builds < 1:
            raise UsageError(f"--runs and --builds must be >= 1 (got runs={self.runs}, builds={self.builds})")
        for flag, n in (("--runs", self.runs), ("--builds", self.builds), ("--timed-runs", self.timed_runs)):
            if n > MAX_COUNT:
                raise UsageError(f"{flag} must be at most {MAX_COUNT:,}, got {n:,}")
        if not 0 <= self.seed <= MAX_SEED:
            raise UsageError(f"--seed must be between 0 and {MAX_SEED} (numpy's seed range), got {self.seed}")
        if math.isnan(self.timeout) or self.timeout <= 0:
            raise UsageError(f"--timeout must be > 0 seconds, got {self.timeout}")
        if self.max_ulp is not None and self.max_ulp < 0:
            raise UsageError(f"--max-ulp must be >= 0 or auto, got {self.max_ulp:g}")
        if self.max_memory is not None and self.max_memory <= 0:
            raise UsageError(f"--max-memory must be a positive size such as 3GiB, got {self.max_memory}")
        if self.timed_runs < 0:
            raise UsageError(f"--timed-runs must be >= 0, got {self.timed_runs}")
        if self.noise_samples < 0:
            raise UsageError(f"--noise-samples must be >= 0 (0: no noise floor), got {self.noise_samples}")
        if self.inputs is not None and self.shapes:
            raise UsageError("--shape and --inputs exclude each other: --inputs arrays carry their shapes")
        if self.noise_samples > MAX_COUNT or self.batch_invariance > MAX_COUNT or self.probe_threads > 4096:
            raise UsageError(
                "--noise-samples, --batch-invariance or --probe-threads is out of range; give a smaller count"
            )
        if self.batch_invariance == 1 or self.batch_invariance < 0:
            raise UsageError(f"--batch-invariance needs a batch size >= 2, got {self.batch_invariance}")
        if self.probe_threads < 0:
            raise UsageError(f"--probe-threads must be >= 1, got {self.probe_threads}")
        if self.inputs is not None and self.ranges:
            raise UsageError("--range and --inputs exclude each other: --range shapes generated inputs only")
        parse_policies(self.fail_on)  # UsageError for unknown policies
        loaded = [n for n, _ in self.loads]
        odd = [n for n in loaded if not NAME.fullmatch(n)]
        if odd:
            raise UsageError(
                f"--load name {odd[0][:60]!r} is not a name: use letters, digits, '_', '.', '+', '-' and '@'"
            )
        if len(set(loaded)) != len(loaded) or set(loaded) & set(self.backends):
            raise UsageError(
                f"--load names clash ({', '.join(loaded)} with --backends {','.join(self.backends)}); "
                "name each capture: --load NAME=DIR"
            )
        stray = sorted({b for b, _, _ in self.runner_options} - set(self.backends) - {self.reference})
        if stray:
            raise UsageError(f"--set names backend(s) {', '.join(stray)} that are not in --backends")

    def with_reference(self) -> CompareOptions:
        """Resolve the reference: the explicit one (added to backends), else 'reference', else the first."""
        if self.reference is None:
            names = (*self.backends, *self.loaded_names)
            ref = "reference" if "reference" in names else names[0]
            return replace(self, reference=ref)
        if self.reference not in self.backends and self.reference not in self.loaded_names:
            return replace(self, backends=(*self.backends, self.reference))
        return self

    @property
    def auto_tolerance(self) -> bool:
        """--max-ulp auto: each tensor's tolerance comes from its noise floor."""
        return self.max_ulp is None

    @property
    def fixed_ulp(self) -> float:
        """--max-ulp N, or the fixed default that stands in where auto has no floor."""
        return DEFAULT_MAX_ULP if self.max_ulp is None else self.max_ulp

    @property
    def tolerance_text(self) -> str:
        return "auto" if self.max_ulp is None else f"{self.max_ulp:g}"

    @property
    def loaded_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.loads)

    @property
    def reference_name(self) -> str:
        return self.reference or (*self.backends, *self.loaded_names)[0]

    def options_for(self, backend: str) -> dict[str, str]:
        return {k: v for b, k, v in self.runner_options if b == backend}

    def command(self, model_path: str) -> str:
        """The CLI command that reproduces this comparison."""
        parts = [
            "xbackend",
            "compare",
            model_path,
            "--backends",
            ",".join(self.backends),
            "--reference",
            self.reference_name,
            "--runs",
            str(self.runs),
            "--builds",
            str(self.builds),
            "--max-ulp",
            self.tolerance_text,
            "--timeout",
            f"{self.timeout:g}",
        ]
        if self.inputs:
            parts += ["--inputs", self.inputs]
        else:
            parts += ["--seed", str(self.seed)]
        for name, shape in self.shapes:
            parts += ["--shape", f"{name}={','.join(map(str, shape))}"]
        for b, k, v in self.runner_options:
            parts += ["--set", f"{b}.{k}={v}"]
        if self.outputs_only:
            parts.append("--outputs-only")
        elif self.tensors != "all":
            parts += ["--tensors", self.tensors]
        if self.probes is not None:
            parts += ["--probes", ",".join(self.probes) or "none"]
        if self.batch_invariance:
            parts += ["--batch-invariance", str(self.batch_invariance)]
        if self.probe_threads:
            parts += ["--probe-threads", str(self.probe_threads)]
        for name, lo, hi in self.ranges:
            parts += ["--range", f"{name}={lo:g}:{hi:g}"]
        if self.timings:
            parts.append("--timings")
        for name, path in self.loads:
            parts += ["--load", f"{name}={path}"]
        if self.baseline:
            parts += ["--baseline", self.baseline]
        if self.fail_on:
            parts += ["--fail-on", ",".join(self.fail_on)]
        if self.save_captures:
            parts += ["--save-captures", self.save_captures]
        if self.noise_samples != 8:
            parts += ["--noise-samples", str(self.noise_samples)]
        if self.timed_runs:
            parts += ["--timed-runs", str(self.timed_runs)]
        if self.max_memory is not None:
            parts += ["--max-memory", f"{self.max_memory}B"]
        return shlex.join(parts)


def _pairs(options: object) -> list[tuple[str, str, str]]:
    """runner_options as (backend, key, value): from {backend: {key: value}} or triples."""
    if options is None:
        return []
    if isinstance(options, Mapping):
        return [(b, k, str(v)) for b, opts in options.items() for k, v in opts.items()]
    return [(str(b), str(k), str(v)) for b, k, v in options]  # type: ignore[attr-defined]


def parse_max_ulp(value: object) -> float | None:
    """--max-ulp: 'auto' (None) or a number of scaled ULP."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UsageError(f"--max-ulp takes a number of scaled ULP or auto, got {value!r}") from None


def load_spec(text: str) -> tuple[str, str]:
    """--load [NAME=]DIR; without NAME the capture is named BACKEND@FOLDER."""
    name, sep, path = text.partition("=")
    if sep and name and "/" not in name and path:
        return name, path
    return default_name(text), text
