"""Options and results of a comparison: plain frozen dataclasses that reports read."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from xbackend.errors import EXIT_ALL_FAILED, EXIT_DIFFERENCES, EXIT_OK, UsageError
from xbackend.gating import Gate, evaluate
from xbackend.metrics import TensorDiff, worst_per_tensor
from xbackend.model import ModelSpec
from xbackend.probes.base import ProbeResult
from xbackend.promises import EXIT_PROMISE, PromiseCheck, check_promises
from xbackend.textfmt import short, with_module
from xbackend.values import value_name

__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_MAX_ULP",
    "EXPECTED",
    "BackendResult",
    "CompareOptions",
    "CrossBackendResult",
    "FeedsInfo",
    "PairResult",
    "Result",
]

DEFAULT_BACKENDS = ("ort-cpu", "reference")
EXPECTED = "expected"  # golden outputs read from --inputs DIR (output_N.pb), compared like a backend
# Scale-aware ULPs (see xbackend.metrics): engines that reorder float sums
# legitimately differ by a few units at a tensor's own scale.
DEFAULT_MAX_ULP = 64.0

Shape = tuple[int, ...]


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
    max_ulp: float = DEFAULT_MAX_ULP
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
    fail_on: tuple[str, ...] = ()  # --fail-on policies (xbackend.gating); () keeps the default gate

    @classmethod
    def create(cls, **kwargs: Any) -> CompareOptions:
        """Build from friendly Python values (lists, dicts, comma strings) and validate."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise UsageError(
                f"unknown compare option(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}"
            )
        kw = dict(kwargs)
        if isinstance(kw.get("backends"), str):
            kw["backends"] = [b for b in kw["backends"].split(",") if b]
        if "backends" in kw:
            kw["backends"] = tuple(kw["backends"])
        if isinstance(kw.get("shapes"), Mapping):
            kw["shapes"] = tuple((k, tuple(v)) for k, v in kw["shapes"].items())
        if isinstance(kw.get("runner_options"), Mapping):
            kw["runner_options"] = tuple(
                (b, k, str(v)) for b, opts in kw["runner_options"].items() for k, v in opts.items()
            )
        if kw.get("inputs") is not None:
            kw["inputs"] = str(kw["inputs"])
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
                _load_spec(x) if isinstance(x, str) else (str(x[0]), str(x[1])) for x in kw["loads"]
            )
        for k in ("save_captures", "baseline"):
            if kw.get(k) is not None:
                kw[k] = str(kw[k])
        if isinstance(kw.get("ranges"), Mapping):
            kw["ranges"] = tuple((k, float(lo), float(hi)) for k, (lo, hi) in kw["ranges"].items())
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
        from xbackend.runners.registry import split_instance

        for b in self.backends:
            split_instance(b)  # UsageError for a malformed label
        if self.runs < 1 or self.builds < 1:
            raise UsageError(f"--runs and --builds must be >= 1 (got runs={self.runs}, builds={self.builds})")
        if self.timeout <= 0:
            raise UsageError(f"--timeout must be > 0 seconds, got {self.timeout}")
        if self.max_ulp < 0:
            raise UsageError(f"--max-ulp must be >= 0, got {self.max_ulp}")
        if self.inputs is not None and self.shapes:
            raise UsageError("--shape and --inputs exclude each other: --inputs arrays carry their shapes")
        if self.batch_invariance == 1 or self.batch_invariance < 0:
            raise UsageError(f"--batch-invariance needs a batch size >= 2, got {self.batch_invariance}")
        if self.probe_threads < 0:
            raise UsageError(f"--probe-threads must be >= 1, got {self.probe_threads}")
        from xbackend.probes import select_probes

        select_probes(self.probes, self.batch_invariance)  # UsageError for unknown names
        if self.inputs is not None and self.ranges:
            raise UsageError("--range and --inputs exclude each other: --range shapes generated inputs only")
        from xbackend.gating import parse_policies

        parse_policies(self.fail_on)  # UsageError for unknown policies
        loaded = [n for n, _ in self.loads]
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
            f"{self.max_ulp:g}",
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
        return shlex.join(parts)


def _load_spec(text: str) -> tuple[str, str]:
    """--load [NAME=]DIR; without NAME the capture is named BACKEND@FOLDER."""
    from xbackend.portable import default_name

    name, sep, path = text.partition("=")
    if sep and name and "/" not in name and path:
        return name, path
    return default_name(text), text


@dataclass(frozen=True)
class FeedsInfo:
    """What was fed: hash, seed, source and shapes (the arrays themselves stay out of results)."""

    sha256: str
    seed: int | None
    source: str
    shapes: tuple[tuple[str, str, str], ...]  # (name, dtype or 'value', shape or structure)
    ranges: tuple[tuple[str, str], ...] = ()  # generated inputs: the range values were drawn from
    expected: bool = False  # golden outputs came with the inputs


@dataclass(frozen=True)
class ObserverEffect:
    """Graph outputs of the instrumented build (every intermediate exposed) vs the plain build."""

    outputs_changed: bool
    max_ulp: int | None = None
    scaled_ulp: float | None = None
    first: str | None = None


@dataclass(frozen=True)
class BackendResult:
    """One backend configuration across its builds and runs.

    Determinism and every figure at the graph outputs come from the plain model (what
    users ship); per-layer run diffs from the instrumented build.
    """

    name: str
    status: str  # "ok" | "failed" | "unavailable"
    reason: str = ""
    options: tuple[tuple[str, str], ...] = ()
    info: tuple[tuple[str, str], ...] = ()
    runs: int = 0
    builds: int = 0
    deterministic: bool | None = None
    distinct_outputs: int = 0
    distinct_run_outputs: int = 0
    distinct_build_outputs: int = 0
    exposed: int = 0
    not_exposed: tuple[tuple[str, str], ...] = ()
    run_diffs: tuple[TensorDiff, ...] = ()
    build_diffs: tuple[TensorDiff, ...] = ()
    fingerprints: tuple[str, ...] = ()
    timings: tuple[tuple[str, float], ...] = field(default=(), compare=False)
    build_s: tuple[float, ...] = field(default=(), compare=False)  # each build's worker, wall seconds
    observer: ObserverEffect | None = None  # None: one build serves both, or no per-layer build ran
    layers_error: str = ""  # the instrumented build failed; graph-output figures still stand
    constant_outputs: tuple[tuple[str, str], ...] = ()  # output -> 'all 0' when one value fills it
    output_digests: tuple[tuple[str, str], ...] = ()  # graph output -> digest, plain build 0, run 0
    layer_digests: tuple[tuple[str, str], ...] = ()  # captured tensor -> digest, instrumented build 0
    loaded_from: str = ""  # a capture folder: this backend ran on the host its capture records
    promises: tuple[str, ...] = ()  # what the runner promises (deterministic hardware)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def varying(self) -> list[TensorDiff]:
        """Tensors that differed between runs or builds, worst kept per tensor, in topological order."""
        diffs = [*self.run_diffs, *self.build_diffs]
        order = {d.name: i for i, d in enumerate(diffs)}
        return worst_per_tensor((d for d in diffs if not d.bitwise_equal), order)

    @property
    def first_nondeterministic(self) -> str | None:
        v = self.varying()
        return v[0].name if v else None

    def digests(self) -> dict[str, str]:
        """Every captured tensor's digest; graph outputs as the plain build (what users ship) gave them."""
        return {**dict(self.layer_digests), **dict(self.output_digests)}

    def moved_since(self, old: BackendResult, order: Mapping[str, int]) -> list[str]:
        """Tensors both captured whose digests differ from `old`'s, in `order` (model order)."""
        mine, theirs = self.digests(), old.digests()
        moved = (n for n in mine if n in theirs and mine[n] != theirs[n])
        return sorted(moved, key=lambda n: order.get(n, len(order)))


@dataclass(frozen=True)
class CrossBackendResult:
    """A backend against a reference: graph outputs from the plain builds, and per layer (in
    topological order) from the instrumented builds."""

    backend: str
    reference: str
    status: str  # "ok" | "skipped"
    reason: str = ""
    tensors: tuple[TensorDiff, ...] = ()  # per layer (instrumented builds); graph outputs included
    outputs: tuple[str, ...] = ()
    only_in_backend: tuple[str, ...] = ()
    only_in_reference: tuple[str, ...] = ()
    max_ulp_tolerance: float = DEFAULT_MAX_ULP
    output_tensors: tuple[TensorDiff, ...] = ()  # graph outputs of the plain builds
    layers_note: str = ""  # why there is no per-layer table, when there is none

    @classmethod
    def from_diffs(
        cls,
        backend: str,
        reference: str,
        outputs_diffs: Sequence[TensorDiff],
        layer_diffs: Sequence[TensorDiff],
        outputs: Iterable[str],
        only_a: Iterable[str],
        only_b: Iterable[str],
        tolerance: float,
        layers_note: str = "",
    ) -> CrossBackendResult:
        return cls(
            backend,
            reference,
            "ok",
            "",
            tuple(layer_diffs),
            tuple(outputs),
            tuple(only_a),
            tuple(only_b),
            tolerance,
            tuple(outputs_diffs),
            layers_note,
        )

    @property
    def bitwise_equal(self) -> bool:
        return self.status == "ok" and all(d.bitwise_equal for d in self.output_tensors)

    def output_diffs(self) -> list[TensorDiff]:
        """Graph outputs of the plain builds: what the verdict is about."""
        return list(self.output_tensors)

    def instrumented_output_diffs(self) -> list[TensorDiff]:
        """The same graph outputs as measured in the instrumented builds."""
        outs = {value_name(d.name) for d in self.output_tensors}
        return [d for d in self.tensors if value_name(d.name) in outs]

    @property
    def observer_differs(self) -> bool:
        """The instrumented builds' output figures differ from the plain builds'."""
        inst = {d.name: (d.bitwise_equal, d.max_ulp, d.scaled_ulp) for d in self.instrumented_output_diffs()}
        plain = {d.name: (d.bitwise_equal, d.max_ulp, d.scaled_ulp) for d in self.output_tensors}
        return bool(inst) and any(inst.get(k, v) != v for k, v in plain.items())

    @property
    def max_ulp(self) -> int | None:
        """Raw max ULP over graph outputs (None if no float output was compared)."""
        vals = [d.max_ulp for d in self.output_tensors if d.max_ulp is not None]
        return max(vals) if vals else None

    @property
    def scaled_ulp(self) -> float | None:
        vals = [d.scaled_ulp for d in self.output_tensors if d.scaled_ulp is not None]
        return max(vals) if vals else None

    @property
    def first_divergence(self) -> str | None:
        layer = next((d.name for d in self.tensors if not d.bitwise_equal), None)
        return layer or next((d.name for d in self.output_tensors if not d.bitwise_equal), None)

    @property
    def first_violation(self) -> str | None:
        layer = next((d.name for d in self.tensors if d.exceeds(self.max_ulp_tolerance)), None)
        out = next((d.name for d in self.output_tensors if d.exceeds(self.max_ulp_tolerance)), None)
        return (layer or out) if out is not None else layer

    @property
    def violates(self) -> bool:
        return self.status == "ok" and any(d.exceeds(self.max_ulp_tolerance) for d in self.output_tensors)

    def zero_ulp_reason(self) -> str:
        """Why outputs' bits differ at 0 ULP ('' unless that is the case)."""
        return "; ".join(
            f"{d.name}: {d.zero_ulp_reason()}" for d in self.output_tensors if d.zero_ulp_reason()
        )


@dataclass(frozen=True)
class PairResult:
    """Two backends against each other at the graph outputs."""

    a: str
    b: str
    bitwise_equal: bool
    max_ulp: int | None
    scaled_ulp: float | None
    max_rel: float

    @classmethod
    def from_diffs(cls, a: str, b: str, diffs: Sequence[TensorDiff]) -> PairResult:
        ulps = [d.max_ulp for d in diffs if d.max_ulp is not None]
        scaled = [d.scaled_ulp for d in diffs if d.scaled_ulp is not None]
        rel = max((d.max_rel for d in diffs), default=0.0)
        return cls(
            a,
            b,
            all(d.bitwise_equal for d in diffs),
            max(ulps) if ulps else None,
            max(scaled) if scaled else None,
            rel,
        )


@dataclass(frozen=True)
class Drift:
    """A backend against the same backend in a baseline (a previous release's capture or report)."""

    backend: str
    baseline: str  # the baseline's backend, and where it came from
    status: str  # "identical" | "drifted" | "no-baseline" | "not-comparable"
    reason: str = ""
    measured: bool = False  # values were compared (ULP figures); else digests only
    outputs: tuple[TensorDiff, ...] = ()  # graph outputs, when measured
    tensors: tuple[TensorDiff, ...] = ()  # every tensor both captured, model order, when measured
    moved: tuple[str, ...] = ()  # tensors whose bits moved, model order

    @property
    def drifted(self) -> bool:
        return self.status == "drifted"

    @property
    def first_moved(self) -> str | None:
        return self.moved[0] if self.moved else None

    @property
    def outputs_moved(self) -> tuple[str, ...]:
        outs = {value_name(d.name) for d in self.outputs}
        return tuple(m for m in self.moved if value_name(m) in outs) if self.measured else ()

    @property
    def max_ulp(self) -> int | None:
        vals = [d.max_ulp for d in self.outputs if d.max_ulp is not None]
        return max(vals) if vals else None

    @property
    def scaled_ulp(self) -> float | None:
        vals = [d.scaled_ulp for d in self.outputs if d.scaled_ulp is not None]
        return max(vals) if vals else None


@dataclass(frozen=True)
class Result:
    """The whole comparison: what ran, on what, and what differed."""

    model: ModelSpec
    feeds: FeedsInfo
    options: CompareOptions
    backends: tuple[BackendResult, ...]
    cross_backend: tuple[CrossBackendResult, ...]
    environment: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()
    pairs: tuple[PairResult, ...] = ()
    oracle_error: tuple[CrossBackendResult, ...] = ()
    probes: tuple[ProbeResult, ...] = ()
    probes_ran: tuple[str, ...] = ()
    reference: str = ""  # the reference used: --reference, or the fallback when it did not run
    expected_error: tuple[CrossBackendResult, ...] = ()  # each backend against golden outputs
    baseline: tuple[Drift, ...] = ()  # each backend against --baseline
    baseline_environment: tuple[tuple[str, str], ...] = ()  # the baseline's, when it records one

    @property
    def command(self) -> str:
        return self.options.command(self.model.path)

    @property
    def reference_used(self) -> str:
        return self.reference or self.options.reference_name

    def backend(self, name: str) -> BackendResult:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)

    def pair(self, a: str, b: str) -> PairResult:
        for p in self.pairs:
            if {p.a, p.b} == {a, b}:
                return p
        raise KeyError((a, b))

    def oracle(self, name: str) -> CrossBackendResult:
        """`name`'s error against the float64 oracle."""
        for c in self.oracle_error:
            if c.backend == name:
                return c
        raise KeyError(name)

    def expected(self, name: str) -> CrossBackendResult:
        """`name` against the expected (golden) outputs."""
        for c in self.expected_error:
            if c.backend == name:
                return c
        raise KeyError(name)

    def cross(self, name: str) -> CrossBackendResult:
        for c in self.cross_backend:
            if c.backend == name:
                return c
        raise KeyError(name)

    def probe(self, name: str) -> ProbeResult:
        for p in self.probes:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def failed(self) -> list[BackendResult]:
        return [b for b in self.backends if not b.ok]

    @property
    def nondeterministic(self) -> list[BackendResult]:
        return [b for b in self.backends if b.ok and b.deterministic is False]

    @property
    def violations(self) -> list[CrossBackendResult]:
        return [c for c in (*self.cross_backend, *self.expected_error) if c.violates]

    def promise_checks(self) -> list[PromiseCheck]:
        """Each promise a backend's runner declared, held or broken as this run observed it."""
        return check_promises(self)

    @property
    def broken_promises(self) -> list[PromiseCheck]:
        return [c for c in self.promise_checks() if c.broken]

    def gates(self) -> list[Gate]:
        """The --fail-on policies that fire, lowest exit code first (none without --fail-on)."""
        return evaluate(self, self.options.fail_on) if self.options.fail_on else []

    @property
    def exit_code(self) -> int:
        if not any(b.ok for b in self.backends):
            return EXIT_ALL_FAILED
        if self.options.fail_on:
            gates = self.gates()
            return gates[0].exit_code if gates else EXIT_OK
        if self.broken_promises:
            return EXIT_PROMISE
        if self.failed or self.nondeterministic or self.violations:
            return EXIT_DIFFERENCES
        return EXIT_OK

    @property
    def drifted(self) -> list[Drift]:
        return [d for d in self.baseline if d.drifted]

    @property
    def vacuous(self) -> str:
        """Why agreement proves little ('' when it does not): every output of the reference is
        one value repeated (e.g. all zeros)."""
        ref = next((b for b in self.backends if b.name == self.reference_used and b.ok), None)
        if ref is None or not ref.constant_outputs:
            return ""
        if len(ref.constant_outputs) < len(self.model.outputs):
            return ""
        what = ", ".join(f"{n} is {v}" for n, v in ref.constant_outputs)
        return f"every graph output of {ref.name} is constant ({what})"

    def _fail_lines(self) -> list[str]:
        lines = []
        for b in self.nondeterministic:
            worst = max(b.varying(), key=lambda d: d.severity(), default=None)
            at = f" ({short(worst.scaled_ulp)} scaled ULP at worst, {worst.name})" if worst else ""
            lines.append(
                f"FAIL: {b.name} is nondeterministic: {b.distinct_outputs} distinct outputs in "
                f"{b.runs * b.builds} runs{at}; first varying tensor {b.first_nondeterministic}"
            )
        for c in self.violations:
            against = "the expected outputs" if c.reference == EXPECTED else c.reference
            lines.append(
                f"FAIL: {c.backend} differs from {against} beyond {c.max_ulp_tolerance:g} scaled ULP "
                f"at the outputs (worst {short(c.scaled_ulp)} scaled ULP); "
                f"first tensor past tolerance {c.first_violation}"
            )
        lines += [f"FAIL: {b.name} {b.status}: {b.reason}" for b in self.failed]
        return lines

    def _warn_lines(self) -> list[str]:
        out = []
        if self.reference_used != self.options.reference_name:
            out.append(
                f"WARN: reference {self.options.reference_name} did not run; every backend is compared "
                f"against {self.reference_used} instead (the first backend in --backends order that ran)"
            )
        for b in self.backends:
            if b.observer is not None and b.observer.outputs_changed:
                out.append(
                    f"WARN: observer effect on {b.name}: exposing intermediates changed its graph outputs "
                    f"({short(b.observer.scaled_ulp)} scaled ULP); output figures come from the plain model, "
                    "per-layer tables from the instrumented one"
                )
            if b.layers_error:
                out.append(
                    f"WARN: {b.name}: the per-layer build failed ({b.layers_error}); output figures stand"
                )
        for p in self.probes:
            out += p.warnings()
        if self.vacuous:
            out.append(
                f"WARN: vacuous comparison: {self.vacuous}; agreement there proves little: feed inputs "
                "that exercise the model (--inputs, --range)"
            )
        for c in self.cross_backend:
            why = c.zero_ulp_reason() if c.status == "ok" else ""
            if why:
                out.append(f"NOTE: {c.backend} vs {c.reference}: bits differ at 0 ULP ({why})")
        return out

    def _drift_lines(self) -> list[str]:
        out = []
        for d in self.baseline:
            if d.drifted:
                size = (
                    f": {short(d.scaled_ulp)} scaled ULP (raw {d.max_ulp}) at the outputs"
                    if d.measured and d.outputs_moved
                    else (": the outputs are bit-identical, intermediates moved" if d.measured else "")
                )
                first = with_module(d.first_moved or "", self.model.modules())
                out.append(f"DRIFT: {d.backend} moved from the baseline{size}; first moved tensor {first}")
            elif d.status == "not-comparable":
                out.append(f"DRIFT: {d.backend} cannot be compared with the baseline: {d.reason}")
        return out

    def _promise_lines(self) -> list[str]:
        return [
            f"FAIL: {c.backend} broke its promise of {c.name} determinism: {c.evidence}"
            + (
                f"; first broke at {with_module(c.first_layer, self.model.modules())}"
                if c.first_layer
                else ""
            )
            for c in self.broken_promises
        ]

    def _gate_lines(self) -> list[str]:
        if not self.options.fail_on:
            return []
        gates = self.gates()
        policies = ",".join(self.options.fail_on)
        if not gates:
            return [f"GATE: pass (--fail-on {policies})"]
        return [f"GATE: {g.policy} fired (exit {g.exit_code}): {g.reason}" for g in gates]

    def verdict(self) -> list[str]:
        """One line per finding, most important first; a single PASS line when all is well."""
        if not any(b.ok for b in self.backends):
            return ["FAIL: every backend failed; nothing was compared", *self._fail_lines()]
        lines = self._promise_lines() + self._fail_lines() + self._drift_lines() + self._warn_lines()
        if not any(line.startswith("FAIL") for line in lines):
            lines.insert(
                0,
                f"PASS{' (vacuous)' if self.vacuous else ''}: every backend is deterministic over "
                f"{self.options.runs} run(s) x {self.options.builds} build(s) and within "
                f"{self.options.max_ulp:g} scaled ULP of {self.reference_used} at the outputs",
            )
        return self._gate_lines() + lines
