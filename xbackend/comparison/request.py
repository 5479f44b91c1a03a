"""One model's comparison as asked (a frozen RunRequest), and what it leaves (Ran)."""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from xbackend.comparison.decode import Against
from xbackend.execution.progress import NullProgress, ProgressSink
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec
from xbackend.planning.builds import Builds
from xbackend.results import CompareOptions, Result

__all__ = ["Ran", "Role", "RunRequest"]


class Role(enum.Enum):
    """Why a model is compared: what its run keeps after, and which backend is judged alone."""

    ALONE = "alone"  # a comparison of its own
    ORIGINAL = "original"  # --candidate's original: every backend's tensors stay on disk after
    CANDIDATE = "candidate"  # a candidate's: its tensors stay on disk; a lone engine is judged
    SWEEP_JOB = "sweep-job"  # a sweep's job: a lone engine is judged against float64 (the fleet's
    # comparison of captures keeps its judgment)

    @property
    def keeps_layers(self) -> bool:
        """Every backend's tensors stay on disk after the run, for a candidate's matching."""
        return self in (Role.ORIGINAL, Role.CANDIDATE)

    @property
    def judges_alone(self) -> bool:
        """A backend that runs alone is judged against float64, as a reference is."""
        return self is not Role.ALONE


@dataclass(frozen=True)
class RunRequest:
    """One model compared in the run folder `work`.

    `feeds`: given (a candidate's: the original's, cast), else made or read as the options say;
    `against`: with --decode, the decoding a candidate's tokens are held against; `quick`: the
    quick table's run, its memory sized no further than the budget asks and its engines' outputs
    taken from the build that exposes every tensor (no plain build of their own); `capture_to`:
    the first backend's portable capture written to this folder (xbackend capture); `read`: the
    model as already read from `model`."""

    model: str | os.PathLike[str]
    options: CompareOptions
    work: Path
    progress: ProgressSink = field(default_factory=NullProgress)
    role: Role = Role.ALONE
    quick: bool = False
    feeds: Feeds | None = None
    against: Against | None = None
    capture_to: str | os.PathLike[str] | None = None
    read: tuple[ModelSpec, onnx.ModelProto] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Ran:
    """One model compared: its Result, the backends' builds (their captures still on disk while
    the run folder lives) and the feeds."""

    result: Result
    builds: Mapping[str, Builds]
    feeds: Feeds
