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
    def outputs(self) -> PhaseResult: ...

    @property
    def layers(self) -> PhaseResult | None: ...

    @property
    def separate_layers(self) -> bool: ...


@dataclass(frozen=True)
class Builds:
    """A backend's main jobs, one per build; or a capture loaded in their place."""

    planned: PlannedBackend
    outcomes: tuple[JobOutcome, ...]
    loaded: LoadedCapture | None = None

    @property
    def ok(self) -> bool:
        return self.loaded is not None or (
            bool(self.outcomes) and all(outcome.ok for outcome in self.outcomes)
        )

    @property
    def first(self) -> FirstRun:
        return self.loaded.run if self.loaded is not None else self.outcomes[0]


def run_builds(ex: Executor, planned_backend: PlannedBackend, jobs: Sequence[Job]) -> Builds:
    outcomes: list[JobOutcome] = []
    for job in jobs:
        if outcomes and not outcomes[-1].ok:
            ex.skip(job)  # a backend that fails to build once is failed; don't spend K timeouts on it
            continue
        outcomes.append(ex.run(job))
    return Builds(planned_backend, tuple(outcomes))
