"""Run one worker job in its own process, with a timeout; never raise for backend trouble.

A crash, a hang, a missing library or a load failure all come back as a failed
WorkerOutcome with a one-line reason, so the comparison goes on with the others.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from xbackend.protocol import PROGRESS_TAG, WorkerJob, WorkerResult

__all__ = ["WorkerOutcome", "run_worker"]

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True)
class WorkerOutcome:
    """What a worker process left behind."""

    status: str  # "ok" | "failed" | "unavailable" (the backend cannot take this model)
    reason: str
    result: WorkerResult = field(default_factory=lambda: WorkerResult("failed"))
    elapsed_s: float = 0.0


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


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def _pump(proc: subprocess.Popen[bytes], deadline: float, on_progress: Callable[[], None]) -> bool:
    """Forward progress lines until the process ends; False if the deadline passed first."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not sel.select(timeout=min(left, 0.5)):
            if proc.poll() is not None:
                return True
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            return proc.wait(timeout=max(0.1, deadline - time.monotonic())) is not None
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.startswith(PROGRESS_TAG.encode()):
                on_progress()


def run_worker(
    job: WorkerJob,
    job_dir: Path,
    timeout: float,
    env: Mapping[str, str],
    on_progress: Callable[[], None] = lambda: None,
) -> WorkerOutcome:
    """Start `python -m xbackend.worker` on `job`, wait at most `timeout` seconds."""
    job_path = job_dir / "job.json"
    job_path.write_text(job.to_json())
    err_path = job_dir / "stderr.txt"
    result_path = Path(job.result)
    start = time.monotonic()
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "xbackend.worker", str(job_path)],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=_env(env),
            start_new_session=True,
        )
        try:
            finished = _pump(proc, start + timeout, on_progress)
        except BaseException:
            _kill(proc)
            raise
        if not finished:
            _kill(proc)
            return WorkerOutcome(
                "failed",
                f"timed out after {timeout:g} s (raise --timeout)",
                WorkerResult("failed"),
                time.monotonic() - start,
            )
    return _outcome(proc.returncode, result_path, err_path, time.monotonic() - start)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
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
    why = f"crashed with {_signal_name(code)}" if code < 0 else f"worker exited with code {code}"
    return WorkerOutcome("failed", f"{why}: {tail}" if tail else why, result, elapsed)
