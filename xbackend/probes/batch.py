"""Batch invariance: the first sample alone vs the same sample inside a batch, per layer.

Only tensors that carry the sample are compared: those whose values depend on the
batched inputs' values (not just their shapes) and whose leading dimension is the
batch. Shape-derived tensors (a Range over the batch size, a ConstantOfShape) change
with the batch by construction; they are left out and listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xbackend.capture import CaptureFile
from xbackend.executor import Job, PhaseSpec, standard_phases
from xbackend.inputs import Feeds, generate_feeds
from xbackend.metrics import TensorDiff, summarize
from xbackend.model import ModelSpec
from xbackend.probes.base import BackendRuns, PlannedBackend, Probe, ProbeContext
from xbackend.protocol import PhaseResult
from xbackend.results.probe import ProbeResult, PromiseEvidence
from xbackend.textfmt import num, table, yes

__all__ = ["BatchProbe", "BatchResult", "BatchResults", "batch_inputs", "batch_positions"]

DEFAULT_BATCH = 4
LISTED = 50


@dataclass(frozen=True)
class BatchResult:
    """Sample alone vs inside a batch of `batch`, at several positions; error by depth."""

    backend: str
    batch: int
    status: str
    reason: str = ""
    positions: tuple[int, ...] = ()
    invariant: bool | None = None
    max_ulp: int | None = None
    scaled_ulp: float | None = None
    first_divergence: str | None = None
    by_depth: tuple[tuple[str, int, int | None, float | None], ...] = ()  # tensor, depth, max ULP, scaled
    shape_derived: tuple[str, ...] = ()  # left out: they change with the batch size by construction
    compared: int = 0


@dataclass(frozen=True)
class BatchResults(ProbeResult):
    name = "batch"
    measures = ("batch-position",)
    rows: tuple[BatchResult, ...] = ()
    notes: tuple[str, ...] = ()

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

    def warnings(self) -> list[str]:
        out = []
        for b in self.rows:
            if b.status != "ok":
                out.append(f"WARN: batch probe failed on {b.backend}: {b.reason}")
            elif b.invariant is False:
                out.append(
                    f"WARN: {b.backend} is not batch-invariant: sample alone vs in a batch of {b.batch} "
                    f"differs from {b.first_divergence} on ({num(b.scaled_ulp)} scaled ULP at worst)"
                )
        return out

    def markdown(self) -> list[str]:
        if not self.rows and not self.notes:
            return []
        rows = [
            [
                b.backend,
                b.batch,
                ",".join(map(str, b.positions)) or "–",
                b.compared,
                yes(b.invariant) if b.status == "ok" else f"**{b.status}**: {b.reason}",
                num(b.max_ulp),
                num(b.scaled_ulp),
                b.first_divergence or "–",
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
            "several positions. Only tensors that carry the sample are compared.",
            "",
            *table(header, rows),
            *[f"- {n}" for n in self.notes],
            *([""] if self.notes else []),
        ]
        derived = next((b.shape_derived for b in self.rows if b.shape_derived), ())
        if derived:
            shown = ", ".join(derived[:LISTED]) + (
                f" and {len(derived) - LISTED} more" if len(derived) > LISTED else ""
            )
            out += [f"Left out as shape-derived (they follow the batch size, not the sample): {shown}.", ""]
        for b in self.rows:
            if b.invariant is False:
                out += [
                    f"Error by depth for {b.backend} (topological index):",
                    "",
                    *table(
                        ["depth", "tensor", "max ULP", "scaled ULP"],
                        [[d, t, num(u), num(s)] for t, d, u, s in b.by_depth[:400]],
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

    def __init__(self, ctx: ProbeContext) -> None:
        super().__init__(ctx)
        self.batch = ctx.opts.batch_invariance or DEFAULT_BATCH
        self.paths: tuple[Path, tuple[Path, ...]] | None = None
        self.notes: list[str] = []
        if not batch_inputs(ctx.spec):
            self.notes.append(
                "batch invariance not probed: no model input has a dynamic first (batch) dimension"
            )
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
            PhaseSpec(p.name, p.tensors, 1, batches, p.serves_outputs)
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
        return BatchResults(tuple(rows), tuple(self.notes))

    def _result(self, backend: str, phase: PhaseResult, plain: PhaseResult) -> BatchResult:
        spec = self.ctx.spec
        carries = spec.data_dependent(batch_inputs(spec))
        per_tensor: dict[str, list[TensorDiff]] = {}
        derived: set[str] = set()
        for p in {phase.name: phase, plain.name: plain}.values():
            self._compare(p, carries, per_tensor, derived)
        depth = {n: i for i, n in enumerate(spec.tensor_order())}
        worst = sorted(
            (max(ds, key=lambda d: d.severity()) for ds in per_tensor.values()),
            key=lambda d: depth.get(d.name, len(depth)),
        )
        invariant, max_ulp, scaled, first = summarize(worst)
        by_depth = tuple((d.name, depth.get(d.name, -1), d.max_ulp, d.scaled_ulp) for d in worst)
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
            tuple(sorted(derived, key=lambda n: depth.get(n, len(depth)))),
            len(worst),
        )

    def _compare(
        self, phase: PhaseResult, carries: set[str], out: dict[str, list[TensorDiff]], derived: set[str]
    ) -> None:
        ops = self.ctx.spec.op_types()
        positions = batch_positions(self.batch)
        with CaptureFile(phase.capture) as single:
            for pos, (path, names) in zip(positions, phase.extra_captures, strict=True):
                with CaptureFile(path) as batched:
                    for n in names:
                        if n not in single:
                            continue
                        a, b = batched[n], single[n]
                        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
                            continue
                        follows_batch = (
                            a.ndim > 0 and b.ndim > 0 and a.shape[0] == self.batch and b.shape[0] == 1
                        )
                        if n not in carries:
                            if a.shape != b.shape:
                                derived.add(n)
                            continue
                        if not follows_batch:
                            continue
                        out.setdefault(n, []).append(
                            TensorDiff.from_arrays(n, a[pos : pos + 1], b, ops.get(n, ""))
                        )
