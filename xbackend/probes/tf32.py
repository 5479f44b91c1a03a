"""TF32: each GPU backend with TF32 math on against itself with it off.

TF32 keeps float32's range but rounds the multiplicands of matmuls and convolutions to 10
mantissa bits. Engines differ in their default (ONNX Runtime CUDA and TensorRT on, PyTorch on
for convolutions only); xbackend's GPU runners turn it off unless `tf32=true`, and this probe
measures what turning it on costs in bits. A runner opts in with a `tf32` option; runners with
a `device` option take part only on cuda.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from xbackend.execution.executor import Job, separate_layers, standard_phases
from xbackend.files.textfmt import num, with_module
from xbackend.planning.context import PlannedBackend
from xbackend.probes.base import BackendRuns, Probe
from xbackend.results.findings import Finding, Kind, Label, scaled_ulp_figure
from xbackend.results.probe import ProbeResult
from xbackend.results.sections import Cell, Paragraph, Section, Strong, Table, TensorName, yes_no

__all__ = ["Tf32Probe", "Tf32Result", "Tf32Row", "on_gpu_with_tf32"]


@dataclass(frozen=True)
class Tf32Row:
    """A backend with TF32 flipped against its main builds."""

    backend: str
    tf32: bool  # what the probe build had
    status: Literal["ok", "failed"]
    reason: str = ""
    same_bits: bool | None = None
    max_ulp: int | None = None
    scaled_ulp: float | None = None
    first_divergence: str | None = None


@dataclass(frozen=True)
class Tf32Result(ProbeResult):
    name = "tf32"
    rows: tuple[Tf32Row, ...] = ()

    def findings(self, modules: Mapping[str, str] | None = None) -> list[Finding]:
        out = []
        for row in self.rows:
            if row.status != "ok":
                out.append(
                    self.finding(
                        Label.WARN,
                        f"tf32 probe failed on {row.backend}: {row.reason}",
                        row.backend,
                        Kind.PROBE_FAILED,
                    )
                )
            elif row.same_bits is False:
                out.append(
                    self.finding(
                        Label.WARN,
                        f"{row.backend} with TF32 {'on' if row.tf32 else 'off'} changes bits from "
                        f"{with_module(row.first_divergence or '', modules or {})} on "
                        f"({num(row.scaled_ulp)} scaled ULP at worst)",
                        row.backend,
                        tensor=row.first_divergence or "",
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
                "on" if row.tf32 else "off",
                yes_no(row.same_bits) if row.status == "ok" else Strong("failed", f": {row.reason}"),
                num(row.max_ulp),
                num(row.scaled_ulp),
                TensorName(row.first_divergence) if row.first_divergence else "–",
            ]
            for row in self.rows
        ]
        return Section(
            "TF32",
            (
                Paragraph.of(
                    "Each GPU backend with TF32 flipped (the main builds run it off unless `tf32=true`) "
                    "against its main build."
                ),
                Table.of(["backend", "TF32", "same bits", "max ULP", "scaled ULP", "first divergence"], rows),
            ),
        )

    def to_json(self) -> Any:
        return [
            {
                "backend": row.backend,
                "tf32": row.tf32,
                "status": row.status,
                "reason": row.reason,
                "same_bits": row.same_bits,
                "max_ulp": row.max_ulp,
                "scaled_ulp": row.scaled_ulp,
                "first_divergence": row.first_divergence,
            }
            for row in self.rows
        ]


def on_gpu_with_tf32(planned_backend: PlannedBackend) -> bool:
    """A backend that has a TF32 switch and runs on a GPU."""
    if planned_backend.cls is None or "tf32" not in {
        option.name for option in planned_backend.cls.option_specs
    }:
        return False
    return str(planned_backend.options.get("device", "cuda")) == "cuda"


class Tf32Probe(Probe):
    name = "tf32"
    help = "GPU backends (ort-cuda, trt-*, torch-cuda, torch-compile device=cuda): TF32 on vs off"

    def _label(self, planned_backend: PlannedBackend) -> str:
        return f"{planned_backend.name}-tf32-{'off' if planned_backend.options['tf32'] else 'on'}"

    def jobs(self, planned_backend: PlannedBackend) -> list[Job]:
        if not on_gpu_with_tf32(planned_backend) or planned_backend.cls is None:
            return []
        layers = not separate_layers(
            planned_backend.cls, self.ctx.spec, planned_backend.raw_options
        )  # one build gives both
        phases = standard_phases(
            planned_backend.cls, self.ctx.spec, 1, layers=layers, options=planned_backend.raw_options
        )
        flipped = "false" if planned_backend.options["tf32"] else "true"
        return [self.ctx.job(self._label(planned_backend), planned_backend, phases, tf32=flipped)]

    def analyze(self, runs: Sequence[BackendRuns]) -> Tf32Result:
        return Tf32Result(tuple(self._row(run) for run in runs if on_gpu_with_tf32(run.planned)))

    def _row(self, backend_runs: BackendRuns) -> Tf32Row:
        planned = backend_runs.planned
        flipped = not planned.options["tf32"]
        main, probe = (
            backend_runs.builds[0] if backend_runs.builds else None,
            backend_runs.jobs.get(self._label(planned)),
        )
        for o in (main, probe):
            if o is None or not o.ok:
                return Tf32Row(planned.name, flipped, "failed", o.reason if o else "not run")
        assert main is not None and probe is not None
        equal, max_ulp, scaled, first = self.ctx.compare_builds(probe, main, probe.layers, main.layers)
        return Tf32Row(planned.name, flipped, "ok", "", equal, max_ulp, scaled, first)
