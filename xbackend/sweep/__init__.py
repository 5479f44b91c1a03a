"""Fleet sweeps: models x backends x hosts, on this machine or a Ray cluster.

spec (the sweep file) -> node (one job, as compare runs it) -> executors (local processes, Ray
tasks) -> fleet (the driver: runs jobs, compares each model's captures) -> report (fleet.md,
fleet.json); outcomes holds the data they pass along.
"""

from __future__ import annotations

from xbackend.sweep.fleet import run_sweep
from xbackend.sweep.outcomes import FleetJob, FleetResult, ModelOutcome
from xbackend.sweep.spec import JobSpec, SweepSpec, load_sweep

__all__ = ["FleetJob", "FleetResult", "JobSpec", "ModelOutcome", "SweepSpec", "load_sweep", "run_sweep"]
