"""The key that seals this user's ledgers (xbackend.files.owned): 32 random bytes, made once, mode
0600 in a 0700 folder of the user's state folder, never in an output folder; and the seal it makes
over a ledger's entries and its folder's identity."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import stat
import tempfile
from pathlib import Path

from xbackend.errors import UsageError

__all__ = ["key_file", "ledger_key", "seal", "shared_folder"]

_KEY_BYTES = 32
_KEYS: dict[Path, bytes] = {}  # the key, read once per process (by its path)


def key_file() -> Path:
    """Where this user's ledger key lives: $XDG_STATE_HOME/xbackend/ledger.key (~/.local/state)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "xbackend" / "ledger.key"


def shared_folder(folder: Path | str) -> bool:
    """Others may write into `folder`: anyone (o+w), or a group that is not this user's own."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    return bool(st.st_mode & stat.S_IWOTH) or bool(st.st_mode & stat.S_IWGRP and st.st_gid != os.getegid())


def _key_problem(path: Path, st: os.stat_result) -> str:
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not this user"
    if st.st_mode & 0o077:
        return f"mode {stat.S_IMODE(st.st_mode):04o}, readable by others"
    if st.st_size != _KEY_BYTES:
        return f"{st.st_size} bytes, not {_KEY_BYTES}"
    if shared_folder(path.parent):
        return f"its folder {path.parent} is writable by others"
    return ""


def ledger_key(create: bool) -> bytes | None:
    """This user's key (made once where `create`); None where there is none yet."""
    path = key_file()
    if path in _KEYS:
        return _KEYS[path]
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
        _make_key(path)
        st = os.lstat(path)
    except OSError as error:
        raise UsageError(
            f"cannot read xbackend's ledger key {path} ({error.strerror}); set XDG_STATE_HOME"
        ) from None
    bad = _key_problem(path, st)
    if bad:
        raise UsageError(
            f"xbackend's ledger key {path} is {bad}: remove it (xbackend makes a new one; what the old one "
            "sealed then needs --force once)"
        )
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        _KEYS[path] = os.read(fd, _KEY_BYTES + 1)
    finally:
        os.close(fd)
    return _KEYS[path]


def _make_key(path: Path) -> None:
    """A new random key, mode 0600, placed only if none is there (two first runs make one key)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".ledger.key.", dir=path.parent)
        try:
            os.write(fd, os.urandom(_KEY_BYTES))
            os.fsync(fd)
            os.close(fd)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    except OSError as error:
        raise UsageError(
            f"cannot make xbackend's ledger key {path} ({error.strerror}); set XDG_STATE_HOME to a folder of "
            "yours"
        ) from None


def seal(key: bytes, folder: Path, files: dict[str, str]) -> str:
    """The ledger's seal over its entries and its folder's identity (the folder's inode, which a
    move keeps: a copy in another folder vouches for nothing)."""
    try:
        identity = os.stat(folder).st_ino
    except OSError:
        identity = -1
    body = json.dumps([identity, sorted(files.items())], separators=(",", ":"))
    return hmac.new(key, body.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()
