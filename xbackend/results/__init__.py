"""Result data types: plain frozen dataclasses that compare builds and reports read.

Nothing here imports a probe, a runner's engine, the orchestrator or a report.

The facade's names load on first use: a lower layer imports its submodule
(`xbackend.results.backend`), which runs this file first, and must not pull in
`xbackend.results.result`, which judges results with those lower layers (gating, promises).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xbackend.facade import lazy_names

if TYPE_CHECKING:
    from xbackend.numerics.metrics import DEFAULT_MAX_ULP
    from xbackend.results.backend import BackendResult, FeedsInfo, Latency, ObserverEffect
    from xbackend.results.comparisons import CrossBackendResult, Drift, PairResult
    from xbackend.results.cost import Family, ModeRow
    from xbackend.results.options import DEFAULT_BACKENDS, EXPECTED, CompareOptions
    from xbackend.results.probe import FailedProbe, ProbeResult
    from xbackend.results.result import Result

_WHERE = {
    "DEFAULT_MAX_ULP": "xbackend.numerics.metrics",
    **dict.fromkeys(("BackendResult", "FeedsInfo", "Latency", "ObserverEffect"), "xbackend.results.backend"),
    **dict.fromkeys(("CrossBackendResult", "Drift", "PairResult"), "xbackend.results.comparisons"),
    **dict.fromkeys(("Family", "ModeRow"), "xbackend.results.cost"),
    **dict.fromkeys(("DEFAULT_BACKENDS", "EXPECTED", "CompareOptions"), "xbackend.results.options"),
    **dict.fromkeys(("FailedProbe", "ProbeResult"), "xbackend.results.probe"),
    "Result": "xbackend.results.result",
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())

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
