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
    """Refuse a runner that promises a property xbackend does not know (a UsageError naming them)."""
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
        """Whether the runs broke the promise."""
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
    backend: BackendResult, probes: Sequence[ProbeResult], properties: tuple[str, ...] | None = None
) -> list[PromiseCheck]:
    """`properties` (default: all four) of backend `backend` from its runs and the probes that ran."""
    wanted = properties if properties is not None else tuple(PROPERTIES)
    out = []
    for prop in wanted:
        own = _OWN_CHECKS.get(prop)
        status, evidence, first = own(backend) if own is not None else _by_probe(prop, backend, probes)
        out.append(PromiseCheck(backend.name, prop, status, evidence, first, prop in backend.promises))
    return out


def _by_probe(prop: str, backend: BackendResult, probes: Sequence[ProbeResult]) -> PromiseEvidence:
    probe = next((probe for probe in probes if prop in probe.measures), None)
    if probe is None:
        name = MEASURED_BY[prop]
        return "unchecked", f"the {name} probe did not run: pass --probes {name}", ""
    return probe.promise(prop, backend.name)


def _run_to_run(backend: BackendResult) -> PromiseEvidence:
    varying = next((diff.name for diff in backend.run_diffs if not diff.bitwise_equal), "")
    if backend.distinct_run_outputs > 1 or varying:
        return (
            "broken",
            f"{backend.distinct_run_outputs} distinct outputs within one session of {backend.runs} runs",
            varying,
        )
    if backend.runs < 2:
        return "unchecked", "1 run per session: pass --runs 2 or more", ""
    layers = f" and at {len(backend.layer_digests)} layers" if backend.layer_digests else ""
    return (
        "held",
        f"bit-identical over {backend.runs} runs in each of {backend.builds} session(s), at the "
        f"outputs{layers}",
        "",
    )


def _build_to_build(backend: BackendResult) -> PromiseEvidence:
    first = next((diff.name for diff in backend.build_diffs if not diff.bitwise_equal), "")
    if backend.distinct_build_outputs > 1 or first:
        return (
            "broken",
            f"{backend.distinct_build_outputs} distinct outputs over {backend.builds} fresh builds",
            first,
        )
    if backend.builds < 2:
        return "unchecked", "1 build: pass --builds 2 or more", ""
    fps = len(set(backend.fingerprints))
    note = f"; {fps} distinct build fingerprints, the same bits" if fps > 1 else ""
    return "held", f"bit-identical over {backend.builds} fresh builds (fresh processes){note}", ""


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
            f"{promise_check.backend} broke its promise of {promise_check.name} determinism: "
            f"{promise_check.evidence}"
            + (
                f"; first broke at {with_module(promise_check.first_layer, modules)}"
                if promise_check.first_layer
                else ""
            ),
            backend=promise_check.backend,
            tensor=promise_check.first_layer or "",
        )
        for promise_check in broken
    ]
