"""Graph optimization levels: which optimizer moves the bits (engines that have levels, e.g. ORT)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from xbackend.execution.executor import Job
from xbackend.files.textfmt import num
from xbackend.planning.context import PlannedBackend
from xbackend.probes.base import BackendRuns, Probe
from xbackend.results.findings import Finding, Kind, Label, scaled_ulp_figure
from xbackend.results.probe import ProbeResult
from xbackend.results.sections import Cell, Paragraph, Section, Strong, Table, yes_no
from xbackend.runners.base import Runner
from xbackend.runners.buildinfo import OptLevelRow

__all__ = ["OptLevelResult", "OptLevelsProbe", "OptLevelsResult"]


@dataclass(frozen=True)
class OptLevelResult(OptLevelRow):
    """One backend's graph optimization level against none (the job's row, with its backend)."""

    backend: str = ""

    @classmethod
    def from_row(cls, backend: str, opt_level_row: OptLevelRow) -> OptLevelResult:
        """The result of one level, from the row the runner measured."""
        return cls(
            **{field.name: getattr(opt_level_row, field.name) for field in fields(opt_level_row)},
            backend=backend,
        )


@dataclass(frozen=True)
class OptLevelsResult(ProbeResult):
    name = "opt-levels"
    rows: tuple[OptLevelResult, ...] = ()
    failures: tuple[tuple[str, str], ...] = ()  # backend, reason

    def findings(self, modules: Mapping[str, str] | None = None) -> list[Finding]:
        out = [
            self.finding(Label.WARN, f"opt-levels probe failed on {b}: {why}", b, Kind.PROBE_FAILED)
            for b, why in self.failures
        ]
        out += [
            self.finding(
                Label.WARN,
                f"{row.backend} optimization level {row.level} changes bits "
                f"({num(row.scaled_ulp)} scaled ULP) vs none; changed by "
                f"{', '.join(row.changed_by) or 'a combination of ' + ', '.join(row.modified_graph)}",
                row.backend,
                figures=scaled_ulp_figure(row.scaled_ulp),
            )
            for row in self.rows
            if not row.bitwise_equal
        ]
        return out

    def section(self, modules: Mapping[str, str] | None = None) -> Section | None:
        if not self.rows and not self.failures:
            return None
        rows: list[list[Cell]] = [
            [
                row.backend,
                row.level,
                yes_no(row.bitwise_equal),
                num(row.max_ulp),
                num(row.scaled_ulp),
                ", ".join(row.changed_by) or ("–" if row.bitwise_equal else "a combination"),
                ", ".join(row.modified_graph) or "–",
            ]
            for row in self.rows
        ]
        rows += [
            [backend, "–", Strong("failed", f": {why}"), "–", "–", "–", "–"] for backend, why in self.failures
        ]
        header = [
            "backend",
            "level",
            "same bits as none",
            "max ULP",
            "scaled ULP",
            "changed by",
            "optimizers that rewrote the graph",
        ]
        return Section(
            "Graph optimization levels",
            (
                Paragraph.of(
                    "Graph outputs of the plain model at each level against no "
                    "optimization; 'changed by' is the optimizer whose removal alone restores the bits."
                ),
                Table.of(header, rows),
            ),
        )

    def to_json(self) -> Any:
        rows: list[dict[str, Any]] = [
            {
                "backend": row.backend,
                "level": row.level,
                "status": "ok",
                "bitwise_equal": row.bitwise_equal,
                "max_ulp": row.max_ulp,
                "scaled_ulp": row.scaled_ulp,
                "changed_by": list(row.changed_by),
                "modified_graph": list(row.modified_graph),
            }
            for row in self.rows
        ]
        return rows + [{"backend": b, "status": "failed", "reason": why} for b, why in self.failures]


def has_opt_levels(planned_backend: PlannedBackend) -> bool:
    """Whether the backend's runner has optimization levels to sweep."""
    return (
        planned_backend.cls is not None
        and planned_backend.cls.optimization_levels is not Runner.optimization_levels
    )


class OptLevelsProbe(Probe):
    name = "opt-levels"
    # Opt-in: it explains a gap (which optimizer moves the bits) rather than testing the engine
    # users ship, and costs five or more engine builds per backend.
    default = False
    help = (
        "ONNX Runtime at each graph optimization level vs none, on the plain model; for a level that "
        "changes bits, names the optimizer whose removal restores them"
    )

    def jobs(self, planned_backend: PlannedBackend) -> list[Job]:
        if not has_opt_levels(planned_backend):
            return []
        return [self.ctx.job(f"{planned_backend.name}-opt-levels", planned_backend, kind="opt-levels")]

    def analyze(self, runs: Sequence[BackendRuns]) -> OptLevelsResult:
        rows: list[OptLevelResult] = []
        failures = []
        for run in runs:
            job_outcome = run.jobs.get(f"{run.planned.name}-opt-levels")
            if job_outcome is None:
                continue
            if not job_outcome.ok:
                failures.append((run.planned.name, job_outcome.reason))
                continue
            rows += [OptLevelResult.from_row(run.planned.name, row) for row in job_outcome.result.opt_levels]
        return OptLevelsResult(tuple(rows), tuple(failures))
