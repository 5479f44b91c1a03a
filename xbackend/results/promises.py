"""Determinism properties: what deterministic hardware promises, and what a run observed.

A runner class declares the properties it promises (`Runner.promises`); every comparison checks
them from what it measured, and a broken promise is a failure with its own exit code (16).
`xbackend certify` checks all four on one backend, whatever it promises. Run-to-run and
build-to-build are checked here from the backend's own runs; the others by the probe that
measures them (`ProbeResult.measures` and `ProbeResult.promise`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from xbackend.errors import UsageError
from xbackend.files.textfmt import with_module
from xbackend.results.backend import BackendResult
from xbackend.results.findings import Finding, Kind, Label
from xbackend.results.probe import ProbeResult, PromiseEvidence, PromiseStatus

__all__ = ["EXIT_PROMISE", "MEASURED_BY", "PROPERTIES", "PromiseCheck", "check", "check_promises", "validate"]

EXIT_PROMISE = 16

PROPERTIES: dict[str, str] = {
    "run-to-run": "the same bits on every run in one session",
    "build-to-build": "the same bits from every fresh build",
    "batch-position": "a sample's bits do not depend on the batch around it or its position in it",
    "thread-count": "the same bits whatever the number of host threads",
}
# The probe whose measurements check a property (the others come from a backend's own runs).
MEASURED_BY = {"batch-position": "batch", "thread-count": "threads"}


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
    status: PromiseStatus
    evidence: str
    first_layer: str = ""
    promised: bool = False

    @property
    def broken(self) -> bool:
        return self.status == "broken"


def check_promises(backends: Sequence[BackendResult], probes: Sequence[ProbeResult]) -> list[PromiseCheck]:
    """Each promise each backend that ran declared, as this comparison observed it."""
    return [
        c
        for backend in backends
        if backend.ok and backend.promises
        for c in check(backend, probes, backend.promises)
    ]


def check(
    b: BackendResult, probes: Sequence[ProbeResult], properties: tuple[str, ...] | None = None
) -> list[PromiseCheck]:
    """`properties` (default: all four) of backend `b` from its runs and the probes that ran."""
    wanted = properties if properties is not None else tuple(PROPERTIES)
    out = []
    for prop in wanted:
        own = _OWN_CHECKS.get(prop)
        status, evidence, first = own(b) if own is not None else _by_probe(prop, b, probes)
        out.append(PromiseCheck(b.name, prop, status, evidence, first, prop in b.promises))
    return out


def _by_probe(prop: str, b: BackendResult, probes: Sequence[ProbeResult]) -> PromiseEvidence:
    probe = next((p for p in probes if prop in p.measures), None)
    if probe is None:
        name = MEASURED_BY[prop]
        return "unchecked", f"the {name} probe did not run: pass --probes {name}", ""
    return probe.promise(prop, b.name)


def _run_to_run(b: BackendResult) -> PromiseEvidence:
    varying = next((diff.name for diff in b.run_diffs if not diff.bitwise_equal), "")
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


def _build_to_build(b: BackendResult) -> PromiseEvidence:
    first = next((diff.name for diff in b.build_diffs if not diff.bitwise_equal), "")
    if b.distinct_build_outputs > 1 or first:
        return "broken", f"{b.distinct_build_outputs} distinct outputs over {b.builds} fresh builds", first
    if b.builds < 2:
        return "unchecked", "1 build: pass --builds 2 or more", ""
    fps = len(set(b.fingerprints))
    note = f"; {fps} distinct build fingerprints, the same bits" if fps > 1 else ""
    return "held", f"bit-identical over {b.builds} fresh builds (fresh processes){note}", ""


_OWN_CHECKS: dict[str, Callable[[BackendResult], PromiseEvidence]] = {
    "run-to-run": _run_to_run,
    "build-to-build": _build_to_build,
}


def promise_findings(broken: Sequence[PromiseCheck], modules: Mapping[str, str]) -> list[Finding]:
    """Each promise a backend's runner declared and this run saw broken."""
    return [
        Finding(
            Label.FAIL,
            Kind.BROKEN_PROMISE,
            f"{c.backend} broke its promise of {c.name} determinism: {c.evidence}"
            + (f"; first broke at {with_module(c.first_layer, modules)}" if c.first_layer else ""),
            backend=c.backend,
            tensor=c.first_layer or "",
        )
        for c in broken
    ]
