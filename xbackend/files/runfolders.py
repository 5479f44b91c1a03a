"""A run's temp folder, marked with the process that made it.

A run removes its folder when it ends, is interrupted or stopped by a signal. A run whose
process was killed outright (SIGKILL, the OOM killer, a lost machine) cannot: its folder keeps
the process id and start time that made it, and the next run removes the folders of processes
that are gone. Only folders that carry the mark, belong to this user and are not links are
ever removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from xbackend.errors import UsageError

__all__ = ["MARK", "remove_dead_runs", "run_temp_folder", "start_time"]

MARK = ".xbackend-run"  # in each run folder: "PID START" of the process that made it


def start_time(pid: int) -> str:
    """When process `pid` started, in clock ticks since boot (Linux); '' where unknown. With the
    pid it names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # someone's: never judged dead
    now = start_time(pid)
    return not started or not now or now == started


def remove_dead_runs(folder: Path | None = None, prefix: str = "xbackend-") -> list[Path]:
    """Remove the run folders in `folder` (the temp folder) whose process is gone; the removed."""
    base = Path(folder or tempfile.gettempdir())
    gone = []
    with contextlib.suppress(OSError):
        for path in base.glob(f"{prefix}*"):
            try:
                if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                    continue
                pid_text, _, started = (path / MARK).read_text().strip().partition(" ")
                pid = int(pid_text)
            except (OSError, ValueError):
                continue  # no mark: not a run folder, or one from before marks
            if pid != os.getpid() and not _alive(pid, started):
                shutil.rmtree(path, ignore_errors=True)
                gone.append(path)
    return gone


def run_temp_folder(prefix: str = "xbackend-") -> tempfile.TemporaryDirectory[str]:
    """A new temp folder for this run, marked with this process (removed when it ends); the
    folders of runs whose process died are removed first."""
    try:
        remove_dead_runs()
        tmp = tempfile.TemporaryDirectory(prefix=prefix)
        pid = os.getpid()
        (Path(tmp.name) / MARK).write_text(f"{pid} {start_time(pid)}\n")
    except OSError as error:  # gettempdir() itself fails where no folder takes a file
        where = f" in {os.environ['TMPDIR']}" if os.environ.get("TMPDIR") else ""
        raise UsageError(
            f"cannot make a temp folder{where} ({error.strerror or error}); set TMPDIR to a writable "
            "folder on a larger disk, and check `ulimit -f`"
        ) from None
    return tmp
