"""The probe contract: a probe plans worker jobs per backend and turns their outcomes into a result.

The orchestrator runs whatever probes it is given: it asks each for its jobs,
runs them beside the main builds, and hands each probe the outcomes. A probe's
result carries its own verdict lines, Markdown section and JSON.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from xbackend.execution.executor import Job, JobOutcome
from xbackend.numerics.metrics import summarize
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.results import BackendResult, ProbeResult

__all__ = ["BackendRuns", "PlannedBackend", "Probe", "ProbeResult", "RunContext", "summarize"]


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

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def jobs(self, planned_backend: PlannedBackend) -> list[Job]:
        """Worker jobs this probe needs for backend `planned_backend` (none by default)."""
        return []

    def followup_jobs(self, backend_runs: BackendRuns) -> list[Job]:
        """Jobs that only the first round's outcomes call for (e.g. locating a divergence the
        graph outputs showed); they join `r.jobs` before `analyze`. None by default."""
        return []

    @abc.abstractmethod
    def analyze(self, runs: Sequence[BackendRuns]) -> ProbeResult:
        """Turn the outcomes of this probe's jobs (and the main builds) into its result."""
