"""Does a difference change the answer? Greedy decoding per backend against the reference, and
over batch compositions (`compare --decode N`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from xbackend.results.comparisons import CrossBackendResult
from xbackend.results.findings import Finding, Kind, Label

__all__ = ["NEAR_TIE", "BackendDecode", "DecodeResult", "PromptDecode", "first_difference", "near_tie"]

# a flip is a near tie when the logit difference that made it is at most this many margins (docs/decode.md)
NEAR_TIE = 2.0
# ...and the reference barely preferred its token: a margin of 0.5 logit is odds of e^0.5 = 1.65 to 1
TIE_LOGIT = 0.5


def near_tie(margin: float | None, difference: float | None) -> bool:
    """Whether a difference of `difference` in the logits flipping a choice whose margin was
    `margin` is a near tie: the reference barely preferred its token (a margin of at most
    TIE_LOGIT), and the difference is about the margin's size, not far above it. A margin of 7
    (odds of 1100 to 1) crossed by a larger difference is a real change, whatever their ratio."""
    if margin is None or difference is None:
        return False
    return margin == 0 or (margin <= TIE_LOGIT and difference <= NEAR_TIE * margin)


def first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """The first step where two token sequences differ (None: equal)."""
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True, kw_only=True)
class PromptDecode:
    """One prompt on one backend: its tokens alone, against the reference's and over the
    batch compositions it was decoded in."""

    prompt: int
    tokens: tuple[int, ...]
    margins: tuple[float, ...]  # top-1 minus top-2 logit at each step (this backend)
    first_divergent_step: int | None = None  # first step whose token differs from the reference's
    margin_at_divergence: float | None = None  # the reference's top-1/top-2 margin at that step
    logit_difference: float | None = None  # at that step: max |logit - the reference's logit|
    # each step's max |logit - the reference's| while the tokens so far agree (through the divergence)
    logit_differences: tuple[float, ...] = ()
    compositions: int = 1  # the batches it was decoded in, alone included
    distinct_completions: int = 1  # distinct token sequences over those compositions
    first_batch_divergence: int | None = None  # first step where a batch departs from alone
    batch_logit_difference: float = 0.0  # largest |logit - alone's| in a batch, while tokens agree
    # each batch composition it was decoded in (the prompts, in batch order) and its tokens there
    batch_tokens: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()


@dataclass(frozen=True, kw_only=True)
class BackendDecode:
    """One backend's decoding of every prompt."""

    backend: str
    status: Literal["ok", "failed", "unavailable"] = "ok"
    reason: str = ""
    prompts: tuple[PromptDecode, ...] = ()
    step_ms: float | None = None  # median milliseconds of a step, a prompt alone

    @property
    def ok(self) -> bool:
        """Whether the backend decoded."""
        return self.status == "ok"

    @property
    def first_divergence(self) -> PromptDecode | None:
        """The prompt whose tokens leave the reference's earliest (None: every token agrees)."""
        diverged = [prompt for prompt in self.prompts if prompt.first_divergent_step is not None]
        return (
            min(diverged, key=lambda prompt: (prompt.first_divergent_step, prompt.prompt))
            if diverged
            else None
        )

    @property
    def first_divergent_step(self) -> int | None:
        """The first step whose token differs from the reference's, or None."""
        first_divergence = self.first_divergence
        return first_divergence.first_divergent_step if first_divergence is not None else None

    @property
    def margin_at_divergence(self) -> float | None:
        """The reference's logit margin at that step, or None."""
        first_divergence = self.first_divergence
        return first_divergence.margin_at_divergence if first_divergence is not None else None

    @property
    def distinct_completions(self) -> int:
        """The most distinct completions any prompt had over its batch compositions."""
        return max((prompt.distinct_completions for prompt in self.prompts), default=0)

    @property
    def flipped_prompts(self) -> int:
        """How many prompts the backend decoded otherwise than the reference."""
        return sum(prompt.first_divergent_step is not None for prompt in self.prompts)


@dataclass(frozen=True, kw_only=True)
class DecodeResult:
    """`--decode N`: every backend's greedy tokens, where they leave the reference's, and how
    batch composition moves them."""

    steps: int
    cached: bool  # the model takes a KV cache (past_key_values.N.* in, present.N.* out)
    reference: str
    batch: int  # 0: each prompt alone only
    prompt_lengths: tuple[int, ...]
    backends: tuple[BackendDecode, ...]
    # the step the per-layer comparison below is of: (backend, prompt, step), None: the prompts
    layers_step: tuple[str, int, int] | None = None
    warnings: tuple[str, ...] = ()  # what could not be decoded as asked, and why
    prompts: tuple[tuple[int, ...], ...] = ()  # each prompt's token ids, as fed

    def backend(self, name: str) -> BackendDecode:
        """The decoding of backend `name`."""
        return next(backend for backend in self.backends if backend.backend == name)

    @property
    def token_flips(self) -> tuple[str, ...]:
        """Backends whose tokens leave the reference's on some prompt."""
        return tuple(
            backend.backend
            for backend in self.backends
            if backend.ok and backend.backend != self.reference and backend.first_divergent_step is not None
        )

    @property
    def batch_dependent(self) -> tuple[str, ...]:
        """Backends where a prompt's completion depends on the batch it shares."""
        return tuple(
            backend.backend for backend in self.backends if backend.ok and backend.distinct_completions > 1
        )

    def findings(self) -> list[Finding]:
        """WARN where a backend's tokens leave the reference's or depend on the batch; NOTE
        where they agree; WARN for a backend that could not decode."""
        out = []
        ref = next((backend for backend in self.backends if backend.backend == self.reference), None)
        for backend_result in self.backends:
            if not backend_result.ok:
                why = f"decode: {backend_result.backend} {backend_result.status}: {backend_result.reason}"
                out.append(Finding(Label.WARN, Kind.DECODE_FAILED, why, backend=backend_result.backend))
                continue
            if backend_result.backend == self.reference:
                continue
            if ref is None or not ref.ok:  # nothing to hold its tokens against
                why = f"{ref.status}: {ref.reason}" if ref is not None else "it did not decode"
                words = (
                    f"decode: {backend_result.backend}'s tokens were not compared: the reference "
                    f"{self.reference} gave none ({why})"
                )
                out.append(
                    Finding(Label.WARN, Kind.DECODE_NOT_COMPARED, words, backend=backend_result.backend)
                )
                continue
            first_divergence = backend_result.first_divergence
            if first_divergence is None:
                words = (
                    f"decode: {backend_result.backend} chose {self.reference}'s token at every step of "
                    f"{len(backend_result.prompts)} prompt(s) x {self.steps} steps"
                )
                out.append(Finding(Label.NOTE, Kind.DECODE_AGREES, words, backend=backend_result.backend))
        out += [Finding(Label.WARN, Kind.DECODE_WARNING, f"decode: {warning}") for warning in self.warnings]
        return out + [
            finding.with_sentence(f"decode: {finding.sentence}") for finding in self.flip_findings()
        ]

    def flips(self) -> list[str]:
        """Each backend whose tokens leave the reference's, and each whose completions depend on
        the batch, in words (what --fail-on token-flip reports)."""
        return [finding.sentence for finding in self.flip_findings()]

    def flip_findings(self) -> list[Finding]:
        """Each backend whose tokens leave the reference's, and each whose completions depend on
        the batch."""
        out = []
        for name in self.token_flips:
            backend_decode = self.backend(name)
            first_divergence = backend_decode.first_divergence
            assert first_divergence is not None
            words = (
                f"{name} leaves {self.reference}'s tokens at step {first_divergence.first_divergent_step} of "
                "prompt "
                f"{first_divergence.prompt} ({self.reference}'s top-1/top-2 margin "
                f"{_g(first_divergence.margin_at_divergence)}, logit "
                f"difference {_g(first_divergence.logit_difference)}); {backend_decode.flipped_prompts} of "
                f"{len(backend_decode.prompts)} prompt(s) "
                "decode differently"
            )
            out.append(Finding(Label.WARN, Kind.TOKEN_FLIP, words, backend=name))
        for name in self.batch_dependent:
            backend_decode = self.backend(name)
            worst = max(
                backend_decode.prompts, key=lambda prompt: (prompt.distinct_completions, -prompt.prompt)
            )
            words = (
                f"{name}'s completions depend on the batch: prompt {worst.prompt} has "
                f"{worst.distinct_completions} distinct completions over {worst.compositions} compositions, "
                f"first apart at step {worst.first_batch_divergence}"
            )
            out.append(Finding(Label.WARN, Kind.BATCH_DEPENDENT, words, backend=name))
        return out


def _g(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


@dataclass(frozen=True, kw_only=True)
class Flip:
    """One decision a backend made differently from the reference."""

    index: tuple[int, ...]  # the decision's position: the output's index without the class axis
    reference_class: int
    backend_class: int
    reference_margin: float  # the reference's top-1 minus top-2 score there
    score_difference: float  # the largest |score - the reference's| over that decision's classes


@dataclass(frozen=True, kw_only=True)
class Decisions:
    """`--decisions`: one backend's top-1 choices along an output's class axis, against the
    reference's."""

    backend: str
    reference: str
    output: str
    axis: int
    decisions: int  # how many choices the output holds (its size over the class axis)
    agree: int  # how many the backend made as the reference did
    smallest_margin: float  # the reference's closest call over every decision
    flips: tuple[Flip, ...] = ()  # the first FLIPS_KEPT, smallest reference margin first
    status: Literal["ok", "not-compared"] = "ok"
    reason: str = ""

    @property
    def flipped(self) -> int:
        """How many decisions differ from the reference's."""
        return self.decisions - self.agree


FLIPS_KEPT = 20


def flip_cause(
    decode_result: DecodeResult | None, cross_backend: Sequence[CrossBackendResult]
) -> list[Finding]:
    """At the step compared layer by layer, where a backend left the reference's tokens: was
    the difference that flipped the token rounding (EXPLAINED) or an error (an origin)?"""
    if (
        decode_result is None
        or decode_result.layers_step is None
        or decode_result.layers_step[0] == decode_result.reference
    ):
        return []
    who, prompt, step = decode_result.layers_step
    c = next((cross for cross in cross_backend if cross.backend == who and cross.status == "ok"), None)
    where = f"step {step} of prompt {prompt}"

    def cause(label: Label, words: str, tensor: str = "") -> list[Finding]:
        return [Finding(label, Kind.FLIP_CAUSE, f"decode: {words}", backend=who, tensor=tensor)]

    if c is None or c.explained is None:
        return cause(Label.NOTE, f"whether {who}'s flip at {where} is rounding was not judged")
    if c.explained:
        prompt_decode = next((x for x in decode_result.backend(who).prompts if x.prompt == prompt), None)
        margin, diff = (
            (prompt_decode.margin_at_divergence, prompt_decode.logit_difference)
            if prompt_decode is not None
            else (None, None)
        )
        if near_tie(margin, diff) or margin is None or diff is None:
            return cause(
                Label.NOTE,
                f"at {where} every node of {who} is within rounding of its float64 value "
                "(EXPLAINED): rounding-sized differences flipped a near tie",
            )
        return cause(
            Label.NOTE,
            f"at {where} every node of {who} is within rounding of its float64 value "
            f"(EXPLAINED), yet its logits moved by {diff:.3g}, {diff / margin:.3g}x the reference's "
            f"margin {margin:.3g}: no near tie; the model carries rounding into that much",
        )
    o = c.origins[0]
    return cause(
        Label.WARN,
        f"at {where} {who} has {len(c.origins)} origin(s), first {o.tensor} ({o.op_type}): "
        "an error beyond rounding flipped the token",
        o.tensor,
    )
