"""Which files xbackend may overwrite or remove: the ones it wrote, by record, not by content.

Every file xbackend writes is listed, with its sha256, in its folder's ledger
(`.xbackend-files.json`). An existing file is replaced or removed only if the ledger lists it with
its current digest (it is xbackend's, unchanged since), or the user passed `--force` for it. A
user's notes that happen to start like a report are someone's file. The rule is checked before a
run and again at the moment of writing, under a lock on the folder: a file that appeared meanwhile
is refused, never replaced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from xbackend.errors import UsageError

__all__ = [
    "LEDGER",
    "allow",
    "check_tree",
    "claim",
    "drop_parts",
    "file_digest",
    "forced",
    "foreign",
    "forget",
    "is_ours",
    "locked",
    "may_place",
    "new_part",
    "place",
    "recorded",
    "refusal",
    "replace_tree",
    "reset",
    "synced_temp",
]

LEDGER = ".xbackend-files.json"
_SCHEMA = "xbackend.files/1"
_LEDGER_LIMIT = 16 << 20  # a ledger lists names and digests: larger is not one of ours
_FORCED: set[Path] = set()  # files the user named with --force in this command


def _key(p: Path) -> Path:
    try:
        return p.parent.resolve() / p.name
    except (OSError, RuntimeError):
        return p.absolute()


def allow(paths: Iterable[str | os.PathLike[str] | None]) -> None:
    """`--force`: these files may be replaced whoever wrote them (never through a link)."""
    _FORCED.update(_key(Path(p)) for p in paths if p)


def reset() -> None:
    """A new command: nothing forced yet (the CLI's commands may run in one process)."""
    _FORCED.clear()


def forced(p: Path) -> bool:
    """The user forced `p`, or a folder it is in (`sweep -o DIR --force`)."""
    k = _key(p)
    return k in _FORCED or any(a in _FORCED for a in k.parents)


def file_digest(p: Path) -> str:
    """sha256 of a regular file, read without following a link or waiting on a pipe."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(p))
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


def _load_ledger(folder: Path) -> dict[str, str] | None:
    """The folder's ledger ({} where there is none), or None: a file of that name that is not
    one (someone's, a link, damaged), which xbackend neither trusts nor replaces."""
    path = folder / LEDGER
    try:
        st = os.lstat(path)
    except OSError:
        return {}
    if not stat.S_ISREG(st.st_mode) or st.st_size > _LEDGER_LIMIT:
        return None
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(_LEDGER_LIMIT + 1))
    except (OSError, ValueError, RecursionError):
        return None
    files = data.get("files") if isinstance(data, dict) and data.get("schema") == _SCHEMA else None
    if not isinstance(files, dict):
        return None
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str) and "/" not in k}


def _read_ledger(folder: Path) -> dict[str, str]:
    """What the folder's ledger lists (nothing, where it has none or it is not one)."""
    return _load_ledger(folder) or {}


def _ledger_to_update(folder: Path) -> dict[str, str]:
    """The ledger about to be rewritten; a file of its name that is not one is refused."""
    files = _load_ledger(folder)
    if files is None:
        raise UsageError(f"{folder / LEDGER} exists and is not xbackend's ledger of its files; move it away")
    return files


def _write_ledger(folder: Path, files: dict[str, str]) -> None:
    body = json.dumps({"schema": _SCHEMA, "files": dict(sorted(files.items()))}, indent=1) + "\n"
    tmp = synced_temp(folder / LEDGER, body.encode("utf-8"))
    try:
        os.replace(tmp, folder / LEDGER)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def synced_temp(dest: Path, data: bytes, mode: int = 0o644, suffix: str = ".tmp") -> Path:
    """`data` in a new temp file of this writer's own beside `dest`, synced to disk, with `mode`:
    the caller moves it into place or removes it. An OSError leaves nothing behind."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name[:200]}.", suffix=suffix, dir=dest.parent)
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600; reports (and pin files) are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(tmp)


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """The folder's ledger held by this process (an advisory lock on the folder itself)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield  # a folder that cannot be opened: the write itself will say why
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def is_ours(p: Path) -> bool:
    """`p` is listed in its folder's ledger and unchanged since xbackend wrote it."""
    return _unchanged(p, _read_ledger(p.parent).get(p.name))


def _unchanged(p: Path, digest: str | None) -> bool:
    """`p` is a regular file (not a link) whose sha256 is `digest`."""
    if digest is None:
        return False
    try:
        return file_digest(p) == digest
    except OSError:  # a link (O_NOFOLLOW), gone, unreadable
        return False


def recorded(folder: Path) -> bool:
    """xbackend has written into `folder` (its ledger lists a file)."""
    return bool(_read_ledger(folder))


def refusal(flag: str, p: Path) -> str:
    """The one line for an existing file that is not xbackend's to replace."""
    return (
        f"{flag} {p} exists and xbackend did not write it (or it changed since); xbackend never "
        "overwrites it: choose another path, or pass --force to replace it"
    )


def claim(p: Path, digest: str) -> None:
    """Record `p` (just written, with `digest`) as xbackend's."""
    with locked(p.parent):
        files = _ledger_to_update(p.parent)
        files[p.name] = digest
        _write_ledger(p.parent, files)


def forget(folder: Path, names: Iterable[str]) -> None:
    """Files xbackend removed: no longer listed."""
    gone = set(names)
    with locked(folder):
        files = _ledger_to_update(folder)
        if gone & set(files):
            _write_ledger(folder, {k: v for k, v in files.items() if k not in gone})


def may_place(dest: Path, what: str, force: bool = False) -> dict[str, str]:
    """`dest` may take a file now: new, or xbackend's unchanged file, or forced; else a UsageError.
    Returns its folder's ledger (read once), to be updated when the file is placed."""
    files = _ledger_to_update(dest.parent)  # before anything is placed: a file is never left unrecorded
    if not os.path.lexists(dest):
        return files
    if dest.is_symlink() or not dest.is_file():
        raise UsageError(f"cannot write {what} {dest}: it is now a link or not a file; choose another path")
    if not (force or forced(dest) or _unchanged(dest, files.get(dest.name))):
        msg = refusal(f"the {what}", dest).replace("exists and", "appeared while xbackend ran and")
        raise UsageError(msg)
    return files


def place(tmp: Path, dest: Path, digest: str, what: str, force: bool = False) -> None:
    """Move the finished temp file `tmp` to `dest` and record it. `dest` is new (then a file made
    there meanwhile is never replaced), or xbackend's unchanged file, or one the user forced."""
    with locked(dest.parent):
        files = may_place(dest, what, force)
        if os.path.lexists(dest):
            os.replace(tmp, dest)
        else:
            try:
                os.link(tmp, dest)  # fails if a file appeared there: nothing is replaced
            except FileExistsError:
                raise UsageError(
                    f"the {what} {dest} appeared while xbackend ran; xbackend never overwrites it: "
                    "choose another path"
                ) from None
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
                    raise
                os.replace(tmp, dest)  # a file system without hard links
            else:
                os.unlink(tmp)
        files[dest.name] = digest
        _write_ledger(dest.parent, files)


def foreign(folder: Path, limit: int = 10_000) -> list[Path]:
    """Everything under `folder` xbackend did not write or that changed since (links, pipes and
    folders of someone's too), the ledgers aside: what replacing or removing the folder would
    destroy. At most `limit` entries are looked at; past that, the folder is someone's."""
    out: list[Path] = []
    seen = 0
    for root, dirs, names in os.walk(folder, followlinks=False):
        here = Path(root)
        listed = _load_ledger(here)
        for d in list(dirs):
            if (here / d).is_symlink():
                out.append(here / d)
                dirs.remove(d)
        for n in names:
            seen += 1
            if seen > limit:
                return [*out, here / n]
            if n == LEDGER and listed is not None:  # the ledger itself, when it is one
                continue
            if not _unchanged(here / n, (listed or {}).get(n)):
                out.append(here / n)
    return out


def check_tree(flag: str, folder: Path) -> None:
    """`folder` may be replaced or removed whole: it holds nothing but xbackend's unchanged files
    (or the user forced it). Else a UsageError names the first file that is someone's."""
    if not folder.exists() or forced(folder):
        return
    if folder.is_symlink() or not folder.is_dir():
        raise UsageError(refusal(flag, folder))
    found = foreign(folder)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UsageError(
            f"{flag} {folder} holds {found[0]}{more}, which xbackend did not write (or which changed "
            "since); xbackend never overwrites or removes it: move it away, choose another folder, or "
            "pass --force"
        )


def replace_tree(part: Path, folder: Path, what: str) -> None:
    """Move the finished folder `part` to `folder`, replacing an earlier one only if it holds
    nothing but xbackend's unchanged files (checked now, at the moment of replacing)."""
    with locked(folder.parent):
        check_tree(what, folder)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(part, folder)


def new_part(folder: Path) -> Path:
    """A fresh hidden folder beside `folder` to build it in (a name of this writer's own)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{folder.name[:100]}.", suffix=".partial", dir=folder.parent))


def drop_parts(folder: Path) -> None:
    """Remove the half-built folders new_part made beside `folder` (their writer was killed)."""
    with contextlib.suppress(OSError):
        for d in folder.parent.glob(f".{glob.escape(folder.name[:100])}.*.partial"):
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d, ignore_errors=True)
