"""Options and results of a comparison: plain frozen dataclasses that reports read."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from xbackend.errors import EXIT_ALL_FAILED, EXIT_DIFFERENCES, EXIT_OK, UsageError
from xbackend.metrics import TensorDiff, worst_per_tensor
from xbackend.model import ModelSpec
from xbackend.probes import Probes, select_probes

__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_MAX_ULP",
    "BackendResult",
    "CompareOptions",
    "CrossBackendResult",
    "FeedsInfo",
    "PairResult",
    "Result",
]

DEFAULT_BACKENDS = ("ort-cpu", "reference")
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
        opts = cls(**kw)
        opts.validate()
        return opts.with_reference()

    def validate(self) -> None:
        if not self.backends:
            raise UsageError("no backends given; pass --backends, e.g. --backends ort-cpu,reference")
        if len(set(self.backends)) != len(self.backends):
            raise UsageError(f"--backends lists a backend twice: {','.join(self.backends)}")
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
        select_probes(self.probes, self.batch_invariance)  # UsageError for unknown names
        stray = sorted({b for b, _, _ in self.runner_options} - set(self.backends) - {self.reference})
        if stray:
            raise UsageError(f"--set names backend(s) {', '.join(stray)} that are not in --backends")

    def with_reference(self) -> CompareOptions:
        """Resolve the reference: the explicit one (added to backends), else 'reference', else the first."""
        if self.reference is None:
            ref = "reference" if "reference" in self.backends else self.backends[0]
            return replace(self, reference=ref)
        if self.reference not in self.backends:
            return replace(self, backends=(*self.backends, self.reference))
        return self

    @property
    def reference_name(self) -> str:
        return self.reference or self.backends[0]

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
        return shlex.join(parts)


@dataclass(frozen=True)
class FeedsInfo:
    """What was fed: hash, seed, source and shapes (the arrays themselves stay out of results)."""

    sha256: str
    seed: int | None
    source: str
    shapes: tuple[tuple[str, str, Shape], ...]  # (name, dtype, shape)


@dataclass(frozen=True)
class BackendResult:
    """One backend configuration across its builds and runs."""

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


@dataclass(frozen=True)
class CrossBackendResult:
    """A backend against the reference, tensor by tensor in topological order."""

    backend: str
    reference: str
    status: str  # "ok" | "skipped"
    reason: str = ""
    tensors: tuple[TensorDiff, ...] = ()
    outputs: tuple[str, ...] = ()
    only_in_backend: tuple[str, ...] = ()
    only_in_reference: tuple[str, ...] = ()
    max_ulp_tolerance: float = DEFAULT_MAX_ULP

    @classmethod
    def from_diffs(
        cls,
        backend: str,
        reference: str,
        diffs: Sequence[TensorDiff],
        outputs: Iterable[str],
        only_a: Iterable[str],
        only_b: Iterable[str],
        tolerance: float,
    ) -> CrossBackendResult:
        return cls(
            backend,
            reference,
            "ok",
            "",
            tuple(diffs),
            tuple(outputs),
            tuple(only_a),
            tuple(only_b),
            tolerance,
        )

    @property
    def bitwise_equal(self) -> bool:
        return self.status == "ok" and all(d.bitwise_equal for d in self.tensors)

    def output_diffs(self) -> list[TensorDiff]:
        outs = set(self.outputs)
        return [d for d in self.tensors if d.name in outs]

    @property
    def max_ulp(self) -> int | None:
        """Raw max ULP over graph outputs (None if no float output was compared)."""
        vals = [d.max_ulp for d in self.output_diffs() if d.max_ulp is not None]
        return max(vals) if vals else None

    @property
    def scaled_ulp(self) -> float | None:
        vals = [d.scaled_ulp for d in self.output_diffs() if d.scaled_ulp is not None]
        return max(vals) if vals else None

    @property
    def first_divergence(self) -> str | None:
        return next((d.name for d in self.tensors if not d.bitwise_equal), None)

    @property
    def first_violation(self) -> str | None:
        return next((d.name for d in self.tensors if d.exceeds(self.max_ulp_tolerance)), None)

    @property
    def violates(self) -> bool:
        return self.status == "ok" and any(d.exceeds(self.max_ulp_tolerance) for d in self.output_diffs())


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
    probes: Probes = field(default_factory=Probes)

    @property
    def command(self) -> str:
        return self.options.command(self.model.path)

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

    def cross(self, name: str) -> CrossBackendResult:
        for c in self.cross_backend:
            if c.backend == name:
                return c
        raise KeyError(name)

    @property
    def failed(self) -> list[BackendResult]:
        return [b for b in self.backends if not b.ok]

    @property
    def nondeterministic(self) -> list[BackendResult]:
        return [b for b in self.backends if b.ok and b.deterministic is False]

    @property
    def violations(self) -> list[CrossBackendResult]:
        return [c for c in self.cross_backend if c.violates]

    @property
    def exit_code(self) -> int:
        if not any(b.ok for b in self.backends):
            return EXIT_ALL_FAILED
        if self.failed or self.nondeterministic or self.violations:
            return EXIT_DIFFERENCES
        return EXIT_OK

    def _probe_warnings(self) -> list[str]:
        """Probe findings: they explain what moves the bits; they do not change the exit code."""
        p = self.probes
        out = [
            f"WARN: observer effect on {o.backend}: exposing intermediates changed its graph outputs "
            f"(max {o.max_ulp} ULP); per-layer numbers describe a differently optimized engine"
            for o in p.observer
            if o.outputs_changed
        ]
        out += [
            f"WARN: {b.backend} builds vary: {b.distinct_fingerprints} distinct engines in {b.builds} builds"
            f" ({len(b.varying_layers)} layers differ); outputs "
            f"{'differ' if b.outputs_differ else 'identical'}"
            for b in p.builds
            if b.builds_vary
        ]
        out += [
            f"WARN: {b.backend} is not batch-invariant: sample alone vs in a batch of {b.batch} differs "
            f"from {b.first_divergence} on (max {b.max_ulp} ULP)"
            for b in p.batch
            if b.invariant is False
        ]
        out += [
            f"WARN: {t.backend} changes with threads ({t.threads} vs 1): from {t.first_divergence} on "
            f"(max {t.max_ulp} ULP)"
            for t in p.threads
            if t.invariant is False
        ]
        out += [
            f"WARN: {o.backend} optimization level {o.level} changes bits (max {o.max_ulp} ULP) vs none; "
            f"changed by {', '.join(o.changed_by) or 'a combination of ' + ', '.join(o.modified_graph)}"
            for o in p.opt_levels
            if not o.bitwise_equal
        ]
        return out

    def verdict(self) -> list[str]:
        """One line per finding, most important first; a single PASS line when all is well."""
        lines: list[str] = []
        if not any(b.ok for b in self.backends):
            return ["FAIL: every backend failed; nothing was compared"]
        for b in self.nondeterministic:
            lines.append(
                f"FAIL: {b.name} is nondeterministic: {b.distinct_outputs} distinct outputs in "
                f"{b.runs * b.builds} runs; first varying tensor {b.first_nondeterministic}"
            )
        for c in self.violations:
            lines.append(
                f"FAIL: {c.backend} differs from {c.reference} beyond {c.max_ulp_tolerance:g} scaled ULP "
                f"at the outputs (worst {_fmt(c.scaled_ulp)}); "
                f"first tensor past tolerance {c.first_violation}"
            )
        for b in self.failed:
            lines.append(f"FAIL: {b.name} {b.status}: {b.reason}")
        lines += self._probe_warnings()
        if not any(line.startswith("FAIL") for line in lines):
            lines.insert(
                0,
                f"PASS: every backend is deterministic over {self.options.runs} run(s) x "
                f"{self.options.builds} build(s) and within {self.options.max_ulp:g} scaled ULP of "
                f"{self.options.reference_name} at the outputs",
            )
        return lines


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"
