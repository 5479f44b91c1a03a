"""--fail-on: release gates, each with its own exit code so CI can tell them apart.

Without --fail-on the default gate holds (exit 1 on nondeterminism, a difference past
--max-ulp, an origin, a judgment that could not be made, or a backend that failed). With it,
only the named policies gate; when several fire, the lowest exit code wins. Every backend
failing is exit 3 whatever the policies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from xbackend.errors import UsageError
from xbackend.files.textfmt import short
from xbackend.results.backend import BackendResult
from xbackend.results.candidates import CandidateResult
from xbackend.results.comparisons import CrossBackendResult, Drift
from xbackend.results.decode import DecodeResult
from xbackend.results.explanation import LOADED, Explanation
from xbackend.results.findings import Finding, Kind, Label
from xbackend.results.probe import ProbeResult
from xbackend.results.promises import PromiseCheck

__all__ = ["POLICIES", "Gate", "Gated", "Policy", "evaluate", "parse_policies", "unjudged"]


@dataclass(frozen=True)
class Policy:
    name: str
    exit_code: int
    help: str


POLICIES = (
    Policy("nondeterminism", 10, "a backend's outputs changed from run to run within one session"),
    Policy(
        "build-variance",
        11,
        "fresh builds of a backend differ: outputs, build fingerprints, or layer implementations",
    ),
    Policy("ulp>N", 12, "a backend is more than N scaled ULP from the reference at the graph outputs"),
    Policy(
        "baseline-drift",
        13,
        "a backend's outputs moved from --baseline's, or could not be compared with it",
    ),
    Policy("probe-warning", 14, "a probe warned (thread count, batch, TF32, observer effect, ...)"),
    Policy("failure", 15, "a backend failed or was unavailable while others ran"),
    Policy(
        "promise",
        16,
        "a runner that promises a determinism property (deterministic hardware) broke it; "
        "enforced with or without --fail-on",
    ),
    Policy(
        "unexplained",
        17,
        "a backend has an origin: a node whose own error (fed the reference's inputs) is beyond "
        "reordering and rounding",
    ),
    Policy(
        "ill-conditioned",
        18,
        "a tensor is ill-conditioned: the rounding above it, carried through condition numbers, passes "
        "half its precision",
    ),
    Policy(
        "not-judged",
        19,
        "a judgment was not made: the explanation, or a backend's local errors, could not run "
        "(--noise-samples 0 asks for none, and does not fire it)",
    ),
    Policy(
        "token-flip",
        20,
        "with --decode: a backend's greedy tokens leave the reference's, or a prompt's completion "
        "depends on the batch it shares",
    ),
    Policy(
        "decision-flip",
        21,
        "with --decisions: a backend's top-1 choice along a class axis differs from the reference's",
    ),
    Policy(
        "candidate-origin",
        22,
        "with --candidate: a candidate's node is past the precision it declares, a tensor of it turns inf "
        "where the original's is finite, or it overflows",
    ),
    Policy("any", 0, "every policy above, with N = --max-ulp (the exit code is the policy that fired)"),
)
_BY_NAME = {p.name: p for p in POLICIES}
_ULP = re.compile(r"^ulp>(\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class Gate:
    """A policy that fired, why, and its exit code."""

    policy: str
    exit_code: int
    reason: str


def parse_policies(names: Iterable[str], max_ulp: float = 64.0) -> list[tuple[str, float | None]]:
    """(policy, threshold) pairs; UsageError naming the valid policies for anything else."""
    out: list[tuple[str, float | None]] = []
    for raw in names:
        name = raw.strip()
        m = _ULP.match(name)
        if m:
            out.append(("ulp>N", float(m.group(1))))
        elif name == "any":
            out += [(p.name, max_ulp if p.name == "ulp>N" else None) for p in POLICIES if p.name != "any"]
        elif name in _BY_NAME and name != "ulp>N":
            out.append((name, None))
        else:
            valid = ", ".join(p.name for p in POLICIES)
            raise UsageError(f"unknown --fail-on policy {raw!r}; valid: {valid} (e.g. --fail-on ulp>8)")
    return out


class Gated(Protocol):
    """What the gates read of a comparison (a xbackend.results.Result)."""

    @property
    def backends(self) -> Sequence[BackendResult]:
        """Every backend's result, the reference's among them."""
        ...

    @property
    def cross_backend(self) -> Sequence[CrossBackendResult]:
        """Each backend against the reference."""
        ...

    @property
    def expected_error(self) -> Sequence[CrossBackendResult]:
        """Each backend against the golden outputs the user gave (empty without them)."""
        ...

    @property
    def probes(self) -> Sequence[ProbeResult]:
        """What each probe measured."""
        ...

    @property
    def baseline(self) -> Sequence[Drift]:
        """Each output's drift from the baseline report (empty without one)."""
        ...

    @property
    def failed(self) -> list[BackendResult]:
        """The backends that could not run."""
        ...

    @property
    def broken_promises(self) -> list[PromiseCheck]:
        """The promises a backend's mode declares that the runs broke."""
        ...

    @property
    def explanation(self) -> Explanation:
        """The judgment of each difference against float64."""
        ...

    @property
    def decode(self) -> DecodeResult | None:
        """The decoding's tokens per backend, where one ran."""
        ...

    def decision_flips(self) -> list[str]:
        """The decisions (top class, token) a backend made otherwise than the reference, in words."""
        ...

    @property
    def candidates(self) -> Sequence[CandidateResult]:
        """Each candidate model against the original."""
        ...


@dataclass(frozen=True)
class _Context:
    r: Gated
    max_ulp: float
    has_baseline: bool


def evaluate(gated: Gated, names: Sequence[str], max_ulp: float, has_baseline: bool) -> list[Gate]:
    """The policies that fire on `gated`, lowest exit code first; `max_ulp` is ulp>N's default N
    (for `any`), `has_baseline` whether a baseline was given (drift is gated only then)."""
    ctx = _Context(gated, max_ulp, has_baseline)
    gates = []
    for name, n in [*parse_policies(names, max_ulp), ("promise", None)]:
        why = _CHECKS[name](ctx, n)
        if why:
            label = f"ulp>{n:g}" if name == "ulp>N" else name
            gates.append(Gate(label, _BY_NAME[name].exit_code, why))
    unique = {gate.policy: gate for gate in gates}
    return sorted(unique.values(), key=lambda value: value.exit_code)


def _nondeterminism(context: _Context, _: float | None) -> str:
    r = context.r
    bad = [
        backend
        for backend in r.backends
        if backend.ok
        and (backend.distinct_run_outputs > 1 or any(not diff.bitwise_equal for diff in backend.run_diffs))
    ]
    return "; ".join(
        f"{backend.name}: {backend.distinct_run_outputs} distinct outputs within a session"
        + (f", first varying {backend.first_nondeterministic}" if backend.first_nondeterministic else "")
        for backend in bad
    )


def _build_variance(context: _Context, _: float | None) -> str:
    r = context.r
    out = []
    for backend in r.backends:
        if not backend.ok:
            continue
        why = []
        if backend.distinct_build_outputs > 1 or any(not diff.bitwise_equal for diff in backend.build_diffs):
            why.append(f"{backend.distinct_build_outputs} distinct outputs over {backend.builds} builds")
        if len(set(backend.fingerprints)) > 1:
            why.append(f"{len(set(backend.fingerprints))} distinct build fingerprints")
        if why:
            out.append(f"{backend.name}: {', '.join(why)}")
    for probe in r.probes:
        out += probe.build_variance()
    return "; ".join(dict.fromkeys(out))


def _ulp(ctx: _Context, n: float | None) -> str:
    r = ctx.r
    limit = ctx.max_ulp if n is None else n
    out = []
    for cross in (*r.cross_backend, *r.expected_error):
        if cross.status != "ok":
            continue
        worst = [tensor for tensor in cross.output_tensors if tensor.exceeds(limit)]
        if worst:
            out.append(
                f"{cross.backend} vs {cross.reference}: {short(cross.scaled_ulp)} scaled ULP at the outputs "
                f"(first past {limit:g}: {worst[0].name})"
            )
    return "; ".join(out)


def _baseline(context: _Context, _: float | None) -> str:
    r = context.r
    if not context.has_baseline:
        return ""
    out = []
    for drift in r.baseline:
        if drift.drifted:
            size = f", {short(drift.scaled_ulp)} scaled ULP at the outputs" if drift.measured else ""
            out.append(f"{drift.backend} moved from the baseline{size}; first moved {drift.first_moved}")
        elif drift.status == "not-comparable":
            out.append(f"{drift.backend} not comparable with the baseline: {drift.reason}")
    return "; ".join(out)


def _probe_warning(context: _Context, _: float | None) -> str:
    r = context.r
    return "; ".join(
        finding.sentence for probe in r.probes for finding in probe.findings() if finding.label is Label.WARN
    )


def _failure(context: _Context, _: float | None) -> str:
    r = context.r
    return "; ".join(f"{backend.name} {backend.status}: {backend.reason}" for backend in r.failed)


def _promise(context: _Context, _: float | None) -> str:
    r = context.r
    return "; ".join(
        f"{promise.backend} broke {promise.name}: {promise.evidence}"
        + (f", first at {promise.first_layer}" if promise.first_layer else "")
        for promise in r.broken_promises
    )


def _unexplained(context: _Context, _: float | None) -> str:
    out = []
    for x in context.r.cross_backend:
        if x.status == "ok" and x.origins:
            o = x.origins[0]
            out.append(
                f"{x.backend}: {len(x.origins)} origin(s), first {o.tensor} ({o.op_type}): local error "
                f"{short(o.local_scaled_ulp)} scaled ULP where {short(o.allowed_scaled_ulp)} is allowed"
            )
    return "; ".join(out)


def _ill_conditioned(context: _Context, _: float | None) -> str:
    return "; ".join(
        f"{ill_conditioned.tensor}: "
        + (
            f"the rounding above it, carried through its nodes' condition numbers, reaches "
            f"{short(ill_conditioned.scaled_ulp)} scaled ULP"
            if ill_conditioned.criterion == "condition"
            else "every engine is past half its precision from float64"
        )
        + f" ({ill_conditioned.cause})"
        for ill_conditioned in context.r.explanation.ill_conditioned
    )


def unjudged(ex: Explanation) -> list[str]:
    """Each judgment that could not be made, with its reason: the explanation (unless declined
    with --noise-samples 0), a backend's nodes, a backend's plain run."""
    if not ex.ok:
        return [] if ex.declined or not ex.reason else [f"no explanation: {ex.reason}"]
    out = [
        f"{x.backend}: {x.reason or x.status}" for x in ex.local if x.status != "ok" and x.reason != LOADED
    ]
    out += [
        f"{local_errors.backend}: its plain run: {local_errors.plain.reason}"
        for local_errors in ex.local
        if local_errors.status == "ok"
        and local_errors.plain is not None
        and local_errors.plain.status == "not-judged"
    ]
    return out


def _not_judged(context: _Context, _: float | None) -> str:
    return "; ".join(unjudged(context.r.explanation))


def _token_flip(context: _Context, _: float | None) -> str:
    decode = context.r.decode
    out = decode.flips() if decode is not None else []
    out += [
        f"candidate {candidate.path}: {line}"
        for candidate in context.r.candidates
        if candidate.decode is not None
        for line in candidate.decode.flips()
    ]
    return "; ".join(out)


def _decision_flip(context: _Context, _: float | None) -> str:
    out = context.r.decision_flips()
    for candidate in context.r.candidates:
        out += [
            f"candidate {candidate.path}: {decision.backend} makes {decision.flipped} of "
            f"{decision.decisions} "
            f"choice(s) at {decision.output} otherwise than the original"
            for decision in candidate.decisions
            if decision.status == "ok" and decision.flipped
        ]
    return "; ".join(out)


def _candidate_origin(context: _Context, _: float | None) -> str:
    out = []
    for candidate in context.r.candidates:
        if candidate.origins:
            b, o = candidate.origins[0]
            out.append(
                f"candidate {candidate.path}: {len(candidate.origins)} origin(s) past its declared "
                "precision, first "
                f"{o.tensor} ({o.op_type}) on {b}"
            )
        elif candidate.departure:
            out.append(
                f"candidate {candidate.path}: departs at {candidate.departure} ({candidate.departure_why})"
            )
        out += [
            f"candidate {candidate.path}: {finding.detail} at {finding.tensor}"
            for finding in candidate.findings
            if finding.kind == "overflow"
        ]
    return "; ".join(out)


_CHECKS: dict[str, Callable[[_Context, float | None], str]] = {
    "nondeterminism": _nondeterminism,
    "build-variance": _build_variance,
    "ulp>N": _ulp,
    "baseline-drift": _baseline,
    "probe-warning": _probe_warning,
    "failure": _failure,
    "promise": _promise,
    "unexplained": _unexplained,
    "ill-conditioned": _ill_conditioned,
    "not-judged": _not_judged,
    "token-flip": _token_flip,
    "decision-flip": _decision_flip,
    "candidate-origin": _candidate_origin,
}


def gate_findings(policies: Sequence[str], gates: Sequence[Gate]) -> list[Finding]:
    """The --fail-on policies: each that fired, or one that says they passed (none without --fail-on)."""
    if not policies:
        return []
    words = ",".join(policies)
    if not gates:
        return [Finding(Label.GATE, Kind.GATE_PASSED, f"pass (--fail-on {words})")]
    return [
        Finding(Label.GATE, Kind.GATE_FIRED, f"{gate.policy} fired (exit {gate.exit_code}): {gate.reason}")
        for gate in gates
    ]
