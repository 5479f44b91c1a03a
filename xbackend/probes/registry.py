"""The probe registry: every built-in probe by name, in report order, and the selection rules."""

from __future__ import annotations

from collections.abc import Sequence

from xbackend.errors import UsageError
from xbackend.probes.autotune import AutotuneProbe
from xbackend.probes.base import Probe
from xbackend.probes.batch import BatchProbe
from xbackend.probes.builds import BuildsProbe
from xbackend.probes.opt_levels import OptLevelsProbe
from xbackend.probes.tf32 import Tf32Probe
from xbackend.probes.threads import ThreadsProbe

__all__ = ["PROBES", "default_probes", "select_probes"]

# Report order.
PROBES: dict[str, type[Probe]] = {
    p.name: p for p in (BuildsProbe, ThreadsProbe, OptLevelsProbe, BatchProbe, AutotuneProbe, Tf32Probe)
}


def default_probes(batch: int) -> tuple[str, ...]:
    """The probes that run when none is asked for (the batch probe too when --batch-invariance is set)."""
    return tuple(key for key, value in PROBES.items() if value.default or (key == "batch" and batch))


def select_probes(requested: Sequence[str] | None, batch: int) -> tuple[str, ...]:
    """The probes to run: the default ones (plus batch when a batch size is given), or those named."""
    if requested is None:
        return default_probes(batch)
    unknown = sorted(set(requested) - set(PROBES) - {"none", "all"})
    if unknown:
        raise UsageError(f"unknown probe(s) {', '.join(unknown)}; choose from {', '.join(PROBES)}, all, none")
    chosen = set(PROBES) if "all" in requested else {p for p in requested if p != "none"}
    return tuple(key for key, value in PROBES.items() if key in chosen or value.always)
