"""Which files xbackend may overwrite or remove: the ones it wrote, by record, not by content.

Every file xbackend writes is listed, with its sha256, in its folder's ledger
(`.xbackend-files.json`). The ledger is sealed with a key of this user's own (made once, mode
0600, in the user's state folder, never in an output folder): a ledger whose seal does not verify
(written by hand, copied from another folder, another user's, an older xbackend's) vouches for
nothing, and xbackend neither trusts nor replaces it. An existing file is replaced or removed only
if the sealed ledger lists it with its current digest, it is owned by this user and its folder is
not writable by others; or the user passed `--force` for it. The check is made before a run and
again at the moment of writing, under a lock on the folder, on the very file that is replaced: the
new file is exchanged with the old one in one step (renameat2's RENAME_EXCHANGE), and the old one,
now beside it, is checked; if it changed meanwhile it is put back.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import hashlib
import hmac
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from xbackend.errors import UsageError
from xbackend.files.ledger_key import ledger_key, seal, shared_folder

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
    "place_all",
    "recorded",
    "refusal",
    "replace_tree",
    "reset",
    "synced_temp",
]

LEDGER = ".xbackend-files.json"
_SCHEMA = "xbackend.files/2"
_LEDGER_LIMIT = 16 << 20  # a ledger lists names and digests: larger is not one of ours
_FORCED: set[Path] = set()  # files the user named with --force in this command


def _key(path: Path) -> Path:
    try:
        return path.parent.resolve() / path.name
    except (OSError, RuntimeError):
        return path.absolute()


def allow(paths: Iterable[str | os.PathLike[str] | None]) -> None:
    """`--force`: these files may be replaced whoever wrote them (never through a link)."""
    _FORCED.update(_key(Path(path)) for path in paths if path)


def reset() -> None:
    """A new command: nothing forced yet (the CLI's commands may run in one process)."""
    _FORCED.clear()


def forced(path: Path) -> bool:
    """The user forced `path`, or a folder it is in (`sweep -o DIR --force`)."""
    k = _key(path)
    return k in _FORCED or any(parent in _FORCED for parent in k.parents)


def file_digest(path: Path) -> str:
    """sha256 of a regular file, read without following a link or waiting on a pipe."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


# --- the ledger ----------------------------------------------------------------------------------


def _ledger_json(path: Path) -> object:
    """What a ledger file of this user's holds, parsed (None where it is not a regular file of this
    user's within the limit, or not JSON); read without following a link or waiting on a pipe."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _LEDGER_LIMIT or st.st_uid != os.geteuid():
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as handle:
            return json.loads(handle.read(_LEDGER_LIMIT + 1))
    except (OSError, ValueError, RecursionError):
        return None


def _load_ledger(folder: Path) -> dict[str, str] | None:
    """The folder's ledger ({} where there is none), or None: a file of that name this user's
    xbackend did not seal (someone's, a link, a copy, damaged, an older xbackend's), which xbackend
    neither trusts nor replaces."""
    path = folder / LEDGER
    if not os.path.lexists(path):
        return {}
    key = ledger_key(create=False)
    data = _ledger_json(path) if key is not None else None
    if not isinstance(data, dict) or data.get("schema") != _SCHEMA or not isinstance(data.get("files"), dict):
        return None
    files = data["files"]
    if not all(
        isinstance(key, str) and isinstance(file, str) and "/" not in key for key, file in files.items()
    ):
        return None
    given = data.get("seal")
    if key is None or not isinstance(given, str) or not hmac.compare_digest(given, seal(key, folder, files)):
        return None
    return dict(files)


def _read_ledger(folder: Path) -> dict[str, str]:
    """What the folder's ledger vouches for (nothing, where it has none or it is not sealed)."""
    return _load_ledger(folder) or {}


def _ledger_to_update(folder: Path) -> dict[str, str]:
    """The ledger about to be rewritten: its sealed entries. An unsealed ledger of this user's (an
    older xbackend's, a copy, one edited by hand) vouches for nothing and is rewritten with what
    this run writes; another user's, or a file of its name that is no ledger, is refused (never
    replaced)."""
    files = _load_ledger(folder)
    if files is not None:
        return files
    if _unsealed_of_ours(folder / LEDGER):
        return {}
    raise UsageError(
        f"{folder / LEDGER} is not a ledger this user's xbackend can vouch for (another user's, or not a "
        "ledger): xbackend never replaces it; move it away, or write into another folder"
    )


def _unsealed_of_ours(path: Path) -> bool:
    """`path` is a ledger in xbackend's format (any version) that this user owns, in a folder
    others cannot write."""
    data = _ledger_json(path)
    schema = data.get("schema") if isinstance(data, dict) else None
    return isinstance(schema, str) and schema.startswith("xbackend.files/") and not shared_folder(path.parent)


def _stage_ledger(folder: Path, files: dict[str, str]) -> Path:
    """The folder's new ledger in a temp file beside it (compact, sealed), refused past its limit
    before anything is placed."""
    key = ledger_key(create=True)
    assert key is not None
    entries = dict(sorted(files.items()))
    body = json.dumps(
        {"schema": _SCHEMA, "files": entries, "seal": seal(key, folder, entries)}, separators=(",", ":")
    )
    data = body.encode("utf-8", "surrogateescape") + b"\n"
    if len(data) > _LEDGER_LIMIT:
        raise UsageError(
            f"the ledger of {folder} would pass its {_LEDGER_LIMIT:,} bytes ({len(entries)} files): "
            "nothing was written; write into another folder"
        )
    return synced_temp(folder / LEDGER, data)


def _write_ledger(folder: Path, files: dict[str, str]) -> None:
    tmp = _stage_ledger(folder, files)
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
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
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


def is_ours(path: Path) -> bool:
    """`path` is xbackend's to replace: its folder's sealed ledger lists it unchanged, it is this
    user's, and its folder is not writable by others."""
    return _unchanged(path, _read_ledger(path.parent).get(path.name)) and not shared_folder(path.parent)


def _unchanged(path: Path, digest: str | None) -> bool:
    """`path` is a regular file of this user's (not a link) whose sha256 is `digest`."""
    if digest is None:
        return False
    try:
        return os.lstat(path).st_uid == os.geteuid() and file_digest(path) == digest
    except OSError:  # a link (O_NOFOLLOW), gone, unreadable
        return False


def recorded(folder: Path) -> bool:
    """xbackend has written into `folder` (its sealed ledger lists a file)."""
    return bool(_read_ledger(folder))


def refusal(flag: str, path: Path) -> str:
    """The one line for an existing file that is not xbackend's to replace."""
    if shared_folder(path.parent) and _unchanged(path, _read_ledger(path.parent).get(path.name)):
        return (
            f"{flag} {path} exists in a folder others may write ({path.parent}), so xbackend cannot tell it "
            "is "
            "still the file it wrote; it never overwrites it there: choose another path, or pass --force "
            "to replace it"
        )
    return (
        f"{flag} {path} exists and xbackend did not write it (or it changed since); xbackend never "
        "overwrites it: choose another path, or pass --force to replace it"
    )


def claim(path: Path, digest: str) -> None:
    """Record `path` (just written, with `digest`) as xbackend's."""
    with locked(path.parent):
        files = _ledger_to_update(path.parent)
        files[path.name] = digest
        _write_ledger(path.parent, files)


def forget(folder: Path, names: Iterable[str]) -> None:
    """Files xbackend removed: no longer listed."""
    gone = set(names)
    with locked(folder):
        files = _ledger_to_update(folder)
        if gone & set(files):
            _write_ledger(folder, {key: file for key, file in files.items() if key not in gone})


def may_place(dest: Path, what: str, force: bool = False) -> dict[str, str]:
    """`dest` may take a file now: new, or xbackend's unchanged file, or forced; else a UsageError.
    Returns its folder's ledger (read once), to be updated when the file is placed."""
    files = _ledger_to_update(dest.parent)  # before anything is placed: a file is never left unrecorded
    _may_take(dest, files, what, force)
    return files


def _may_take(dest: Path, files: dict[str, str], what: str, force: bool) -> None:
    """`dest` may take a file now, by its folder's ledger `files`; else a UsageError."""
    if not os.path.lexists(dest):
        return
    if dest.is_symlink() or not dest.is_file():
        raise UsageError(f"cannot write {what} {dest}: it is now a link or not a file; choose another path")
    ours = _unchanged(dest, files.get(dest.name)) and not shared_folder(dest.parent)
    if not (force or forced(dest) or ours):
        msg = refusal(f"the {what}", dest).replace("exists and", "appeared while xbackend ran and")
        raise UsageError(msg)


# --- placing files: the check on the file that is actually replaced -------------------------------

_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Linux's renameat2(2); False where this system or file system does not offer `flags`."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def _exchange(path: Path, b: Path) -> bool:
    """Swap the files at `path` and `b` in one step (False: not offered here)."""
    return _renameat2(path, b, _RENAME_EXCHANGE)


def _appeared(what: str, dest: Path) -> UsageError:
    return UsageError(
        f"the {what} {dest} appeared while xbackend ran; xbackend never overwrites it: choose another path"
    )


def _changed(what: str, dest: Path) -> UsageError:
    return UsageError(
        f"the {what} {dest} changed while xbackend wrote it; xbackend never overwrites it: it was left as "
        "it is; choose another path, or pass --force"
    )


def _install_new(tmp: Path, dest: Path, what: str) -> None:
    """`tmp` at `dest`, where nothing is: a file made there meanwhile is never replaced."""
    try:
        os.link(tmp, dest)  # fails if a file appeared there: nothing is replaced
    except FileExistsError:
        raise _appeared(what, dest) from None
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
            raise
        try:  # a file system without hard links
            if not _renameat2(tmp, dest, _RENAME_NOREPLACE):
                os.replace(tmp, dest)
        except FileExistsError:
            raise _appeared(what, dest) from None
    else:
        os.unlink(tmp)


def _install_over(tmp: Path, dest: Path, digest: str | None, what: str) -> Path:
    """`tmp` in place of the file at `dest`, which must be the one whose sha256 is `digest` (None:
    forced, any file) at the moment it is replaced. Returns where the replaced file now is (removed
    once every file is placed; put back if a later one fails)."""
    if _exchange(tmp, dest):
        if digest is not None and not _unchanged(tmp, digest):
            _exchange(tmp, dest)  # someone's edit: put back as it is now
            raise _changed(what, dest)
        return tmp
    aside = Path(tempfile.mkstemp(prefix=f".{dest.name[:200]}.", suffix=".old", dir=dest.parent)[1])
    os.replace(dest, aside)  # no exchange here: the file is moved aside, checked, then replaced
    if digest is not None and not _unchanged(aside, digest):
        with contextlib.suppress(FileExistsError):
            os.link(aside, dest)
            os.unlink(aside)
        raise _changed(what, dest)
    try:
        _install_new(tmp, dest, what)
    except BaseException:
        with contextlib.suppress(OSError):
            os.link(aside, dest)
            os.unlink(aside)
        raise
    return aside


def _undo(dest: Path, replaced: Path | None) -> None:
    """A placed file taken back (a later one of the same batch failed)."""
    with contextlib.suppress(OSError):
        if replaced is None:
            os.unlink(dest)
        elif not _exchange(replaced, dest):
            os.replace(replaced, dest)


def place_all(items: Sequence[tuple[Path, Path, str]], what: str, force: bool = False) -> None:
    """Move each finished temp file to its destination, (tmp, dest, sha256), and record them: all or
    none. Each destination is new (then a file made there meanwhile is never replaced), or
    xbackend's unchanged file at the moment it is replaced, or one the user forced. Every folder's
    new ledger is staged (and its size checked) before the first file is placed."""
    where = {dest: Path(os.path.realpath(dest.parent)) for _, dest, _ in items}
    folders = sorted(set(where.values()), key=str)  # each locked once (flock binds per open file)
    with contextlib.ExitStack() as stack:
        for folder in folders:
            stack.enter_context(locked(folder))
        ledgers = {folder: _ledger_to_update(folder) for folder in folders}  # each read once
        for _, dest, _ in items:
            _may_take(dest, ledgers[where[dest]], what, force)
        expected: dict[Path, str | None] = {}
        for _, dest, digest in items:
            listed = ledgers[where[dest]].get(dest.name)
            expected[dest] = None if (force or forced(dest)) else listed
            ledgers[where[dest]][dest.name] = digest
        staged = {folder: _stage_ledger(folder, files) for folder, files in ledgers.items()}
        placed: list[tuple[Path, Path | None]] = []
        try:
            for tmp, dest, _ in items:
                if os.path.lexists(dest):
                    placed.append((dest, _install_over(tmp, dest, expected[dest], what)))
                else:
                    _install_new(tmp, dest, what)
                    placed.append((dest, None))
            for folder, ledger_tmp in staged.items():
                os.replace(ledger_tmp, folder / LEDGER)
        except BaseException:
            for dest, replaced in reversed(placed):
                _undo(dest, replaced)
            raise
        finally:
            for ledger_tmp in staged.values():
                with contextlib.suppress(OSError):
                    os.unlink(ledger_tmp)
        for _, replaced in placed:
            if replaced is not None:
                with contextlib.suppress(OSError):
                    os.unlink(replaced)


def place(tmp: Path, dest: Path, digest: str, what: str, force: bool = False) -> None:
    """Move the finished temp file `tmp` to `dest` and record it (place_all for one file)."""
    place_all([(tmp, dest, digest)], what, force)


# --- folders -------------------------------------------------------------------------------------


def foreign(folder: Path, limit: int = 10_000) -> list[Path]:
    """Everything under `folder` xbackend did not write or that changed since (links, pipes and
    folders of someone's too, a ledger it did not seal), its own ledgers aside: what replacing or
    removing the folder would destroy. At most `limit` entries are looked at; past that, the folder
    is someone's."""
    out: list[Path] = []
    seen = 0
    for root, dirs, names in os.walk(folder, followlinks=False):
        here = Path(root)
        listed = _load_ledger(here)
        shared = shared_folder(here)
        for d in list(dirs):
            if (here / d).is_symlink():
                out.append(here / d)
                dirs.remove(d)
        for name in names:
            seen += 1
            if seen > limit:
                return [*out, here / name]
            if name == LEDGER and listed is not None:  # the ledger itself, when it is one of ours
                continue
            if shared or not _unchanged(here / name, (listed or {}).get(name)):
                out.append(here / name)
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
        for path in folder.parent.glob(f".{glob.escape(folder.name[:100])}.*.partial"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
