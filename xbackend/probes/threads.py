"""Thread invariance: each backend at its default and at N threads against itself at 1 thread."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from xbackend.execution.executor import Job, JobOutcome, separate_layers, standard_phases
from xbackend.execution.protocol import LAYERS, Phase, PhaseResult
from xbackend.files.textfmt import num, with_module
from xbackend.numerics.metrics import summarize
from xbackend.planning.context import PlannedBackend
from xbackend.probes.base import BackendRuns, Probe
from xbackend.results.findings import Finding, Kind, Label, scaled_ulp_figure
from xbackend.results.probe import ProbeResult, PromiseEvidence
from xbackend.results.sections import Cell, Paragraph, Section, Strong, Table, TensorName, yes_no

__all__ = ["ThreadResult", "ThreadsProbe", "ThreadsResult"]


@dataclass(frozen=True)
class ThreadResult:
    """A backend at `threads` against the same backend at 1 thread."""

    backend: str
    threads: str
    status: Literal["ok", "failed"]
    reason: str = ""
    invariant: bool | None = None
    max_ulp: int | None = None
    scaled_ulp: float | None = None
    first_divergence: str | None = None
    outputs_equal: bool | None = None  # the graph outputs alone (None: reports before this field)

    def moved_outputs(self) -> bool:
        """Whether the thread counts' bits differ at the graph outputs (not only inside)."""
        return self.invariant is False and self.outputs_equal is not True


@dataclass(frozen=True)
class ThreadsResult(ProbeResult):
    name = "threads"
    measures = ("thread-count",)
    rows: tuple[ThreadResult, ...] = ()

    def promise(self, prop: str, backend: str) -> PromiseEvidence:
        """Thread count: every other thread count against 1 thread."""
        rows = [row for row in self.rows if row.backend == backend]
        checked = [row for row in rows if row.status == "ok" and row.invariant is not None]
        if not checked:
            why = "; ".join(row.reason for row in rows) or "the runner has no thread-count option"
            return "unchecked", f"not measured: {why}", ""
        bad = next((row for row in checked if not row.invariant), None)
        if bad is not None:
            return "broken", f"{bad.threads} threads differ from 1 thread", bad.first_divergence or ""
        counts = ", ".join(row.threads for row in checked)
        return "held", f"bit-identical at 1 thread and at {counts} threads", ""

    def findings(self, modules: Mapping[str, str] | None = None) -> list[Finding]:
        """Graph outputs that move with the thread count; intermediates alone are a note."""
        out = []
        for t in self.rows:
            if t.status != "ok":
                why = f"threads probe failed on {t.backend} at {t.threads} thread(s): {t.reason}"
                out.append(self.finding(Label.WARN, why, t.backend, Kind.PROBE_FAILED))
            elif t.moved_outputs():
                out.append(
                    self.finding(
                        Label.WARN,
                        f"{t.backend} changes with threads ({t.threads} vs 1): from "
                        f"{with_module(t.first_divergence or '', modules or {})} on "
                        f"({num(t.scaled_ulp)} scaled ULP at worst at the outputs)",
                        t.backend,
                        Kind.THREADS_VARY,
                        tensor=t.first_divergence or "",
                        figures=scaled_ulp_figure(t.scaled_ulp),
                    )
                )
        return out + [
            self.finding(
                Label.NOTE,
                f"{row.backend} at {row.threads} vs 1 thread(s): graph outputs bit-identical; "
                f"intermediates move from {with_module(row.first_divergence or '', modules or {})} on",
                row.backend,
                tensor=row.first_divergence or "",
            )
            for row in self.rows
            if row.status == "ok" and row.invariant is False and not row.moved_outputs()
        ]

    def section(self, modules: Mapping[str, str] | None = None) -> Section | None:
        if not self.rows:
            return None
        rows: list[list[Cell]] = [
            [
                row.backend,
                row.threads,
                yes_no(row.invariant) if row.status == "ok" else Strong(row.status, f": {row.reason}"),
                num(row.max_ulp),
                num(row.scaled_ulp),
                TensorName(row.first_divergence) if row.first_divergence else "–",
            ]
            for row in self.rows
        ]
        header = ["backend", "threads", "same bits as 1 thread", "max ULP", "scaled ULP", "first divergence"]
        return Section(
            "Thread invariance",
            (
                Paragraph.of(
                    "Each backend at other thread counts against itself at 1 thread: graph outputs of plain "
                    "builds; where they differ, per-layer builds name the first divergent layer."
                ),
                Table.of(header, rows),
            ),
        )

    def to_json(self) -> Any:
        return [
            {
                "backend": row.backend,
                "threads": row.threads,
                "status": row.status,
                "reason": row.reason,
                "invariant": row.invariant,
                "max_ulp": row.max_ulp,
                "scaled_ulp": row.scaled_ulp,
                "first_divergence": row.first_divergence,
                "outputs_equal": row.outputs_equal,
            }
            for row in self.rows
        ]


def has_threads(planned_backend: PlannedBackend) -> bool:
    """Whether the backend's runner takes a threads option."""
    return planned_backend.cls is not None and any(
        option.name == "threads" for option in planned_backend.cls.option_specs
    )


class ThreadsProbe(Probe):
    name = "threads"
    help = (
        "each backend at 1 thread vs its default vs N threads (--probe-threads N, default twice the "
        "logical cores): ORT intra-op, OpenVINO inference, BLAS threads for reference and oracle, torch"
    )

    def _counts(self, planned_backend: PlannedBackend) -> list[int]:
        n = self.ctx.opts.probe_threads or 2 * (os.cpu_count() or 1)
        default = int(planned_backend.options["threads"])
        return [t for t in (1, n) if t != default]

    def jobs(self, planned_backend: PlannedBackend) -> list[Job]:
        """Plain builds only: graph outputs decide invariance; layers are captured in a second
        round, and only for a variant whose outputs moved (see followup_jobs)."""
        if not has_threads(planned_backend) or planned_backend.cls is None:
            return []
        layers = not separate_layers(
            planned_backend.cls, self.ctx.spec, planned_backend.raw_options
        )  # one build gives both: take them
        phases = standard_phases(
            planned_backend.cls, self.ctx.spec, 1, layers=layers, options=planned_backend.raw_options
        )
        return [
            self.ctx.job(
                f"{planned_backend.name}-threads{count}", planned_backend, phases, threads=str(count)
            )
            for count in self._counts(planned_backend)
        ]

    def followup_jobs(self, backend_runs: BackendRuns) -> list[Job]:
        """Per-layer builds at 1 thread and at each count whose graph outputs differ from it, to
        name the first divergent layer."""
        planned = backend_runs.planned
        if not has_threads(planned) or planned.cls is None or self.ctx.spec.outputs_only:
            return []
        one = self._one(backend_runs)
        if one is None or not one.ok:
            return []
        moved = [
            t
            for t, o in self._variants(backend_runs)
            if o is not one and o.ok and not self._outputs_equal(o, one)
        ]
        want = [t for t in moved if self._layers(backend_runs, t) is None]
        if moved and self._layers(backend_runs, 1) is None:
            want.insert(0, 1)
        phase = Phase.planned(LAYERS, self.ctx.spec.tensor_order(), 1)
        return [
            self.ctx.job(f"{planned.name}-threads{t}-layers", planned, [phase], threads=str(t)) for t in want
        ]

    def analyze(self, runs: Sequence[BackendRuns]) -> ThreadsResult:
        return ThreadsResult(
            tuple(row for run in runs if has_threads(run.planned) for row in self._rows(run))
        )

    def _default(self, backend_runs: BackendRuns) -> int:
        return int(backend_runs.planned.options["threads"])

    def _one(self, backend_runs: BackendRuns) -> JobOutcome | None:
        return (
            backend_runs.builds[0]
            if self._default(backend_runs) == 1
            else backend_runs.jobs.get(f"{backend_runs.planned.name}-threads1")
        )

    def _variants(self, backend_runs: BackendRuns) -> list[tuple[int, JobOutcome]]:
        """(thread count, outcome) of the default (the main build) and each probed count but 1."""
        out = [(self._default(backend_runs), backend_runs.builds[0])]
        return out + [
            (count, backend_runs.jobs[f"{backend_runs.planned.name}-threads{count}"])
            for count in self._counts(backend_runs.planned)
            if count != 1
        ]

    def _layers(self, backend_runs: BackendRuns, t: int) -> PhaseResult | None:
        """The per-layer capture at `t` threads: from the main build, the variant's own build, or
        a second-round per-layer build."""
        own = (
            backend_runs.builds[0]
            if t == self._default(backend_runs)
            else backend_runs.jobs.get(f"{backend_runs.planned.name}-threads{t}")
        )
        if own is not None and own.ok and own.layers is not None:
            return own.layers
        extra = backend_runs.jobs.get(f"{backend_runs.planned.name}-threads{t}-layers")
        return extra.layers if extra is not None and extra.ok else None

    def _outputs_equal(self, job_outcome: JobOutcome, b: JobOutcome) -> bool:
        return summarize(self.ctx.diff_phases(job_outcome.outputs, b.outputs, True))[0]

    def _rows(self, backend_runs: BackendRuns) -> list[ThreadResult]:
        planned = backend_runs.planned
        one = self._one(backend_runs)
        if one is None or not one.ok:
            return [ThreadResult(planned.name, "1", "failed", one.reason if one else "not run")]
        one_layers = self._layers(backend_runs, 1)
        out = []
        for t, o in self._variants(backend_runs):
            if o is one:
                continue
            label = (f"{t} (default)" if t else "default") if o is backend_runs.builds[0] else str(t)
            if not o.ok:
                out.append(ThreadResult(planned.name, label, "failed", o.reason))
                continue
            equal, max_ulp, scaled, first = self.ctx.compare_builds(
                o, one, self._layers(backend_runs, t), one_layers
            )
            outputs = self._outputs_equal(o, one)
            out.append(ThreadResult(planned.name, label, "ok", "", equal, max_ulp, scaled, first, outputs))
        return out
