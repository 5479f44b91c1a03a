"""Every file a user names, read the one way: a regular file, checked before a byte is read, in
one line with exit 2 otherwise (never a hang on a FIFO, never /dev/zero read until memory runs
out, never a traceback for a name the system refuses)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from xbackend.errors import InputError

__all__ = ["name_problem", "open_user_file", "os_problem", "read_user_bytes", "read_user_text", "user_file"]

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_NAME_MAX = 255  # bytes in one path component, on every file system xbackend runs on


def name_problem(path: Path) -> str:
    """What is wrong with `path`'s name for this system (not UTF-8, a part too long), or ''."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "has a name that is not valid UTF-8; rename it"
    if any(len(os.fsencode(part)) > _NAME_MAX for part in path.parts):
        return f"has a name part longer than {_NAME_MAX} bytes; give it a shorter name"
    return ""


def os_problem(os_error: OSError) -> str:
    """What an OSError says of a file a user named, in words that say what to do."""
    return {
        errno.ENOENT: "does not exist",
        errno.ELOOP: "is a symbolic link loop",
        errno.EACCES: "cannot be read (no permission); make it readable, or copy it somewhere you can read",
        errno.EPERM: "cannot be read (not permitted)",
        errno.ENAMETOOLONG: "has a name too long for the system; give it a shorter name",
        errno.ENOTDIR: "lies under something that is not a folder",
    }.get(os_error.errno or 0, f"cannot be read ({os_error.strerror or os_error})")


def user_file(path: str | os.PathLike[str], what: str, fix: str, limit: int | None = None) -> Path:
    """`path` as a regular file of at most `limit` bytes, or an InputError: '{what} PATH is a
    FIFO (a named pipe); {fix}'. Looked at without opening it (a FIFO would block)."""
    p = Path(path)
    shown = str(p)
    bad = name_problem(p)
    if bad:
        raise InputError(f"{what} {shown!a} {bad}")
    try:
        st = os.stat(p)
    except OSError as error:
        raise InputError(f"{what} {shown} {os_problem(error)}; {fix}") from None
    for test, kind in _KINDS:
        if test(st.st_mode):
            raise InputError(f"{what} {shown} is {kind}, not a file; {fix}")
    if limit is not None and st.st_size > limit:
        raise InputError(
            f"{what} {shown} is {st.st_size} bytes, more than such a file holds ({limit}); {fix}"
        )
    return p


def open_user_file(path: str | os.PathLike[str], what: str, fix: str, limit: int | None = None) -> int:
    """A read-only descriptor of the regular file `path` (checked as user_file does, and again once
    open: a FIFO swapped in meanwhile is refused, never waited on). The caller closes it."""
    p = user_file(path, what, fix, limit)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise InputError(f"{what} {p} {os_problem(error)}; {fix}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (limit is not None and st.st_size > limit):
        os.close(fd)
        raise InputError(f"{what} {p} changed while it was opened and is no longer a file; {fix}")
    os.set_blocking(fd, True)
    return fd


def read_user_bytes(path: str | os.PathLike[str], what: str, fix: str, limit: int | None = None) -> bytes:
    """The whole regular file `path`, at most `limit` bytes (see user_file)."""
    fd = open_user_file(path, what, fix, limit)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1 if limit is not None else -1)
    if limit is not None and len(data) > limit:
        raise InputError(f"{what} {path} grew past {limit} bytes while it was read; {fix}")
    return data


def read_user_text(path: str | os.PathLike[str], what: str, fix: str, limit: int | None = None) -> str:
    """The UTF-8 text of a file a user named (`what`, read as read_user_bytes reads it); an InputError with
    `fix` where it is not text."""
    data = read_user_bytes(path, what, fix, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {error.start}); {fix}") from None
