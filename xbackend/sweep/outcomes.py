"""What a sweep produced: how each job ended, each model's comparison, and the fleet as a whole.

Plain data the sweep's driver fills and its report reads; the progress and executor contracts.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from xbackend.errors import EXIT_ALL_FAILED, EXIT_DIFFERENCES, EXIT_OK
from xbackend.results import Result
from xbackend.results.backend import BackendStatus
from xbackend.results.findings import Finding, Label, labelled
from xbackend.results.promises import EXIT_PROMISE
from xbackend.sweep.spec import JobSpec, ModelEntry, SweepSpec, safe_name

__all__ = [
    "JOBS",
    "MODELS",
    "FleetJob",
    "FleetProgress",
    "FleetResult",
    "ModelOutcome",
    "NullFleetProgress",
    "SweepExecutor",
    "environment_sha256",
    "node_label",
    "relpath",
]

JOBS = "jobs"
MODELS = "models"


def environment_sha256(env: Mapping[str, str]) -> str:
    """A digest of an environment (its sorted key=value lines): two jobs ran in the same one."""
    return hashlib.sha256(
        "".join(f"{key}={value}\n" for key, value in sorted(env.items())).encode()
    ).hexdigest()


class FleetProgress(Protocol):
    """What a sweep tells its progress display: the jobs to run, each one started and finished."""

    def start(self, total: int, resumed: int) -> None:
        """The sweep has `total` jobs, `resumed` of them done by an earlier run of it."""
        ...

    def started(self, job: str, node: str) -> None:
        """`job` started on `node` (a host, or `local`)."""
        ...

    def finished(self, job: str, node: str, status: str) -> None:
        """`job` ended on `node` with `status` (`ok`, or how it failed)."""
        ...

    def describe(self, text: str) -> None:
        """`text` is what the sweep is doing now (placing jobs, writing the fleet report)."""
        ...

    def stop(self) -> None:
        """The sweep is over: the bar is taken down."""
        ...


class NullFleetProgress(FleetProgress):
    """A sweep's progress shown nowhere."""

    def start(self, total: int, resumed: int) -> None:
        pass

    def started(self, job: str, node: str) -> None:
        pass

    def finished(self, job: str, node: str, status: str) -> None:
        pass

    def describe(self, text: str) -> None:
        pass

    def stop(self) -> None:
        pass


@dataclass(frozen=True)
class FleetJob:
    """How one job ended, wherever it ran."""

    job: JobSpec
    status: BackendStatus
    reason: str = ""
    node: Mapping[str, Any] = field(default_factory=dict)
    attempts: int = 1
    record: Mapping[str, Any] | None = None  # the job's job.json, when it wrote one
    resumed: bool = False  # an earlier sweep's valid capture, not run again

    @property
    def ok(self) -> bool:
        """The job ran its backend."""
        return self.status == "ok"

    @property
    def node_name(self) -> str:
        """The node it ran on, as the report names it (host, and address where it has one)."""
        return node_label(self.node)

    @property
    def warnings(self) -> list[Finding]:
        """The job's own WARN and FAIL findings (its probes: threads, batch, ...)."""
        if not self.record:
            return []
        found = [Finding.from_json(f) for f in self.record.get("findings", [])]
        return labelled(found, Label.WARN, Label.FAIL)


def node_label(node: Mapping[str, Any]) -> str:
    """A node's host name, with its address where the record holds one."""
    host = str(node.get("hostname", "?"))
    addr = node.get("address")
    return f"{host} ({addr})" if addr else host


class SweepExecutor(Protocol):
    """Where a sweep's jobs run (a process per job here, a Ray task per job on a cluster)."""

    name: str

    def run(
        self, jobs: Sequence[JobSpec], jobs_dir: Path, progress: FleetProgress, timeout: float, retries: int
    ) -> list[FleetJob]:
        """Run `jobs` (each in its folder under `jobs_dir`, within `timeout` seconds, run again up to
        `retries` times where its process, Ray worker or node died), telling `progress`; how each
        ended."""
        ...


@dataclass(frozen=True)
class ModelOutcome:
    entry: ModelEntry
    sha256: str = ""
    error: str = ""  # the model could not be loaded: none of its jobs ran
    result: Result | None = None  # the comparison of its captures
    reference: str = ""
    note: str = ""

    @property
    def report(self) -> str:
        """The model's report, relative to the sweep's output folder."""
        return f"{MODELS}/{safe_name(self.entry.name)}.md"

    @cached_property
    def findings(self) -> tuple[Finding, ...]:
        """The comparison's findings (computed once: the fleet report reads them per job)."""
        return tuple(self.result.findings()) if self.result is not None else ()

    @property
    def verdict(self) -> tuple[str, ...]:
        """The comparison's verdict lines."""
        return tuple(finding.line for finding in self.findings)


@dataclass(frozen=True)
class FleetResult:
    spec: SweepSpec
    executor: str
    jobs: tuple[FleetJob, ...]
    models: tuple[ModelOutcome, ...]

    def job(self, model: str, backend: str) -> FleetJob:
        """The job of `model` on `backend`."""
        for job in self.jobs:
            if job.job.model == model and job.job.backend == backend:
                return job
        raise KeyError((model, backend))

    def model(self, name: str) -> ModelOutcome:
        """The outcome of the model named `name` in the sweep file."""
        for model in self.models:
            if model.entry.name == name:
                return model
        raise KeyError(name)

    @property
    def failed(self) -> list[FleetJob]:
        """The jobs that failed or could not run."""
        return [job for job in self.jobs if not job.ok]

    @property
    def exit_code(self) -> int:
        """0 every job ran and every comparison passed; 16 a promise broke; 1 any other finding or
        a failed job; 3 no job ran at all."""
        if not any(job.ok for job in self.jobs):
            return EXIT_ALL_FAILED
        codes = {model.result.exit_code for model in self.models if model.result is not None}
        if EXIT_PROMISE in codes:
            return EXIT_PROMISE
        if self.failed or any(model.error for model in self.models) or codes - {EXIT_OK}:
            return EXIT_DIFFERENCES
        return EXIT_OK


def relpath(path: str | os.PathLike[str], start: Path) -> str:
    """`path` relative to `start` where it can be (another drive: as given)."""
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive
        return str(path)
