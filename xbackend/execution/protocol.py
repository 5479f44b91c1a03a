"""What crosses the parent/worker process boundary: typed jobs and results with JSON round trips.

A worker gets a WorkerJob (one backend configuration) and writes a WorkerResult.
A job runs one or more phases, each a fresh engine build with its own tensors:
the "outputs" phase builds the plain model users ship and captures its graph
outputs; the "layers" phase builds the instrumented model (every intermediate
exposed) for the per-layer tables. Progress goes to stdout as tagged lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from xbackend.execution.decoding import DecodeTask, RowTrace
from xbackend.files.modelref import ModelRef
from xbackend.numerics.metrics import TensorDiff
from xbackend.runners.buildinfo import BuildFingerprint, OptLevelRow

__all__ = [
    "LAYERS",
    "OUTPUTS",
    "PROGRESS_TAG",
    "OptLevelRow",
    "Phase",
    "PhaseResult",
    "RunStatus",
    "WorkerJob",
    "WorkerResult",
]

PROGRESS_TAG = "xbackend-progress"
PARENT_ENV = "XBACKEND_PARENT_PID"  # the worker dies with the process that started it
OUTPUTS = "outputs"
LAYERS = "layers"

# how a backend's job ended: it ran, it failed, or the backend cannot take this model
RunStatus = Literal["ok", "failed", "unavailable"]


def _fingerprint(fp: Mapping[str, Any]) -> BuildFingerprint:
    return BuildFingerprint(str(fp["backend"]), str(fp["digest"]), tuple(map(tuple, fp["layers"])))


def diff_from_dict(d: Mapping[str, Any]) -> TensorDiff:
    """A TensorDiff from its JSON data."""
    x = dict(d)
    x["shape"] = tuple(x["shape"])
    return TensorDiff(**x)


@dataclass(frozen=True)
class Phase:
    """One engine build inside a job: the tensors it exposes, how often it runs, where run 0 goes.

    `extra_feeds` are (feeds file, capture file) pairs run once each after the main runs.
    `serves_outputs`: this phase's graph outputs stand for the plain model's (set when the
    engine computes the same with intermediates exposed, so no separate outputs phase runs).
    """

    name: str
    tensors: tuple[str, ...]
    runs: int
    capture: str
    extra_feeds: tuple[tuple[str, str], ...] = ()
    serves_outputs: bool = False
    # A model file prepared for this phase in xbackend's process (tensors exposed, IR lowered),
    # for a worker in another interpreter that has no onnx package; None: the job's model.
    model: ModelRef | None = None
    # --max-memory: the tensors cut into windows, each its own build and runs; () for one window
    windows: tuple[tuple[str, ...], ...] = ()
    # False: no other process reads this phase's capture beyond the graph outputs, so the rest
    # is compared run to run by digest and never written (a tensor that moves is measured apart)
    spill: bool = True
    # "spread": the extra feeds are other orders of a permuted model (xbackend.numerics.spread); each
    # is held against run 0 as it runs and one spread file, at the first extra's capture path,
    # stands for them all
    extras: str = "captures"
    # False: nothing reads this phase's digests (the explanation's one-run captures, read by
    # name): written without hashing each tensor
    hashed: bool = True

    @classmethod
    def planned(
        cls,
        name: str,
        tensors: Sequence[str],
        runs: int = 1,
        extra_feeds: Sequence[str | os.PathLike[str]] = (),
        serves_outputs: bool = False,
        model: ModelRef | None = None,
        windows: tuple[tuple[str, ...], ...] = (),
        spill: bool = True,
        extras: str = "captures",
        hashed: bool = True,
    ) -> Phase:
        """A phase as a job asks for it: its capture files are named where the job runs
        (`placed`); `extra_feeds` are feeds files."""
        feeds = tuple((str(feed), "") for feed in extra_feeds)
        return cls(
            name, tuple(tensors), runs, "", feeds, serves_outputs, model, windows, spill, extras, hashed
        )

    def placed(self, job_dir: Path) -> Phase:
        """The phase with its capture files in `job_dir`."""
        extra = tuple(
            (f, str(job_dir / f"{self.name}-extra{i}.xbv")) for i, (f, _) in enumerate(self.extra_feeds)
        )
        return replace(self, capture=str(job_dir / f"{self.name}.xbv"), extra_feeds=extra)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Phase:
        """The phase as the job file holds it."""
        return cls(
            str(d["name"]),
            tuple(d["tensors"]),
            int(d["runs"]),
            str(d["capture"]),
            tuple((str(a), str(b)) for a, b in d["extra_feeds"]),
            bool(d["serves_outputs"]),
            ModelRef.from_dict(d["model"]) if d.get("model") else None,
            tuple(tuple(w) for w in d.get("windows", ())),
            bool(d.get("spill", True)),
            str(d.get("extras", "captures")),
            bool(d.get("hashed", True)),
        )


@dataclass(frozen=True)
class WorkerJob:
    backend: str
    options: Mapping[str, str]
    model: ModelRef
    outputs: tuple[str, ...]
    op_types: Mapping[str, str]
    feeds: str
    result: str
    phases: tuple[Phase, ...] = ()
    kind: str = "main"  # "main" | "opt-levels" | "decode"
    fingerprint: bool = False
    target: str = ""  # 'module:Class' of the runner, imported directly (no registry lookup)
    decode: DecodeTask | None = None  # kind "decode": what to decode

    def to_json(self) -> str:
        """The job as the worker reads it (JSON text)."""
        d = asdict(self)
        d["decode"] = self.decode.to_dict() if self.decode is not None else None
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> WorkerJob:
        """The job from its JSON text."""
        d = json.loads(text)
        return cls(
            str(d["backend"]),
            dict(d["options"]),
            ModelRef.from_dict(d["model"]),
            tuple(d["outputs"]),
            dict(d["op_types"]),
            str(d["feeds"]),
            str(d["result"]),
            tuple(Phase.from_dict(phase) for phase in d["phases"]),
            str(d["kind"]),
            bool(d["fingerprint"]),
            str(d.get("target", "")),
            DecodeTask.from_dict(d["decode"]) if d.get("decode") else None,
        )


@dataclass(frozen=True)
class PhaseResult:
    """One phase's outcome: what it captured, how runs differed, what the build decided."""

    name: str
    capture: str
    capture_names: tuple[str, ...]
    output_hashes: tuple[str, ...]
    capture_hashes: tuple[str, ...]
    run_diffs: tuple[TensorDiff, ...]
    prepare_s: float
    run_s: tuple[float, ...]
    fingerprint: BuildFingerprint
    not_exposed: tuple[tuple[str, str], ...] = ()
    info: tuple[tuple[str, str], ...] = ()
    extra_captures: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (file, names)
    serves_outputs: bool = False
    digests: tuple[tuple[str, str], ...] = ()  # run 0's per-tensor digests (value_sha256, 16 hex)
    windows: int = 1  # builds the tensors were exposed in (--max-memory)
    floors: tuple[tuple[str, float], ...] = ()  # extras="spread": per tensor, the largest move

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PhaseResult:
        """The phase's result as the worker wrote it."""
        fp = d["fingerprint"]
        return cls(
            str(d["name"]),
            str(d["capture"]),
            tuple(d["capture_names"]),
            tuple(d["output_hashes"]),
            tuple(d["capture_hashes"]),
            tuple(diff_from_dict(run_diff) for run_diff in d["run_diffs"]),
            float(d["prepare_s"]),
            tuple(float(x) for x in d["run_s"]),
            _fingerprint(fp),
            tuple(map(tuple, d["not_exposed"])),
            tuple(map(tuple, d["info"])),
            tuple((str(f), tuple(n)) for f, n in d["extra_captures"]),
            bool(d["serves_outputs"]),
            tuple(map(tuple, d.get("digests", ()))),
            int(d.get("windows", 1)),
            tuple((str(n), float(f)) for n, f in d.get("floors", ())),
        )


@dataclass(frozen=True)
class WorkerResult:
    # "ok" | "failed" | "unavailable" as the worker wrote it; the executor holds it as a RunStatus
    status: str
    stage: str = "load"
    reason: str = ""
    error_type: str = ""
    phases: tuple[PhaseResult, ...] = ()
    info: tuple[tuple[str, str], ...] = ()
    opt_levels: tuple[OptLevelRow, ...] = field(default=())
    phase_errors: tuple[tuple[str, str], ...] = ()  # later phases that failed after the first ran
    peak_rss_bytes: int = 0  # the worker process's peak resident memory (0: not measurable here)
    start_rss_bytes: int = 0  # its resident memory once the engine was loaded, before the model
    decode_rows: tuple[RowTrace, ...] = ()  # kind "decode": each composition's rows
    decode_seconds: tuple[float, ...] = ()  # kind "decode": each step of a prompt alone
    fingerprint: BuildFingerprint | None = None  # kind "decode": what the build decided

    def to_json(self) -> str:
        """The worker's result as JSON text."""
        d = asdict(self)
        d["decode_rows"] = [row.to_dict() for row in self.decode_rows]
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> WorkerResult:
        """The worker's result from its JSON text."""
        d = json.loads(text)
        return cls(
            str(d["status"]),
            str(d["stage"]),
            str(d["reason"]),
            str(d["error_type"]),
            tuple(PhaseResult.from_dict(phase) for phase in d["phases"]),
            tuple(map(tuple, d["info"])),
            tuple(OptLevelRow.from_dict(opt_level) for opt_level in d["opt_levels"]),
            tuple(map(tuple, d["phase_errors"])),
            int(d.get("peak_rss_bytes", 0)),
            int(d.get("start_rss_bytes", 0)),
            tuple(RowTrace.from_dict(r) for r in d.get("decode_rows", ())),
            tuple(float(x) for x in d.get("decode_seconds", ())),
            _fingerprint(d["fingerprint"]) if d.get("fingerprint") else None,
        )

    def phase(self, name: str) -> PhaseResult | None:
        """The phase called `name`, or None."""
        return next((phase for phase in self.phases if phase.name == name), None)
