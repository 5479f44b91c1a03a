"""Probes: plug-ins that say which knob moves the bits.

Each probe is one module: a Probe subclass that declares the worker jobs it
needs per backend and turns their outcomes into a ProbeResult, which carries
its verdict lines, report section, JSON and the promise checks it measures.
The orchestrator runs whatever `registry.PROBES` holds and names none of them.
"""

from __future__ import annotations

from xbackend.numerics.metrics import summarize
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.probes.base import BackendRuns, Probe
from xbackend.probes.registry import PROBES, default_probes, select_probes
from xbackend.results import ProbeResult

__all__ = [
    "PROBES",
    "BackendRuns",
    "PlannedBackend",
    "Probe",
    "ProbeResult",
    "RunContext",
    "default_probes",
    "select_probes",
    "summarize",
]
