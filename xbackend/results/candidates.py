"""`--candidate`: a release candidate (a float16, bf16 or int8 conversion, an optimized or
re-exported graph) against its original, tensor by tensor and in tokens and decisions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from xbackend.bounds.element import unit_roundoff
from xbackend.files.codec import OMIT_DEFAULT
from xbackend.files.textfmt import short, with_module
from xbackend.numerics.metrics import COMPUTE_FLOATS
from xbackend.results.backend import BackendResult
from xbackend.results.decode import Decisions, DecodeResult, near_tie
from xbackend.results.explanation import NOT_MEASURED, Explanation, Origin
from xbackend.results.findings import Finding, Kind, Label
from xbackend.results.probe import ProbeResult

__all__ = [
    "MINOR_CLIPPING",
    "SENTINEL",
    "Advice",
    "CandidateResult",
    "NumericalEvent",
    "Sensitivity",
    "TensorMatch",
    "Try",
    "Unmatched",
    "declared_unit",
]

SENTINEL = 1e30  # a finite value this large stands for ±inf (a mask's fill): as inf it is no overflow
MINOR_CLIPPING = 0.01  # clipped share of a tensor below which saturation is a note, not a warning


def declared_unit(dtype: str) -> float | None:
    """The unit roundoff of a float dtype a candidate declares (None: not a float dtype)."""
    return unit_roundoff(dtype) if dtype in COMPUTE_FLOATS else None


@dataclass(frozen=True, kw_only=True)
class TensorMatch:
    """One tensor of the original and the candidate's tensor that holds the same value."""

    original: str
    candidate: str
    how: str  # "name" | "node" (the same node's output, renamed) | "dequantized" (after Q/DQ)
    depth: int  # the original's node that computes it, in graph order (0: a graph input)
    dtype: str  # the candidate's dtype
    op: str = ""  # the original's op that computes it
    elements: int = 0
    # max |candidate - original| in ULPs of the candidate's dtype at the original's largest element
    scaled_ulp: float | None = None
    sqnr_db: float | None = None  # 10·log10(Σ original² / Σ (candidate - original)²); None: equal
    max_abs: float = 0.0  # max |candidate - original|
    # elements the candidate holds as inf or NaN where the original is finite and no sentinel (SENTINEL)
    nonfinite: int = 0
    status: Literal["ok", "not-compared"] = "ok"
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Unmatched:
    """An original tensor the candidate does not hold, and why."""

    original: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class NumericalEvent:
    """A numerical event of the candidate's own, named at the tensor and node where it happens."""

    kind: str  # "overflow" | "saturation" | "coarse-scale"
    tensor: str  # the candidate's tensor
    node: str  # the candidate's node that wrote it
    count: int  # elements affected
    of: int  # elements in the tensor
    detail: str


@dataclass(frozen=True, kw_only=True)
class Sensitivity:
    """The noise a conversion adds at one of the original's nodes, as a share of its output's power
    (the candidate's value against the original's op on the candidate's inputs)."""

    node: str
    op: str
    share: float
    nonfinite: int = 0  # elements it turns inf or NaN where float64 is finite: kept before any other


@dataclass(frozen=True, kw_only=True)
class Try:
    """One re-conversion the advisor ran: the nodes it kept, whether the answers matched."""

    kept: int
    matched: bool
    differed: str = ""  # what differed ("" where they matched)
    step: str = ""  # events | whole | weightless | bisect | drop
    answers: tuple[int, int] = (0, 0)  # (prompts or decisions as the original's, of how many)


@dataclass(frozen=True, kw_only=True)
class Advice:
    """`--advise`: the fewest of the nodes the converter changed to keep in float32 so the
    candidate's tokens or decisions match the original's, confirmed by making it again with the
    printed code and running it; or why no list holds."""

    status: Literal["ok", "none-holds", "not-found", "unavailable"]
    reason: str = ""
    converter: str = ""  # the tool whose lists these are
    target: str = ""  # "tokens" | "decisions"
    keep: tuple[str, ...] = ()  # node names, the converter's node_block_list / nodes_to_exclude
    command: str = ""  # the Python that makes the candidate again with them, runnable as printed
    requantize: str = ""  # static QDQ: the quantizer's own call with the settings read (READER yours)
    settings: tuple[tuple[str, str], ...] = ()  # the converter's settings, read from the candidate
    unread: tuple[str, ...] = ()  # settings the candidate does not show
    converted: int = 0  # the original's nodes the converter changed
    still: tuple[tuple[str, int, int], ...] = ()  # (op, still converted, converted) with `keep` kept
    weights: tuple[int, int, int] = (0, 0, 0)  # weight bytes: the original, the candidate, with `keep`
    causes: tuple[tuple[str, str], ...] = ()  # (node, event): the changed nodes the events name
    matters: tuple[str, ...] = ()  # no list holds: the nodes that matter most
    scored: int = 0  # nodes scored from the candidate's instrumented pass
    tried: tuple[Try, ...] = ()
    budget: int = 0  # re-conversions allowed (--advise-budget)
    confirmed: str = ""  # how the list was found, in words
    seconds: float = 0.0  # scoring excluded: the re-conversions and their runs

    def shipped(self) -> str:
        """What stays converted and what it saves, in words."""
        if not self.converted:
            return ""
        left = self.converted - len(self.keep)
        ops = ", ".join(f"{op} {n} of {m}" for op, n, m in self.still[:4] if m)
        o, c, k = self.weights
        size = (
            f"; weights {_mb(k)} against the original's {_mb(o)} and the candidate's {_mb(c)}: {_saved(o, k)}"
            if o and k
            else ""
        )
        return f"{left} of {self.converted} converted node(s) stay converted ({ops}){size}"

    def causes_alone(self) -> str:
        """Where the list the events name was tried and did not hold: what it kept."""
        t = next((t for t in self.tried if t.step == "events" and not t.matched), None)
        if t is None:
            return ""
        unit = "prompts" if self.target == "tokens" else "decisions"
        kept = f"{t.answers[0]} of {t.answers[1]} {unit}" if t.answers[1] else f"no {unit}"
        return f"the {t.kept} node(s) the events name keep {kept} as the original's alone"


def _saved(original: int, kept: int) -> str:
    share = 1 - kept / original
    return f"{100 * share:.0f}% saved" if share >= 0.005 else "nothing saved"


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 10_000 else f"{n} bytes"


@dataclass(frozen=True, kw_only=True)
class CandidateResult:
    """One candidate: what it ran on, how its tensors match the original's, how far each moved,
    where its own nodes pass the precision they declare, and what that does to the answers."""

    path: str
    sha256: str
    precision: str  # what the candidate declares, in words ("float16", "int8 (QDQ)", ...)
    backends: tuple[BackendResult, ...] = ()
    compared_on: str = ""  # the candidate's backend whose tensors are set beside the original's
    original_on: str = ""  # the original's backend they are set beside
    status: Literal["ok", "failed"] = "ok"
    reason: str = ""
    matches: tuple[TensorMatch, ...] = ()
    unmatched: tuple[Unmatched, ...] = ()
    findings: tuple[NumericalEvent, ...] = ()
    # the candidate's own nodes judged against their float64 values at the precision each declares
    explanation: Explanation = NOT_MEASURED
    # the original's nodes the candidate computes through inserted casts, judged whole at the
    # precision their output declares (xbackend.candidates.stretches): those past it
    stretch_origins: tuple[Origin, ...] = ()
    stretches_judged: int = 0
    # the first matched tensor the candidate moves past what its precision explains (its origins
    # and what they carry), in the original's order; "" where every move is explained
    departure: str = ""
    departure_why: str = ""
    decode: DecodeResult | None = field(default=None, metadata={OMIT_DEFAULT: True})
    decisions: tuple[Decisions, ...] = field(default=(), metadata={OMIT_DEFAULT: True})
    notes: tuple[str, ...] = ()
    # the candidate's own probes (with --batch-invariance B: its batch probe)
    probes: tuple[ProbeResult, ...] = field(default=(), metadata={OMIT_DEFAULT: True})
    sensitivities: tuple[Sensitivity, ...] = field(default=(), metadata={OMIT_DEFAULT: True})  # --advise
    advice: Advice | None = field(default=None, metadata={OMIT_DEFAULT: True})  # --advise

    @property
    def ok(self) -> bool:
        """Whether the candidate ran."""
        return self.status == "ok"

    @property
    def origins(self) -> tuple[tuple[str, Origin], ...]:
        """(backend, origin) of each of the candidate's backends, in its order."""
        return tuple((le.backend, origin) for le in self.explanation.local for origin in le.origins)

    @property
    def coverage(self) -> tuple[int, int]:
        """(matched, original tensors considered)."""
        seen = {match.original for match in self.matches}
        return len(seen), len(seen) + len(self.unmatched)

    @property
    def token_flips(self) -> tuple[str, ...]:
        """The backends whose decoded tokens differ from the original's."""
        return self.decode.token_flips if self.decode is not None else ()

    @property
    def decision_flips(self) -> tuple[str, ...]:
        """The backends whose decisions (top class, token) differ from the original's."""
        return tuple(
            decision.backend for decision in self.decisions if decision.status == "ok" and decision.flipped
        )

    @property
    def events(self) -> tuple[NumericalEvent, ...]:
        """The findings that move the candidate's answers: all but a few clipped outliers (what
        min/max calibration on other data leaves)."""
        return tuple(
            finding
            for finding in self.findings
            if not (finding.kind == "saturation" and finding.count < MINOR_CLIPPING * finding.of)
            and not (
                finding.kind == "decision-tensor" and not finding.count
            )  # its own rounding: its precision
        )

    @property
    def faulted(self) -> bool:
        """Not compared, or past its declared precision somewhere (an origin, a stretch, an event)."""
        return not self.ok or bool(self.origins or self.stretch_origins or self.events or self.departure)

    def _flip_cause(self) -> list[Finding]:
        return _cause(self)

    def worst(self) -> TensorMatch | None:
        """The matched tensor with the lowest SQNR (the largest move where none is finite)."""
        # a constant's rounding (a layer norm's epsilon in float16) moves no tensor by itself
        ok = [
            match
            for match in self.matches
            if match.status == "ok" and match.elements and match.op != "Constant"
        ]
        if not ok:
            return None
        return min(ok, key=lambda m: (math.inf if m.sqnr_db is None else m.sqnr_db, -(m.scaled_ulp or 0.0)))

    def verdict_findings(self, modules: Mapping[str, str] | None = None) -> list[Finding]:
        """The candidate's findings in the verdict; `modules` (the original's) names each tensor's module."""
        mods = modules or {}
        name = self.path

        def found(label: Label, kind: Kind, words: str, **rest: Any) -> Finding:
            return Finding(label, kind, f"candidate {name}: {words}", candidate=name, **rest)

        if not self.ok:
            return [found(Label.WARN, Kind.CANDIDATE_NOT_COMPARED, f"not compared: {self.reason}")]
        out = []
        matched, total = self.coverage
        worst = self.worst()
        moved = (
            f"; lowest SQNR {_db(worst.sqnr_db)} at {with_module(worst.original, mods)}"
            if worst is not None and worst.sqnr_db is not None
            else "; every matched tensor equal to the original's"
            if matched
            else ": nothing to compare it on"
        )
        summary = (
            f"{name} ({self.precision}) on {self.compared_on} against the original on "
            f"{self.original_on}: {matched} of {total} tensors matched{moved}"
        )
        sqnr = (("sqnr_db", worst.sqnr_db),) if worst is not None and worst.sqnr_db is not None else ()
        out.append(
            Finding(
                Label.CANDIDATE,
                Kind.CANDIDATE_SUMMARY,
                summary,
                backend=self.compared_on,
                candidate=name,
                tensor=worst.original if worst is not None and worst.sqnr_db is not None else "",
                figures=sqnr,
            )
        )
        for backend, o in self.origins[:1]:
            n = len(self.origins)
            words = (
                f"{n} origin(s) past the precision its nodes declare, first "
                f"{with_module(o.tensor, mods)} ({o.op_type}) on {backend}: {short(o.local_scaled_ulp)} "
                "scaled ULP, allowed "
                f"{short(o.allowed_scaled_ulp)}"
            )
            out.append(found(Label.FAIL, Kind.CANDIDATE_ORIGINS, words, backend=backend, tensor=o.tensor))
        for o in self.stretch_origins[:1]:
            words = (
                f"{len(self.stretch_origins)} stretch(es) through casts past the "
                f"precision they declare, first the original's {with_module(o.tensor, mods)} ({o.op_type}): "
                f"{o.detail}"
            )
            out.append(found(Label.FAIL, Kind.CANDIDATE_STRETCH, words, tensor=o.tensor))
        if self.departure:
            words = (
                f"first departure from the original past its precision at "
                f"{with_module(self.departure, mods)}: {self.departure_why}"
            )
            out.append(found(Label.WARN, Kind.CANDIDATE_DEPARTURE, words, tensor=self.departure))
        elif (
            self.explanation.status == "ok" and not self.origins and not self.stretch_origins and self.events
        ):
            named = ", ".join(
                f"{event.kind} at {with_module(event.tensor, mods)}" for event in self.events[:3]
            )
            more = f" and {len(self.events) - 3} more" if len(self.events) > 3 else ""
            words = (
                f"every node is within the precision it declares; what moves it "
                f"further is {len(self.events)} event(s): {named}{more}"
            )
            out.append(found(Label.NOTE, Kind.CANDIDATE_EVENTS, words))
        elif self.explanation.status == "ok" and not self.origins and not self.stretch_origins:
            words = (
                "every node is within the precision it declares; its "
                "differences from the original are that precision carried through the model"
            )
            out.append(found(Label.EXPLAINED, Kind.CANDIDATE_EXPLAINED, words))
        elif self.explanation.status != "ok":
            level = Label.NOTE if self.explanation.declined else Label.WARN  # declined: the user's choice
            words = f"its nodes were not judged at their precision: {self.explanation.reason}"
            out.append(found(level, Kind.CANDIDATE_NOT_JUDGED, words))
        for f in self.findings:  # a few clipped outliers are what min/max calibration leaves: a note
            level = Label.WARN if f in self.events or f.kind == "decision-tensor" else Label.NOTE
            where = with_module(f.tensor, mods)
            words = f"{f.kind} at {where} ({f.node}): {f.detail}"
            out.append(found(level, Kind.CANDIDATE_EVENT, words, tensor=f.tensor))
        if self.decode is not None:
            out += [
                flip.with_sentence(f"decode: {flip.sentence}").for_candidate(name)
                for flip in self.decode.flip_findings()
            ]
            out += self._flip_cause()
            for backend_result in self.decode.backends:
                if backend_result.ok and backend_result.first_divergence is None:
                    words = (
                        f"decode: {backend_result.backend} chose the original's token at every "
                        f"step of {len(backend_result.prompts)} prompt(s) x {self.decode.steps} steps"
                    )
                    out.append(found(Label.NOTE, Kind.DECODE_AGREES, words, backend=backend_result.backend))
                elif not backend_result.ok:
                    words = (
                        f"decode: {backend_result.backend} {backend_result.status}: {backend_result.reason}"
                    )
                    out.append(found(Label.WARN, Kind.DECODE_FAILED, words, backend=backend_result.backend))
        for decision in self.decisions:
            if decision.status != "ok":
                words = f"decisions: {decision.backend} at {decision.output} not compared: {decision.reason}"
                out.append(found(Label.WARN, Kind.DECISIONS_NOT_COMPARED, words, backend=decision.backend))
            elif decision.flipped:
                words = (
                    f"decisions: {decision.backend} makes {decision.flipped} of {decision.decisions} "
                    f"choice(s) at {decision.output} otherwise than the original"
                )
                out.append(
                    found(
                        Label.WARN,
                        Kind.DECISION_FLIP,
                        words,
                        backend=decision.backend,
                        tensor=decision.output,
                    )
                )
            else:
                words = (
                    f"decisions: {decision.backend} makes the original's {decision.decisions} "
                    f"choice(s) at {decision.output} (the original's smallest margin "
                    f"{decision.smallest_margin:.3g})"
                )
                out.append(
                    found(
                        Label.NOTE,
                        Kind.DECISIONS_AGREE,
                        words,
                        backend=decision.backend,
                        tensor=decision.output,
                    )
                )
        out += [found(Label.NOTE, Kind.CANDIDATE_NOTE, note) for note in self.notes]
        for probe in self.probes:
            said = [finding.for_candidate(name) for finding in probe.findings()]
            out += said or [found(Label.NOTE, Kind.PROBE, f"its {probe.name} probe found nothing to warn of")]
        out += _advice_findings(self)
        return out


def _advice_findings(candidate: CandidateResult) -> list[Finding]:
    a, name = candidate.advice, candidate.path
    if a is None:
        return []

    def advice(words: str) -> list[Finding]:
        return [Finding(Label.ADVICE, Kind.ADVICE, f"candidate {name}: {words}", candidate=name)]

    if a.status == "ok" and not a.keep:
        return advice(a.reason)
    if a.status == "ok":
        listed = f"{', '.join(a.keep[:8])}{' ...' if len(a.keep) > 8 else ''}"
        alone = a.causes_alone()
        return advice(
            f"keep {len(a.keep)} of its {a.converted} converted node(s) in "
            f"float32 and its {a.target} match the original's: {a.shipped()} "
            f"(confirmed: {a.confirmed}{'; ' + alone if alone else ''}): {listed}"
        )
    if a.status == "none-holds":
        named = ", ".join(a.matters)
        return advice(f"{a.reason}; the nodes that matter most: {named or 'none scored'}")
    tried = "; ".join(f"{t.kept} node(s) kept: {t.differed or 'matched'}" for t in a.tried)
    words = f"candidate {name}: advise: {a.reason}{f' ({tried})' if tried else ''}"
    return [Finding(Label.WARN, Kind.ADVICE_FAILED, words, candidate=name)]


def _cause(candidate: CandidateResult) -> list[Finding]:
    """Where the candidate's tokens left the original's: whether its nodes, at that step, are
    within the precision they declare (the flip is that precision carried), or where not."""
    decode = candidate.decode
    first = (
        [
            (backend.first_divergence, backend.backend)
            for backend in decode.backends
            if backend.ok and backend.first_divergence
        ]
        if decode
        else []
    )
    if not first or candidate.compared_on == "":
        return []
    prompt_decode, backend = min(first, key=lambda x: (x[0].first_divergent_step or 0, x[0].prompt))
    where = f"step {prompt_decode.first_divergent_step} of prompt {prompt_decode.prompt}"
    size = (
        f"logit difference {short(prompt_decode.logit_difference)} against the original's margin "
        f"{short(prompt_decode.margin_at_divergence)}"
    )
    if candidate.events:
        e = candidate.events[0]
        words = (
            f"candidate {candidate.path}: decode: at {where} ({backend}: {size}) the candidate has "
            f"{len(candidate.events)} event(s) past its precision, first {e.kind} at {e.tensor}"
        )
        return [
            Finding(
                Label.WARN, Kind.FLIP_CAUSE, words, backend=backend, candidate=candidate.path, tensor=e.tensor
            )
        ]
    if candidate.origins or candidate.stretch_origins:
        first_o = candidate.stretch_origins[0] if candidate.stretch_origins else candidate.origins[0][1]
        words = (
            f"candidate {candidate.path}: decode: at {where} ({backend}: {size}) the candidate has "
            f"{len(candidate.origins) + len(candidate.stretch_origins)} origin(s) past its declared "
            "precision, first "
            f"{first_o.tensor} ({first_o.op_type})"
        )
        return [
            Finding(
                Label.WARN,
                Kind.FLIP_CAUSE,
                words,
                backend=backend,
                candidate=candidate.path,
                tensor=first_o.tensor,
            )
        ]
    if candidate.explanation.status == "ok":
        tie = (
            " (a near tie)"
            if near_tie(prompt_decode.margin_at_divergence, prompt_decode.logit_difference)
            else ""
        )
        words = (
            f"candidate {candidate.path}: decode: at {where} every node of the candidate is within the "
            f"precision it declares: the flip{tie} is that precision carried through the model "
            f"({backend}: {size})"
        )
        return [Finding(Label.NOTE, Kind.FLIP_CAUSE, words, backend=backend, candidate=candidate.path)]
    return []


def _db(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f} dB"
