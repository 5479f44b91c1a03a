"""Batch invariance: the first sample alone vs the same sample inside a batch, per layer.

Only tensors that carry the sample are compared: those whose values depend on the
batched inputs' values (not just their shapes), where the sample's elements can be found
(`batchaxis`: a batch axis of its own, or rows of a `[B*T, C]` view). Every other tensor
is listed with the reason: shape-derived ones (a Range over the batch size, a
ConstantOfShape) change with the batch by construction, some mix the samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from xbackend.execution.executor import Job, standard_phases
from xbackend.execution.protocol import Phase, PhaseResult
from xbackend.files.codec import OMIT_DEFAULT
from xbackend.files.run_values import CaptureFile
from xbackend.files.textfmt import num
from xbackend.model.inputs import Feeds, generate_feeds
from xbackend.model.load import ModelSpec
from xbackend.numerics.metrics import TensorDiff, summarize
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.probes.base import BackendRuns, Probe
from xbackend.probes.batchaxis import Layout, batch_layouts, computed_by, sample
from xbackend.results.findings import Finding, Kind, Label, scaled_ulp_figure
from xbackend.results.probe import ProbeResult, PromiseEvidence
from xbackend.results.sections import (
    Block,
    Bullets,
    Cell,
    Paragraph,
    Section,
    Strong,
    Table,
    TensorName,
    yes_no,
)

__all__ = ["BatchProbe", "BatchResult", "BatchResults", "batch_inputs", "batch_positions"]

DEFAULT_BATCH = 4
LISTED = 50


@dataclass(frozen=True)
class BatchResult:
    """Sample alone vs inside a batch of `batch`, at several positions; error by depth."""

    backend: str
    batch: int
    status: Literal["ok", "failed"]
    reason: str = ""
    positions: tuple[int, ...] = ()
    invariant: bool | None = None
    max_ulp: int | None = None
    scaled_ulp: float | None = None
    first_divergence: str | None = None
    by_depth: tuple[tuple[str, int, int | None, float | None], ...] = ()  # tensor, depth, max ULP, scaled
    shape_derived: tuple[str, ...] = ()  # left out: they change with the batch size by construction
    compared: int = 0
    left_out: tuple[tuple[str, str], ...] = ()  # every exposed tensor not compared, with why
    seen_at: str = ""  # a view whose bits first differed, when first_divergence computed them
    module: str = ""  # first_divergence's source module

    def where(self) -> str:
        """The first divergence with its module, and the view it was first seen at."""
        out = f"{self.first_divergence} ({self.module})" if self.module else f"{self.first_divergence}"
        return f"{out}, first seen at {self.seen_at}" if self.seen_at else out


@dataclass(frozen=True)
class BatchResults(ProbeResult):
    name = "batch"
    measures = ("batch-position",)
    rows: tuple[BatchResult, ...] = ()
    notes: tuple[str, ...] = ()
    # why the probe did not run, where it could not (also among the notes)
    not_probed: str = field(default="", metadata={OMIT_DEFAULT: True})

    def promise(self, prop: str, backend: str) -> PromiseEvidence:
        """Batch position: the first sample alone against it at each position of a batch."""
        row = next((row for row in self.rows if row.backend == backend), None)
        if row is None or row.status != "ok" or row.invariant is None:
            why = row.reason if row is not None else "; ".join(self.notes) or "no batch dimension to vary"
            return "unchecked", f"the batch probe could not check it: {why}", ""
        positions = ", ".join(map(str, row.positions))
        where = f"the first sample alone vs at positions {positions} of a batch of {row.batch}"
        if row.invariant:
            return "held", f"bit-identical, {where} ({row.compared} tensors)", ""
        return "broken", f"bits differ, {where}", row.first_divergence or ""

    def findings(self, modules: Mapping[str, str] | None = None) -> list[Finding]:
        out = [self.finding(Label.WARN, self.not_probed)] if self.not_probed else []
        for row in self.rows:
            if row.status != "ok":
                out.append(
                    self.finding(
                        Label.WARN,
                        f"batch probe failed on {row.backend}: {row.reason}",
                        row.backend,
                        Kind.PROBE_FAILED,
                    )
                )
            elif row.invariant is False:
                out.append(
                    self.finding(
                        Label.WARN,
                        f"{row.backend} is not batch-invariant: sample alone vs in a batch of {row.batch} "
                        f"differs from {row.where()} on ({num(row.scaled_ulp)} scaled ULP at worst)",
                        row.backend,
                        tensor=row.first_divergence or "",
                        figures=scaled_ulp_figure(row.scaled_ulp),
                    )
                )
        return out

    def section(self, modules: Mapping[str, str] | None = None) -> Section | None:
        if not self.rows and not self.notes:
            return None
        rows: list[list[Cell]] = [
            [
                row.backend,
                row.batch,
                ",".join(map(str, row.positions)) or "–",
                row.compared,
                yes_no(row.invariant) if row.status == "ok" else Strong(row.status, f": {row.reason}"),
                num(row.max_ulp),
                num(row.scaled_ulp),
                row.where() if row.first_divergence else "–",
            ]
            for row in self.rows
        ]
        header = [
            "backend",
            "batch",
            "positions",
            "tensors compared",
            "same bits alone",
            "max ULP",
            "scaled ULP",
            "first divergence",
        ]
        blocks: list[Block] = [
            Paragraph.of(
                "The first sample alone vs the same sample inside a batch (other rows random, seeded), at "
                "several positions. Only tensors that carry the sample are compared; a tensor whose "
                "batch was merged into rows (`[B*T, C]`) is compared on the sample's rows."
            ),
            Table.of(header, rows),
            Bullets(tuple(self.notes)),
        ]
        left_out = next((row.left_out for row in self.rows if row.left_out), ())
        by_reason: dict[str, list[str]] = {}
        for tensor, why in left_out:
            by_reason.setdefault(why, []).append(tensor)
        for why, names in by_reason.items():
            shown = ", ".join(names[:LISTED]) + (
                f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
            )
            blocks.append(Paragraph.of(f"Left out, {why}: {shown}."))
        for row in self.rows:
            if row.invariant is False:
                blocks += [
                    Paragraph.of(f"Error by depth for {row.backend} (topological index):"),
                    Table.of(
                        ["depth", "tensor", "max ULP", "scaled ULP"],
                        [
                            [depth, TensorName(tensor), num(ulp), num(stats)]
                            for tensor, depth, ulp, stats in row.by_depth[:400]
                        ],
                    ),
                ]
        return Section("Batch invariance", tuple(blocks))

    def to_json(self) -> Any:
        return [
            {
                "backend": row.backend,
                "batch": row.batch,
                "status": row.status,
                "reason": row.reason,
                "positions": list(row.positions),
                "invariant": row.invariant,
                "max_ulp": row.max_ulp,
                "scaled_ulp": row.scaled_ulp,
                "first_divergence": row.first_divergence,
                "compared": row.compared,
                "shape_derived": list(row.shape_derived),
                "left_out": [{"tensor": tensor, "reason": why} for tensor, why in row.left_out],
                "first_divergence_module": row.module,
                "first_seen_at": row.seen_at,
                "by_depth": [
                    {"tensor": tensor, "depth": depth, "max_ulp": ulp, "scaled_ulp": stats}
                    for tensor, depth, ulp, stats in row.by_depth
                ],
            }
            for row in self.rows
        ]


def batch_inputs(spec: ModelSpec) -> list[str]:
    """Tensor inputs whose first dimension is symbolic: the batch dimension."""
    return [
        spec_input.name
        for spec_input in spec.inputs
        if spec_input.kind == "tensor" and spec_input.shape and not isinstance(spec_input.shape[0], int)
    ]


def batch_positions(batch: int) -> tuple[int, ...]:
    """Where the sample sits in a batch of `batch`: first, middle and last."""
    return tuple(sorted({0, batch // 2, batch - 1}))


def batch_feed_sets(spec: ModelSpec, feeds: Feeds, batch: int, seed: int) -> tuple[Feeds, list[Feeds]]:
    """The first sample alone, and batches of `batch` holding it at each probed position."""
    names = set(batch_inputs(spec))
    single = {
        key: (array[:1] if key in names and isinstance(array, np.ndarray) else array)
        for key, array in feeds.arrays.items()
    }
    shapes = {
        key: ((batch, *value.shape[1:]) if key in names else tuple(value.shape))
        for key, value in single.items()
        if isinstance(value, np.ndarray)
    }
    ranges = {}
    for name, text in feeds.ranges:
        lo, hi = text.strip("[)").split(", ")
        ranges[name] = (float(lo), float(hi))
    others = generate_feeds(
        spec, seed + 1, {key: tuple(int(dim) for dim in shape) for key, shape in shapes.items()}, ranges
    )
    batches = []
    for pos in batch_positions(batch):
        arrays = {
            key: np.array(array, copy=True)
            for key, array in others.arrays.items()
            if isinstance(array, np.ndarray)
        }
        for k in names:
            sample = single[k]
            assert isinstance(sample, np.ndarray)
            arrays[k][pos] = sample[0]
        batches.append(Feeds.from_arrays({**single, **arrays}, seed + 1, f"batch position {pos}"))
    return Feeds.from_arrays(single, feeds.seed, "first sample"), batches


class BatchProbe(Probe):
    name = "batch"
    default = False  # on with --batch-invariance B
    help = (
        "the first sample alone vs at positions 0, B/2 and B-1 of a batch of B (--batch-invariance B), "
        "per layer, on tensors that carry the sample; needs an input with a dynamic first dimension"
    )

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.batch = ctx.opts.batch_invariance or DEFAULT_BATCH
        self.paths: tuple[Path, tuple[Path, ...]] | None = None
        self.notes: list[str] = []
        self.not_probed = ""
        if not batch_inputs(ctx.spec):
            shapes = ", ".join(
                f"{spec_input.name} {spec_input.shape_str()}" for spec_input in ctx.spec.inputs
            )
            self.not_probed = (
                "batch invariance not probed: no model input has a dynamic first (batch) dimension "
                f"({shapes}); export the model with a dynamic batch axis to probe it"
            )
            self.notes.append(self.not_probed)
            return
        if ctx.opts.inputs:
            self.notes.append("batch rows other than the first sample are generated (seeded)")
        single, batches = batch_feed_sets(ctx.spec, ctx.feeds, self.batch, ctx.opts.seed)
        self.paths = (
            ctx.save_feeds(single, "batch-single"),
            tuple(ctx.save_feeds(batch, f"batch{index}") for index, batch in enumerate(batches)),
        )

    def jobs(self, planned_backend: PlannedBackend) -> list[Job]:
        if self.paths is None or planned_backend.cls is None:
            return []
        single, batches = self.paths
        phases = [
            Phase.planned(
                standard_phase.name, standard_phase.tensors, 1, batches, standard_phase.serves_outputs
            )
            for standard_phase in standard_phases(
                planned_backend.cls, self.ctx.spec, 1, options=planned_backend.raw_options
            )
        ]
        return [self.ctx.job(f"{planned_backend.name}-batch", planned_backend, phases, feeds=single)]

    def analyze(self, runs: Sequence[BackendRuns]) -> BatchResults:
        rows = []
        for run in runs:
            job_outcome = run.jobs.get(f"{run.planned.name}-batch")
            if job_outcome is None:
                continue
            if not job_outcome.ok:
                rows.append(BatchResult(run.planned.name, self.batch, "failed", job_outcome.reason))
                continue
            phase = job_outcome.layers or job_outcome.outputs
            rows.append(self._result(run.planned.name, phase, job_outcome.outputs))
        return BatchResults(tuple(rows), tuple(self.notes), self.not_probed)

    def _result(self, backend: str, phase: PhaseResult, plain: PhaseResult) -> BatchResult:
        spec = self.ctx.spec
        carries = spec.data_dependent(batch_inputs(spec))
        phases = list({phase.name: phase, plain.name: plain}.values())
        single: dict[str, tuple[int, ...]] = {}
        batched: dict[str, tuple[int, ...]] = {}
        others: set[str] = set()
        for phase_result in phases:
            with CaptureFile(phase_result.capture) as value_file:
                single.update({name: stats for name, (_, stats) in value_file.tensors().items()})
                others.update(name for name in value_file.names if value_file.kind(name) != "tensor")
            with CaptureFile(phase_result.extra_captures[0][0]) as value_file:
                batched.update({name: stats for name, (_, stats) in value_file.tensors().items()})
        layouts, left_out = batch_layouts(spec, single, batched, self.batch, carries)
        left_out.update({other: "not a plain tensor" for other in others})
        per_tensor: dict[str, list[TensorDiff]] = {}
        for phase_result in phases:
            self._compare(phase_result, layouts, per_tensor)
        depth = {name: index for index, name in enumerate(spec.tensor_order())}
        worst = sorted(
            (max(ds, key=lambda tensor_diff: tensor_diff.severity()) for ds in per_tensor.values()),
            key=lambda depth_row: depth.get(depth_row.name, len(depth)),
        )
        invariant, max_ulp, scaled, first = summarize(worst)
        seen_at = ""
        if first is not None:
            maker = computed_by(spec, first, set(per_tensor))
            first, seen_at = maker, (first if maker != first else "")
        by_depth = tuple(
            (tensor_diff.name, depth.get(tensor_diff.name, -1), tensor_diff.max_ulp, tensor_diff.scaled_ulp)
            for tensor_diff in worst
        )
        ranked = sorted(left_out.items(), key=lambda kv: depth.get(kv[0], len(depth)))
        return BatchResult(
            backend,
            self.batch,
            "ok",
            "",
            batch_positions(self.batch),
            invariant,
            max_ulp,
            scaled,
            first,
            by_depth,
            tuple(name for name, why in ranked if why.startswith("shape-derived")),
            len(worst),
            tuple(ranked),
            seen_at,
            spec.modules().get(first, "") if first else "",
        )

    def _compare(
        self, phase: PhaseResult, layouts: dict[str, Layout], out: dict[str, list[TensorDiff]]
    ) -> None:
        ops = self.ctx.spec.op_types()
        positions = batch_positions(self.batch)
        with CaptureFile(phase.capture) as single:
            for pos, (path, names) in zip(positions, phase.extra_captures, strict=True):
                with CaptureFile(path) as batched:
                    for name in names:
                        if name not in single or name not in layouts:
                            continue
                        a, b = batched[name], single[name]
                        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
                            continue
                        d = TensorDiff.from_arrays(name, sample(a, layouts[name], pos), b, ops.get(name, ""))
                        out.setdefault(name, []).append(d)
