"""xbackend: does your model give the same bits everywhere it runs?"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

# ONNX Runtime 1.29+ writes $TMPDIR/.ses and ~/.cache/Microsoft (its telemetry) on every session
# unless told not to before it starts; xbackend writes nowhere but the paths it is given. A user
# who sets the variable keeps their choice; the workers inherit it.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from xbackend.facade import lazy_names
from xbackend.version import VERSION

if TYPE_CHECKING:
    from xbackend.api.compare import compare, compare_with_options
    from xbackend.candidates.convert import keep_float32
    from xbackend.errors import (
        BackendUnavailableError,
        ExportError,
        InputError,
        ModelLoadError,
        NotInResultError,
        ReportError,
        RunnerFailedError,
        UsageError,
        XbackendError,
    )
    from xbackend.export.torch_onnx import InputDecl, export_torch
    from xbackend.model.inputs import Feeds, generate_feeds, load_feeds
    from xbackend.model.load import ModelSpec, load_model
    from xbackend.numerics.metrics import TensorDiff, ulp_distance
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
    from xbackend.results.capture_record import load_capture
    from xbackend.results.findings import Finding, Kind, Label
    from xbackend.runners import Availability, BuildFingerprint, Runner, get_runner, list_runners

__version__ = VERSION

# name -> the module that defines it. Imported on first use: a worker process (python -m
# xbackend.execution.worker) imports this package too, and needs none of the comparator's modules.
_WHERE = {
    **dict.fromkeys(("compare", "compare_with_options"), "xbackend.api.compare"),
    "keep_float32": "xbackend.candidates.convert",
    **dict.fromkeys(
        (
            "BackendUnavailableError",
            "ExportError",
            "InputError",
            "ModelLoadError",
            "NotInResultError",
            "ReportError",
            "RunnerFailedError",
            "UsageError",
            "XbackendError",
        ),
        "xbackend.errors",
    ),
    **dict.fromkeys(("Feeds", "generate_feeds", "load_feeds"), "xbackend.model.inputs"),
    **dict.fromkeys(("TensorDiff", "ulp_distance"), "xbackend.numerics.metrics"),
    **dict.fromkeys(("ModelSpec", "load_model"), "xbackend.model.load"),
    "ProbeResult": "xbackend.probes",
    **dict.fromkeys(("to_json", "to_markdown", "write_atomic"), "xbackend.report"),
    **dict.fromkeys(
        ("BackendResult", "CompareOptions", "CrossBackendResult", "ObserverEffect", "PairResult", "Result"),
        "xbackend.results",
    ),
    **dict.fromkeys(
        ("Availability", "BuildFingerprint", "Runner", "get_runner", "list_runners"), "xbackend.runners"
    ),
    **dict.fromkeys(("InputDecl", "export_torch"), "xbackend.export.torch_onnx"),
    "load_capture": "xbackend.results.capture_record",
    **dict.fromkeys(("Finding", "Kind", "Label"), "xbackend.results.findings"),
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())


__all__ = [
    "Availability",
    "BackendResult",
    "BackendUnavailableError",
    "BuildFingerprint",
    "CompareOptions",
    "CrossBackendResult",
    "ExportError",
    "Feeds",
    "Finding",
    "InputDecl",
    "InputError",
    "Kind",
    "Label",
    "ModelLoadError",
    "ModelSpec",
    "NotInResultError",
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
    "keep_float32",
    "list_runners",
    "load_capture",
    "load_feeds",
    "load_model",
    "to_json",
    "to_markdown",
    "ulp_distance",
    "write_atomic",
]
