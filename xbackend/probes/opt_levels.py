"""Graph optimization levels: which optimizer moves the bits (engines that have levels, e.g. ORT)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from xbackend.execution.executor import Job
from xbackend.files.textfmt import num, strong, table, yes
from xbackend.planning.context import PlannedBackend
from xbackend.probes.base import BackendRuns, Probe
from xbackend.results.findings import Finding, Kind, Label, scaled_ulp_figure
from xbackend.results.probe import ProbeResult
from xbackend.runners.base import Runner
from xbackend.runners.buildinfo import OptLevelRow

__all__ = ["OptLevelResult", "OptLevelsProbe", "OptLevelsResult"]


@dataclass(frozen=True)
class OptLevelResult(OptLevelRow):
    """One backend's graph optimization level against none (the job's row, with its backend)."""

    backend: str = ""

    @classmethod
    def from_row(cls, backend: str, r: OptLevelRow) -> OptLevelResult:
        return cls(**{f.name: getattr(r, f.name) for f in fields(r)}, backend=backend)


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

    def markdown(self, modules: Mapping[str, str] | None = None) -> list[str]:
        if not self.rows and not self.failures:
            return []
        rows = [
            [
                o.backend,
                o.level,
                yes(o.bitwise_equal),
                num(o.max_ulp),
                num(o.scaled_ulp),
                ", ".join(o.changed_by) or ("–" if o.bitwise_equal else "a combination"),
                ", ".join(o.modified_graph) or "–",
            ]
            for o in self.rows
        ]
        rows += [[b, "–", strong("failed", f": {why}"), "–", "–", "–", "–"] for b, why in self.failures]
        header = [
            "backend",
            "level",
            "same bits as none",
            "max ULP",
            "scaled ULP",
            "changed by",
            "optimizers that rewrote the graph",
        ]
        return [
            "### Graph optimization levels",
            "",
            "Graph outputs of the plain model at each level against no "
            "optimization; 'changed by' is the optimizer whose removal alone restores the bits.",
            "",
            *table(header, rows),
        ]

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


def has_opt_levels(b: PlannedBackend) -> bool:
    return b.cls is not None and b.cls.optimization_levels is not Runner.optimization_levels


class OptLevelsProbe(Probe):
    name = "opt-levels"
    # Opt-in: it explains a gap (which optimizer moves the bits) rather than testing the engine
    # users ship, and costs five or more engine builds per backend.
    default = False
    help = (
        "ONNX Runtime at each graph optimization level vs none, on the plain model; for a level that "
        "changes bits, names the optimizer whose removal restores them"
    )

    def jobs(self, b: PlannedBackend) -> list[Job]:
        if not has_opt_levels(b):
            return []
        return [self.ctx.job(f"{b.name}-opt-levels", b, kind="opt-levels")]

    def analyze(self, runs: Sequence[BackendRuns]) -> OptLevelsResult:
        rows: list[OptLevelResult] = []
        failures = []
        for r in runs:
            o = r.jobs.get(f"{r.planned.name}-opt-levels")
            if o is None:
                continue
            if not o.ok:
                failures.append((r.planned.name, o.reason))
                continue
            rows += [OptLevelResult.from_row(r.planned.name, row) for row in o.result.opt_levels]
        return OptLevelsResult(tuple(rows), tuple(failures))
