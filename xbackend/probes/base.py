"""The probe contract: a probe plans worker jobs per backend and turns their outcomes into a result.

The orchestrator runs whatever probes it is given: it asks each for its jobs,
runs them beside the main builds, and hands each probe the outcomes. A probe's
result carries its own verdict lines, Markdown section and JSON.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from xbackend.execution.executor import Job, JobOutcome, diff_phases
from xbackend.execution.foreign import Interpreter
from xbackend.execution.protocol import Phase, PhaseResult
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec
from xbackend.numerics.metrics import TensorDiff, summarize
from xbackend.results import BackendResult, CompareOptions, ProbeResult
from xbackend.runners.base import Runner

__all__ = ["BackendRuns", "PlannedBackend", "Probe", "ProbeContext", "ProbeResult", "summarize"]


@dataclass(frozen=True)
class PlannedBackend:
    """A backend as the user configured it (cls is None when it cannot run here)."""

    name: str
    cls: type[Runner] | None
    options: Mapping[str, Any]
    raw_options: Mapping[str, str]
    unavailable: str = ""
    interpreter: Interpreter | None = None  # python=PATH: another environment, as probed
    planned_bytes: int = 0  # what its largest build holds beyond its engine (the memory plan)

    def interpreter_info(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.interpreter.info().items())) if self.interpreter else ()

    def variant(self, **overrides: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({**self.raw_options, **overrides}.items()))


@dataclass
class ProbeContext:
    """What a probe may use while planning: the model, options, feeds and a work directory."""

    spec: ModelSpec
    opts: CompareOptions
    feeds: Feeds
    feeds_path: Path
    work: Path
    notes: list[str] = field(default_factory=list)
    run_bytes: int = 0  # the activations of one run (every tensor sized before running)
    budget: int | None = None  # bytes a worker process may use (None: the OS does not say)
    judge_disk: int | None = None  # bytes a float64 judge may write at once (None: no limit)
    judge_alone: bool = False  # judge the reference against float64 when no other backend ran

    def save_feeds(self, feeds: Feeds, name: str) -> Path:
        path = self.work / f"{name}.xbv"
        feeds.save(path)
        return path

    def job(
        self,
        label: str,
        b: PlannedBackend,
        phases: Sequence[Phase] = (),
        feeds: Path | None = None,
        kind: str = "main",
        **overrides: str,
    ) -> Job:
        assert b.cls is not None
        return Job(
            label, b.name, b.cls, b.variant(**overrides), feeds or self.feeds_path, tuple(phases), kind
        )

    def diff_phases(self, a: PhaseResult, b: PhaseResult, outputs: bool) -> list[TensorDiff]:
        """`a` against `b` at the tensors both captured, in model order (graph outputs only, or
        every tensor)."""
        return diff_phases(a, b, self.spec, outputs)

    def compare_builds(
        self, a: JobOutcome, b: JobOutcome, a_layers: PhaseResult | None, b_layers: PhaseResult | None
    ) -> tuple[bool, int | None, float | None, str | None]:
        """summarize() of `a` against `b` at the graph outputs; where both have per-layer
        captures, equality and the first divergence come from every layer."""
        equal, max_ulp, scaled, first = summarize(self.diff_phases(a.outputs, b.outputs, True))
        if a_layers is not None and b_layers is not None:
            first_layer = summarize(self.diff_phases(a_layers, b_layers, False))[3]
            equal, first = equal and first_layer is None, first_layer or first
        return equal, max_ulp, scaled, first


@dataclass(frozen=True)
class BackendRuns:
    """One backend's main builds and the outcomes of the probe's jobs for it."""

    planned: PlannedBackend
    builds: tuple[JobOutcome, ...]
    jobs: Mapping[str, JobOutcome]
    result: BackendResult


class Probe(abc.ABC):
    """One probe; instances live for one comparison."""

    name: ClassVar[str]
    default: ClassVar[bool] = True  # in the default set
    always: ClassVar[bool] = False  # spawns no jobs: runs whatever --probes says
    help: ClassVar[str] = ""

    def __init__(self, ctx: ProbeContext) -> None:
        self.ctx = ctx

    def jobs(self, b: PlannedBackend) -> list[Job]:
        """Worker jobs this probe needs for backend `b` (none by default)."""
        return []

    def followup_jobs(self, r: BackendRuns) -> list[Job]:
        """Jobs that only the first round's outcomes call for (e.g. locating a divergence the
        graph outputs showed); they join `r.jobs` before `analyze`. None by default."""
        return []

    @abc.abstractmethod
    def analyze(self, runs: Sequence[BackendRuns]) -> ProbeResult:
        """Turn the outcomes of this probe's jobs (and the main builds) into its result."""
