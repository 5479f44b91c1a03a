"""A backend's main builds as compare reads them: live worker outcomes or a loaded capture."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from xbackend.execution.executor import Executor, Job, JobOutcome
from xbackend.execution.protocol import PhaseResult
from xbackend.planning.context import PlannedBackend
from xbackend.results.capture_record import LoadedCapture

__all__ = ["Builds", "FirstRun", "run_builds"]


class FirstRun(Protocol):
    """What comparisons read of a backend: build 0's phases (a live job, or a loaded capture)."""

    @property
    def outputs(self) -> PhaseResult:
        """The phase whose outputs stand for the shipped model."""
        ...

    @property
    def layers(self) -> PhaseResult | None:
        """The per-layer phase, where one ran."""
        ...

    @property
    def separate_layers(self) -> bool:
        """Whether the layers came from a build of their own (not the outputs' build)."""
        ...


@dataclass(frozen=True)
class Builds:
    """A backend's main jobs, one per build; or a capture loaded in their place."""

    planned: PlannedBackend
    outcomes: tuple[JobOutcome, ...]
    loaded: LoadedCapture | None = None

    @property
    def ok(self) -> bool:
        """Whether the backend ran: every build succeeded, or its capture was loaded."""
        return self.loaded is not None or (
            bool(self.outcomes) and all(outcome.ok for outcome in self.outcomes)
        )

    @property
    def first(self) -> FirstRun:
        """The first build's run (or the loaded capture's), whose figures the comparison reports."""
        return self.loaded.run if self.loaded is not None else self.outcomes[0]


def run_builds(ex: Executor, planned_backend: PlannedBackend, jobs: Sequence[Job]) -> Builds:
    """Run a backend's build jobs in order; after a failed build the rest are skipped, not run."""
    outcomes: list[JobOutcome] = []
    for job in jobs:
        if outcomes and not outcomes[-1].ok:
            ex.skip(job)  # a backend that fails to build once is failed; don't spend K timeouts on it
            continue
        outcomes.append(ex.run(job))
    return Builds(planned_backend, tuple(outcomes))
