"""Worker process: one backend configuration, one or more phases (engine builds), N runs each.

Started by xbackend.execution.isolation as ``python -m xbackend.execution.worker JOB.json``. It saves
the first run's capture to disk and compares each later run to that file as it
arrives, tensor by tensor, so memory stays at one run's worth whatever the runs. Progress goes to
stdout as tagged lines; the outcome goes to the result JSON named in the job.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

try:
    import resource as _resource  # POSIX only
except ImportError:  # Windows: no peak memory to report
    _resource = None  # type: ignore[assignment]

from xbackend.errors import BackendUnavailableError, XbackendError
from xbackend.execution.decoding import DecodeTask, decode, prompt_key
from xbackend.execution.protocol import PARENT_ENV, PROGRESS_TAG, Phase, PhaseResult, WorkerJob, WorkerResult
from xbackend.files.run_values import combined_digest, save_capture, tensor_digest
from xbackend.files.storage import ValueFile, ValueWriter, save_values
from xbackend.numerics.metrics import TensorDiff, diff_values, keep_worse
from xbackend.numerics.spread import Spread
from xbackend.numerics.values import Value
from xbackend.runners.base import Runner
from xbackend.runners.buildinfo import BuildFingerprint
from xbackend.runners.registry import get_runner


class RunTracker:
    """Saves run 0's capture to `path`, hashing each tensor while it is written; compares each
    later run against that file, one tensor at a time, so a worker holds one run's values (as the
    engine does), never two. A later run's tensor that equals run 0's bit for bit takes run 0's
    digest: only tensors that moved are hashed again. Runs arrive window by window (each window
    is one build exposing some of the tensors): run 0 of a window, then its later runs.

    With spill=False only the graph outputs are written; the other tensors are compared by
    digest, and those that moved are listed in `moved` for measure() to compare apart."""

    def __init__(
        self,
        outputs: Sequence[str],
        op_types: Mapping[str, str],
        path: str,
        spill: bool = True,
        hashed: bool = True,
    ) -> None:
        self.outputs = list(outputs)
        self.hashed = hashed or not spill  # an unspilled tensor is compared by its digest
        self.op_types = dict(op_types)
        self.spill = spill
        self._output_set = set(outputs)
        self.moved: list[str] = []  # unspilled tensors whose digest changed, in this window
        self.writer = ValueWriter(path)
        self.names: list[str] = []  # run 0's, every window's in order
        self.window: list[str] = []  # run 0's names in the current window
        self.run_digests: list[dict[str, str]] = []
        self.worst: dict[str, TensorDiff] = {}
        self.output_hashes: list[str] = []
        self.capture_hashes: list[str] = []

    @property
    def digests(self) -> dict[str, str]:
        """The first run's digest of each tensor ({} before any run)."""
        return self.run_digests[0] if self.run_digests else {}

    def add(self, run: int, capture: dict[str, Value]) -> None:
        """Record run `run`'s captured values: their digests, and for later runs the tensors whose bits
        moved."""
        while len(self.run_digests) <= run:
            self.run_digests.append({})
        digests = self.run_digests[run]
        if run == 0:
            self.window = list(capture)
            self.names += self.window
            self.moved = []
            # hashing runs beside the write (both release the GIL on large buffers)
            with ThreadPoolExecutor(max_workers=1 if self.spill else 2) as pool:
                named = self.window if self.hashed else []
                pending = [(n, pool.submit(tensor_digest, n, capture[n])) for n in named]
                for n in self.window:
                    if self._spilled(n):
                        self.writer.add(n, capture[n])
                digests.update((n, f.result()) for n, f in pending)
            return
        first = self.run_digests[0]
        unspilled = [n for n in self.window if n in capture and not self._spilled(n)]
        with ThreadPoolExecutor(max_workers=2) as pool:
            hashed = dict(zip(unspilled, pool.map(lambda n: tensor_digest(n, capture[n]), unspilled)))
        for n, value in hashed.items():
            digests[n] = value
            if value != first[n] and n not in self.moved:
                self.moved.append(n)
        for n in self.window:
            if n in hashed:
                continue
            if n not in capture:
                keep_worse(
                    self.worst,
                    TensorDiff.mismatch(n, self.op_types.get(n, ""), "missing", "absent in a later run"),
                )
                continue
            diffs = diff_values(n, capture[n], self.writer.read(n), self.op_types.get(n, ""))
            for d in diffs:
                keep_worse(self.worst, d)
            same = all(diff.bitwise_equal for diff in diffs)
            digests[n] = first.get(n, "") if same else tensor_digest(n, capture[n])

    def _spilled(self, name: str) -> bool:
        return self.spill or name in self._output_set

    def measure(self, run: Callable[[], dict[str, Value]], path: str) -> None:
        """How far the moved tensors move, when their digests said only that they did: two more
        runs, the first's moved tensors written to `path`, the second's compared with them."""
        with ValueWriter(path) as side:
            first = run()
            for n in self.moved:
                if n in first:
                    side.add(n, first[n])
            del first
            again = run()
            for n in self.moved:
                if n in again and n in side.entries:
                    for diff_value in diff_values(n, again[n], side.read(n), self.op_types.get(n, "")):
                        keep_worse(self.worst, diff_value)
            del again
        os.unlink(path)

    def finish(self) -> None:
        """Close the capture file; each run's hashes from its tensors' digests."""
        self.writer.close()
        for digests in self.run_digests:
            self.output_hashes.append(
                combined_digest(
                    (output, digests.get(output, "absent")) for output in self.outputs if output in self.names
                )
            )
            self.capture_hashes.append(
                combined_digest((name, digests.get(name, "absent")) for name in self.names)
            )


def _one_line(base_exception: BaseException) -> str:
    text = " ".join(str(base_exception).split())
    if isinstance(base_exception, XbackendError):
        return text
    return f"{type(base_exception).__name__}: {text}"[:500]


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def load_feeds_file(path: str) -> dict[str, Value]:
    """The feeds saved at `path`, every value loaded."""
    with ValueFile(path) as value_file:
        return value_file.load_all()


def _tick() -> None:
    print(f"{PROGRESS_TAG} run", flush=True)


def _stage(text: str) -> None:
    """What the worker does now, for the progress bar (long loads, builds and runs say so)."""
    print(f"{PROGRESS_TAG} stage {text}", flush=True)


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def run_phase(runner: Runner, job: WorkerJob, phase: Phase, feeds: Mapping[str, Value]) -> PhaseResult:
    """Prepare `runner` for the phase's tensors, run the feeds `runs` times, then each extra feed
    set. A phase cut into windows (--max-memory) builds a fresh runner for each later window."""
    windows = phase.windows or (phase.tensors,)
    tracker = RunTracker(job.outputs, job.op_types, phase.capture, phase.spill, phase.hashed)
    run_s = [0.0] * phase.runs
    prepare_s = 0.0
    fingerprints = []
    not_exposed: dict[str, str] = {}
    info: dict[str, str] = {}
    extras = []
    floors: tuple[tuple[str, float], ...] = ()
    try:
        for index, tensors in enumerate(windows):
            where = f"{phase.name}" + (f", window {index + 1}/{len(windows)}" if len(windows) > 1 else "")
            if index:
                runner = _new_runner(job)
            try:
                model = phase.model or job.model
                weights = f"loading {_size(model.weight_bytes)} of weights, " if model.weight_bytes else ""
                _stage(f"{where}: {weights}building ({len(tensors)} tensors exposed)")
                t0 = time.perf_counter()
                runner.prepare(model, tensors)
                prepare_s += time.perf_counter() - t0
                for i in range(phase.runs):
                    _stage(f"{where}: run {i + 1}/{phase.runs}")
                    t0 = time.perf_counter()
                    capture = runner.run(feeds)
                    run_s[i] += time.perf_counter() - t0
                    held = sum(getattr(value, "nbytes", 0) for value in capture.values())
                    what = "comparing with run 1:" if i else ("saving" if phase.spill else "hashing")
                    _stage(f"{where}: run {i + 1}/{phase.runs}: {what} {len(capture)} tensors, {_size(held)}")
                    tracker.add(i, capture)
                    if i == 0:
                        fingerprints.append(runner.fingerprint())
                    del capture
                    _tick()
                if tracker.moved:
                    _stage(
                        f"{where}: {len(tracker.moved)} tensors moved run to run; two more runs measure them"
                    )
                    tracker.measure(functools.partial(runner.run, feeds), f"{phase.capture}.moved")
                not_exposed.update(runner.not_exposed())
                info = info or runner.info()
                spread = Spread(job.op_types) if phase.extras == "spread" else None
                for k, (feeds_path, capture_path) in enumerate(phase.extra_feeds):  # never windowed
                    _stage(f"{where}: extra feeds {k + 1}/{len(phase.extra_feeds)}")
                    # an extra feeds file holds what differs from the job's feeds
                    capture = runner.run({**feeds, **load_feeds_file(feeds_path)})
                    if spread is None:
                        extras.append((capture_path, tuple(capture)))
                        save_capture(capture_path, list(capture), capture)
                    else:
                        for n in [n for n in capture if n in tracker.writer.entries]:
                            spread.add(n, capture.pop(n), tracker.writer.read(n))
                    del capture
                    _tick()
                if spread is not None and phase.extra_feeds:
                    path = phase.extra_feeds[0][1]
                    save_capture(path, list(spread.spread), spread.spread)
                    extras.append((path, tuple(spread.spread)))
                    floors = tuple(spread.floors.items())
            finally:
                if len(windows) > 1:  # a window's engine goes before the next is built
                    runner.close()
    finally:
        tracker.finish()
    return PhaseResult(
        name=phase.name,
        capture=phase.capture,
        capture_names=tuple(tracker.names),
        output_hashes=tuple(tracker.output_hashes),
        capture_hashes=tuple(tracker.capture_hashes),
        run_diffs=tuple(tracker.worst.values()),
        prepare_s=prepare_s,
        run_s=tuple(run_s),
        fingerprint=_combined(fingerprints),
        not_exposed=tuple(sorted(not_exposed.items())),
        info=tuple(sorted(info.items())),
        extra_captures=tuple(extras),
        serves_outputs=phase.serves_outputs,
        digests=tuple((key, digest[:16]) for key, digest in tracker.digests.items()),
        windows=len(windows),
        floors=floors,
    )


def _combined(fingerprints: Sequence[BuildFingerprint]) -> BuildFingerprint:
    """One build's fingerprint, or the windows' builds' together."""
    if len(fingerprints) == 1:
        return fingerprints[0]
    items = [
        (f"window {index} {key}", value)
        for index, fp in enumerate(fingerprints)
        for key, value in (fp.layers or (("digest", fp.digest),))
    ]
    return BuildFingerprint.from_items(fingerprints[0].backend, items)


def _runner_class(job: WorkerJob) -> type[Runner]:
    if not job.target:
        return get_runner(job.backend)

    module, _, attr = job.target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Runner)):
        raise TypeError(f"{job.target} is not a xbackend Runner subclass")
    return cls


def _new_runner(job: WorkerJob) -> Runner:
    runner = _runner_class(job)(job.options)
    runner.detailed_fingerprint = job.fingerprint
    return runner


def execute(job: WorkerJob) -> WorkerResult:
    """Run the job; never raises: failures come back as status 'failed' with a reason."""
    stage = "load"
    phases: list[PhaseResult] = []
    runner: Runner | None = None
    start = 0
    try:
        with contextlib.suppress(Exception):  # a failed import fails the build, with its reason
            _runner_class(job).load_engine()
        start = current_rss()
        if job.kind == "opt-levels":
            stage = "opt-levels"
            runner = _new_runner(job)
            rows = runner.optimization_levels(job.model, load_feeds_file(job.feeds))
            _tick()
            return WorkerResult(
                "ok", "done", info=tuple(sorted(runner.info().items())), opt_levels=tuple(rows)
            )
        if job.kind == "decode" and job.decode is not None:
            stage = "decode"
            runner = _new_runner(job)
            return _decode(runner, job, job.decode, start)
        feeds = load_feeds_file(job.feeds)
        errors: list[tuple[str, str]] = []
        for index, phase in enumerate(job.phases):
            stage = phase.name
            runner = _new_runner(job)
            try:
                phases.append(run_phase(runner, job, phase, feeds))
            except Exception as error:
                if index == 0:
                    raise
                # The engine users ship ran; only the instrumented build failed: keep the verdict.
                errors.append((phase.name, _one_line(error)))
            runner.close()
            runner = None
        return WorkerResult(
            "ok",
            "done",
            phases=tuple(phases),
            info=phases[0].info,
            phase_errors=tuple(errors),
            start_rss_bytes=start,
        )
    except BaseException as error:  # the worker reports every failure, even KeyboardInterrupt
        info: tuple[tuple[str, str], ...] = ()
        if runner is not None:
            with contextlib.suppress(Exception):
                info = tuple(sorted(runner.info().items()))
        status = "unavailable" if isinstance(error, BackendUnavailableError) else "failed"
        return WorkerResult(status, stage, _one_line(error), type(error).__name__, tuple(phases), info)
    finally:
        if runner is not None:
            with contextlib.suppress(Exception):
                runner.close()


def _decode(runner: Runner, job: WorkerJob, task: DecodeTask, start: int) -> WorkerResult:
    """Greedy decoding of every composition on one build (xbackend.execution.decoding)."""
    model = job.model
    _stage(f"decode: building ({len(task.convention.outputs())} outputs)")
    runner.prepare(model, task.convention.outputs())
    _tick()
    prompts = load_feeds_file(task.prompts)
    ordered = [np.asarray(prompts[prompt_key(k)]) for k in range(len(prompts))]
    last = [0.0]

    def stage(text: str) -> None:  # a line per step would cost as much as a small model's step
        now = time.perf_counter()
        if now - last[0] > 0.25:
            last[0] = now
            _stage(f"decode: {text}")

    # run_impl: the engine's own call; decoding reads tensors by name and needs no normalized copy
    rows, logits, seconds, failed = decode(runner.run_impl, task, ordered, stage)
    if task.logits:
        save_values(task.logits, logits)
    _tick()
    return WorkerResult(
        "ok",
        "done",
        info=tuple(sorted(runner.info().items())),
        start_rss_bytes=start,
        decode_rows=tuple(rows),
        decode_seconds=tuple(seconds),
        phase_errors=tuple(failed),
        fingerprint=runner.fingerprint(),
    )


def current_rss() -> int:
    """This process's resident memory now, in bytes; 0 where the OS does not say (not Linux)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def peak_rss() -> int:
    """This process's peak resident memory so far, in bytes; 0 where the OS does not say. On
    Linux, the kernel's high-water mark of this program's memory (VmHWM): getrusage's maxrss
    survives exec, so it would count the parent's memory at the fork."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if _resource is None:
        return 0
    peak = int(_resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024  # Linux counts KiB, macOS bytes


def _die_with_parent() -> None:
    """A worker outlives nothing: when the process that started it dies (a sweep job killed at its
    timeout, a lost Ray worker), the kernel kills it too (Linux; elsewhere it ends at its pipe)."""
    parent = os.environ.get(PARENT_ENV, "")
    if not sys.platform.startswith("linux") or not parent.isdigit():
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        os._exit(1)


def _handed(target: str) -> list[str]:
    """A worker started ahead (isolation.prestart): its engine loaded, then the job files it is
    handed on stdin, its stderr moved to theirs. Nothing handed (stdin closed): no job."""
    with contextlib.suppress(Exception):  # a failed import fails the job later, with its reason
        module, _, attr = target.partition(":")
        getattr(importlib.import_module(module), attr).load_engine()
    line = sys.stdin.readline()
    if not line:
        return []
    handed = json.loads(line)
    fd = os.open(handed["stderr"], os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)
    return [str(job) for job in handed["jobs"]]


def main(argv: Sequence[str] | None = None) -> int:
    """Run each job file named, in order, in this process; write each one's result as it ends.

    Several files: variants of a backend whose differences are per engine (see
    Runner.shares_process), sharing one process's start-up and imports.
    """
    if argv is None:
        _die_with_parent()
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--wait"]:
        args = _handed(args[1])
    code = 0
    for path in args:
        with open(path) as handle:
            job = WorkerJob.from_json(handle.read())
        result = replace(execute(job), peak_rss_bytes=peak_rss())
        _write(job.result, result.to_json())
        print(f"{PROGRESS_TAG} job", flush=True)
        code = code or (0 if result.status == "ok" else 1)
    return code


if __name__ == "__main__":
    sys.exit(main())
