"""xbackend: does your model give the same bits everywhere it runs?"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Names load on first use: a worker process (python -m xbackend.worker) then pays only for
# the modules it needs, not for the orchestrator's.
_WHERE = {
    "compare": "xbackend.compare",
    "compare_with_options": "xbackend.compare",
    **dict.fromkeys(
        (
            "BackendUnavailableError",
            "ExportError",
            "InputError",
            "ModelLoadError",
            "ReportError",
            "RunnerFailedError",
            "UsageError",
            "XbackendError",
        ),
        "xbackend.errors",
    ),
    **dict.fromkeys(("Feeds", "generate_feeds", "load_feeds"), "xbackend.inputs"),
    **dict.fromkeys(("TensorDiff", "ulp_distance"), "xbackend.metrics"),
    **dict.fromkeys(("ModelSpec", "load_model"), "xbackend.model"),
    "ProbeResult": "xbackend.probes",
    **dict.fromkeys(("to_json", "to_markdown", "write_atomic"), "xbackend.report"),
    **dict.fromkeys(
        ("BackendResult", "CompareOptions", "CrossBackendResult", "ObserverEffect", "PairResult", "Result"),
        "xbackend.results",
    ),
    **dict.fromkeys(
        ("Availability", "BuildFingerprint", "Runner", "get_runner", "list_runners"), "xbackend.runners"
    ),
    **dict.fromkeys(("InputDecl", "export_torch"), "xbackend.torch_export"),
}


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # Importing the submodule xbackend.compare binds it here; the public name stays the function.
        if name == "compare" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'xbackend' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

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
