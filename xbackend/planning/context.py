"""A backend as planned, and the context every planner of worker jobs reads: the model, the options,
the feeds, the run folder and the memory the run may use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xbackend.execution.executor import Job, JobOutcome, diff_phases
from xbackend.execution.foreign import Interpreter
from xbackend.execution.protocol import Phase, PhaseResult
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec
from xbackend.numerics.metrics import TensorDiff, summarize
from xbackend.results import CompareOptions
from xbackend.runners.base import Runner


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
        """What the other interpreter said of itself (python=PATH), sorted; () for this one."""
        return tuple(sorted(self.interpreter.info().items())) if self.interpreter else ()

    def variant(self, **overrides: str) -> tuple[tuple[str, str], ...]:
        """Its runner options as given, with `overrides`, sorted: what a job passes its worker."""
        return tuple(sorted({**self.raw_options, **overrides}.items()))


@dataclass
class RunContext:
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
        """`feeds` written to NAME.xbv in the run folder; its path."""
        path = self.work / f"{name}.xbv"
        feeds.save(path)
        return path

    def job(
        self,
        label: str,
        planned_backend: PlannedBackend,
        phases: Sequence[Phase] = (),
        feeds: Path | None = None,
        kind: str = "main",
        **overrides: str,
    ) -> Job:
        """A worker job for backend `planned_backend` (runnable here): `phases` on `feeds` (the run's, by
        default), its options with `overrides`."""
        assert planned_backend.cls is not None
        return Job(
            label,
            planned_backend.name,
            planned_backend.cls,
            planned_backend.variant(**overrides),
            feeds or self.feeds_path,
            tuple(phases),
            kind,
        )

    def diff_phases(self, phase_result: PhaseResult, b: PhaseResult, outputs: bool) -> list[TensorDiff]:
        """`phase_result` against `b` at the tensors both captured, in model order (graph outputs only, or
        every tensor)."""
        return diff_phases(phase_result, b, self.spec, outputs)

    def compare_builds(
        self,
        job_outcome: JobOutcome,
        b: JobOutcome,
        a_layers: PhaseResult | None,
        b_layers: PhaseResult | None,
    ) -> tuple[bool, int | None, float | None, str | None]:
        """summarize() of `job_outcome` against `b` at the graph outputs; where both have per-layer
        captures, equality and the first divergence come from every layer."""
        equal, max_ulp, scaled, first = summarize(self.diff_phases(job_outcome.outputs, b.outputs, True))
        if a_layers is not None and b_layers is not None:
            first_layer = summarize(self.diff_phases(a_layers, b_layers, False))[3]
            equal, first = equal and first_layer is None, first_layer or first
        return equal, max_ulp, scaled, first
