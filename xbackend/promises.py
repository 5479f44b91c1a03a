"""Determinism properties: what deterministic hardware promises, and what a run observed.

A runner class declares the properties it promises (`Runner.promises`); every comparison checks
them from what it measured, and a broken promise is a failure with its own exit code (16).
`xbackend certify` checks all four on one backend, whatever it promises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xbackend.errors import UsageError

if TYPE_CHECKING:
    from xbackend.results import BackendResult, Result

__all__ = ["EXIT_PROMISE", "PROPERTIES", "PromiseCheck", "check", "check_promises", "validate"]

EXIT_PROMISE = 16

PROPERTIES: dict[str, str] = {
    "run-to-run": "the same bits on every run in one session",
    "build-to-build": "the same bits from every fresh build",
    "batch-position": "a sample's bits do not depend on the batch around it or its position in it",
    "thread-count": "the same bits whatever the number of host threads",
}


def validate(promises: frozenset[str], runner: str) -> None:
    unknown = sorted(promises - set(PROPERTIES))
    if unknown:
        known = ", ".join(PROPERTIES)
        raise UsageError(f"runner {runner} promises unknown properties {', '.join(unknown)}; known: {known}")


@dataclass(frozen=True)
class PromiseCheck:
    """One property of one backend: held, broken (with the first layer that broke), or not
    checked (and what would check it)."""

    backend: str
    name: str  # one of PROPERTIES
    status: str  # "held" | "broken" | "unchecked"
    evidence: str
    first_layer: str = ""
    promised: bool = False

    @property
    def broken(self) -> bool:
        return self.status == "broken"


def check_promises(r: Result) -> list[PromiseCheck]:
    """Each promise each backend that ran declared, as this comparison observed it."""
    return [c for b in r.backends if b.ok and b.promises for c in check(r, b, b.promises)]


def check(r: Result, b: BackendResult, properties: tuple[str, ...] | None = None) -> list[PromiseCheck]:
    """`properties` (default: all four) of backend `b` from what `r` measured."""
    wanted = properties if properties is not None else tuple(PROPERTIES)
    out = []
    for prop in wanted:
        status, evidence, first = _CHECKS[prop](r, b)
        out.append(PromiseCheck(b.name, prop, status, evidence, first, prop in b.promises))
    return out


def _run_to_run(r: Result, b: BackendResult) -> tuple[str, str, str]:
    varying = next((d.name for d in b.run_diffs if not d.bitwise_equal), "")
    if b.distinct_run_outputs > 1 or varying:
        return (
            "broken",
            f"{b.distinct_run_outputs} distinct outputs within one session of {b.runs} runs",
            varying,
        )
    if b.runs < 2:
        return "unchecked", "1 run per session: pass --runs 2 or more", ""
    layers = f" and at {len(b.layer_digests)} layers" if b.layer_digests else ""
    return (
        "held",
        f"bit-identical over {b.runs} runs in each of {b.builds} session(s), at the outputs{layers}",
        "",
    )


def _build_to_build(r: Result, b: BackendResult) -> tuple[str, str, str]:
    first = next((d.name for d in b.build_diffs if not d.bitwise_equal), "")
    if b.distinct_build_outputs > 1 or first:
        return "broken", f"{b.distinct_build_outputs} distinct outputs over {b.builds} fresh builds", first
    if b.builds < 2:
        return "unchecked", "1 build: pass --builds 2 or more", ""
    fps = len(set(b.fingerprints))
    note = f"; {fps} distinct build fingerprints, the same bits" if fps > 1 else ""
    return "held", f"bit-identical over {b.builds} fresh builds (fresh processes){note}", ""


def _batch_position(r: Result, b: BackendResult) -> tuple[str, str, str]:
    from xbackend.probes.batch import BatchResults

    probe = next((p for p in r.probes if isinstance(p, BatchResults)), None)
    if probe is None:
        return "unchecked", "the batch probe did not run: pass --probes batch", ""
    row = next((x for x in probe.rows if x.backend == b.name), None)
    if row is None or row.status != "ok" or row.invariant is None:
        why = row.reason if row is not None else "; ".join(probe.notes) or "no batch dimension to vary"
        return "unchecked", f"the batch probe could not check it: {why}", ""
    positions = ", ".join(map(str, row.positions))
    where = f"the first sample alone vs at positions {positions} of a batch of {row.batch}"
    if row.invariant:
        return "held", f"bit-identical, {where} ({row.compared} tensors)", ""
    return "broken", f"bits differ, {where}", row.first_divergence or ""


def _thread_count(r: Result, b: BackendResult) -> tuple[str, str, str]:
    from xbackend.probes.threads import ThreadsResult

    probe = next((p for p in r.probes if isinstance(p, ThreadsResult)), None)
    if probe is None:
        return "unchecked", "the threads probe did not run: pass --probes threads", ""
    rows = [x for x in probe.rows if x.backend == b.name]
    checked = [x for x in rows if x.status == "ok" and x.invariant is not None]
    if not checked:
        why = "; ".join(x.reason for x in rows) or "the runner has no thread-count option"
        return "unchecked", f"not measured: {why}", ""
    bad = next((x for x in checked if not x.invariant), None)
    if bad is not None:
        return "broken", f"{bad.threads} threads differ from 1 thread", bad.first_divergence or ""
    counts = ", ".join(x.threads for x in checked)
    return "held", f"bit-identical at 1 thread and at {counts} threads", ""


_CHECKS = {
    "run-to-run": _run_to_run,
    "build-to-build": _build_to_build,
    "batch-position": _batch_position,
    "thread-count": _thread_count,
}
