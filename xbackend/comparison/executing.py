"""The execute and judge stages of one comparison: every backend's builds, every probe's jobs and
the follow-ups they ask for, under one progress bar, and the explanation (the float64 judge) in a
thread of its own, started once, where it runs beside the rest.

`Execution` is a context: entering it runs the builds and the probes; inside it the caller
compares the captures on this core while the judge's workers run; `judge()` waits for the
explanation. Leaving it on an error or an interrupt tells the judge to start nothing more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from types import TracebackType

from xbackend.comparison.cross import effective_reference
from xbackend.comparison.probing import analyze_probe, run_followups, run_probe_jobs
from xbackend.comparison.summary import summarize_backend
from xbackend.execution.executor import Executor, Job, JobOutcome
from xbackend.execution.progress import ProgressSink
from xbackend.judge.explain_jobs import explain
from xbackend.judge.room import explanation_room
from xbackend.planning.builds import Builds, run_builds
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.planning.memory import Fit, side_by_side
from xbackend.planning.plan import executor_for, main_jobs
from xbackend.probes.base import Probe
from xbackend.results import EXPECTED, BackendResult, FailedProbe, ProbeResult
from xbackend.results.capture_record import LoadedCapture
from xbackend.results.explanation import Explanation

__all__ = ["Execution", "ProbesRun", "probe_results"]


@dataclass(frozen=True)
class ProbesRun:
    """What the worker processes produced: each backend's builds and result (loaded captures
    included), the reference, and the probes' outcomes."""

    planned: tuple[PlannedBackend, ...]
    builds: Mapping[str, Builds]
    backends: tuple[BackendResult, ...]
    reference: str
    probe_outcomes: Mapping[tuple[str, str], Mapping[str, JobOutcome]]
    broken_probes: Mapping[str, str]  # probe -> why it failed to plan its follow-ups


class _Judge:
    """The explanation in its own thread, submitted once, at the first `start()`."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        run: ProbesRun,
        ex: Executor,
        ctx: RunContext,
        shared: ProgressSink,
        memory: Fit,
    ) -> None:
        self._pool = pool
        named = {backend.name: backend for backend in run.backends}
        self._args = (ex, ctx, run.planned, run.builds, named, run.reference, shared, memory)
        self._future: Future[Explanation] | None = None

    @property
    def started(self) -> bool:
        """The explanation has been submitted."""
        return self._future is not None

    def start(self) -> None:
        """Submit the explanation, the first time only."""
        if self._future is None:
            self._future = self._pool.submit(explain, *self._args)

    def result(self) -> Explanation:
        """The explanation, waited for (submitted now if it was not yet)."""
        self.start()
        assert self._future is not None
        return self._future.result()


class Execution:
    """The execute stage on entry, the judge stage at `judge()` (see the module's docstring).

    `windows`: each backend's per-layer tensors cut to fit the memory plan; `spill`: per-layer
    tensors cross the process boundary; `plain` False: the engines' outputs come from the build
    that exposes every tensor; `memory`: whether the explanation's builds fit the budget."""

    def __init__(
        self,
        ctx: RunContext,
        planned: Sequence[PlannedBackend],
        probes: Sequence[Probe],
        captures: Sequence[LoadedCapture],
        bar: ProgressSink,
        windows: Mapping[str, tuple[tuple[str, ...], ...]],
        *,
        spill: bool,
        plain: bool,
        memory: Fit,
    ) -> None:
        self._ctx, self._planned, self._probes, self._captures = ctx, tuple(planned), tuple(probes), captures
        self._bar, self._windows, self._spill, self._plain, self._memory = bar, windows, spill, plain, memory
        self._stack = contextlib.ExitStack()
        self._ex: Executor | None = None
        self._judge: _Judge | None = None
        self.run: ProbesRun | None = None
        # the probes' results where they were analyzed before the explanation ran (None: after)
        self.probes: tuple[ProbeResult, ...] | None = None

    def __enter__(self) -> Execution:
        try:
            self._execute()
        except BaseException:  # interrupted or failed: the explanation starts nothing more
            if self._ex is not None:
                self._ex.cancelled.set()
            self._stack.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if error is not None and self._ex is not None:
            self._ex.cancelled.set()
        self._stack.__exit__(kind, error, trace)

    def judge(self) -> Explanation:
        """The judge stage: the explanation, waited for (started now if it was not yet)."""
        assert self._judge is not None, "judge() inside the Execution context"
        return self._judge.result()

    def _execute(self) -> None:
        ctx, planned, spec, opts = self._ctx, self._planned, self._ctx.spec, self._ctx.opts
        ex = self._ex = executor_for(spec, ctx.work, opts.timeout, self._bar, planned)
        mains = {
            p.name: main_jobs(
                p, spec, opts, ctx.feeds_path, self._windows.get(p.name, ()), self._spill, self._plain
            )
            for p in planned
        }
        probe_jobs = {
            (probe.name, planned_backend.name): probe.jobs(planned_backend)
            for probe in self._probes
            for planned_backend in planned
            if planned_backend.cls is not None
        }
        self._bar.start(_steps([*mains.values(), *probe_jobs.values()]))
        self._stack.callback(self._bar.stop)
        builds = {p.name: run_builds(ex, p, mains[p.name]) for p in planned}
        backends = tuple(summarize_backend(builds[p.name], spec, opts) for p in planned)
        results = {
            backend.name: backend for backend in backends
        }  # the probes read the backends that ran here
        everything = dict(builds)
        for cap in self._captures:
            everything[cap.name] = Builds(PlannedBackend(cap.name, None, {}, {}), (), cap)
            backends += (replace(cap.backend, loaded_from=str(cap.path)),)
        ref = effective_reference(opts, backends)
        shared = self._stack.enter_context(ex.shared())
        pool = self._stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="xbackend-explain"))
        built = ProbesRun(planned, everything, backends, ref, {}, {})
        judge = self._judge = _Judge(pool, built, ex, ctx, shared, self._memory)
        # The explanation needs only the builds: it runs beside the probes where memory holds
        # both (their workers leave cores idle while they start and write), else after them.
        if probe_jobs and opts.noise_samples != 0 and side_by_side(ctx, 2, processes=3):
            judge.start()
        outcomes = run_probe_jobs(ex, planned, probe_jobs, builds)
        broken = run_followups(ex, self._probes, planned, builds, outcomes, results, shared)
        self.run = replace(built, probe_outcomes=outcomes, broken_probes=broken)
        if not judge.started and probe_jobs:  # analyzed now, their captures deleted: room on disk
            # (their captures still on disk, it plans its files in what is left)
            others = [value for key, value in everything.items() if key not in (ref, EXPECTED) and value.ok]
            if explanation_room(ctx, others).fit.fits:
                judge.start()  # room beside them: it starts meanwhile
            self.probes = probe_results(self._probes, self.run)
            for by_job in outcomes.values():
                for outcome in by_job.values():
                    outcome.drop_captures()
        judge.start()  # the comparisons read the builds' captures on this core while it runs


def _steps(jobs: Sequence[Sequence[Job]]) -> int:
    return sum(job.steps for batch in jobs for job in batch)


def probe_results(probes: Sequence[Probe], run: ProbesRun) -> tuple[ProbeResult, ...]:
    """Each probe's result from its jobs' outcomes (or why it could not plan its follow-ups)."""
    results = {backend.name: backend for backend in run.backends}
    return tuple(
        FailedProbe(probe.name, run.broken_probes[probe.name])
        if probe.name in run.broken_probes
        else analyze_probe(probe, run.planned, run.builds, run.probe_outcomes, results)
        for probe in probes
    )
