"""Atomic writes: a reader never sees half a file (reports, captures, pins, engines)."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from xbackend.errors import ReportError, UsageError
from xbackend.files.owned import allow, forced, is_ours, place, refusal, synced_temp
from xbackend.files.userfile import name_problem

__all__ = [
    "NPZ_MARK",
    "check_export_output",
    "check_outputs",
    "stage_bytes",
    "takes_files",
    "write_atomic",
    "write_atomic_bytes",
]

# the array `capture export` adds to its .npz (a mark of where it came from; ownership is by record)
NPZ_MARK = "xbackend.capture-export"


def check_outputs(
    outputs: Sequence[tuple[str, str | os.PathLike[str] | None]],
    inputs: Sequence[str | os.PathLike[str] | None] = (),
    force: bool = False,
) -> None:
    """Before anything runs: each output (flag, path) can be written and destroys nothing. Its name
    is one the system takes; it is not a folder, a link or a device, not the same file as another
    output or an input, and, if it exists, a file xbackend wrote and recorded, unchanged since
    (xbackend.files.owned), or `force` (--force) is given; its folder takes a new regular file. A
    UsageError, one line, names the flag and what to do. Every file a command writes passes here:
    a report's companions too (its table and figures: see xbackend.report.bundle.bundle_outputs).
    The same rule is checked again when each file is written."""
    seen: dict[Path, str] = {}
    read = {_resolved("an input", Path(input_name)) for input_name in inputs if input_name}
    if force:
        allow(p for _, p in outputs)
    for flag, path in outputs:
        if not path:
            continue
        p = Path(path)
        bad = name_problem(p)
        if bad:
            raise UsageError(f"{flag} {str(p)!a} {bad}")
        key = _resolved(flag, p)
        if key in read:
            raise UsageError(f"{flag} {p} is an input of this command; write the output to another path")
        if key in seen:
            raise UsageError(f"{flag} {p} is the same file as {seen[key]}; give each output its own path")
        seen[key] = f"{flag} {p}"
        if p.is_symlink():
            raise UsageError(
                f"{flag} {p} is a symbolic link; xbackend never writes through or replaces one: "
                "choose another path"
            )
        if p.is_dir():
            raise UsageError(f"{flag} {p} is a folder; give a file path in it, such as {p / p.name}.out")
        if p.exists() and not p.is_file():
            raise UsageError(f"{flag} {p} is not a regular file (a device or a pipe); choose another path")
        if p.exists() and not (forced(p) or is_ours(p)):
            raise UsageError(refusal(flag, p))
        folder = next((a for a in (p.parent, *p.parent.parents) if a.exists()), Path("."))
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK) or not takes_files(folder):
            raise UsageError(
                f"{flag} {p} cannot be written: {folder} is not a writable folder; choose another path"
            )


def _resolved(flag: str, path: Path) -> Path:
    try:
        return path.resolve()
    except RuntimeError:  # a link loop
        raise UsageError(
            f"{flag} {path} goes through a symbolic link loop; fix the link or give another path"
        ) from None
    except OSError as error:
        raise UsageError(f"{flag} {path} cannot be looked up ({error.strerror}); give another path") from None


def takes_files(folder: Path) -> bool:
    """A new regular file can be made in `folder` (not /proc or /sys, not a read-only mount, not an
    immutable folder): tried with a temp file of our own, removed at once."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".xbackend-check.", dir=folder)
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return True


def write_atomic(path: str | os.PathLike[str], text: str, what: str = "report", force: bool = False) -> None:
    """Write `text` (UTF-8) to a temp file beside `path`, fsync, then move it into place: a new
    file, or one xbackend wrote and recorded (`force`: any regular file). See write_atomic_bytes."""
    write_atomic_bytes(path, text.encode("utf-8"), what, force)


def write_atomic_bytes(
    path: str | os.PathLike[str], data: bytes, what: str = "report", force: bool = False
) -> None:
    """Write `data` to a temp file beside `path`, fsync, then move it into place and record it as
    xbackend's (xbackend.files.owned.place); errors name the file as `what`. A full disk or a
    file-size limit leaves nothing behind."""
    p = Path(path)
    tmp = stage_bytes(p, data, what)
    try:
        place(tmp, p, hashlib.sha256(data).hexdigest(), what, force)
    finally:
        tmp.unlink(missing_ok=True)


def stage_bytes(path: Path, data: bytes, what: str) -> Path:
    """`data` in a finished temp file beside `path` (the caller moves it into place or removes it)."""
    if path.is_symlink():  # made since the check before the run: never written through
        raise ReportError(f"cannot write {what} {path}: it is a symbolic link; choose another path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return synced_temp(path, data)
    except OSError as error:
        full = error.errno in (errno.ENOSPC, errno.EFBIG)
        hint = (
            " (a full disk or a file-size limit: nothing was left behind)" if full else "; check the folder"
        )
        raise ReportError(f"cannot write {what} {path}: {error.strerror}{hint}") from error


def check_export_output(
    output: str | os.PathLike[str], module: str, inputs: str | None, force: bool = False
) -> None:
    """`export torch -o OUT.onnx`, before the module is loaded: OUT and the weights files beside it
    (OUT.data, OUT.data0, ...) are new, or an earlier export's (recorded); never the module's own
    file or the example inputs (not even with --force), a pipe or someone's file."""
    target = module.rpartition(":")[0]
    read = [x for x in (target if target.endswith(".py") else None, inputs) if x]
    out = Path(output)
    beside = sorted(out.parent.glob(glob.escape(out.name) + ".data*")) if out.parent.is_dir() else []
    check_outputs([("-o", out), *((f"-o {out}'s weights", b) for b in beside)], read, force)
