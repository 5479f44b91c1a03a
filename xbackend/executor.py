"""Worker jobs: what one worker process does, and running it with progress.

Every backend configuration (a build, or a probe's variant) is one Job, run in
its own process by xbackend.isolation. The plan is known up front, so the
progress bar covers all of it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xbackend.isolation import WorkerOutcome, run_worker
from xbackend.model import ModelSpec
from xbackend.progress import ProgressSink
from xbackend.runners.base import Runner

__all__ = ["Executor", "Job", "JobOutcome"]


@dataclass(frozen=True)
class Job:
    """One worker process: a backend with options, the tensors to capture, the feed sets to run."""

    label: str  # unique, used as the job's directory name
    backend: str
    cls: type[Runner]
    raw_options: tuple[tuple[str, str], ...]
    tensors: tuple[str, ...]
    feeds: Path
    runs: int = 1
    extra_feeds: tuple[Path, ...] = ()
    kind: str = "main"  # "main" | "opt-levels"
    fingerprint: bool = False

    @property
    def steps(self) -> int:
        return 1 + (self.runs + len(self.extra_feeds) if self.kind == "main" else 1)

    def env(self) -> dict[str, str]:
        return self.cls.process_env(self.cls.resolve_options(dict(self.raw_options)))


@dataclass(frozen=True)
class JobOutcome:
    """A finished job: the worker's outcome and where its captures are."""

    job: Job
    outcome: WorkerOutcome
    capture: Path
    extra_captures: tuple[Path, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.outcome.status == "ok"

    @property
    def result(self) -> dict[str, Any]:
        return dict(self.outcome.result)

    @property
    def names(self) -> list[str]:
        return list(self.outcome.result.get("capture_names", []))

    def extra_names(self, i: int) -> list[str]:
        return list(self.outcome.result.get("extra_capture_names", [])[i])


class Executor:
    """Runs jobs in worker processes under one work directory, advancing one progress bar."""

    def __init__(self, spec: ModelSpec, work: Path, timeout: float, bar: ProgressSink) -> None:
        self.spec = spec
        self.work = work
        self.timeout = timeout
        self.bar = bar

    def _payload(self, job: Job, job_dir: Path) -> dict[str, Any]:
        return {
            "backend": job.backend,
            "options": dict(job.raw_options),
            "model": asdict(self.spec.ref()),
            "tensors": list(job.tensors),
            "outputs": list(self.spec.output_names),
            "op_types": self.spec.op_types(),
            "runs": job.runs,
            "feeds": str(job.feeds),
            "capture": str(job_dir / "capture.npz"),
            "result": str(job_dir / "result.json"),
            "extra_feeds": [[str(f), str(job_dir / f"extra{i}.npz")] for i, f in enumerate(job.extra_feeds)],
            "kind": job.kind,
            "fingerprint": job.fingerprint,
        }

    def run(self, job: Job) -> JobOutcome:
        job_dir = self.work / job.label
        job_dir.mkdir(parents=True)
        self.bar.describe(job.label)
        seen = 0

        def tick() -> None:
            nonlocal seen
            seen += 1
            self.bar.advance()

        outcome = run_worker(self._payload(job, job_dir), job_dir, self.timeout, job.env(), tick)
        self.bar.advance(max(0, job.steps - seen))
        extras = tuple(job_dir / f"extra{i}.npz" for i in range(len(job.extra_feeds)))
        return JobOutcome(job, outcome, job_dir / "capture.npz", extras)

    def skip(self, job: Job) -> None:
        """A planned job that will not run (its backend failed): keep the bar honest."""
        self.bar.advance(job.steps)
