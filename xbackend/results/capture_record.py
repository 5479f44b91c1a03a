"""Portable captures: one backend's run on one host, in a folder that travels to another.

The folder's layout, checksums and manifest are `xbackend.files.capture_folder`'s; this module writes
a backend's result and phases into one, and reads them back typed (BackendResult, FeedsInfo,
build fingerprints) once every checksum matched. Value files keep every dtype bit for bit
(see xbackend.files.storage).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from xbackend.execution.protocol import LAYERS, OUTPUTS, PhaseResult
from xbackend.files.capture_folder import INPUTS, CapturedInputs, bad_capture, verify_folder, write_folder
from xbackend.files.codec import CodecError, decode, encode
from xbackend.files.storage import ValueFile
from xbackend.numerics.values import walk
from xbackend.results import BackendResult, FeedsInfo
from xbackend.runners.buildinfo import BuildFingerprint

__all__ = ["LoadedCapture", "LoadedRun", "load_capture", "open_capture", "write_capture"]

_FILES = {OUTPUTS: "outputs.xbv", LAYERS: "layers.xbv"}


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
    backend: BackendResult,
    model: Mapping[str, Any],
    feeds: FeedsInfo,
    feeds_path: Path,
    phases: Mapping[str, PhaseResult],
    environment: Mapping[str, str],
    version: str,
) -> Path:
    """Write a capture folder at `dest` (values, manifest, checksums last)."""
    files = {INPUTS: feeds_path, **{_FILES[name]: Path(ph.capture) for name, ph in phases.items()}}
    manifest = {
        "xbackend": version,
        "backend": encode(backend, times=False),
        "model": dict(model),
        "inputs": encode(feeds),
        "phases": [_phase_record(ph, _FILES[name]) for name, ph in phases.items()],
        "environment": dict(environment),
    }
    return write_folder(dest, files, manifest)


@dataclass(frozen=True)
class LoadedRun:
    """A capture standing in for a build's first run (what cross-backend comparisons read)."""

    outputs: PhaseResult
    layers: PhaseResult | None

    @property
    def separate_layers(self) -> bool:
        """Whether the capture's layers came from a build of their own."""
        return self.layers is not None and not self.layers.serves_outputs


@dataclass(frozen=True)
class LoadedCapture:
    path: Path
    name: str  # the name it takes in a comparison
    backend: BackendResult  # as recorded
    model_sha256: str
    model_name: str
    feeds: FeedsInfo  # as recorded
    run: LoadedRun
    environment: tuple[tuple[str, str], ...]
    xbackend_version: str
    outputs: tuple[str, ...] = ()  # the model's graph outputs (captures from before 0.x: unknown)

    @property
    def inputs_path(self) -> Path:
        """The capture's inputs file."""
        return self.path / INPUTS

    @property
    def inputs(self) -> CapturedInputs:
        """The inputs the capture was made with (their file, seed and ranges)."""
        return CapturedInputs(self.path, self.inputs_path, self.feeds.seed, self.feeds.ranges)


def _phase(path: Path, rec: Mapping[str, Any], listed: Mapping[str, Any]) -> PhaseResult:
    if rec["file"] not in listed:  # only files the checksums cover, all inside the folder
        raise bad_capture(
            path, f"has a phase reading {str(rec['file'])[:80]!r}, which its manifest does not list"
        )
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


def open_capture(path: str | os.PathLike[str], name: str | None = None) -> LoadedCapture:
    """Check and open a capture folder; `name` defaults to BACKEND@FOLDER."""
    p = Path(path)
    m = verify_folder(p)
    try:
        backend = decode(BackendResult, m["backend"], "backend")
        feeds = decode(FeedsInfo, m["inputs"], "inputs")
        phases = {str(phase["name"]): _phase(p, phase, m["files"]) for phase in m["phases"]}
        model = m["model"]
        model_sha256, model_name = str(model["sha256"]), str(model["name"])
        graph_outputs = tuple(str(n) for n in model.get("outputs", ()))
        env = tuple(sorted((str(key), str(value)) for key, value in m["environment"].items()))
    except (CodecError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise bad_capture(
            p, f"has a manifest this xbackend cannot read ({type(error).__name__}: {str(error)[:120]})"
        ) from None
    outputs = phases.get(OUTPUTS) or phases.get(LAYERS)
    if outputs is None:
        raise bad_capture(p, "holds no graph outputs")
    label = name or f"{backend.name}@{p.resolve().name}"
    if backend.status != "ok":
        raise bad_capture(p, f"records a backend that {backend.status}: {backend.reason}")
    return LoadedCapture(
        path=p,
        name=label,
        backend=replace(backend, name=label),
        model_sha256=model_sha256,
        model_name=model_name,
        feeds=feeds,
        run=LoadedRun(outputs, phases.get(LAYERS)),
        environment=env,
        xbackend_version=str(m.get("xbackend", "")),
        outputs=graph_outputs,
    )


def load_capture(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """A capture folder's values as numpy arrays, after its checksums are checked:
    `inputs/NAME` (the feeds), `outputs/NAME` (the plain build's graph outputs) and `layers/NAME`
    (every tensor the instrumented build captured, when it ran). A sequence or map gives one
    array per element (`NAME[0]`, `NAME{'key'}`); an empty optional gives none."""
    cap = open_capture(path)
    out: dict[str, np.ndarray] = {}
    outputs = cap.run.outputs
    files = [("inputs", cap.inputs_path, None), ("outputs", Path(outputs.capture), set(cap.outputs) or None)]
    if cap.run.layers is not None:
        files.append(("layers", Path(cap.run.layers.capture), None))
    for prefix, file, only in files:
        try:
            with ValueFile(str(file)) as value_file:
                values = value_file.load_all()
        except (ValueError, MemoryError, OSError) as error:  # checked, resealed and still damaged
            raise bad_capture(
                Path(path), f"has a damaged value file {file.name} ({str(error)[:160]})"
            ) from None
        for name, value in values.items():
            if only is not None and outputs.serves_outputs and prefix == "outputs" and name not in only:
                continue
            for where, v in walk(name, value):
                if isinstance(v, np.ndarray):
                    out[f"{prefix}/{where}"] = v
    return out
