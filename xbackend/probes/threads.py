"""Thread invariance: each backend at its default and at N threads against itself at 1 thread."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xbackend.capture import CaptureFile, common_names, diff_captures
from xbackend.executor import Job, standard_phases
from xbackend.probes.base import BackendRuns, PlannedBackend, Probe, ProbeResult, summarize
from xbackend.protocol import PhaseResult
from xbackend.textfmt import num, table, yes

__all__ = ["ThreadResult", "ThreadsProbe", "ThreadsResult"]


@dataclass(frozen=True)
class ThreadResult:
    """A backend at `threads` against the same backend at 1 thread."""

    backend: str
    threads: str
    status: str  # "ok" | "failed"
    reason: str = ""
    invariant: bool | None = None
    max_ulp: int | None = None
    scaled_ulp: float | None = None
    first_divergence: str | None = None


@dataclass(frozen=True)
class ThreadsResult(ProbeResult):
    name = "threads"
    rows: tuple[ThreadResult, ...] = ()

    def warnings(self) -> list[str]:
        out = []
        for t in self.rows:
            if t.status != "ok":
                out.append(f"WARN: threads probe failed on {t.backend} at {t.threads} thread(s): {t.reason}")
            elif t.invariant is False:
                out.append(
                    f"WARN: {t.backend} changes with threads ({t.threads} vs 1): from "
                    f"{t.first_divergence} on ({num(t.scaled_ulp)} scaled ULP at worst)"
                )
        return out

    def markdown(self) -> list[str]:
        if not self.rows:
            return []
        rows = [
            [
                t.backend,
                t.threads,
                yes(t.invariant) if t.status == "ok" else f"**{t.status}**: {t.reason}",
                num(t.max_ulp),
                num(t.scaled_ulp),
                t.first_divergence or "–",
            ]
            for t in self.rows
        ]
        header = ["backend", "threads", "same bits as 1 thread", "max ULP", "scaled ULP", "first divergence"]
        return [
            "### Thread invariance",
            "",
            "Each backend at other thread counts against itself at 1 thread.",
            "",
            *table(header, rows),
        ]

    def to_json(self) -> Any:
        return [
            {
                "backend": t.backend,
                "threads": t.threads,
                "status": t.status,
                "reason": t.reason,
                "invariant": t.invariant,
                "max_ulp": t.max_ulp,
                "scaled_ulp": t.scaled_ulp,
                "first_divergence": t.first_divergence,
            }
            for t in self.rows
        ]


def has_threads(b: PlannedBackend) -> bool:
    return b.cls is not None and any(s.name == "threads" for s in b.cls.option_specs)


class ThreadsProbe(Probe):
    name = "threads"
    help = (
        "each backend at 1 thread vs its default vs N threads (--probe-threads N, default twice the "
        "logical cores): ORT intra-op, OpenVINO inference, BLAS threads for reference and oracle, torch"
    )

    def _counts(self, b: PlannedBackend) -> list[int]:
        n = self.ctx.opts.probe_threads or 2 * (os.cpu_count() or 1)
        default = int(b.options["threads"])
        return [t for t in (1, n) if t != default]

    def jobs(self, b: PlannedBackend) -> list[Job]:
        if not has_threads(b) or b.cls is None:
            return []
        phases = standard_phases(b.cls, self.ctx.spec, 1, self.ctx.opts.outputs_only)
        return [self.ctx.job(f"{b.name}-threads{t}", b, phases, threads=str(t)) for t in self._counts(b)]

    def analyze(self, runs: Sequence[BackendRuns]) -> ThreadsResult:
        return ThreadsResult(tuple(row for r in runs if has_threads(r.planned) for row in self._rows(r)))

    def _rows(self, r: BackendRuns) -> list[ThreadResult]:
        b = r.planned
        default = int(b.options["threads"])
        main = r.builds[0]
        one = main if default == 1 else r.jobs.get(f"{b.name}-threads1")
        if one is None or not one.ok:
            return [ThreadResult(b.name, "1", "failed", one.reason if one else "not run")]
        variants = [(f"{default} (default)" if default else "default", main)]
        variants += [(str(t), r.jobs[f"{b.name}-threads{t}"]) for t in self._counts(b) if t != 1]
        out = []
        for label, o in variants:
            if o is one:
                continue
            if not o.ok:
                out.append(ThreadResult(b.name, label, "failed", o.reason))
                continue
            equal, max_ulp, scaled, first = summarize(self._diff(o.outputs, one.outputs, True))
            if o.layers is not None and one.layers is not None:
                first_layer = summarize(self._diff(o.layers, one.layers, False))[3]
                equal, first = equal and first_layer is None, first_layer or first
            out.append(ThreadResult(b.name, label, "ok", "", equal, max_ulp, scaled, first))
        return out

    def _diff(self, a: PhaseResult, b: PhaseResult, outputs: bool) -> list[Any]:
        order = self.ctx.spec.tensor_order(outputs_only=outputs)
        with CaptureFile(a.capture) as ca, CaptureFile(b.capture) as cb:
            return diff_captures(ca, cb, common_names(ca, cb, order), self.ctx.spec.op_types())
