"""Findings: what a comparison found, one typed record each.

A Finding holds its label (how serious, as the verdict line begins), its kind (what was found),
the backend, candidate, probe and tensor it is about, the figures it quotes, and its sentence.
The verdict lines, the report's order and folding, the JSON, the sweeps and the gates read the
records, never the sentence: rewording a sentence moves nothing.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Finding", "Kind", "Label", "labelled", "scaled_ulp_figure"]


class Label(enum.Enum):
    """How serious a finding is: the word its verdict line begins with."""

    GATE = "GATE"  # a --fail-on policy, fired or passed
    PASS = "PASS"
    FAIL = "FAIL"
    DRIFT = "DRIFT"
    ADVICE = "ADVICE"
    CANDIDATE = "CANDIDATE"  # a candidate's summary
    WARN = "WARN"
    EXPLAINED = "EXPLAINED"
    BASELINE = "BASELINE"
    NOTE = "NOTE"


class Kind(enum.Enum):
    """What a finding is about (its label says how serious it is)."""

    PASS = "pass"
    GATE_PASSED = "gate-passed"
    GATE_FIRED = "gate-fired"
    ALL_FAILED = "all-failed"
    BACKEND_FAILED = "backend-failed"
    NONDETERMINISTIC = "nondeterministic"
    BROKEN_PROMISE = "broken-promise"
    VIOLATION = "violation"  # past the tolerance at the outputs
    ORIGINS = "origins"  # a node past what rounding allows
    REFERENCE_ORIGINS = "reference-origins"
    EXPLAINED = "explained"
    NOT_JUDGED = "not-judged"  # the explanation, or a backend's nodes, not judged
    SHIPPED_NOT_JUDGED = "shipped-not-judged"  # the plain run, as it ships
    EXPLANATION_DECLINED = "explanation-declined"
    UNFUSED_GRAPH = "unfused-graph"  # kernels judged on another graph than the engine's own
    ILL_CONDITIONED = "ill-conditioned"
    FLUSH_TO_ZERO = "flush-to-zero"
    AMPLIFIER = "amplifier"
    REORDER_CHECK = "reorder-check"
    REFERENCE_FALLBACK = "reference-fallback"
    OBSERVER_EFFECT = "observer-effect"  # exposing intermediates changed the outputs
    LAYERS_FAILED = "layers-failed"
    ORACLE_BELOW_FLOAT64 = "oracle-below-float64"
    VACUOUS = "vacuous"
    ZERO_ULP = "zero-ulp"
    DRIFTED = "drifted"
    NOT_COMPARABLE = "not-comparable"
    BASELINE_IDENTICAL = "baseline-identical"
    NOT_IN_BASELINE = "not-in-baseline"
    BASELINE_UNUSED = "baseline-unused"
    DECODE_FAILED = "decode-failed"
    DECODE_NOT_COMPARED = "decode-not-compared"
    DECODE_AGREES = "decode-agrees"
    DECODE_WARNING = "decode-warning"
    TOKEN_FLIP = "token-flip"
    BATCH_DEPENDENT = "batch-dependent"  # a completion that depends on its batch
    FLIP_CAUSE = "flip-cause"
    DECISION_FLIP = "decision-flip"
    DECISIONS_NOT_COMPARED = "decisions-not-compared"
    DECISIONS_AGREE = "decisions-agree"
    PROBE_FAILED = "probe-failed"
    THREADS_VARY = "threads-vary"  # outputs move with the thread count
    PROBE = "probe"  # any other probe's finding (its `probe` names which)
    CANDIDATE_SUMMARY = "candidate-summary"
    CANDIDATE_NOT_COMPARED = "candidate-not-compared"
    CANDIDATE_ORIGINS = "candidate-origins"
    CANDIDATE_STRETCH = "candidate-stretch"
    CANDIDATE_DEPARTURE = "candidate-departure"
    CANDIDATE_EVENTS = "candidate-events"
    CANDIDATE_EXPLAINED = "candidate-explained"
    CANDIDATE_NOT_JUDGED = "candidate-not-judged"
    CANDIDATE_EVENT = "candidate-event"  # one numerical event (overflow, saturation, ...)
    CANDIDATE_NOTE = "candidate-note"
    ADVICE = "advice"
    ADVICE_FAILED = "advice-failed"
    SWEEP_MODEL_FAILED = "sweep-model-failed"  # a sweep's model that could not be loaded
    SWEEP_JOB_FAILED = "sweep-job-failed"
    SWEEP_NOTE = "sweep-note"

    @property
    def changes_an_answer(self) -> bool:
        """A token or a decision the backend (or candidate) makes otherwise: beside the failures."""
        return self in _ANSWERS


_ANSWERS = frozenset({Kind.TOKEN_FLIP, Kind.BATCH_DEPENDENT, Kind.DECISION_FLIP})


@dataclass(frozen=True)
class Finding:
    """One thing a comparison found. `sentence` is its words after the label; `tensor` the
    tensor or node it names first; `figures` the measurements it quotes, by name."""

    label: Label
    kind: Kind
    sentence: str
    backend: str = ""
    candidate: str = ""  # the --candidate file it is about ("" for the model itself)
    probe: str = ""  # the probe that found it ("" for the comparison's own)
    tensor: str = ""
    figures: tuple[tuple[str, float], ...] = ()
    qualifier: str = ""  # a word on the label itself: PASS (vacuous)

    def __post_init__(self) -> None:  # one order for the figures, however they were given
        object.__setattr__(self, "figures", tuple(sorted(self.figures)))

    @property
    def heading(self) -> str:
        """The label as the verdict line shows it, with its qualifier: PASS (vacuous)."""
        return f"{self.label.value} ({self.qualifier})" if self.qualifier else self.label.value

    @property
    def line(self) -> str:
        """The verdict line: the label, then the sentence."""
        return f"{self.heading}: {self.sentence}"

    def figure(self, name: str) -> float | None:
        """The measurement `name` the finding quotes (scaled_ulp, local_scaled_ulp, ...), or None."""
        return dict(self.figures).get(name)

    def to_json(self) -> dict[str, Any]:
        """The finding as the JSON report's verdict.findings holds it (empty fields left out)."""
        out: dict[str, Any] = {"label": self.label.value, "kind": self.kind.value, "sentence": self.sentence}
        for key in ("backend", "candidate", "probe", "tensor", "qualifier"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.figures:
            out["figures"] = dict(self.figures)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        """A finding as to_json wrote it (a sweep's job record)."""
        return cls(
            Label(data["label"]),
            Kind(data["kind"]),
            str(data["sentence"]),
            backend=str(data.get("backend", "")),
            candidate=str(data.get("candidate", "")),
            probe=str(data.get("probe", "")),
            tensor=str(data.get("tensor", "")),
            qualifier=str(data.get("qualifier", "")),
            figures=tuple((str(key), float(value)) for key, value in dict(data.get("figures", {})).items()),
        )

    def with_sentence(self, sentence: str) -> Finding:
        """The same finding in other words."""
        return dataclasses.replace(self, sentence=sentence)

    def for_candidate(self, path: str) -> Finding:
        """This finding (a probe's or a decoding's) as a candidate's, its sentence saying whose."""
        return dataclasses.replace(self, sentence=f"candidate {path}: {self.sentence}", candidate=path)


def labelled(findings: Iterable[Finding], *labels: Label) -> list[Finding]:
    """The findings whose label is one of `labels`, in order."""
    return [finding for finding in findings if finding.label in labels]


def scaled_ulp_figure(value: float | None) -> tuple[tuple[str, float], ...]:
    """A finding's figures holding its scaled ULP, where one was measured."""
    return (("scaled_ulp", float(value)),) if value is not None else ()
