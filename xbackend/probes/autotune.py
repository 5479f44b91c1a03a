"""Autotune variance: a backend family with autotuning off, on, and on with a pin file, each
over K fresh builds, in one table.

A runner opts in with `Runner.autotune_family()`: the backend and options for each of
"off", "on" and "pinned" (TorchInductor, ONNX Runtime CUDA and TensorRT, cuDNN through
torch). Every build is a fresh process, so "on" re-tunes each time; "pinned" records its
choices in the first build and replays them after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from xbackend.execution.executor import Job, JobOutcome, standard_phases
from xbackend.files.run_values import CaptureFile, diff_captures
from xbackend.files.textfmt import num
from xbackend.model.load import ModelSpec
from xbackend.planning.context import PlannedBackend
from xbackend.probes.base import BackendRuns, Probe
from xbackend.probes.builds import BuildVariance
from xbackend.results.findings import Finding, Kind, Label, scaled_ulp_figure
from xbackend.results.probe import ProbeResult
from xbackend.results.sections import Block, Cell, Paragraph, Section, Strong, Table
from xbackend.runners.registry import get_runner

__all__ = ["AutotuneProbe", "AutotuneResult", "AutotuneRow", "variant_row"]

DEFAULT_BUILDS = 3
VARIANTS = ("off", "on", "pinned")


@dataclass(frozen=True)
class AutotuneRow:
    """One variant of a backend family over its builds."""

    backend: str  # the family, as planned
    variant: str  # off | on | pinned
    runner: str  # the backend that ran it
    status: Literal["ok", "failed"]
    reason: str = ""
    builds: int = 0
    distinct_outputs: int = 0
    distinct_fingerprints: int = 0
    moved: tuple[tuple[str, tuple[str, ...]], ...] = ()  # tuned op, its choice in each build
    scaled_ulp: float | None = None  # largest between build 0 and the others, at the outputs
    build_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class AutotuneResult(ProbeResult):
    name = "autotune"
    rows: tuple[AutotuneRow, ...] = ()

    def findings(self, modules: Mapping[str, str] | None = None) -> list[Finding]:
        out = []
        for row in self.rows:
            if row.status != "ok":
                why = f"autotune probe failed on {row.backend} ({row.variant}): {row.reason}"
                out.append(self.finding(Label.WARN, why, row.backend, Kind.PROBE_FAILED))
            elif row.distinct_outputs > 1:
                out.append(
                    self.finding(
                        Label.WARN,
                        f"{row.backend} with autotune {row.variant}: {row.distinct_outputs} distinct outputs "
                        "in "
                        f"{row.builds} builds ({num(row.scaled_ulp)} scaled ULP at worst); "
                        f"{len(row.moved)} tuned op(s) changed kernel",
                        row.backend,
                        figures=scaled_ulp_figure(row.scaled_ulp),
                    )
                )
        return out

    def section(self, modules: Mapping[str, str] | None = None) -> Section | None:
        if not self.rows:
            return None
        rows: list[list[Cell]] = [
            [
                row.backend,
                f"{row.variant} ({row.runner})",
                row.builds,
                row.distinct_outputs if row.status == "ok" else Strong("failed", f": {row.reason}"),
                row.distinct_fingerprints if row.status == "ok" else "–",
                len(row.moved) if row.status == "ok" else "–",
                num(row.scaled_ulp),
            ]
            for row in self.rows
        ]
        header = ["backend", "autotune", "builds", "distinct outputs", "distinct engines", "ops moved",
                  "max scaled ULP between builds"]  # fmt: skip
        blocks: list[Block] = [
            Paragraph.of(
                "Fresh builds with autotuning off, on, and on with a pin file (recorded by the first build, "
                "replayed by the others)."
            ),
            Table.of(header, rows),
        ]
        for row in self.rows:
            if row.moved:
                blocks += [
                    Paragraph.of(
                        f"Tuned ops whose kernel changed between builds of {row.backend} "
                        f"(autotune {row.variant}):"
                    ),
                    Table.of(
                        ["op (module)", *[f"build {i}" for i in range(row.builds)]],
                        [[op, *choices] for op, choices in row.moved],
                    ),
                ]
        return Section("Autotune variance", tuple(blocks))

    def build_times(self) -> list[tuple[str, tuple[float, ...]]]:
        return [(f"{row.backend} (autotune {row.variant})", row.build_s) for row in self.rows]

    def to_json(self) -> Any:
        return [
            {
                "backend": row.backend,
                "variant": row.variant,
                "runner": row.runner,
                "status": row.status,
                "reason": row.reason,
                "builds": row.builds,
                "distinct_outputs": row.distinct_outputs,
                "distinct_fingerprints": row.distinct_fingerprints,
                "moved": [{"op": k, "choices": list(v)} for k, v in row.moved],
                "max_scaled_ulp": row.scaled_ulp,
            }
            for row in self.rows
        ]


class AutotuneProbe(Probe):
    name = "autotune"
    default = False  # 3 x K compiles from scratch: minutes
    help = (
        "backends that autotune (torch-compile-autotune, ort-cuda, ort-trt, trt-autotune, torch-cuda): "
        "K fresh builds (--builds K, at least 2, else 3) "
        "each with autotune off, on and pinned; distinct outputs and engines, the ops whose kernel moved"
    )

    def _builds(self) -> int:
        return self.ctx.opts.builds if self.ctx.opts.builds >= 2 else DEFAULT_BUILDS

    def _family(self, planned_backend: PlannedBackend) -> dict[str, tuple[str, dict[str, str]]]:
        if planned_backend.cls is None:
            return {}
        return planned_backend.cls.autotune_family(
            str(self.ctx.work / f"{planned_backend.name}-autotune-pin.json")
        )

    def _main(self, planned_backend: PlannedBackend) -> str:
        """The variant the backend's main builds already are (same runner, same options, K
        builds), so its builds are not made twice; "" when none is."""
        if planned_backend.cls is None or self.ctx.opts.builds != self._builds():
            return ""
        for variant, (runner, extra) in self._family(planned_backend).items():
            if runner == planned_backend.cls.name and planned_backend.cls.resolve_options(
                {**planned_backend.raw_options, **extra}
            ) == dict(planned_backend.options):
                return variant
        return ""

    def jobs(self, planned_backend: PlannedBackend) -> list[Job]:
        out = []
        for variant, (runner, extra) in self._family(planned_backend).items():
            if variant == self._main(planned_backend):
                continue
            cls = get_runner(runner)
            raw = {
                key: raw_option
                for key, raw_option in planned_backend.raw_options.items()
                if key in {option.name for option in cls.all_option_specs()}
            }
            options = tuple(sorted({**raw, **extra}.items()))
            phases = standard_phases(cls, self.ctx.spec, 1, layers=False)
            out += [
                Job(
                    f"{planned_backend.name}-autotune-{variant}{k}",
                    runner,
                    cls,
                    options,
                    self.ctx.feeds_path,
                    phases,
                    fingerprint=True,
                )
                for k in range(self._builds())
            ]
        return out

    def analyze(self, runs: Sequence[BackendRuns]) -> AutotuneResult:
        rows = []
        for run in runs:
            for variant, (runner, _) in self._family(run.planned).items():
                outcomes: Sequence[JobOutcome | None] = (
                    run.builds
                    if variant == self._main(run.planned)
                    else [
                        run.jobs.get(f"{run.planned.name}-autotune-{variant}{k}")
                        for k in range(self._builds())
                    ]
                )
                rows.append(variant_row(self.ctx.spec, run.planned.name, variant, runner, outcomes))
        return AutotuneResult(tuple(rows))


def variant_row(
    spec: ModelSpec, backend: str, variant: str, runner: str, outcomes: Sequence[JobOutcome | None]
) -> AutotuneRow:
    """One variant's builds compared: distinct outputs and engines, the tuned ops whose kernel
    moved, the largest scaled ULP between build 0 and the others at the graph outputs."""
    done = [outcome for outcome in outcomes if outcome is not None]
    if not done or len(done) < len(outcomes):
        return AutotuneRow(backend, variant, runner, "failed", "not run", len(outcomes))
    failed = next((outcome for outcome in done if not outcome.ok), None)
    if failed is not None:
        return AutotuneRow(backend, variant, runner, "failed", failed.reason, len(outcomes))
    build_variance = BuildVariance.from_fingerprints(
        runner, [outcome.outputs.fingerprint for outcome in done], False
    )
    moved = tuple(
        (k.removeprefix("tuned "), c) for k, c in build_variance.varying_layers if k.startswith("tuned ")
    )
    worst = 0.0
    order = spec.output_order()
    with CaptureFile(done[0].outputs.capture) as first:
        for o in done[1:]:
            with CaptureFile(o.outputs.capture) as other:
                names = [n for n in order if n in first and n in other]
                for capture in diff_captures(other, first, names, spec.op_types()):
                    worst = max(worst, capture.scaled_ulp or 0.0)
    return AutotuneRow(
        backend,
        variant,
        runner,
        "ok",
        builds=len(done),
        distinct_outputs=len({outcome.outputs.output_hashes[0] for outcome in done}),
        distinct_fingerprints=build_variance.distinct_fingerprints,
        moved=moved,
        scaled_ulp=worst,
        build_s=tuple(outcome.outcome.elapsed_s for outcome in done),
    )
