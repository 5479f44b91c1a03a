"""The report's first screen: three answers (run to run, build to build, across backends), then
the findings a reviewer acts on, with xbackend's own instrumentation notes moved beside the
tables they qualify."""

from __future__ import annotations

from collections.abc import Sequence

from xbackend.files.textfmt import inert, module_note, prose, short
from xbackend.numerics.metrics import TensorDiff
from xbackend.results import BackendResult, Result
from xbackend.results.findings import Finding, Kind, Label

__all__ = ["GLOSSARY", "TERMS", "answers", "instrumentation", "rank", "ranked"]

# the words the report uses, defined once: the report's folded glossary and docs/glossary.md
GLOSSARY = (
    (
        "ULP",
        "a unit in the last place: the gap between a float and the next one. Two float32 values 1 ULP "
        "apart differ in their last bit.",
    ),
    (
        "scaled ULP",
        "a tensor's difference counted in ULPs of its largest element, so tiny elements do not "
        "inflate it. A few are normal when engines sum in another order; hundreds are not, unless "
        "the model amplifies rounding there.",
    ),
    (
        "raw ULP",
        "the largest difference counted in ULPs of each element itself: near zero one ULP is tiny, "
        "so raw ULP reaches thousands for the same harmless rounding. The tables keep it.",
    ),
    (
        "allowance",
        "what correct rounding permits one node's own error, computed from its operands (a sum of "
        "n terms is allowed more than one addition). Its rule is printed per op type.",
    ),
    (
        "origin",
        "a node whose own error, fed the reference's inputs, is past its allowance: the engine "
        "computed it wrongly, not merely in another order.",
    ),
    (
        "EXPLAINED",
        "a backend without origins: every difference it shows is rounding carried through the model.",
    ),
    (
        "judged at N tensors",
        "an engine that fuses nodes exposes only its kernels' outputs; each such stretch is judged "
        "against the rounding its nodes compose to, not node by node.",
    ),
    (
        "first divergence",
        "the first tensor, in model order, whose bits differ from the reference: look there first.",
    ),
    (
        "deterministic",
        "identical bits in every run of one session and in every fresh build.",
    ),
    (
        "oracle",
        "the model evaluated in float64 and rounded to each tensor's dtype: the closest value a "
        "float32 engine could give.",
    ),
    (
        "observer effect",
        "exposing every intermediate (for the per-layer tables) can change what an engine fuses, "
        "and so its outputs; verdicts on outputs always come from the plain model you ship.",
    ),
)

TERMS = (
    "*Terms:* **scaled ULP** counts a difference in units in the last place of the tensor's largest "
    "value; a node's **allowance** is what correct rounding permits its own error; an **origin** is "
    "a node past it; **EXPLAINED** means a backend has no origin, so every difference is rounding "
    "carried through the model. See the [glossary](#glossary)."
)


def _where(diffs: Sequence[TensorDiff], result: Result) -> str:
    """', up to S scaled ULP, first at T (module)' for the tensors that varied."""
    worst = max(diffs, key=lambda diff: diff.severity(), default=None)
    size = f", up to {short(worst.scaled_ulp)} scaled ULP" if worst is not None else ""
    first = module_note(
        next((diff.name for diff in diffs if not diff.bitwise_equal), None), result.model.modules()
    )
    return f"{size}, first at {first}"


def _runs(result: Result, ok: Sequence[BackendResult]) -> str:
    runs = result.options.runs + result.options.timed_runs  # the timed runs' bits are compared too
    if runs < 2:
        return "**Run to run: not measured.** One run per build (`--runs N` repeats them)."
    vary = [backend for backend in ok if backend.varies_run_to_run]
    if not vary:
        return (
            f"**Run to run: the same bits.** Each of the {len(ok)} backends gave identical outputs and "
            f"intermediates in every one of its {runs} runs."
        )
    parts = []
    for backend_result in vary:
        outs = (
            f"{backend_result.distinct_run_outputs} distinct outputs in {backend_result.runs} runs"
            if backend_result.distinct_run_outputs > 1
            else f"identical outputs in {backend_result.runs} runs, but intermediates varied"
        )
        parts.append(f"{inert(backend_result.name)}: {outs}{_where(backend_result.run_diffs, result)}")
    return f"**Run to run: NO.** {'; '.join(parts)}."


def _builds(result: Result, ok: Sequence[BackendResult]) -> str:
    if result.options.builds < 2:
        return "**Build to build: not measured.** One build per backend (`--builds 2` makes fresh ones)."
    vary = [backend for backend in ok if backend.varies_build_to_build]
    engines = [
        build_variance
        for probe in result.probes
        if probe.name == "builds"
        for build_variance in getattr(probe, "backends", ())
        if build_variance.builds_vary
    ]
    if not vary and not engines:
        return (
            f"**Build to build: the same bits.** {result.options.builds} fresh builds of each backend "
            "computed the same bits at every exposed tensor."
        )
    parts = [
        f"{inert(backend.name)}: {backend.distinct_build_outputs} distinct outputs over {backend.builds} "
        "builds" + _where(backend.build_diffs, result)
        for backend in vary
    ]
    shown = {backend.name for backend in vary}
    for engine in engines:
        if engine.backend not in shown:
            parts.append(
                f"{inert(engine.backend)}: {engine.distinct_fingerprints} distinct engines in "
                f"{engine.builds} builds "
                f"({len(engine.varying_layers)} layers), the same bits"
            )
    verdict = "NO" if vary else "the same bits, different engines"
    return f"**Build to build: {verdict}.** {'; '.join(parts)}."


def _across(result: Result, stem: str | None, figure: bool) -> str:
    crosses = [c for c in result.cross_backend if c.status == "ok" and c.scaled_ulp is not None]
    if not crosses:
        why = (
            "only one backend ran"
            if sum(backend.ok for backend in result.backends) < 2
            else "no backend was compared"
        )
        return f"**Across backends: not measured.** {why[0].upper()}{why[1:]}."
    if all(cross.bitwise_equal for cross in crosses):
        return (
            f"**Across backends: the same bits.** Every backend matches {inert(result.reference_used)} bit "
            "for "
            "bit at the outputs."
        )
    worst = max(crosses, key=lambda cross: (cross.scaled_ulp or 0.0, cross.backend))
    fig = f" ([figure]({stem}.error-depth.png))" if stem and figure else ""
    size = (
        f"Largest: {inert(worst.backend)}, {short(worst.scaled_ulp)} scaled ULP (units in the last place of "
        f"the tensor's largest value) from {inert(result.reference_used)} at the outputs, first at "
        f"{module_note(worst.first_divergence, result.model.modules())}{fig}"
    )
    ex = result.explanation
    if not ex.ok:
        why = ex.reason or "the explanation did not run"
        return f"**Across backends: different bits, not judged.** {size}; {prose(why)}."
    nodes = result.judged_nodes
    judged = [(cross, ex.local_for(cross.backend)) for cross in crosses]
    origins = [inert(c.backend) for c, le in judged if le is not None and le.status == "ok" and le.origins]
    unjudged = [inert(c.backend) for c, le in judged if le is None or le.status != "ok"]
    coarse = [
        f"{inert(c.backend)} {le.compared}"
        for c, le in judged
        if le is not None and le.status == "ok" and le.coarser_than(nodes)
    ]
    at = (
        f"judged at each engine's kernel outputs ({', '.join(coarse)} of the model's {nodes} tensors), the "
        "rest node by node"
        if coarse
        else "judged node by node"
    )
    if origins:
        return (
            f"**Across backends: different bits, NOT explained by rounding.** {size}; "
            f"{', '.join(origins)} computed a node past what rounding allows (see Verdict)."
        )
    if unjudged:
        return (
            f"**Across backends: different bits, partly judged.** {size}; {', '.join(unjudged)} could "
            f"not be judged against float64, the others are explained by rounding ({at})."
        )
    return (
        f"**Across backends: different bits, explained by rounding.** {size}; every backend is within "
        f"what rounding allows, {at}."
    )


def answers(result: Result, stem: str | None, figure: bool = True) -> list[str]:
    """The three answers, one bullet each."""
    ok = [backend for backend in result.backends if backend.ok]
    if not ok:
        return ["- **Nothing was compared:** every backend failed (see Verdict)."]
    out = [f"- {_runs(result, ok)}", f"- {_builds(result, ok)}", f"- {_across(result, stem, figure)}"]
    return [*out, f"- {_baseline(result)}"] if result.baseline else out


def _baseline(result: Result) -> str:
    moved = [inert(d.backend) for d in result.baseline if d.drifted]
    compared = [d for d in result.baseline if d.status in ("identical", "drifted")]
    if moved:
        return f"**Against the baseline: moved.** {', '.join(moved)} (see Verdict)."
    if compared:
        return f"**Against the baseline: the same bits.** None of {len(compared)} backend(s) compared moved."
    return (
        "**Against the baseline: not compared.** No backend was compared (it holds none of these backends)."
    )


def instrumentation(result: Result, found: Finding) -> bool:
    """A finding about xbackend's own instruments, not the engines the team ships: the observer
    effect of exposing intermediates, and the reference evaluators' own thread counts."""
    if found.kind is Kind.OBSERVER_EFFECT:
        return True
    tools = {result.reference_used, "reference", "oracle"}
    return found.kind is Kind.THREADS_VARY and found.backend in tools and not found.candidate


_RANK = {Label.GATE: 0, Label.FAIL: 1, Label.DRIFT: 1, Label.ADVICE: 1, Label.WARN: 2, Label.PASS: -1}


def rank(found: Finding) -> int:
    """Where a reviewer reads a finding: PASS first, then gates, failures, changed answers and
    advice, warnings, then the rest."""
    if found.label is Label.WARN and found.kind.changes_an_answer:
        return 1  # a flipped token or decision: a finding, beside the failures
    return _RANK.get(found.label, 3)


def ranked(findings: Sequence[Finding]) -> list[Finding]:
    """The findings in the order a reviewer acts on them (the verdict's own order kept within
    each rank)."""
    return sorted(findings, key=rank)
