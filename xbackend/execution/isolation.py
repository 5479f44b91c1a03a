"""Run one worker job in its own process, with a timeout; never raise for backend trouble.

A crash, a hang, a missing library or a load failure all come back as a failed
WorkerOutcome with a one-line reason, so the comparison goes on with the others.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from xbackend.execution.foreign import foreign_env, worker_path
from xbackend.execution.protocol import PARENT_ENV, PROGRESS_TAG, RunStatus, WorkerJob, WorkerResult

__all__ = [
    "NEARLY_FULL",
    "WorkerOutcome",
    "cancel_all",
    "drop_spares",
    "kill_group",
    "prestart",
    "reset_cancel",
    "run_batch",
    "run_worker",
    "signal_name",
]

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class WorkerOutcome:
    """What a worker process left behind."""

    status: RunStatus
    reason: str
    result: WorkerResult = field(default_factory=lambda: WorkerResult("failed"))
    elapsed_s: float = 0.0
    signal: int = 0  # the signal that ended the worker (0: it exited, or was not started)


def _stderr_tail(path: Path) -> str:
    try:
        lines = [
            ln.strip()
            for ln in path.read_text(errors="replace").splitlines()
            if ln.strip() and "Warning" not in ln
        ]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def signal_name(code: int) -> str:
    """The name of the signal that ended a process whose return code is `code` (negative)."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env["GGML_NO_BACKTRACE"] = "1"  # ggml's abort handler would run gdb on the worker: its own line instead
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def _pump(
    proc: subprocess.Popen[bytes],
    timeout: float,
    on_progress: Callable[[], None],
    on_job: Callable[[], None] = lambda: None,
    on_stage: Callable[[str], None] = lambda text: None,
) -> bool:
    """Forward progress lines until the process ends; False if `timeout` seconds passed first.

    The clock restarts whenever the worker reports a finished job (several jobs, one process).
    """
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buf = b""
    run_tag, job_tag = f"{PROGRESS_TAG} run".encode(), f"{PROGRESS_TAG} job".encode()
    stage_tag = f"{PROGRESS_TAG} stage ".encode()
    exited = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not sel.select(timeout=0 if exited else min(left, 0.5)):
            if exited:  # ended, and its last lines are read
                return True
            # the last lines may land between the select and the poll: read once more
            exited = proc.poll() is not None
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            return proc.wait(timeout=max(0.1, deadline - time.monotonic())) is not None
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.startswith(stage_tag):
                on_stage(line[len(stage_tag) :].decode(errors="replace"))
            elif line.startswith(run_tag):
                on_progress()
            elif line.startswith(job_tag):
                deadline = time.monotonic() + timeout
                on_job()


def run_worker(
    job: WorkerJob,
    job_dir: Path,
    timeout: float,
    env: Mapping[str, str],
    on_progress: Callable[[], None] = lambda: None,
    python: str = "",
) -> WorkerOutcome:
    """Start `python -m xbackend.execution.worker` on `job`, wait at most `timeout` seconds."""
    return run_batch([(job, job_dir)], timeout, env, on_progress, python)[0]


def run_batch(
    jobs: Sequence[tuple[WorkerJob, Path]],
    timeout: float,
    env: Mapping[str, str],
    on_progress: Callable[[], None] = lambda: None,
    python: str = "",
    on_stage: Callable[[str], None] = lambda text: None,
) -> list[WorkerOutcome]:
    """Run jobs one after another in one worker process, each with `timeout` seconds; under
    the interpreter `python` when given (another environment: see xbackend.execution.foreign).

    A crash or hang fails the job it happened in (its stderr names why); the jobs after
    it start again in a process of their own, so one job's failure costs no other.
    """
    if not jobs:
        return []
    if _CANCELLED.is_set():  # interrupted: a lane thread starts nothing new
        raise KeyboardInterrupt
    paths = []
    for job, job_dir in jobs:
        (job_dir / "job.json").write_text(job.to_json())
        paths.append(str(job_dir / "job.json"))
    err_path = jobs[0][1] / "stderr.txt"
    # an engine's own temp files (caches, rewritten models) inside the run's folder: removed with
    # it, even when the worker is killed before its own cleanup runs
    extra = {PARENT_ENV: str(os.getpid()), "TMPDIR": str(_worker_tmp(jobs[0][1]))}
    worker_env = {**(foreign_env(env) if python else _env(env)), **extra}
    with open(err_path, "wb") as err:
        proc = None if python else _handed(jobs[0][0].target, worker_env, paths, err_path)
        if proc is None:
            proc = subprocess.Popen(
                [python or sys.executable, "-m", "xbackend.execution.worker", *paths],
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=worker_env,
                cwd=worker_path() if python else None,  # `-m` puts the folder it starts in first on sys.path
                start_new_session=True,
            )
        start = time.monotonic()
        ends: list[float] = []
        with _LOCK:
            _LIVE.add(proc)
        try:
            finished = _pump(proc, timeout, on_progress, lambda: ends.append(time.monotonic()), on_stage)
        except BaseException:
            kill_group(proc)
            raise
        finally:
            with _LOCK:
                _LIVE.discard(proc)
        if _CANCELLED.is_set():
            kill_group(proc)
            raise KeyboardInterrupt
        if not finished:
            kill_group(proc)
    outcomes: list[WorkerOutcome] = []
    for i, (job, _) in enumerate(jobs):
        began = ends[i - 1] if 0 < i <= len(ends) else start
        took = (ends[i] if i < len(ends) else time.monotonic()) - began
        if i < len(ends):  # it finished: its result file says how
            outcomes.append(_outcome(0, Path(job.result), err_path, took))
            continue
        if not finished:
            why = f"timed out after {timeout:g} s (raise --timeout)"
            outcomes.append(WorkerOutcome("failed", why, WorkerResult("failed"), took))
        else:
            outcomes.append(_outcome(proc.returncode or 1, Path(job.result), err_path, took))
        return outcomes + run_batch(jobs[i + 1 :], timeout, env, on_progress, python, on_stage)
    return outcomes


# Workers running now, from any lane thread: an interrupt stops them all at once, so the lanes
# return, the run's temp folder is removed and nothing is left behind.
_LIVE: set[subprocess.Popen[bytes]] = set()
_LOCK = threading.Lock()
_CANCELLED = threading.Event()


def cancel_all() -> None:
    """Stop every running worker's process group, and start no other (an interrupt)."""
    _CANCELLED.set()
    with _LOCK:
        live = list(_LIVE)
    for proc in live:
        _kill(proc)  # no wait here: the lane that started it reaps it


def reset_cancel() -> None:
    """A new command in this process may start workers again."""
    _CANCELLED.clear()


# Workers started ahead (prestart), each waiting on its stdin for the jobs it is handed: its
# interpreter, numpy and the engine load while this process plans (the quick table).
_SPARE: dict[tuple[str, tuple[tuple[str, str], ...]], list[subprocess.Popen[bytes]]] = {}
_SPARES_STARTED = itertools.count()


def prestart(env: Mapping[str, str], target: str, folder: Path) -> None:
    """A worker for jobs of the runner `target` under `folder` whose environment is `env`, started
    now; run_batch hands it the first such batch (a worker that died meanwhile is set aside: a
    fresh one runs). Only that runner's batches take it: its engine is already loaded."""
    if _CANCELLED.is_set():
        return
    tmp = _worker_tmp(folder / "spare")
    worker_env = {**_env(env), PARENT_ENV: str(os.getpid()), "TMPDIR": str(tmp)}
    with open(tmp / f"spare-{next(_SPARES_STARTED)}.stderr", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "xbackend.execution.worker", "--wait", target],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.PIPE,
            env=worker_env,
            start_new_session=True,
        )
    with _LOCK:
        _LIVE.add(proc)
        _SPARE.setdefault((target, tuple(sorted(worker_env.items()))), []).append(proc)


def _handed(
    target: str, env: Mapping[str, str], paths: Sequence[str], err: Path
) -> subprocess.Popen[bytes] | None:
    """A spare worker started for this runner and environment, handed these jobs; None where
    there is none."""
    with _LOCK:
        spares = _SPARE.get((target, tuple(sorted(env.items()))), [])
        proc = spares.pop(0) if spares else None
    if proc is None:
        return None
    assert proc.stdin is not None
    try:
        proc.stdin.write((json.dumps({"jobs": list(paths), "stderr": str(err)}) + "\n").encode())
        proc.stdin.close()
        return proc
    except OSError:  # it died waiting: set aside, a fresh worker runs
        kill_group(proc)
        with _LOCK:
            _LIVE.discard(proc)
        return None


def drop_spares() -> None:
    """Stop the spare workers no batch took (the run is over)."""
    with _LOCK:
        left = [p for ps in _SPARE.values() for p in ps]
        _SPARE.clear()
    for proc in left:
        kill_group(proc)
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                pipe and pipe.close()
        with _LOCK:
            _LIVE.discard(proc)


def _worker_tmp(job_dir: Path) -> Path:
    tmp = job_dir.parent / "worker-tmp"
    tmp.mkdir(exist_ok=True)
    return tmp


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the worker's process group and reap it."""
    _kill(proc)
    proc.wait()


def _outcome(code: int, result_path: Path, err_path: Path, elapsed: float) -> WorkerOutcome:
    result = WorkerResult("failed")
    if result_path.is_file():
        try:
            result = WorkerResult.from_json(result_path.read_text())
        except (ValueError, KeyError, TypeError):
            result = WorkerResult("failed")
    if result.status == "ok" and code == 0:
        return WorkerOutcome("ok", "", result, elapsed)
    if result.status == "unavailable":
        return WorkerOutcome("unavailable", result.reason, result, elapsed)
    if result.reason:
        return WorkerOutcome("failed", f"{result.stage}: {result.reason}", result, elapsed)
    tail = _stderr_tail(err_path)
    why = f"crashed with {signal_name(code)}" if code < 0 else f"worker exited with code {code}"
    full = disk_full(err_path.parent)
    if full:  # a memory-mapped write to a full disk ends in SIGBUS, a buffered one anywhere
        why = f"{why}: {full}"
    return WorkerOutcome("failed", f"{why}: {tail}" if tail else why, result, elapsed, max(0, -code))


# below this, the disk that holds a job's files is taken to be what stopped it
NEARLY_FULL = 64 << 20  # free bytes below which a disk counts as full


def disk_full(folder: Path) -> str:
    """Why a job's folder's disk stopped it ('' while it has room)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    if free >= NEARLY_FULL:
        return ""
    return f"no space left on the disk that holds {folder.parent} (set TMPDIR to a folder on a larger disk)"
