"""The whole comparison (Result), its verdict lines and its exit code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from xbackend.errors import EXIT_ALL_FAILED, EXIT_DIFFERENCES, EXIT_OK, NotInResultError
from xbackend.files.codec import OMIT_DEFAULT
from xbackend.files.textfmt import short, with_module
from xbackend.model.load import ModelSpec
from xbackend.numerics.values import value_name
from xbackend.results.backend import BackendResult, FeedsInfo
from xbackend.results.candidates import CandidateResult
from xbackend.results.comparisons import CrossBackendResult, Drift, PairResult, drift_findings
from xbackend.results.cost import Family, families
from xbackend.results.decode import Decisions, DecodeResult, flip_cause
from xbackend.results.explanation import (
    LOADED,
    NOT_MEASURED,
    Explanation,
    LocalErrors,
    Origin,
    explained_words,
    origins_line,
)
from xbackend.results.findings import Finding, Kind, Label, labelled, scaled_ulp_figure
from xbackend.results.gating import Gate, evaluate, gate_findings, unjudged
from xbackend.results.options import EXPECTED, CompareOptions
from xbackend.results.probe import ProbeResult
from xbackend.results.promises import EXIT_PROMISE, PromiseCheck, check_promises, promise_findings

__all__ = ["Result"]


@dataclass(frozen=True, kw_only=True)  # sixteen fields, three of one type: built by keyword only
class Result:
    """The whole comparison: what ran, on what, and what differed."""

    model: ModelSpec
    feeds: FeedsInfo
    options: CompareOptions
    backends: tuple[BackendResult, ...]
    cross_backend: tuple[CrossBackendResult, ...]
    environment: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()
    pairs: tuple[PairResult, ...] = ()
    oracle_error: tuple[CrossBackendResult, ...] = ()
    probes: tuple[ProbeResult, ...] = ()
    probes_ran: tuple[str, ...] = ()
    reference: str = ""  # the reference used: --reference, or the fallback when it did not run
    expected_error: tuple[CrossBackendResult, ...] = ()  # each backend against golden outputs
    baseline: tuple[Drift, ...] = ()  # each backend against --baseline
    baseline_environment: tuple[tuple[str, str], ...] = ()  # the baseline's, when it records one
    explanation: Explanation = NOT_MEASURED
    decode: DecodeResult | None = field(default=None, metadata={OMIT_DEFAULT: True})  # --decode N
    decisions: tuple[Decisions, ...] = field(default=(), metadata={OMIT_DEFAULT: True})  # --decisions
    candidates: tuple[CandidateResult, ...] = field(default=(), metadata={OMIT_DEFAULT: True})  # --candidate
    # the quick table's words on what it left out (--candidate --probes none --runs 1; also a note)
    quick_table: str = field(default="", metadata={OMIT_DEFAULT: True})

    def decision_flips(self) -> list[str]:
        """Each backend and output where a top-1 choice differs from the reference's, in words
        (what --fail-on decision-flip reports)."""
        return [flip.sentence for flip in self._decision_flips()]

    def _decision_flips(self) -> list[Finding]:
        out = []
        for decision in self.decisions:
            if decision.status == "ok" and decision.flipped:
                flip = decision.flips[0]
                at = ",".join(map(str, flip.index))
                words = (
                    f"{decision.backend} makes {decision.flipped} of {decision.decisions} choice(s) at "
                    f"{decision.output} otherwise than "
                    f"{decision.reference}; first [{at}]: class {flip.backend_class} for "
                    f"{flip.reference_class} "
                    f"(margin {flip.reference_margin:.3g}, score difference {flip.score_difference:.3g})"
                )
                out.append(
                    Finding(
                        Label.WARN,
                        Kind.DECISION_FLIP,
                        words,
                        backend=decision.backend,
                        tensor=decision.output,
                    )
                )
        return out

    @property
    def command(self) -> str:
        """The xbackend command line that reproduces this comparison."""
        return self.options.command(self.model.path)

    @property
    def reference_used(self) -> str:
        """The backend every other was compared against: --reference, or the fallback that ran."""
        return self.reference or self.options.reference_name

    def backend(self, name: str) -> BackendResult:
        """The backend `name` as it ran; NotInResultError naming the backends when it did not."""
        return _named(name, {backend.name: backend for backend in self.backends}, "backend")

    def pair(self, a: str, b: str) -> PairResult:
        """Backends `a` and `b` against each other (either order)."""
        for found in self.pairs:
            if {found.a, found.b} == {a, b}:
                return found
        held = ", ".join(f"{found.a}/{found.b}" for found in self.pairs) or "none"
        raise NotInResultError(f"no pair {a}/{b} in this result; its pairs: {held}")

    def oracle(self, name: str) -> CrossBackendResult:
        """`name`'s error against the float64 oracle."""
        return _named(
            name, {cross.backend: cross for cross in self.oracle_error}, "comparison against the oracle for"
        )

    def expected(self, name: str) -> CrossBackendResult:
        """`name` against the expected (golden) outputs."""
        return _named(
            name,
            {cross.backend: cross for cross in self.expected_error},
            "comparison against golden outputs for",
        )

    def cross(self, name: str) -> CrossBackendResult:
        """Backend `name` against the reference; NotInResultError naming those compared."""
        return _named(
            name,
            {cross.backend: cross for cross in self.cross_backend},
            "comparison against the reference for",
        )

    def probe(self, name: str) -> ProbeResult:
        """The result of probe `name` (as --probes names it)."""
        return _named(name, {probe.name: probe for probe in self.probes}, "probe")

    @property
    def failed(self) -> list[BackendResult]:
        """The backends that failed or could not run here."""
        return [backend for backend in self.backends if not backend.ok]

    @property
    def nondeterministic(self) -> list[BackendResult]:
        """The backends that ran and gave other bits run to run or build to build."""
        return [backend for backend in self.backends if backend.ok and backend.deterministic is False]

    @property
    def violations(self) -> list[CrossBackendResult]:
        """The comparisons (against the reference or golden outputs) past their tolerance."""
        return [cross for cross in (*self.cross_backend, *self.expected_error) if cross.violates]

    def promise_checks(self) -> list[PromiseCheck]:
        """Each promise a backend's runner declared, held or broken as this run observed it."""
        return check_promises(self.backends, self.probes)

    def cost_of_determinism(self) -> list[Family]:
        """Each runner run under several modes here: what each promised, held, and cost."""
        return families(self.backends, self.promise_checks())

    @property
    def broken_promises(self) -> list[PromiseCheck]:
        """The promises a backend's runner declared that this run saw broken."""
        return [check for check in self.promise_checks() if check.broken]

    def gates(self) -> list[Gate]:
        """The --fail-on policies that fire, lowest exit code first (none without --fail-on)."""
        if not self.options.fail_on:
            return []
        return evaluate(self, self.options.fail_on, self.options.fixed_ulp, self.options.baseline is not None)

    @property
    def exit_code(self) -> int:
        """What `xbackend compare` exits with: 0 clean, 1 findings, 3 nothing ran, a fired gate's
        code with --fail-on, 16 for a broken promise (docs/compare.md#exit-codes)."""
        if not any(backend.ok for backend in self.backends):
            return EXIT_ALL_FAILED
        if self.options.fail_on:
            gates = self.gates()
            return gates[0].exit_code if gates else EXIT_OK
        if self.broken_promises:
            return EXIT_PROMISE
        if self.failed or self.nondeterministic or self.violations or self.reference_fails:
            return EXIT_DIFFERENCES
        if unjudged(self.explanation):  # nothing passes unjudged
            return EXIT_DIFFERENCES
        if any(candidate.faulted for candidate in self.candidates):
            return EXIT_DIFFERENCES
        if self.flipped:  # a changed answer is a finding, as an origin is
            return EXIT_DIFFERENCES
        return EXIT_OK

    @property
    def flipped(self) -> bool:
        """A token or decision that --decode or --decisions found changed: a backend's against the
        reference's, a completion that depends on its batch, or a candidate's against the original's."""
        if self.decode is not None and self.decode.flips():
            return True
        if self.decision_flips():
            return True
        return any(
            (candidate.decode is not None and bool(candidate.decode.flips()))
            or any(decision.status == "ok" and decision.flipped for decision in candidate.decisions)
            for candidate in self.candidates
        )

    @property
    def oracle_below_float64(self) -> tuple[str, ...]:
        """Graph outputs the oracle computed below float64 (ops with no float64 form there)."""
        oracle = next((backend for backend in self.backends if backend.name == "oracle" and backend.ok), None)
        below = dict(oracle.info).get("computed_below_float64", "") if oracle is not None else ""
        names = {n.strip() for n in below.split(",") if n.strip()}
        for tensor in self.model.tensors:  # model order: what is computed from them is below too
            if any(input_name in names for input_name in tensor.inputs):
                names.add(tensor.name)
        return tuple(output_name for output_name in self.model.output_names if output_name in names)

    def oracle_ranking(self) -> list[tuple[str, float]]:
        """Each backend's largest scaled ULP from the oracle over the outputs it computed in
        float64, closest first (none when it computed none so)."""
        below = set(self.oracle_below_float64)
        out = []
        for cross in self.oracle_error:
            vals = [
                output_tensor.scaled_ulp
                for output_tensor in cross.output_tensors
                if output_tensor.scaled_ulp is not None and value_name(output_tensor.name) not in below
            ]
            if vals:
                out.append((cross.backend, max(vals)))
        return sorted(out, key=lambda x: (x[1], x[0]))

    @property
    def reference_fails(self) -> bool:
        """Under --max-ulp auto, the reference has an origin of its own against float64."""
        ref = self.reference_judgment
        return self.options.auto_tolerance and ref is not None and bool(ref.origins)

    @property
    def drifted(self) -> list[Drift]:
        """The backends that moved from the same backend in --baseline."""
        return [drift for drift in self.baseline if drift.drifted]

    @property
    def vacuous(self) -> str:
        """Why agreement proves little ('' when it does not): every output of the reference is
        one value repeated (e.g. all zeros), or empty (a batch of 0)."""
        ref = next(
            (backend for backend in self.backends if backend.name == self.reference_used and backend.ok), None
        )
        if ref is None or not ref.constant_outputs:
            return ""
        if len(ref.constant_outputs) < len(self.model.outputs):
            return ""
        what = ", ".join(f"{n} is {v}" for n, v in ref.constant_outputs)
        if all(v.startswith("empty") for _, v in ref.constant_outputs):
            return f"every graph output of {ref.name} is empty ({what}): no element was compared"
        empty = any(v.startswith("empty") for _, v in ref.constant_outputs)
        return f"every graph output of {ref.name} is constant{' or empty' if empty else ''} ({what})"

    def _fail_findings(self) -> list[Finding]:
        out = []
        modules = self.model.modules()
        for backend_result in self.nondeterministic:
            worst = max(
                backend_result.varying(), key=lambda tensor_diff: tensor_diff.severity(), default=None
            )
            at = (
                f" ({short(worst.scaled_ulp)} scaled ULP at worst, {with_module(worst.name, modules)})"
                if worst
                else ""
            )
            first = with_module(backend_result.first_nondeterministic or "", modules)
            words = (
                f"{backend_result.name}: {backend_result.variance_words()}{at}; first varying tensor {first}"
            )
            figures = scaled_ulp_figure(worst.scaled_ulp) if worst else ()
            out.append(
                Finding(
                    Label.FAIL,
                    Kind.NONDETERMINISTIC,
                    words,
                    backend=backend_result.name,
                    tensor=backend_result.first_nondeterministic or "",
                    figures=figures,
                )
            )
        ref = self.reference_judgment
        if ref is not None and ref.origins and self.options.auto_tolerance:
            out.append(self._origins_finding(Label.FAIL, Kind.REFERENCE_ORIGINS, ref.backend, ref.origins))
        for violation in self.violations:
            against = "the expected outputs" if violation.reference == EXPECTED else violation.reference
            if violation.origins and violation.explained is False:
                out.append(
                    self._origins_finding(Label.FAIL, Kind.ORIGINS, violation.backend, violation.origins)
                )
                continue
            tol = (
                "its noise floor's tolerance"
                if violation.tolerances
                else f"{violation.max_ulp_tolerance:g} scaled ULP"
            )
            first = with_module(violation.first_violation or "", modules)
            words = (
                f"{violation.backend} differs from {against} beyond {tol} at the outputs (worst "
                f"{short(violation.scaled_ulp)} scaled ULP); first tensor past tolerance {first}"
            )
            out.append(
                Finding(
                    Label.FAIL,
                    Kind.VIOLATION,
                    words,
                    backend=violation.backend,
                    tensor=violation.first_violation or "",
                    figures=scaled_ulp_figure(violation.scaled_ulp),
                )
            )
        out += [
            Finding(
                Label.FAIL,
                Kind.BACKEND_FAILED,
                f"{backend.name} {backend.status}: {backend.reason}",
                backend=backend.name,
            )
            for backend in self.failed
        ]
        return out

    def _origins_finding(self, label: Label, kind: Kind, backend: str, origins: Sequence[Origin]) -> Finding:
        words = origins_line(backend, origins, self.model.modules())
        first = origins[0] if origins else None
        figures: tuple[tuple[str, float], ...] = ()
        if first is not None and first.local_scaled_ulp is not None:
            figures = (
                ("local_scaled_ulp", first.local_scaled_ulp),
                ("allowed_scaled_ulp", first.allowed_scaled_ulp),
            )
        return Finding(
            label, kind, words, backend=backend, tensor=first.tensor if first else "", figures=figures
        )

    @property
    def judged_nodes(self) -> int:
        """How many node outputs the model's own graph was judged at (the reference's count)."""
        ref = self.reference_judgment
        return ref.compared if ref is not None else len(self.model.tensor_order())

    @property
    def reference_judgment(self) -> LocalErrors | None:
        """The reference's own nodes against float64 (it is judged like any backend)."""
        le = self.explanation.local_for(self.reference_used) if self.explanation.ok else None
        return le if le is not None and le.status == "ok" else None

    def _explanation_findings(self) -> list[Finding]:
        """What each difference is: rounding (explained), a backend's own error (origins), or the
        model's conditioning; a judgment that could not be made is a finding with the reason."""
        ex = self.explanation
        if not ex.ok:
            if not ex.reason:
                return []
            if ex.declined and self.quick_table:  # what the quick table left out, the explanation among them
                return [Finding(Label.NOTE, Kind.EXPLANATION_DECLINED, self.quick_table)]
            if ex.declined:
                words = f"no explanation of the differences: {ex.reason}"
                return [Finding(Label.NOTE, Kind.EXPLANATION_DECLINED, words)]
            words = f"not judged: no explanation of the differences: {ex.reason}"
            return [Finding(Label.FAIL, Kind.NOT_JUDGED, words)]
        modules = self.model.modules()
        out = []
        for tensor in ex.ill_conditioned:
            how = (
                f"the rounding above it, carried through its nodes' condition numbers, reaches "
                f"{short(tensor.scaled_ulp)} scaled ULP"
                if tensor.criterion == "condition"
                else "every engine is past half its precision from the float64 oracle while they agree"
            )
            words = (
                f"{with_module(tensor.tensor, modules)}: ill-conditioned — {how} ({tensor.cause}); "
                "differences at and after it are the model's, not the engines'"
            )
            out.append(Finding(Label.WARN, Kind.ILL_CONDITIONED, words, tensor=tensor.tensor))
        for local in ex.local:
            if local.flushed:
                words = (
                    f"{local.backend} flushes results below float's normal range to zero ({local.flushed} "
                    f"element(s), first at {with_module(local.flushed_at, modules)}): flush-to-zero is an "
                    "engine's mode, allowed"
                )
                out.append(
                    Finding(
                        Label.NOTE, Kind.FLUSH_TO_ZERO, words, backend=local.backend, tensor=local.flushed_at
                    )
                )
        for amp in ex.amplifiers:
            words = (
                f"{with_module(amp.tensor, modules)}: {amp.op_type} of inputs up to {amp.input_max:.4g} is "
                f"ill-conditioned in float32: half an ULP of its input moves it by up to "
                f"{short(amp.gain_scaled_ulp)} scaled ULP; a backend that keeps more of the input's digits "
                "(the float64 oracle) differs there by that much, and neither is wrong"
            )
            out.append(Finding(Label.NOTE, Kind.AMPLIFIER, words, tensor=amp.tensor))
        rc = ex.reorder_check
        if rc.status == "ok" and rc.over:
            where = ", ".join(with_module(name, modules) for name in rc.over[:5])
            words = (
                f"{rc.engine}'s own sums, reordered, pass their allowance at {where} "
                f"({short(rc.largest_ratio)}x at worst): the bound there is tighter than legitimate orders, "
                "so an origin there is not proof of an error"
            )
            out.append(Finding(Label.WARN, Kind.REORDER_CHECK, words, backend=rc.engine, tensor=rc.over[0]))
        ref = self.reference_judgment
        if ref is not None and ref.origins and not self.options.auto_tolerance:
            out.append(self._origins_finding(Label.NOTE, Kind.REFERENCE_ORIGINS, ref.backend, ref.origins))
        for cross in self.cross_backend:
            judged = ex.local_for(cross.backend)
            if cross.status != "ok" or judged is None:
                continue
            if judged.status != "ok":
                label = (
                    Label.WARN if judged.reason == LOADED else Label.FAIL
                )  # loaded captures: the user's choice
                words = (
                    f"{cross.backend}: not judged against float64: {judged.reason}; its outputs were held to "
                    "the noise floor's tolerance instead, which says nothing of its nodes"
                )
                out.append(Finding(label, Kind.NOT_JUDGED, words, backend=cross.backend))
            elif judged.origins:
                if not (cross.judged and cross in self.violations):  # a FAIL says it already
                    out.append(self._origins_finding(Label.NOTE, Kind.ORIGINS, cross.backend, judged.origins))
            else:
                words = f"{cross.backend}: {explained_words(judged, modules, self.judged_nodes)}"
                out.append(Finding(Label.EXPLAINED, Kind.EXPLAINED, words, backend=cross.backend))
            if judged.status == "ok" and judged.plain is not None and judged.plain.status == "not-judged":
                words = f"{cross.backend}: not judged as it ships: {judged.plain.reason}"
                out.append(Finding(Label.FAIL, Kind.SHIPPED_NOT_JUDGED, words, backend=cross.backend))
            if judged.status == "ok" and judged.unfused:
                words = f"{cross.backend}: its kernels were judged on {judged.graph}"
                out.append(Finding(Label.WARN, Kind.UNFUSED_GRAPH, words, backend=cross.backend))
        return out

    def _warn_findings(self) -> list[Finding]:
        out = []
        if self.reference_used != self.options.reference_name:
            words = (
                f"the reference ({self.options.reference_name}) did not run; every backend is compared "
                f"against {self.reference_used} instead (the first backend in --backends order that ran)"
            )
            out.append(Finding(Label.WARN, Kind.REFERENCE_FALLBACK, words, backend=self.reference_used))
        for backend in self.backends:
            if backend.observer is not None and backend.observer.outputs_changed:
                local = self.explanation.local_for(backend.name)
                plain = f"; {local.plain.words()}" if local is not None and local.plain is not None else ""
                words = (
                    f"observer effect on {backend.name}: exposing intermediates changed its graph outputs "
                    f"({short(backend.observer.scaled_ulp)} scaled ULP); output figures come from the plain "
                    "model, "
                    f"per-layer tables from the instrumented one{plain}"
                )
                figures = scaled_ulp_figure(backend.observer.scaled_ulp)
                out.append(
                    Finding(Label.WARN, Kind.OBSERVER_EFFECT, words, backend=backend.name, figures=figures)
                )
            if backend.layers_error:
                words = (
                    f"{backend.name}: the per-layer build failed ({backend.layers_error}); "
                    "output figures stand"
                )
                out.append(Finding(Label.WARN, Kind.LAYERS_FAILED, words, backend=backend.name))
        if self.decode is not None:
            out += self.decode.findings()
            out += flip_cause(self.decode, self.cross_backend)
        out += [flip.with_sentence(f"decisions: {flip.sentence}") for flip in self._decision_flips()]
        for decision in self.decisions:
            if decision.status != "ok":
                words = f"decisions: {decision.backend} at {decision.output} not compared: {decision.reason}"
                out.append(
                    Finding(
                        Label.WARN,
                        Kind.DECISIONS_NOT_COMPARED,
                        words,
                        backend=decision.backend,
                        tensor=decision.output,
                    )
                )
            elif not decision.flipped:
                words = (
                    f"decisions: {decision.backend} makes {decision.reference}'s {decision.decisions} "
                    "choice(s) at "
                    f"{decision.output} (the reference's smallest margin {decision.smallest_margin:.3g})"
                )
                out.append(
                    Finding(
                        Label.NOTE,
                        Kind.DECISIONS_AGREE,
                        words,
                        backend=decision.backend,
                        tensor=decision.output,
                    )
                )
        modules = self.model.modules()
        below = self.oracle_below_float64
        if below:
            words = (
                f"oracle: {', '.join(below)} computed in float32 (their ops have no float64 form in "
                "onnx's evaluator); the oracle is not ranked there"
            )
            out.append(Finding(Label.NOTE, Kind.ORACLE_BELOW_FLOAT64, words, backend="oracle"))
        probed = [finding for probe in self.probes for finding in probe.findings(modules)]
        out += [f for f in probed if f.label is not Label.NOTE]
        if self.vacuous:
            words = (
                f"vacuous comparison: {self.vacuous}; agreement there proves little: feed inputs "
                "that exercise the model (--inputs, --range)"
            )
            out.append(Finding(Label.WARN, Kind.VACUOUS, words, backend=self.reference_used))
        out += [f for f in probed if f.label is Label.NOTE]
        for cross in self.cross_backend:
            why = cross.zero_ulp_reason() if cross.status == "ok" else ""
            if why:
                words = f"{cross.backend} vs {cross.reference}: bits differ at 0 ULP ({why})"
                out.append(Finding(Label.NOTE, Kind.ZERO_ULP, words, backend=cross.backend))
        return out

    def _pass_words(self, ref: str) -> str:
        judged = [cross for cross in self.cross_backend if cross.status == "ok" and cross.judged]
        others = [cross for cross in self.cross_backend if cross.status == "ok" and not cross.judged]
        if not (self.options.auto_tolerance and judged):
            if self.options.auto_tolerance and any(other.tolerances for other in others):
                return f"within the noise floor's tolerance of {ref} at the outputs"
            return f"within {self.options.fixed_ulp:g} scaled ULP of {ref} at the outputs"
        # the reference is named only where its own nodes were judged
        judged_ref = [ref] if self.reference_judgment is not None else []
        names = ", ".join([*judged_ref, *(cross.backend for cross in judged)])
        partial = [
            f"{le.backend}: {le.share()}"
            for le in self.explanation.local
            if le.status == "ok" and le.unjudged and le.backend in names.split(", ")
        ]
        words = f"every node of {names} is within rounding of its float64 value"
        if partial:  # some nodes' allowances judge nothing: say how many were judged
            words = (
                f"every judged node of {names} is within rounding of its float64 value ({'; '.join(partial)})"
            )
        nodes = self.judged_nodes
        coarse = [
            f"{le.backend} at {le.compared} {'tensor' if le.compared == 1 else 'tensors'} of {nodes}"
            for le in self.explanation.local
            if le.status == "ok" and le.coarser_than(nodes) and le.backend in names.split(", ")
        ]
        if coarse:  # the grain the fused engines were judged at, on the line itself
            words += f" (judged {'; '.join(coarse)}: their kernels' outputs)"
        if self.reference_judgment is None:
            words += f" ({ref}'s own nodes were not judged)"
        if others:
            named = ", ".join(other.backend for other in others)
            words += f"; {named} within the noise floor's tolerance at the outputs"
        return words

    def findings(self) -> list[Finding]:
        """What the comparison found, one Finding each, in the verdict's order: the gates, then
        a PASS where nothing failed, the broken promises, failures, drift, warnings, the
        explanation's findings and the candidates'."""
        if not any(backend.ok for backend in self.backends):
            every = Finding(Label.FAIL, Kind.ALL_FAILED, "every backend failed; nothing was compared")
            return [every, *self._fail_findings()]
        modules = self.model.modules()
        found = promise_findings(self.broken_promises, modules) + self._fail_findings()
        found += drift_findings(self.baseline, modules) + self._warn_findings()
        found += self._explanation_findings()
        found += [finding for candidate in self.candidates for finding in candidate.verdict_findings(modules)]
        if not labelled(found, Label.FAIL):
            ref = self.reference_used
            within = self._pass_words(ref)
            words = (
                f"every backend is deterministic over "
                f"{self.options.runs + self.options.timed_runs} run(s) x {self.options.builds} build(s) "
                f"and {within}"
            )
            qualifier = "vacuous" if self.vacuous else ""
            found.insert(0, Finding(Label.PASS, Kind.PASS, words, qualifier=qualifier))
        return gate_findings(self.options.fail_on, self.gates()) + found

    def verdict(self) -> list[str]:
        """One line per finding, most important first; a single PASS line when all is well."""
        return [finding.line for finding in self.findings()]


_Held = TypeVar("_Held")


def _named(name: str, held: Mapping[str, _Held], what: str) -> _Held:
    """`held[name]`, else NotInResultError saying what the result holds."""
    if name in held:
        return held[name]
    names = ", ".join(held) or "none"
    raise NotInResultError(f"no {what} {name!r} in this result; it holds: {names}")
