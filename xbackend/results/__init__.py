"""Result data types: plain frozen dataclasses that compare builds and reports read.

Nothing here imports a probe, a runner's engine, the orchestrator or a report.
"""

from __future__ import annotations

from xbackend.metrics import DEFAULT_MAX_ULP
from xbackend.results.backend import BackendResult, FeedsInfo, Latency, ObserverEffect
from xbackend.results.comparisons import CrossBackendResult, Drift, PairResult
from xbackend.results.cost import Family, ModeRow
from xbackend.results.options import DEFAULT_BACKENDS, EXPECTED, CompareOptions
from xbackend.results.probe import FailedProbe, ProbeResult
from xbackend.results.result import Result

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
