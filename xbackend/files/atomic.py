"""Atomic writes: a reader never sees half a file (reports, captures, pins, engines)."""

from __future__ import annotations

import base64
import contextlib
import glob
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from xbackend.errors import ReportError, UsageError

__all__ = [
    "NPZ_MARK",
    "check_export_output",
    "check_outputs",
    "exported_by_us",
    "takes_files",
    "write_atomic",
    "write_atomic_bytes",
]

# how a Markdown file xbackend wrote begins, or what a JSON report's last bytes hold (its keys
# sorted, "schema" comes after the large "result")
_HEADS = (
    b"# xbackend report",
    b"# xbackend diff: ",
    b"# Determinism certificate: ",
    b"comparison,position,tensor,module,op,",  # a report's layer table (STEM.layers.csv)
)
# a report's figure: a PNG whose Software text chunk (before the image data) names xbackend
_PNG, _PNG_MARK = b"\x89PNG\r\n\x1a\n", b"tEXtSoftware\x00xbackend"
_PNG_EARLIER = b'tEXtDescription\x00{"series": ['  # a figure from before the mark: its series legend
_TAIL = b'"schema": "xbackend.report/'
_CERTIFICATE = "https://xbackend.dev/attestation/certificate/"
_MODEL_SIGNING = "https://model_signing/signature/v1.0"
# the array `capture export` adds to its .npz: its name is in the zip's directory, at the end
NPZ_MARK = "xbackend.capture-export"


def _written_by_us(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            head = f.read(1 << 12)
            size = p.stat().st_size
            f.seek(max(0, size - (1 << 16)))
            tail = f.read()
    except OSError:
        return False
    ours = _TAIL in tail or (head.startswith(b"PK") and NPZ_MARK.encode() + b".npy" in tail)
    ours = ours or (head.startswith(_PNG) and (_PNG_MARK in head or _PNG_EARLIER in head))
    return head.startswith(_HEADS) or ours or (size < (1 << 24) and _is_certificate(p))


def _is_certificate(p: Path) -> bool:
    """A certificate xbackend wrote: an in-toto Statement of ours, bare or signed in a bundle."""
    try:
        data = json.loads(p.read_bytes())
        if isinstance(data, dict) and isinstance(data.get("dsseEnvelope"), dict):
            data = json.loads(base64.b64decode(data["dsseEnvelope"].get("payload", "")))
        kind = str(data.get("predicateType", "")) if isinstance(data, dict) else ""
        # certify --key writes STEM.model.sig beside the certificate, in model-signing's format
        return kind.startswith(_CERTIFICATE) or (kind == _MODEL_SIGNING and p.name.endswith(".model.sig"))
    except (OSError, ValueError, RecursionError):
        return False


def check_outputs(
    outputs: Sequence[tuple[str, str | os.PathLike[str] | None]],
    inputs: Sequence[str | os.PathLike[str] | None] = (),
    ours: Callable[[Path], bool] | None = None,
) -> None:
    """Before anything runs: each output (flag, path) can be written and destroys nothing. It is
    not a folder, a link or a device, not the same file as another output, and, if it exists, a
    file xbackend wrote (never a model, an input or someone's notes); its folder takes a new
    regular file. A UsageError, one line, names the flag and what to do. Every file a command
    writes passes here: a report's companions too (its table and figures: see
    xbackend.report.bundle.bundle_outputs)."""
    seen: dict[Path, str] = {}
    read = {Path(i).resolve() for i in inputs if i}
    for flag, path in outputs:
        if not path:
            continue
        p = Path(path)
        key = p.resolve()
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
        if p.exists() and not (ours or _written_by_us)(p):
            raise UsageError(
                f"{flag} {p} exists and is not a report xbackend wrote; xbackend never overwrites it: "
                "choose another path (or move that file away yourself)"
            )
        folder = next((a for a in (p.parent, *p.parent.parents) if a.exists()), Path("."))
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK) or not takes_files(folder):
            raise UsageError(
                f"{flag} {p} cannot be written: {folder} is not a writable folder; choose another path"
            )


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


def write_atomic(path: str | os.PathLike[str], text: str, what: str = "report") -> None:
    """Write `text` (UTF-8) to a temp file beside `path`, fsync, then rename over it."""
    write_atomic_bytes(path, text.encode("utf-8"), what)


def write_atomic_bytes(path: str | os.PathLike[str], data: bytes, what: str = "report") -> None:
    """Write `data` to a temp file beside `path`, fsync, then rename over it; errors name the
    file as `what`."""
    p = Path(path)
    if p.is_symlink():  # made since the check before the run: never written through
        raise ReportError(f"cannot write {what} {p}: it is a symbolic link; choose another path")
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


def exported_by_us(p: Path) -> bool:
    """An ONNX file `xbackend export` wrote: its metadata records the module it came from."""
    import onnx  # heavy: only when an export's output already exists

    try:
        if p.stat().st_size > 1 << 31:  # an export past 2 GiB keeps its weights beside it
            return False
        proto = onnx.load_model(str(p), load_external_data=False)
    except Exception:  # not a model: someone's file
        return False
    return any(m.key == "xbackend.torch.module" for m in proto.metadata_props)


def check_export_output(output: str | os.PathLike[str], module: str, inputs: str | None) -> None:
    """`export torch -o OUT.onnx`, before the module is loaded: OUT and the weights files beside it
    (OUT.data, OUT.data0, ...) are new, or an earlier export's; never the module's own file, the
    example inputs, a pipe or someone's file."""
    target = module.rpartition(":")[0]
    read = [x for x in (target if target.endswith(".py") else None, inputs) if x]
    out = Path(output)
    beside = sorted(out.parent.glob(glob.escape(out.name) + ".data*")) if out.parent.is_dir() else []
    previous = out.is_file() and not out.is_symlink() and exported_by_us(out)
    check_outputs(
        [("-o", out), *((f"-o {out}'s weights", b) for b in beside)],
        read,
        ours=lambda f: previous,
    )
