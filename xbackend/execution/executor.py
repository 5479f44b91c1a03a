"""Worker jobs: what one worker process does, and running it with progress.

Every backend configuration (a build, or a probe's variant) is one Job, run in
its own process by xbackend.execution.isolation. The plan is known up front, so the
progress bar covers all of it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from xbackend.execution.decoding import DecodeTask
from xbackend.execution.foreign import stage_model
from xbackend.execution.isolation import WorkerOutcome, disk_full, run_batch
from xbackend.execution.progress import ProgressSink
from xbackend.execution.protocol import LAYERS, OUTPUTS, Phase, PhaseResult, WorkerJob, WorkerResult
from xbackend.files.run_values import CaptureFile, common_names, diff_captures
from xbackend.model.load import ModelSpec
from xbackend.numerics.metrics import TensorDiff
from xbackend.runners.base import PYTHON_OPTION, Runner
from xbackend.runners.registry import runner_target

__all__ = ["Executor", "Job", "JobOutcome", "diff_phases", "separate_layers", "standard_phases"]


def standard_phases(
    cls: type[Runner],
    spec: ModelSpec,
    runs: int,
    layers: bool = True,
    options: Mapping[str, str] | None = None,
    timed_runs: int = 0,
    windows: tuple[tuple[str, ...], ...] = (),
    spill: bool = True,
    plain_build: bool = True,
) -> tuple[Phase, ...]:
    """The plain model for graph outputs and, unless outputs only, the instrumented model for
    per-layer tables; one build serves both where exposing intermediates changes nothing, or
    where the plain build is not asked for (`plain_build` False: the quick table's original).
    `timed_runs` more runs go to the phase that serves the outputs: timed and compared alike."""
    outputs = spec.output_order()
    plain = runs + timed_runs
    if spec.outputs_only or not layers:
        return (Phase.planned(OUTPUTS, outputs, plain),)
    if not plain_build or not separate_layers(cls, spec, options or {}):
        return (
            Phase.planned(
                LAYERS, spec.tensor_order(), plain, serves_outputs=True, windows=windows, spill=spill
            ),
        )
    return (
        Phase.planned(OUTPUTS, outputs, plain),
        Phase.planned(LAYERS, spec.tensor_order(), runs, windows=windows, spill=spill),
    )


def separate_layers(cls: type[Runner], spec: ModelSpec, options: Mapping[str, str]) -> bool:
    """Whether this backend's per-layer capture of this model is a build of its own."""
    resolved = cls.resolve_options(options)
    return cls.instruments(dict(spec.metadata), Path(spec.path).resolve().parent, resolved)


@dataclass(frozen=True)
class Job:
    """One worker process: a backend with options, its phases, the feeds to run."""

    label: str  # unique, used as the job's directory name
    backend: str
    cls: type[Runner]
    raw_options: tuple[tuple[str, str], ...]
    feeds: Path
    phases: tuple[Phase, ...] = ()
    kind: str = "main"  # "main" | "opt-levels" | "decode"
    fingerprint: bool = False
    decode: DecodeTask | None = None  # kind "decode": what the worker decodes

    @functools.cached_property
    def options(self) -> dict[str, Any]:
        """The runner's options, resolved once for the job (its interpreter, its environment)."""
        return self.cls.resolve_options(dict(self.raw_options))

    @property
    def python(self) -> str:
        """The interpreter the worker runs under ('' for this one): the runner option python."""
        return str(self.options[PYTHON_OPTION.name])

    @property
    def steps(self) -> int:
        """How many steps of the progress bar this job takes: its build, then each run of each phase."""
        if self.kind != "main":  # opt-levels, decode: the build, then the work (its steps as the detail)
            return 2
        return 1 + sum(
            phase.runs * max(1, len(phase.windows)) + len(phase.extra_feeds) for phase in self.phases
        )

    def env(self) -> dict[str, str]:
        """The environment variables the worker process runs with (the runner's own, from its options)."""
        return self.cls.process_env(self.options)


def _with_hint(job: Job, outcome: WorkerOutcome) -> WorkerOutcome:
    """A crashed worker's reason, with what its runner knows to try (Runner.crash_hint)."""
    hint = job.cls.crash_hint(job.backend, job.options) if outcome.signal else ""
    return replace(outcome, reason=f"{outcome.reason}; {hint}") if hint else outcome


@dataclass(frozen=True)
class JobOutcome:
    """A finished job: the worker's outcome, its phases' captures and results."""

    job: Job
    outcome: WorkerOutcome

    @property
    def ok(self) -> bool:
        """Whether the worker finished the job."""
        return self.outcome.status == "ok"

    @property
    def result(self) -> WorkerResult:
        """What the worker returned: its phases, timings and engine info."""
        return self.outcome.result

    @property
    def reason(self) -> str:
        """Why the job failed, in one line ('' when it did not)."""
        return self.outcome.reason

    def drop_captures(self) -> None:
        """Delete the captures this job wrote, once nothing reads them (a run of activations each)."""
        for ph in self.result.phases:
            for path in (ph.capture, *(c for c, _ in ph.extra_captures)):
                Path(path).unlink(missing_ok=True)

    def phase(self, name: str) -> PhaseResult | None:
        """The phase called `name`, or None where the job ran none of that name."""
        return self.result.phase(name)

    @property
    def outputs(self) -> PhaseResult:
        """The phase whose graph outputs stand for the plain model users ship."""
        p = self.phase(OUTPUTS)
        if p is not None:
            return p
        p = self.phase(LAYERS)
        if p is None or not p.serves_outputs:
            raise LookupError(f"{self.job.label}: no phase holds the plain model's outputs")
        return p

    @property
    def layers(self) -> PhaseResult | None:
        """The instrumented phase (every intermediate exposed), if it ran."""
        return self.phase(LAYERS)

    @property
    def separate_layers(self) -> bool:
        """True when the per-layer capture comes from a different build than the outputs."""
        layers = self.layers
        return layers is not None and not layers.serves_outputs


class Executor:
    """Runs jobs in worker processes under one work directory, advancing one progress bar."""

    def __init__(
        self,
        spec: ModelSpec,
        work: Path,
        timeout: float,
        bar: ProgressSink,
        max_ir: Mapping[str, int | None] | None = None,
    ) -> None:
        self.spec = spec
        self.work = work
        self.timeout = timeout
        self.bar = bar
        # interpreter -> the highest IR its engine reads, for models staged for foreign workers
        self.max_ir = dict(max_ir or {})
        self.cancelled = threading.Event()  # set: queues start nothing more (the caller is stopping)

    def _worker_job(self, job: Job, job_dir: Path) -> WorkerJob:
        model = self.spec.ref()
        phases = tuple(phase.placed(job_dir) for phase in job.phases)
        if job.python or job.cls.stages_model:  # the worker needs no onnx: models are prepared here
            max_ir = self.max_ir.get(job.python) if job.python else job.cls.max_ir_version()
            staged = self.work / "staged-models"
            own = job.cls.stages_model  # a plugin may read the model with onnx.load
            phases = tuple(
                replace(phase, model=stage_model(phase.model or model, phase.tensors, max_ir, staged, own))
                for phase in phases
            )
            model = stage_model(model, (), max_ir, staged, own)
        return WorkerJob(
            backend=job.backend,
            options=dict(job.raw_options),
            model=model,
            outputs=self.spec.output_names,
            op_types=self.spec.op_types(),
            feeds=str(job.feeds),
            result=str(job_dir / "result.json"),
            phases=phases,
            kind=job.kind,
            fingerprint=job.fingerprint,
            target=runner_target(job.backend),
            decode=replace(job.decode, logits=str(job_dir / "logits.xbv")) if job.decode else None,
        )

    def run(self, job: Job) -> JobOutcome:
        """Run one job in its own worker process and wait for it; a failure is an outcome, never raised."""
        return self.run_together([job])[0]

    def run_together(self, jobs: Sequence[Job]) -> list[JobOutcome]:
        """Jobs one after another in one worker process (see Runner.shares_process)."""
        label = ", ".join(job.label for job in jobs)
        self.bar.describe(label)
        seen = 0

        def tick() -> None:
            nonlocal seen
            seen += 1
            self.bar.advance()

        try:
            dirs = []
            for job in jobs:
                job_dir = self.work / job.label
                job_dir.mkdir(parents=True)
                dirs.append(job_dir)
            batch = [(self._worker_job(job, d), d) for job, d in zip(jobs, dirs, strict=True)]
            outcomes = run_batch(
                batch,
                self.timeout,
                jobs[0].env(),
                tick,
                jobs[0].python,
                lambda text: self.bar.detail(f"{label}: {text}"),
            )
        except OSError as error:  # its files could not be written: these jobs fail, the comparison goes on
            why = _not_started(error, jobs[0].python or sys.executable) or disk_full(self.work)
            why = why or f"its files could not be written: {error.strerror or error} ({error.filename})"
            failed = WorkerOutcome("failed", f"load: {why}", WorkerResult("failed", reason=why), 0.0)
            outcomes = [failed] * len(jobs)
        self.bar.advance(max(0, sum(job.steps for job in jobs) - seen))
        self.bar.done(label)
        pairs = zip(jobs, outcomes, strict=True)
        return [JobOutcome(job, _with_hint(job, outcome)) for job, outcome in pairs]

    def skip(self, job: Job) -> None:
        """A planned job that will not run (its backend failed): keep the bar honest."""
        self.bar.advance(job.steps)

    def run_all(self, jobs: Sequence[Job], go: bool) -> dict[str, JobOutcome]:
        """Run `jobs`; consecutive variants of a backend that shares a process run in one."""
        if not go:
            for job in jobs:
                self.skip(job)
            return {}
        groups: list[list[Job]] = []
        for job in jobs:
            if groups and _same_process(groups[-1][0], job):
                groups[-1].append(job)
            else:
                groups.append([job])
        return {o.job.label: o for group in groups for o in self.run_together(group)}

    def run_queue(
        self,
        queue: Sequence[Sequence[Job]],
        lanes: int,
        then: Callable[[JobOutcome], Sequence[Sequence[Job]]] = lambda _: (),
        started: Sequence[Future[JobOutcome]] = (),
    ) -> dict[str, JobOutcome]:
        """Run each batch of `queue` in a worker process of its own (a batch's jobs share it), up
        to `lanes` processes at a time, in queue order; `then(outcome)` may return batches that
        outcome made possible, which go to the front of the queue. `started`: jobs already
        running (a lane each, counted in `lanes`), whose outcomes go through `then` as they end.
        The caller answers for batches running side by side being independent and fitting in
        memory together."""
        pending: deque[list[Job]] = deque(list(jobs) for jobs in queue if jobs)
        done: dict[str, JobOutcome] = {}
        lock = threading.Condition()
        running = len(started)

        def settle(run: Callable[[], list[JobOutcome]]) -> None:
            """One batch's outcomes (`run`) through `then`, recorded with their follow-ups."""
            nonlocal running
            outcomes: list[JobOutcome] = []
            follow: list[list[Job]] = []
            try:
                outcomes = run()
                follow = [list(b) for outcome in outcomes for b in then(outcome) if b]
            finally:  # in one step: a lane must not see the queue empty before these are in
                with lock:
                    running -= 1
                    done.update((outcome.job.label, outcome) for outcome in outcomes)
                    for b in reversed(follow):
                        self.bar.grow(sum(j.steps for j in b))
                        pending.appendleft(b)
                    lock.notify_all()

        def adopt(f: Future[JobOutcome], stay: bool) -> None:
            """A started job's lane: its outcome through `then`, then (`stay`) a lane like the
            others."""
            settle(lambda: [f.result()])
            if stay:
                lane()

        def lane() -> None:
            nonlocal running
            while True:
                with lock:
                    while not pending and running:
                        lock.wait()
                    if not pending or self.cancelled.is_set():
                        lock.notify_all()
                        return
                    batch = pending.popleft()
                    running += 1
                settle(lambda: self.run_together(batch))  # noqa: B023  # called before the loop moves on

        if lanes <= 1 and not started:
            lane()
            return done
        width = max(lanes, len(started), 1)
        with self.shared(), ThreadPoolExecutor(width, thread_name_prefix="xbackend-lane") as pool:
            futures = [pool.submit(adopt, f, index < lanes) for index, f in enumerate(started)]
            futures += [pool.submit(lane) for _ in range(width - len(started))]
            for f in futures:
                f.result()
        return done

    @contextlib.contextmanager
    def shared(self) -> Iterator[ProgressSink]:
        """While work runs from several threads: the bar they all advance, one call at a time."""
        bar = self.bar
        self.bar = bar if isinstance(bar, _Locked) else _Locked(bar)
        try:
            yield self.bar
        finally:
            self.bar = bar


class _Locked:
    """A progress sink that several lanes advance: one call at a time."""

    def __init__(self, bar: ProgressSink) -> None:
        self._bar = bar
        self._lock = threading.Lock()

    def start(self, total: int) -> None:
        with self._lock:
            self._bar.start(total)

    def grow(self, steps: int) -> None:
        with self._lock:
            self._bar.grow(steps)

    def describe(self, text: str) -> None:
        with self._lock:
            self._bar.describe(text)

    def detail(self, text: str) -> None:
        with self._lock:
            self._bar.detail(text)

    def done(self, text: str) -> None:
        with self._lock:
            self._bar.done(text)

    def advance(self, steps: int = 1) -> None:
        with self._lock:
            self._bar.advance(steps)

    def stop(self) -> None:
        with self._lock:
            self._bar.stop()


def _same_process(job: Job, b: Job) -> bool:
    return job.cls is b.cls and job.cls.shares_process and job.env() == b.env() and job.python == b.python


def diff_phases(
    phase_result: PhaseResult, b: PhaseResult, spec: ModelSpec, outputs: bool
) -> list[TensorDiff]:
    """a's run-0 capture against b's, over the tensors both hold, in model order (graph outputs
    only, or every tensor)."""
    with CaptureFile(phase_result.capture) as ca, CaptureFile(b.capture) as cb:
        names = common_names(ca, cb, spec.output_order() if outputs else spec.tensor_order())
        return diff_captures(ca, cb, names, spec.op_types())


def _not_started(os_error: OSError, interpreter: str) -> str:
    """Why the worker's interpreter could not be started ('' where the error is about another file)."""
    if not os_error.filename or os.path.abspath(str(os_error.filename)) != os.path.abspath(interpreter):
        return ""
    return (
        f"the interpreter {interpreter} cannot be started by this user ({os_error.strerror or os_error}): "
        "run xbackend as "
        "a user who may execute it, or give another: --set BACKEND.python=PATH"
    )
