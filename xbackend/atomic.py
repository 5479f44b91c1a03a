"""Atomic writes: a reader never sees half a file (reports, captures, pins, engines)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from xbackend.errors import ReportError

__all__ = ["write_atomic", "write_atomic_bytes"]


def write_atomic(path: str | os.PathLike[str], text: str, what: str = "report") -> None:
    """Write `text` (UTF-8) to a temp file beside `path`, fsync, then rename over it."""
    write_atomic_bytes(path, text.encode("utf-8"), what)


def write_atomic_bytes(path: str | os.PathLike[str], data: bytes, what: str = "report") -> None:
    """Write `data` to a temp file beside `path`, fsync, then rename over it; errors name the
    file as `what`."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as e:
        raise ReportError(f"cannot write {what} {p}: {e.strerror}; check the directory") from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; reports (and pin files) are meant to be shared
        os.replace(tmp, p)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ReportError(f"cannot write {what} {p}: {e.strerror}") from e
