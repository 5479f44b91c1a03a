"""Probes that say which knob moves the bits: builds, batch, threads, optimization level, observer.

Each probe plans worker jobs (variants of a backend's main configuration),
and compares their captures with the main run's. Results are frozen
dataclasses that reports read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xbackend.capture import CaptureFile
from xbackend.errors import UsageError
from xbackend.executor import JobOutcome
from xbackend.inputs import Feeds, generate_feeds
from xbackend.metrics import TensorDiff
from xbackend.model import ModelSpec
from xbackend.runners.base import Runner

__all__ = [
    "CHEAP_PROBES",
    "PROBES",
    "BatchResult",
    "BuildVariance",
    "ObserverResult",
    "OptLevelResult",
    "Probes",
    "ThreadResult",
    "select_probes",
]

PROBES = ("observer", "threads", "opt-levels", "batch")
CHEAP_PROBES = ("observer", "threads", "opt-levels")
DEFAULT_BATCH = 4


def select_probes(requested: Sequence[str] | None, batch: int) -> tuple[str, ...]:
    """The probes to run: the cheap ones by default, plus batch when a batch size is given."""
    if requested is None:
        chosen = list(CHEAP_PROBES) + (["batch"] if batch else [])
    else:
        unknown = sorted(set(requested) - set(PROBES) - {"none", "all"})
        if unknown:
            raise UsageError(
                f"unknown probe(s) {', '.join(unknown)}; choose from {', '.join(PROBES)}, all, none"
            )
        chosen = list(PROBES) if "all" in requested else [p for p in requested if p != "none"]
    return tuple(p for p in PROBES if p in chosen)


# --- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildVariance:
    """Whether fresh builds of one backend decided the same thing, layer by layer."""

    backend: str
    builds: int
    distinct_fingerprints: int
    varying_layers: tuple[tuple[str, tuple[str, ...]], ...]  # layer, its implementation in each build
    outputs_differ: bool

    @property
    def builds_vary(self) -> bool:
        return self.distinct_fingerprints > 1

    @classmethod
    def from_fingerprints(
        cls, backend: str, fingerprints: Sequence[Mapping[str, Any]], outputs_differ: bool
    ) -> BuildVariance:
        digests = {fp["digest"] for fp in fingerprints}
        layers = [dict(map(tuple, fp.get("layers", []))) for fp in fingerprints]
        keys = sorted(set().union(*layers)) if layers else []
        varying = tuple(
            (k, tuple(lay.get(k, "(absent)") for lay in layers))
            for k in keys
            if len({lay.get(k, "(absent)") for lay in layers}) > 1
        )
        return cls(backend, len(fingerprints), len(digests), varying, outputs_differ)


@dataclass(frozen=True)
class ThreadResult:
    """A backend at `threads` against the same backend at 1 thread."""

    backend: str
    threads: str
    status: str  # "ok" | "failed" | "n/a"
    reason: str = ""
    invariant: bool | None = None
    max_ulp: int | None = None
    scaled_ulp: float | None = None
    first_divergence: str | None = None


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


@dataclass(frozen=True)
class OptLevelResult:
    """One graph optimization level against none, and what changed the bits."""

    backend: str
    level: str
    bitwise_equal: bool
    max_ulp: int
    scaled_ulp: float
    changed_by: tuple[str, ...]
    modified_graph: tuple[str, ...]


@dataclass(frozen=True)
class ObserverResult:
    """Graph outputs with every intermediate exposed vs the plain model."""

    backend: str
    status: str
    reason: str = ""
    outputs_changed: bool | None = None
    max_ulp: int | None = None
    scaled_ulp: float | None = None


@dataclass(frozen=True)
class Probes:
    ran: tuple[str, ...] = ()
    builds: tuple[BuildVariance, ...] = ()
    batch: tuple[BatchResult, ...] = ()
    threads: tuple[ThreadResult, ...] = ()
    opt_levels: tuple[OptLevelResult, ...] = ()
    observer: tuple[ObserverResult, ...] = ()
    notes: tuple[str, ...] = ()


# --- shared comparison helpers --------------------------------------------------------------


def summarize(diffs: Sequence[TensorDiff]) -> tuple[bool, int | None, float | None, str | None]:
    """(all bitwise equal, max ULP, max scaled ULP, first divergent tensor)."""
    ulps = [d.max_ulp for d in diffs if d.max_ulp is not None]
    scaled = [d.scaled_ulp for d in diffs if d.scaled_ulp is not None]
    first = next((d.name for d in diffs if not d.bitwise_equal), None)
    return first is None, (max(ulps) if ulps else None), (max(scaled) if scaled else None), first


def has_threads(cls: type[Runner]) -> bool:
    return any(s.name == "threads" for s in cls.option_specs)


def has_opt_levels(cls: type[Runner]) -> bool:
    return cls.optimization_levels is not Runner.optimization_levels


# --- batch feeds ----------------------------------------------------------------------------


def batch_inputs(spec: ModelSpec) -> list[str]:
    """Inputs whose first dimension is symbolic: the batch dimension."""
    return [i.name for i in spec.inputs if i.shape and not isinstance(i.shape[0], int)]


def batch_positions(batch: int) -> tuple[int, ...]:
    return tuple(sorted({0, batch // 2, batch - 1}))


def batch_feed_sets(spec: ModelSpec, feeds: Feeds, batch: int, seed: int) -> tuple[Feeds, list[Feeds]]:
    """The first sample alone, and batches of `batch` holding it at each probed position."""
    names = set(batch_inputs(spec))
    single = {k: (v[:1] if k in names else v) for k, v in feeds.arrays.items()}
    shapes = {k: ((batch, *v.shape[1:]) if k in names else tuple(v.shape)) for k, v in single.items()}
    others = generate_feeds(spec, seed + 1, {k: tuple(int(d) for d in s) for k, s in shapes.items()})
    batches = []
    for pos in batch_positions(batch):
        arrays = {k: np.array(v, copy=True) for k, v in others.arrays.items()}
        for k in names:
            arrays[k][pos] = single[k][0]
        batches.append(Feeds.from_arrays(arrays, seed + 1, f"batch position {pos}"))
    return Feeds.from_arrays(single, feeds.seed, "first sample"), batches


def batch_result(backend: str, batch: int, outcome: JobOutcome, spec: ModelSpec) -> BatchResult:
    positions = batch_positions(batch)
    if not outcome.ok:
        return BatchResult(backend, batch, "failed", outcome.outcome.reason)
    ops = spec.op_types()
    per_tensor: dict[str, list[TensorDiff]] = {}
    with CaptureFile(outcome.capture, outcome.names) as single:
        for i, (pos, path) in enumerate(zip(positions, outcome.extra_captures, strict=True)):
            with CaptureFile(path, outcome.extra_names(i)) as batched:
                for n in outcome.names:
                    if n not in batched:
                        continue
                    a, b = batched[n], single[n]
                    if a.ndim == 0 or b.ndim == 0 or a.shape[0] != batch or b.shape[0] != 1:
                        continue  # not batched along the first axis
                    per_tensor.setdefault(n, []).append(
                        TensorDiff.from_arrays(n, a[pos : pos + 1], b, ops.get(n, ""))
                    )
    depth = {n: i for i, n in enumerate(spec.tensor_order())}
    worst = sorted(
        (max(ds, key=lambda d: d.severity()) for ds in per_tensor.values()),
        key=lambda d: depth.get(d.name, len(depth)),
    )
    invariant, max_ulp, scaled, first = summarize(worst)
    by_depth = tuple((d.name, depth.get(d.name, -1), d.max_ulp, d.scaled_ulp) for d in worst)
    return BatchResult(backend, batch, "ok", "", positions, invariant, max_ulp, scaled, first, by_depth)


def save_feeds(feeds: Feeds, path: Path) -> Path:
    feeds.save(path)
    return path
