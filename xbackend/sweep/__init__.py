"""Fleet sweeps: models x backends x hosts, on this machine or a Ray cluster (xbackend.sweep.fleet)."""

from __future__ import annotations

from xbackend.sweep.fleet import FleetJob, FleetResult, ModelOutcome, run_sweep
from xbackend.sweep.spec import JobSpec, SweepSpec, load_sweep

__all__ = ["FleetJob", "FleetResult", "JobSpec", "ModelOutcome", "SweepSpec", "load_sweep", "run_sweep"]
