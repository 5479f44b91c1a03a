"""What a comparison is asked to do: CompareOptions, the one place every flag lands. Each field
declares its flag (xbackend.results.flags): the CLI's parameters, the coercion of friendly
values, the checks and command() all come from that one declaration."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from xbackend.errors import UsageError
from xbackend.files.capture_folder import NAME, default_name
from xbackend.model.footprint import parse_size
from xbackend.model.inputs import parse_range, parse_shape
from xbackend.numerics.metrics import DEFAULT_MAX_ULP
from xbackend.results.candidate_spec import candidate_words, candidates_of
from xbackend.results.flags import (
    MAX_COUNT,
    Flag,
    at_least,
    comma_list,
    count,
    declared,
    flag,
    pairs,
)
from xbackend.results.gating import parse_policies
from xbackend.results.option_sets import TORCH_BACKENDS, expand_modes, thread_options, torch_options
from xbackend.runners.registry import split_instance

__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_MAX_ULP",
    "EXPECTED",
    "INPUT_FLAGS",
    "MODES_TIMED_RUNS",
    "TORCH_BACKENDS",
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
MAX_SEED = 2**32 - 1


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


def _shapes(value: Any) -> tuple[tuple[str, Shape], ...]:
    if isinstance(value, Mapping):  # a named dimension's one size may come bare: {"batch": 2}
        return tuple(
            (str(key), (int(item),) if isinstance(item, int) else tuple(int(d) for d in item))
            for key, item in value.items()
        )
    return tuple(
        parse_shape(item) if isinstance(item, str) else (str(item[0]), tuple(item[1])) for item in value
    )


def _ranges(value: Any) -> tuple[tuple[str, float, float], ...]:
    if isinstance(value, Mapping):
        return tuple((str(key), float(lo), float(hi)) for key, (lo, hi) in value.items())
    return tuple(
        parse_range(item) if isinstance(item, str) else (str(item[0]), float(item[1]), float(item[2]))
        for item in value
    )


def _loads(value: Any) -> tuple[tuple[str, str], ...]:
    if isinstance(value, Mapping):
        return tuple((str(key), str(item)) for key, item in value.items())
    return tuple(load_spec(item) if isinstance(item, str) else (str(item[0]), str(item[1])) for item in value)


def _size(value: Any) -> int | None:
    return parse_size(value) if isinstance(value, str) else value


def _seed(cli: str, seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"{cli} must be between 0 and {MAX_SEED} (numpy's seed range), got {seed}")


def _batch(cli: str, size: int) -> None:
    if size > MAX_COUNT:
        raise UsageError(f"{cli} must be at most {MAX_COUNT:,}, got {size:,}")
    if size == 1 or size < 0:
        raise UsageError(f"{cli} needs a batch size >= 2, got {size}")


def _memory(cli: str, size: int | None) -> None:
    if size is not None and size <= 0:
        raise UsageError(f"{cli} must be a positive size such as 3GiB, got {size}")


def _each(cli: str, fmt: Any) -> Any:
    return lambda _o, value: [word for item in value for word in (cli, fmt(item))]


@dataclass(frozen=True)
class CompareOptions:
    """Everything that decides what a comparison does, each field with its flag, in the order
    command() writes them."""

    backends: tuple[str, ...] = flag(
        DEFAULT_BACKENDS,
        "--backends",
        parse=comma_list,
        show=lambda _o, value: ["--backends", ",".join(value)],
    )
    reference: str | None = flag(
        None, "--reference", show=lambda compare_options, _v: ["--reference", compare_options.reference_name]
    )
    runs: int = flag(3, "--runs", check=count(1), always=True, sweep_file=True)
    builds: int = flag(1, "--builds", check=count(1), always=True, sweep_file=True)
    max_ulp: float | None = flag(
        None,
        "--max-ulp",
        parse=parse_max_ulp,
        check=at_least(0, strict=False),
        show=lambda compare_options, _v: ["--max-ulp", compare_options.tolerance_text],
    )
    timeout: float = flag(
        600.0, "--timeout", check=at_least(0, True, " seconds"), always=True, sweep_file=True
    )
    inputs: str | None = flag(None, "--inputs", parse=str)
    seed: int = flag(
        0, "--seed", check=_seed, show=lambda opts, value: [] if opts.inputs else ["--seed", str(value)]
    )
    shapes: tuple[tuple[str, Shape], ...] = flag(
        (),
        "--shape",
        parse=_shapes,
        show=_each("--shape", lambda shape: f"{shape[0]}={','.join(map(str, shape[1]))}"),
    )
    runner_options: tuple[tuple[str, str, str], ...] = flag(
        (),
        "--set",
        parse=pairs,
        show=_each("--set", lambda setting: f"{setting[0]}.{setting[1]}={setting[2]}"),
    )
    # the same choice as tensors="outputs" (create() sets both); kept as the JSON twin's record
    outputs_only: bool = flag(False, "--outputs-only", sweep_file=True)
    tensors: str = flag(
        "all",
        "--tensors",
        parse=lambda value: str(value).strip() or "all",
        show=lambda opts, value: ["--tensors", value] if value != "all" and not opts.outputs_only else [],
    )
    probes: tuple[str, ...] | None = flag(
        None,
        "--probes",
        parse=comma_list,
        show=lambda _o, value: [] if value is None else ["--probes", ",".join(value) or "none"],
        sweep_file=True,
    )
    batch_invariance: int = flag(
        0, "--batch-invariance", check=lambda cli, size: _batch(cli, size) if size else None, sweep_file=True
    )
    probe_threads: int = flag(0, "--probe-threads", check=count(0, 4096), sweep_file=True)
    ranges: tuple[tuple[str, float, float], ...] = flag(
        (),
        "--range",
        parse=_ranges,
        show=_each("--range", lambda range_spec: f"{range_spec[0]}={range_spec[1]:g}:{range_spec[2]:g}"),
    )
    timings: bool = flag(False, "--timings")
    loads: tuple[tuple[str, str], ...] = flag(
        (), "--load", parse=_loads, show=_each("--load", lambda nv: f"{nv[0]}={nv[1]}")
    )
    baseline: str | None = flag(None, "--baseline", parse=str)
    fail_on: tuple[str, ...] = flag(
        (),
        "--fail-on",
        parse=comma_list,
        check=lambda _cli, value: parse_policies(value) and None,
        show=lambda _o, value: ["--fail-on", ",".join(value)] if value else [],
    )
    save_captures: str | None = flag(None, "--save-captures", parse=str)
    noise_samples: int | None = flag(None, "--noise-samples", check=count(0, what=" (0: no explanation)"))
    timed_runs: int = flag(0, "--timed-runs", check=count(0))
    max_memory: int | None = flag(
        None,
        "--max-memory",
        parse=_size,
        check=_memory,
        show=lambda _o, value: [] if value is None else ["--max-memory", f"{value}B"],
    )

    decode: int = flag(0, "--decode", check=count(0, 100_000), omit_default=True)

    decisions: tuple[str, ...] = flag(
        (),
        "--decisions",
        parse=comma_list,
        show=lambda _o, value: ["--decisions", ",".join(value)] if value else [],
        omit_default=True,
    )

    candidates: tuple[tuple[str, tuple[str, ...]], ...] = flag(
        (), "--candidate", parse=candidates_of, show=_each("--candidate", candidate_words), omit_default=True
    )

    advise: bool = flag(False, "--advise", omit_default=True)
    advise_budget: int = flag(8, "--advise-budget", check=count(1), omit_default=True)

    @property
    def shows_times(self) -> bool:
        """Wall times go in the reports: asked for with --timings, or by asking for timed runs."""
        return self.timings or self.timed_runs > 0

    @classmethod
    def create(cls, **kwargs: Any) -> CompareOptions:
        """Build from friendly Python or command-line values (lists, dicts, comma strings; None
        for a default) and validate. Besides the fields, the INPUT_FLAGS: modes, threads,
        torch_module, trust_model_code."""
        by_name = {field.name: fl for field, fl in declared(cls)}
        unknown = sorted(set(kwargs) - set(by_name) - set(INPUT_FLAGS))
        if unknown:
            valid = sorted({*by_name, *INPUT_FLAGS})
            raise UsageError(f"unknown compare option(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
        modes = comma_list(kwargs.get("modes") or ())
        kw: dict[str, Any] = {}
        for name, value in kwargs.items():
            if name in by_name and value is not None:  # None: the field's default
                fl = by_name[name]
                kw[name] = fl.parse(value) if fl.parse is not None else value
        mode_sets: tuple[tuple[str, str, str], ...] = ()
        if modes:  # each family under its default and its modes
            kw["backends"], mode_sets = expand_modes(kw.get("backends", ()), modes)
        if kwargs.get("timed_runs") is None:
            kw["timed_runs"] = MODES_TIMED_RUNS if modes else 0
        chosen = kw.get("backends", DEFAULT_BACKENDS)
        # the later setting wins: a mode, then --threads and --torch-module, then the user's --set
        # (one backend's own module, e.g. --set executorch.module=..., over --torch-module)
        kw["runner_options"] = (
            mode_sets
            + thread_options(chosen, kwargs.get("threads"))
            + torch_options(chosen, kwargs.get("torch_module"), bool(kwargs.get("trust_model_code")))
            + kw.get("runner_options", ())
        )
        # one choice, one source: --outputs-only is the selection "outputs"
        if kw.get("outputs_only") and kw.get("tensors", "all") not in ("all", "outputs"):
            raise UsageError(
                f"--outputs-only and --tensors {kw['tensors']} choose different tensors; give one of them"
            )
        if kw.get("outputs_only") or kw.get("tensors") == "outputs":
            kw["outputs_only"], kw["tensors"] = True, "outputs"
        opts = cls(**kw)
        opts.validate()
        return opts.with_reference()

    def validate(self) -> None:
        """Check every option and how they combine; a UsageError that says what to pass."""
        for field, fl in declared(type(self)):
            if fl.check is not None:
                fl.check(fl.cli, getattr(self, field.name))
        if not self.backends and not self.loads:
            raise UsageError("no backends given; pass --backends, e.g. --backends ort-cpu,reference")
        if len(set(self.backends)) != len(self.backends):
            twice = next(backend for backend in self.backends if self.backends.count(backend) > 1)
            other = f"{twice.partition('@')[0]}@other"
            raise UsageError(
                f"--backends lists {twice} twice; to run it under other settings list it again under "
                f"a label, e.g. {other}, and --set {other}.OPTION=VALUE"
            )
        for b in (*self.backends, *(backend for _, bs in self.candidates for backend in bs)):
            split_instance(b)  # UsageError for a malformed label
        if self.inputs is not None and self.shapes:
            raise UsageError("--shape and --inputs exclude each other: --inputs arrays carry their shapes")
        if self.inputs is not None and self.ranges:
            raise UsageError("--range and --inputs exclude each other: --range shapes generated inputs only")
        loaded = [name for name, _ in self.loads]
        odd = [name for name in loaded if not NAME.fullmatch(name)]
        if odd:
            raise UsageError(
                f"--load name {odd[0][:60]!r} is not a name: use letters, digits, '_', '.', '+', '-' and '@'"
            )
        if len(set(loaded)) != len(loaded) or set(loaded) & set(self.backends):
            raise UsageError(
                f"--load names clash ({', '.join(loaded)} with --backends {','.join(self.backends)}); "
                "name each capture: --load NAME=DIR"
            )
        if self.advise and not (self.candidates and (self.decode or self.decisions)):
            raise UsageError(
                "--advise finds the nodes to keep in float32 so a candidate's tokens or decisions match: "
                "give --candidate FILE and --decode N or --decisions auto"
            )
        if self.decode and self.loads:
            raise UsageError("--decode runs every backend step by step; --load's captures cannot: drop one")
        named = {*self.backends, self.reference, *(backend for _, bs in self.candidates for backend in bs)}
        named |= (
            {"llama.cpp"}
            if any(figure.lower().endswith(".gguf") and not bs for figure, bs in self.candidates)
            else set()
        )
        stray = sorted({backend for backend, _, _ in self.runner_options} - named)
        if stray:
            raise UsageError(
                f"--set names backend(s) {', '.join(stray)} that are not in --backends or a --candidate's"
            )

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
        """The ULP tolerance in words (`auto` where the explanation decides it)."""
        return "auto" if self.max_ulp is None else f"{self.max_ulp:g}"

    @property
    def loaded_names(self) -> tuple[str, ...]:
        """The names of the backends whose captures are loaded (--load)."""
        return tuple(name for name, _ in self.loads)

    @property
    def reference_name(self) -> str:
        """The reference backend: the one named, else the first backend given."""
        return self.reference or (*self.backends, *self.loaded_names)[0]

    def options_for(self, backend: str) -> dict[str, str]:
        """The runner options given for `backend`."""
        return {key: value for backend_result, key, value in self.runner_options if backend_result == backend}

    def command(self, model_path: str) -> str:
        """The CLI command that reproduces this comparison: each field's flag, in field order."""
        parts = ["xbackend", "compare", model_path]
        for field, fl in declared(type(self)):
            parts += fl.words(self, getattr(self, field.name), field.default)
        return shlex.join(parts)


# Options create() takes besides the fields: each becomes fields (backends, runner_options).
INPUT_FLAGS = {
    "modes": Flag("--modes", name="modes"),
    "threads": Flag("--threads", name="threads"),
    "torch_module": Flag("--torch-module", name="torch_module"),
    "trust_model_code": Flag("--trust-model-code", name="trust_model_code"),
}
