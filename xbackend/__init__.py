"""xbackend: does your model give the same bits everywhere it runs?"""

from __future__ import annotations

from xbackend.compare import compare, compare_with_options
from xbackend.errors import (
    BackendUnavailableError,
    ExportError,
    InputError,
    ModelLoadError,
    ReportError,
    RunnerFailedError,
    UsageError,
    XbackendError,
)
from xbackend.inputs import Feeds, generate_feeds, load_feeds
from xbackend.metrics import TensorDiff, ulp_distance
from xbackend.model import ModelSpec, load_model
from xbackend.probes import ProbeResult
from xbackend.report import to_json, to_markdown, write_atomic
from xbackend.results import (
    BackendResult,
    CompareOptions,
    CrossBackendResult,
    ObserverEffect,
    PairResult,
    Result,
)
from xbackend.runners import Availability, BuildFingerprint, Runner, get_runner, list_runners
from xbackend.torch_export import InputDecl, export_torch
from xbackend.version import VERSION

__version__ = VERSION

__all__ = [
    "Availability",
    "BackendResult",
    "BackendUnavailableError",
    "BuildFingerprint",
    "CompareOptions",
    "CrossBackendResult",
    "ExportError",
    "Feeds",
    "InputDecl",
    "InputError",
    "ModelLoadError",
    "ModelSpec",
    "ObserverEffect",
    "PairResult",
    "ProbeResult",
    "ReportError",
    "Result",
    "Runner",
    "RunnerFailedError",
    "TensorDiff",
    "UsageError",
    "XbackendError",
    "__version__",
    "compare",
    "compare_with_options",
    "export_torch",
    "generate_feeds",
    "get_runner",
    "list_runners",
    "load_feeds",
    "load_model",
    "to_json",
    "to_markdown",
    "ulp_distance",
    "write_atomic",
]
