"""Result data types: plain frozen dataclasses that compare builds and reports read.

Nothing here imports a probe, a runner's engine, the orchestrator or a report.

The facade's names load on first use: a lower layer imports its submodule
(`xbackend.results.backend`), which runs this file first, and must not pull in
`xbackend.results.result`, which judges results with those lower layers (gating, promises).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xbackend.metrics import DEFAULT_MAX_ULP
    from xbackend.results.backend import BackendResult, FeedsInfo, Latency, ObserverEffect
    from xbackend.results.comparisons import CrossBackendResult, Drift, PairResult
    from xbackend.results.cost import Family, ModeRow
    from xbackend.results.options import DEFAULT_BACKENDS, EXPECTED, CompareOptions
    from xbackend.results.probe import FailedProbe, ProbeResult
    from xbackend.results.result import Result

_WHERE = {
    "DEFAULT_MAX_ULP": "xbackend.metrics",
    **dict.fromkeys(("BackendResult", "FeedsInfo", "Latency", "ObserverEffect"), "xbackend.results.backend"),
    **dict.fromkeys(("CrossBackendResult", "Drift", "PairResult"), "xbackend.results.comparisons"),
    **dict.fromkeys(("Family", "ModeRow"), "xbackend.results.cost"),
    **dict.fromkeys(("DEFAULT_BACKENDS", "EXPECTED", "CompareOptions"), "xbackend.results.options"),
    **dict.fromkeys(("FailedProbe", "ProbeResult"), "xbackend.results.probe"),
    "Result": "xbackend.results.result",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'xbackend.results' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_MAX_ULP",
    "EXPECTED",
    "BackendResult",
    "CompareOptions",
    "CrossBackendResult",
    "Drift",
    "FailedProbe",
    "Family",
    "FeedsInfo",
    "Latency",
    "ModeRow",
    "ObserverEffect",
    "PairResult",
    "ProbeResult",
    "Result",
]
