"""Portable captures: one backend's run on one host, in a folder that travels to another.

A capture folder holds:

    capture.json   manifest: format, backend result (determinism, fingerprints, info),
                   model identity, inputs, phases, environment
    inputs.xbv     the feeds, bit for bit
    outputs.xbv    graph outputs of the plain build (build 0, run 0)
    layers.xbv     every captured tensor of the instrumented build, when it ran
    SHA256SUMS     sha256 of every file above (`sha256sum -c SHA256SUMS` checks it too)

Value files keep every dtype bit for bit (see xbackend.storage). Loading checks the
format version and every checksum before anything is compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from xbackend.codec import CodecError, decode, encode
from xbackend.errors import InputError
from xbackend.protocol import LAYERS, OUTPUTS, PhaseResult
from xbackend.report.write import write_atomic, write_atomic_bytes
from xbackend.runners.base import BuildFingerprint

__all__ = [
    "FORMAT",
    "LoadedCapture",
    "is_capture",
    "load_capture",
    "write_capture",
]

FORMAT = "xbackend.capture/1"
MANIFEST = "capture.json"
SUMS = "SHA256SUMS"
INPUTS = "inputs.xbv"
_FILES = {OUTPUTS: "outputs.xbv", LAYERS: "layers.xbv"}


def is_capture(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / MANIFEST).is_file()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _phase_record(ph: PhaseResult, file: str) -> dict[str, Any]:
    return {
        "name": ph.name,
        "file": file,
        "capture_names": list(ph.capture_names),
        "not_exposed": [list(x) for x in ph.not_exposed],
        "serves_outputs": ph.serves_outputs,
        "fingerprint": encode(ph.fingerprint),
    }


def write_capture(
    dest: str | os.PathLike[str],
    backend: Any,
    model: Mapping[str, Any],
    feeds: Any,
    feeds_path: Path,
    phases: Mapping[str, PhaseResult],
    environment: Mapping[str, str],
    version: str,
) -> Path:
    """Write a capture folder at `dest`: values first, manifest, then the checksum list last, so
    a folder without SHA256SUMS is an interrupted write and is refused on load."""
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMS).unlink(missing_ok=True)
    files = {INPUTS: feeds_path}
    records = []
    for name, ph in phases.items():
        files[_FILES[name]] = Path(ph.capture)
        records.append(_phase_record(ph, _FILES[name]))
    for stale in set(_FILES.values()) - set(files):
        (out / stale).unlink(missing_ok=True)
    for name, src in files.items():
        tmp = out / f".{name}.tmp"
        shutil.copyfile(src, tmp)
        os.replace(tmp, out / name)
    manifest = {
        "format": FORMAT,
        "xbackend": version,
        "backend": encode(backend, times=False),
        "model": dict(model),
        "inputs": encode(feeds),
        "phases": records,
        "environment": dict(environment),
        "files": {n: (out / n).stat().st_size for n in sorted(files)},
    }
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n", "capture manifest")
    sums = "".join(f"{_sha256(out / n)}  {n}\n" for n in sorted([*files, MANIFEST]))
    write_atomic_bytes(out / SUMS, sums.encode(), "capture checksums")
    return out


@dataclass(frozen=True)
class LoadedRun:
    """A capture standing in for a build's first run (what cross-backend comparisons read)."""

    outputs: PhaseResult
    layers: PhaseResult | None

    @property
    def separate_layers(self) -> bool:
        return self.layers is not None and not self.layers.serves_outputs


@dataclass(frozen=True)
class LoadedCapture:
    path: Path
    name: str  # the name it takes in a comparison
    backend: Any  # xbackend.results.BackendResult, as recorded
    model_sha256: str
    model_name: str
    feeds: Any  # xbackend.results.FeedsInfo, as recorded
    inputs_path: Path
    run: LoadedRun
    environment: tuple[tuple[str, str], ...]
    xbackend_version: str


def _bad(path: Path, what: str) -> InputError:
    return InputError(
        f"capture {path} {what}; capture it again with `xbackend capture MODEL --backend NAME -o {path}`"
    )


def _manifest(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise InputError(f"capture {path} not found; pass a folder written by `xbackend capture`")
    if not (path / MANIFEST).is_file():
        raise InputError(
            f"{path} is not an xbackend capture (no {MANIFEST}); pass a folder written by `xbackend capture`"
        )
    try:
        manifest = json.loads((path / MANIFEST).read_text("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(path, f"has a damaged {MANIFEST} ({type(e).__name__})") from e
    if not isinstance(manifest, dict):
        raise _bad(path, f"has a damaged {MANIFEST} (not an object)")
    fmt = manifest.get("format")
    if fmt != FORMAT:
        raise InputError(
            f"capture {path} has format {fmt!r}; this xbackend reads {FORMAT!r}: load it with the "
            f"xbackend version that wrote it ({manifest.get('xbackend', '?')}), or capture again"
        )
    return dict(manifest)


def _verify(path: Path) -> dict[str, Any]:
    manifest = _manifest(path)
    if not (path / SUMS).is_file():
        raise _bad(path, f"has no {SUMS} (its write was interrupted)")
    sums = {}
    for line in (path / SUMS).read_text("utf-8").splitlines():
        digest, _, name = line.partition("  ")
        sums[name] = digest
    for name, size in sorted(manifest.get("files", {}).items()):
        f = path / name
        if not f.is_file():
            raise _bad(path, f"lacks {name}")
        if f.stat().st_size != size:
            raise _bad(path, f"is truncated: {name} has {f.stat().st_size} bytes, the manifest says {size}")
    for name in sorted({*manifest.get("files", {}), MANIFEST}):
        if sums.get(name) != _sha256(path / name):
            raise _bad(path, f"was modified: {name} does not match its sha256 in {SUMS}")
    return dict(manifest)


def _phase(path: Path, rec: Mapping[str, Any]) -> PhaseResult:
    return PhaseResult(
        name=str(rec["name"]),
        capture=str(path / str(rec["file"])),
        capture_names=tuple(rec["capture_names"]),
        output_hashes=(),
        capture_hashes=(),
        run_diffs=(),
        prepare_s=0.0,
        run_s=(),
        fingerprint=decode(BuildFingerprint, rec["fingerprint"]),
        not_exposed=tuple((str(a), str(b)) for a, b in rec["not_exposed"]),
        serves_outputs=bool(rec["serves_outputs"]),
    )


def recorded_name(path: str | os.PathLike[str]) -> str:
    """The backend the capture ran, read from the manifest (fully checked later, by load_capture)."""
    p = Path(path)
    m = _manifest(p)
    backend = m.get("backend", {}).get("name") if isinstance(m.get("backend"), dict) else None
    if not isinstance(backend, str):
        raise _bad(p, "has a manifest without a backend name")
    return backend


def default_name(path: str | os.PathLike[str]) -> str:
    """BACKEND@FOLDER: what a loaded capture is called unless named."""
    return f"{recorded_name(path)}@{Path(path).resolve().name}"


def load_capture(path: str | os.PathLike[str], name: str | None = None) -> LoadedCapture:
    """Check and open a capture folder; `name` defaults to BACKEND@FOLDER."""
    from xbackend.results import BackendResult, FeedsInfo

    p = Path(path)
    m = _verify(p)
    try:
        backend = decode(BackendResult, m["backend"], "backend")
        feeds = decode(FeedsInfo, m["inputs"], "inputs")
        phases = {str(r["name"]): _phase(p, r) for r in m["phases"]}
        model = m["model"]
        env = tuple(sorted((str(k), str(v)) for k, v in m["environment"].items()))
    except (CodecError, KeyError, TypeError, ValueError) as e:
        raise _bad(p, f"has a manifest this xbackend cannot read ({e})") from e
    outputs = phases.get(OUTPUTS) or phases.get(LAYERS)
    if outputs is None:
        raise _bad(p, "holds no graph outputs")
    label = name or f"{backend.name}@{p.resolve().name}"
    if backend.status != "ok":
        raise _bad(p, f"records a backend that {backend.status}: {backend.reason}")
    return LoadedCapture(
        path=p,
        name=label,
        backend=replace(backend, name=label),
        model_sha256=str(model["sha256"]),
        model_name=str(model["name"]),
        feeds=feeds,
        inputs_path=p / INPUTS,
        run=LoadedRun(outputs, phases.get(LAYERS)),
        environment=env,
        xbackend_version=str(m.get("xbackend", "")),
    )
