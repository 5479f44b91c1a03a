"""Probes' jobs: the first round beside the main builds, follow-ups, and each probe's analysis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from xbackend.execution.executor import Executor, Job, JobOutcome
from xbackend.execution.progress import ProgressSink
from xbackend.planning.builds import Builds
from xbackend.planning.context import PlannedBackend
from xbackend.probes.base import BackendRuns, Probe
from xbackend.results import EXPECTED, BackendResult, FailedProbe, ProbeResult

__all__ = ["analyze_probe", "backend_runs", "run_followups", "run_probe_jobs"]


def run_probe_jobs(
    ex: Executor,
    planned: Sequence[PlannedBackend],
    probe_jobs: Mapping[tuple[str, str], Sequence[Job]],
    builds: Mapping[str, Builds],
) -> dict[tuple[str, str], dict[str, JobOutcome]]:
    """Every probe's jobs for a backend in one go (variants that can share a process do)."""
    out: dict[tuple[str, str], dict[str, JobOutcome]] = {job: {} for job in probe_jobs}
    for planned_backend in planned:
        keys = [job for job in probe_jobs if job[1] == planned_backend.name]
        done = ex.run_all([j for key in keys for j in probe_jobs[key]], builds[planned_backend.name].ok)
        for k in keys:
            out[k] = {j.label: done[j.label] for j in probe_jobs[k] if j.label in done}
    return out


def backend_runs(
    probe: Probe,
    planned: Sequence[PlannedBackend],
    builds: Mapping[str, Builds],
    outcomes: Mapping[tuple[str, str], Mapping[str, JobOutcome]],
    results: Mapping[str, BackendResult],
) -> list[BackendRuns]:
    """What `probe` planned for each backend, with the outcomes of its jobs and the backend's result."""
    return [
        BackendRuns(
            planned_backend,
            builds[planned_backend.name].outcomes,
            outcomes.get((probe.name, planned_backend.name), {}),
            results[planned_backend.name],
        )
        for planned_backend in planned
        if results[planned_backend.name].ok and planned_backend.name != EXPECTED
    ]


def run_followups(
    ex: Executor,
    probes: Sequence[Probe],
    planned: Sequence[PlannedBackend],
    builds: Mapping[str, Builds],
    outcomes: dict[tuple[str, str], dict[str, JobOutcome]],
    results: Mapping[str, BackendResult],
    bar: ProgressSink,
) -> dict[str, str]:
    """The second round: jobs a probe asks for after reading the first round's outcomes, all of
    a backend's together; they join that probe's outcomes. Returns the probes that failed to
    plan it, with the reason."""
    wanted: dict[tuple[str, str], list[Job]] = {}
    broken: dict[str, str] = {}
    for pr in probes:
        for run in backend_runs(pr, planned, builds, outcomes, results):
            try:
                wanted[(pr.name, run.planned.name)] = pr.followup_jobs(run)
            except Exception as error:  # a broken probe is a warning, never a silent pass
                broken.setdefault(pr.name, f"{type(error).__name__}: {error}")
    bar.grow(sum(j.steps for js in wanted.values() for j in js))
    for key, done in run_probe_jobs(ex, planned, wanted, builds).items():
        outcomes.setdefault(key, {}).update(done)
    return broken


def analyze_probe(
    probe: Probe,
    planned: Sequence[PlannedBackend],
    builds: Mapping[str, Builds],
    outcomes: Mapping[tuple[str, str], Mapping[str, JobOutcome]],
    results: Mapping[str, BackendResult],
) -> ProbeResult:
    """The probe's result from its jobs' outcomes; a FailedProbe (with the reason) where its analysis
    raises."""
    try:
        return probe.analyze(backend_runs(probe, planned, builds, outcomes, results))
    except Exception as error:  # a broken probe is a warning, never a silent pass or a crash
        return FailedProbe(probe.name, f"{type(error).__name__}: {error}")
