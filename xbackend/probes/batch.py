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
from xbackend.files.textfmt import num, strong, table, with_module, yes
from xbackend.model.inputs import Feeds, generate_feeds
from xbackend.model.load import ModelSpec
from xbackend.numerics.metrics import TensorDiff, summarize
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.probes.base import BackendRuns, Probe
from xbackend.probes.batchaxis import Layout, batch_layouts, computed_by, sample
from xbackend.results.findings import Finding, Kind, Label, scaled_ulp_figure
from xbackend.results.probe import ProbeResult, PromiseEvidence

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
        row = next((x for x in self.rows if x.backend == backend), None)
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
        for b in self.rows:
            if b.status != "ok":
                out.append(
                    self.finding(
                        Label.WARN,
                        f"batch probe failed on {b.backend}: {b.reason}",
                        b.backend,
                        Kind.PROBE_FAILED,
                    )
                )
            elif b.invariant is False:
                out.append(
                    self.finding(
                        Label.WARN,
                        f"{b.backend} is not batch-invariant: sample alone vs in a batch of {b.batch} "
                        f"differs from {b.where()} on ({num(b.scaled_ulp)} scaled ULP at worst)",
                        b.backend,
                        tensor=b.first_divergence or "",
                        figures=scaled_ulp_figure(b.scaled_ulp),
                    )
                )
        return out

    def markdown(self, modules: Mapping[str, str] | None = None) -> list[str]:
        if not self.rows and not self.notes:
            return []
        rows = [
            [
                b.backend,
                b.batch,
                ",".join(map(str, b.positions)) or "–",
                b.compared,
                yes(b.invariant) if b.status == "ok" else strong(b.status, f": {b.reason}"),
                num(b.max_ulp),
                num(b.scaled_ulp),
                b.where() if b.first_divergence else "–",
            ]
            for b in self.rows
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
        out = [
            "### Batch invariance",
            "",
            "The first sample alone vs the same sample inside a batch (other rows random, seeded), at "
            "several positions. Only tensors that carry the sample are compared; a tensor whose "
            "batch was merged into rows (`[B*T, C]`) is compared on the sample's rows.",
            "",
            *table(header, rows),
            *[f"- {note}" for note in self.notes],
            *([""] if self.notes else []),
        ]
        left_out = next((b.left_out for b in self.rows if b.left_out), ())
        by_reason: dict[str, list[str]] = {}
        for t, why in left_out:
            by_reason.setdefault(why, []).append(t)
        for why, names in by_reason.items():
            shown = ", ".join(names[:LISTED]) + (
                f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
            )
            out += [f"Left out, {why}: {shown}.", ""]
        for b in self.rows:
            if b.invariant is False:
                out += [
                    f"Error by depth for {b.backend} (topological index):",
                    "",
                    *table(
                        ["depth", "tensor", "max ULP", "scaled ULP"],
                        [
                            [d, with_module(t, modules or {}), num(u), num(s)]
                            for t, d, u, s in b.by_depth[:400]
                        ],
                    ),
                ]
        return out

    def to_json(self) -> Any:
        return [
            {
                "backend": b.backend,
                "batch": b.batch,
                "status": b.status,
                "reason": b.reason,
                "positions": list(b.positions),
                "invariant": b.invariant,
                "max_ulp": b.max_ulp,
                "scaled_ulp": b.scaled_ulp,
                "first_divergence": b.first_divergence,
                "compared": b.compared,
                "shape_derived": list(b.shape_derived),
                "left_out": [{"tensor": t, "reason": why} for t, why in b.left_out],
                "first_divergence_module": b.module,
                "first_seen_at": b.seen_at,
                "by_depth": [
                    {"tensor": t, "depth": d, "max_ulp": u, "scaled_ulp": s} for t, d, u, s in b.by_depth
                ],
            }
            for b in self.rows
        ]


def batch_inputs(spec: ModelSpec) -> list[str]:
    """Tensor inputs whose first dimension is symbolic: the batch dimension."""
    return [i.name for i in spec.inputs if i.kind == "tensor" and i.shape and not isinstance(i.shape[0], int)]


def batch_positions(batch: int) -> tuple[int, ...]:
    return tuple(sorted({0, batch // 2, batch - 1}))


def batch_feed_sets(spec: ModelSpec, feeds: Feeds, batch: int, seed: int) -> tuple[Feeds, list[Feeds]]:
    """The first sample alone, and batches of `batch` holding it at each probed position."""
    names = set(batch_inputs(spec))
    single = {k: (v[:1] if k in names and isinstance(v, np.ndarray) else v) for k, v in feeds.arrays.items()}
    shapes = {
        k: ((batch, *v.shape[1:]) if k in names else tuple(v.shape))
        for k, v in single.items()
        if isinstance(v, np.ndarray)
    }
    ranges = {}
    for name, text in feeds.ranges:
        lo, hi = text.strip("[)").split(", ")
        ranges[name] = (float(lo), float(hi))
    others = generate_feeds(spec, seed + 1, {k: tuple(int(d) for d in s) for k, s in shapes.items()}, ranges)
    batches = []
    for pos in batch_positions(batch):
        arrays = {k: np.array(v, copy=True) for k, v in others.arrays.items() if isinstance(v, np.ndarray)}
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
            self.not_probed = (
                "batch invariance not probed: no model input has a dynamic first (batch) dimension "
                f"({', '.join(f'{i.name} {i.shape_str()}' for i in ctx.spec.inputs)}); export the "
                "model with a dynamic batch axis to probe it"
            )
            self.notes.append(self.not_probed)
            return
        if ctx.opts.inputs:
            self.notes.append("batch rows other than the first sample are generated (seeded)")
        single, batches = batch_feed_sets(ctx.spec, ctx.feeds, self.batch, ctx.opts.seed)
        self.paths = (
            ctx.save_feeds(single, "batch-single"),
            tuple(ctx.save_feeds(f, f"batch{i}") for i, f in enumerate(batches)),
        )

    def jobs(self, b: PlannedBackend) -> list[Job]:
        if self.paths is None or b.cls is None:
            return []
        single, batches = self.paths
        phases = [
            Phase.planned(p.name, p.tensors, 1, batches, p.serves_outputs)
            for p in standard_phases(b.cls, self.ctx.spec, 1, options=b.raw_options)
        ]
        return [self.ctx.job(f"{b.name}-batch", b, phases, feeds=single)]

    def analyze(self, runs: Sequence[BackendRuns]) -> BatchResults:
        rows = []
        for r in runs:
            o = r.jobs.get(f"{r.planned.name}-batch")
            if o is None:
                continue
            if not o.ok:
                rows.append(BatchResult(r.planned.name, self.batch, "failed", o.reason))
                continue
            phase = o.layers or o.outputs
            rows.append(self._result(r.planned.name, phase, o.outputs))
        return BatchResults(tuple(rows), tuple(self.notes), self.not_probed)

    def _result(self, backend: str, phase: PhaseResult, plain: PhaseResult) -> BatchResult:
        spec = self.ctx.spec
        carries = spec.data_dependent(batch_inputs(spec))
        phases = list({phase.name: phase, plain.name: plain}.values())
        single: dict[str, tuple[int, ...]] = {}
        batched: dict[str, tuple[int, ...]] = {}
        others: set[str] = set()
        for p in phases:
            with CaptureFile(p.capture) as f:
                single.update({n: s for n, (_, s) in f.tensors().items()})
                others.update(n for n in f.names if f.kind(n) != "tensor")
            with CaptureFile(p.extra_captures[0][0]) as f:
                batched.update({n: s for n, (_, s) in f.tensors().items()})
        layouts, left_out = batch_layouts(spec, single, batched, self.batch, carries)
        left_out.update({n: "not a plain tensor" for n in others})
        per_tensor: dict[str, list[TensorDiff]] = {}
        for p in phases:
            self._compare(p, layouts, per_tensor)
        depth = {n: i for i, n in enumerate(spec.tensor_order())}
        worst = sorted(
            (max(ds, key=lambda d: d.severity()) for ds in per_tensor.values()),
            key=lambda d: depth.get(d.name, len(depth)),
        )
        invariant, max_ulp, scaled, first = summarize(worst)
        seen_at = ""
        if first is not None:
            maker = computed_by(spec, first, set(per_tensor))
            first, seen_at = maker, (first if maker != first else "")
        by_depth = tuple((d.name, depth.get(d.name, -1), d.max_ulp, d.scaled_ulp) for d in worst)
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
            tuple(n for n, why in ranked if why.startswith("shape-derived")),
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
                    for n in names:
                        if n not in single or n not in layouts:
                            continue
                        a, b = batched[n], single[n]
                        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
                            continue
                        d = TensorDiff.from_arrays(n, sample(a, layouts[n], pos), b, ops.get(n, ""))
                        out.setdefault(n, []).append(d)
