"""Capture folders on disk: the portable format's files, checksums and manifest, untyped.

A capture folder holds:

    capture.json   manifest: format, backend result (determinism, fingerprints, info),
                   model identity, inputs, phases, environment
    inputs.xbv     the feeds, bit for bit
    outputs.xbv    graph outputs of the plain build (build 0, run 0)
    layers.xbv     every captured tensor of the instrumented build, when it ran
    SHA256SUMS     sha256 of every file above (`sha256sum -c SHA256SUMS` checks it too)

This module writes and checks the folder (format version, every checksum) and reads what
needs no result types: the backend's name and the inputs. `xbackend.results.capture_record` turns a
checked manifest into typed results.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xbackend.errors import InputError, UsageError
from xbackend.files.atomic import takes_files, write_atomic, write_atomic_bytes
from xbackend.files.owned import allow, forced, forget, is_ours, place, recorded, refusal
from xbackend.files.storage import ValueFile
from xbackend.files.untrusted import contained, json_loads
from xbackend.files.userfile import name_problem

__all__ = [
    "FORMAT",
    "INPUTS",
    "CapturedInputs",
    "bad_capture",
    "captured_inputs",
    "check_folder",
    "default_name",
    "file_sha256",
    "is_capture",
    "read_manifest",
    "recorded_name",
    "verify_folder",
    "write_folder",
]

FORMAT = "xbackend.capture/1"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+@-]*")  # a runner, a runner@label
MANIFEST = "capture.json"
SUMS = "SHA256SUMS"
INPUTS = "inputs.xbv"
WRITES = (INPUTS, "outputs.xbv", "layers.xbv")  # the value files a capture may write


def is_capture(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a capture folder (it holds a manifest)."""
    return (Path(path) / MANIFEST).is_file()


def file_sha256(path: Path) -> str:
    """A file's sha256, read in chunks (checksums of captures, digests of certified files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_folder(
    dest: str | os.PathLike[str], files: Mapping[str, Path], manifest: Mapping[str, Any]
) -> Path:
    """Copy `files` (name in the folder -> source) into `dest`, then the manifest, then the
    checksum list last, so a folder without SHA256SUMS is an interrupted write and is refused
    on load. Value files an earlier capture there listed and this one lacks are removed; no other
    file is touched, and a folder holding files xbackend did not write is refused (check_folder,
    again now)."""
    out = Path(dest)
    earlier = check_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    stale = [n for n in sorted({SUMS, *earlier} - set(files)) if is_ours(out / n)]
    for name in stale:
        (out / name).unlink(missing_ok=True)
    forget(out, stale)
    for name, src in files.items():
        # a temp name of this writer's own: two captures into one folder never write one file,
        # and a full disk leaves no part behind
        fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            shutil.copyfile(src, tmp)
            place(tmp, out / name, file_sha256(tmp), "capture file")
        finally:
            tmp.unlink(missing_ok=True)
    body = {
        **manifest,
        "format": FORMAT,
        "files": {file: (out / file).stat().st_size for file in sorted(files)},
    }
    write_atomic(out / MANIFEST, json.dumps(body, indent=2, sort_keys=True) + "\n", "capture manifest")
    sums = "".join(f"{file_sha256(out / n)}  {n}\n" for n in sorted([*files, MANIFEST]))
    write_atomic_bytes(out / SUMS, sums.encode(), "capture checksums")
    return out


def check_folder(out: Path, flag: str = "the capture folder", force: bool = False) -> set[str]:
    """Before a capture is written to `out`: it is missing, empty, or holds only files xbackend
    wrote and recorded, unchanged since (xbackend.files.owned), or the user forced it (--force).
    The value files an earlier capture there listed are returned: the only ones a new one may
    remove."""
    bad = name_problem(out)
    if bad:
        raise UsageError(f"{flag} {str(out)!a} {bad}")
    if force:
        allow([out])
    try:
        folder = next((a for a in (out, *out.parents) if os.path.lexists(a)), Path("."))
        out.resolve()
    except (OSError, RuntimeError):
        raise UsageError(
            f"{flag} {out} goes through a symbolic link loop or a path the system refuses; "
            "give another folder"
        ) from None
    if out.is_symlink() or (folder != out and folder.is_symlink() and not folder.exists()):
        raise UsageError(f"{flag} {out} is a symbolic link (or lies under a broken one); give a folder path")
    if folder != out and not folder.is_dir():
        raise UsageError(
            f"{flag} {out} lies under {folder}, which is a file, not a folder; give a folder path"
        )
    if folder.is_dir() and not takes_files(folder):  # read-only, immutable, /proc: before any run
        raise UsageError(f"{flag} {out} cannot be written: {folder} takes no new file; give another folder")
    if not out.exists():
        return set()
    if not out.is_dir():
        raise UsageError(
            f"{flag} {out} is a file; give a folder for the capture (xbackend never overwrites it)"
        )
    try:
        empty = not any(out.iterdir())
    except OSError as error:
        raise UsageError(f"{flag} {out} cannot be read ({error.strerror}); give another folder") from None
    if empty:
        return set()
    try:
        listed = json_loads((out / MANIFEST).read_text("utf-8")).get("files", {})
    except (OSError, ValueError, AttributeError):
        listed = {}
    ours = {n for n in listed if isinstance(n, str) and n == Path(n).name and n.endswith(".xbv")}
    if not forced(out):
        if not recorded(out):
            raise UsageError(
                f"{flag} {out} is a non-empty folder xbackend did not write; xbackend never writes into "
                "it: give a new or empty folder (or pass --force)"
            )
        for name in sorted({MANIFEST, SUMS, *WRITES, *ours}):  # what a capture replaces or removes
            p = out / name
            if os.path.lexists(p) and not is_ours(p):
                raise UsageError(refusal(flag, p))
    return {our for our in ours if (out / our).is_file() and not (out / our).is_symlink()}


def bad_capture(path: Path, what: str) -> InputError:
    """The error for a capture folder at `path` that `what` (is wrong), with the command that captures it
    again."""
    return InputError(
        f"capture {path} {what}; capture it again with `xbackend capture MODEL --backend NAME -o {path}`"
    )


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest, its format checked (checksums are verify_folder's)."""
    if not path.is_dir():
        raise InputError(f"capture {path} not found; pass a folder written by `xbackend capture`")
    if not (path / MANIFEST).is_file():
        raise InputError(
            f"{path} is not an xbackend capture (no {MANIFEST}); pass a folder written by `xbackend capture`"
        )
    try:
        manifest = json_loads((path / MANIFEST).read_text("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_capture(path, f"has a damaged {MANIFEST} ({type(error).__name__})") from error
    if not isinstance(manifest, dict):
        raise bad_capture(path, f"has a damaged {MANIFEST} (not an object)")
    fmt = manifest.get("format")
    if fmt != FORMAT:
        raise InputError(
            f"capture {path} has format {fmt!r}; this xbackend reads {FORMAT!r}: load it with the "
            f"xbackend version that wrote it ({manifest.get('xbackend', '?')}), or capture again"
        )
    return dict(manifest)


def verify_folder(path: Path) -> dict[str, Any]:
    """The manifest of a capture whose every file matches its size and sha256."""
    manifest = read_manifest(path)
    if not (path / SUMS).is_file():
        raise bad_capture(path, f"has no {SUMS} (its write was interrupted)")
    sums = {}
    try:
        for line in (path / SUMS).read_text("utf-8").splitlines():
            digest, _, name = line.partition("  ")
            sums[name] = digest
    except (OSError, UnicodeDecodeError) as error:
        raise bad_capture(path, f"has an unreadable {SUMS} ({type(error).__name__})") from None
    listed = manifest.get("files", {})
    if not isinstance(listed, dict) or not all(
        isinstance(key, str) and isinstance(value, int) and not isinstance(value, bool)
        for key, value in listed.items()
    ):
        raise bad_capture(path, f"has a damaged {MANIFEST} (files must map names to sizes)")
    fix = f"capture it again with `xbackend capture MODEL --backend NAME -o {path}`"
    for name, size in sorted(listed.items()):
        f = contained(path, name, f"capture {path}'s {MANIFEST}", fix)
        if not f.is_file():
            raise bad_capture(path, f"lacks {name}")
        if f.stat().st_size != size:
            size_now = f.stat().st_size
            raise bad_capture(path, f"is truncated: {name} has {size_now} bytes, the manifest says {size}")
    for name in sorted({*listed, MANIFEST}):
        if sums.get(name) != file_sha256(path / name):
            raise bad_capture(path, f"was modified: {name} does not match its sha256 in {SUMS}")
    for name in sorted(listed):
        if name.endswith(".xbv"):  # sums recomputed over a damaged file still match
            try:
                ValueFile(path / name).close()
            except ValueError as error:
                raise bad_capture(path, f"has a damaged value file {name} ({error})") from error
    return dict(manifest)


def recorded_name(path: str | os.PathLike[str]) -> str:
    """The backend the capture ran, read from the manifest (fully checked later, by open_capture)."""
    p = Path(path)
    m = read_manifest(p)
    backend = m.get("backend", {}).get("name") if isinstance(m.get("backend"), dict) else None
    if not isinstance(backend, str):
        raise bad_capture(p, "has a manifest without a backend name")
    if not NAME.fullmatch(backend):  # a name lands in report headings and tables
        raise bad_capture(p, f"records a backend name that is not a runner name ({backend[:60]!r})")
    return backend


def default_name(path: str | os.PathLike[str]) -> str:
    """BACKEND@FOLDER: what a loaded capture is called unless named (the folder's name with
    anything but letters, digits, '_', '.', '+' and '-' made '_')."""
    folder = re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(path).resolve().name).lstrip("._+-") or "capture"
    return f"{recorded_name(path)}@{folder}"


@dataclass(frozen=True)
class CapturedInputs:
    """A capture's inputs file and how its values were made (what --inputs CAPTURE feeds)."""

    folder: Path
    path: Path
    seed: int | None
    ranges: tuple[tuple[str, str], ...]


def captured_inputs(folder: str | os.PathLike[str]) -> CapturedInputs:
    """The inputs of a checked capture folder."""
    path = Path(folder)
    m = verify_folder(path)
    try:
        rec = m["inputs"]
        seed = rec["seed"]
        ranges = tuple((str(n), str(r)) for n, r in rec.get("ranges", ()))
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise bad_capture(
            path, f"has a manifest this xbackend cannot read ({type(error).__name__})"
        ) from None
    return CapturedInputs(path, path / INPUTS, seed if isinstance(seed, int) else None, ranges)
