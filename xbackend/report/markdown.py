"""The Markdown report: verdict first, then backends, layers, inputs, options, environment.

The head (verdict, summary, backend table, promises, figures, how to read them) is here; the
per-layer sections are `xbackend.report.layers`', the folded rest `xbackend.report.sections`'.
"""

from __future__ import annotations

from pathlib import PurePath

from xbackend.files.textfmt import fenced, fold, gib, inert, module_note, only_our_html, prose
from xbackend.files.textfmt import num as _num
from xbackend.files.textfmt import table as _table
from xbackend.files.textfmt import yes as _yes
from xbackend.report.candidate_section import candidate_section
from xbackend.report.decode_section import decisions_section, decode_section
from xbackend.report.explanation_section import allowances_section, explanation_section
from xbackend.report.figures import planned_figures
from xbackend.report.layers import (
    cross_section,
    expected_section,
    matrix_section,
    oracle_section,
    past_header,
)
from xbackend.report.sections import (
    baseline_section,
    cost_section,
    environment_section,
    exposure_section,
    inputs_section,
    metrics_section,
    model_section,
    observer_section,
    options_section,
    probes_section,
    runs_section,
    timings_section,
)
from xbackend.results import BackendResult, Result

__all__ = ["to_markdown"]

VERDICT_LINES = 10  # findings shown before the first fold; the rest are folded under "All findings"


def _verdict(r: Result) -> list[str]:
    lines = r.verdict()
    shown = lines[:VERDICT_LINES]
    more = len(lines) - len(shown)
    out = ["## Verdict", "", *[f"- {prose(line)}" for line in shown]]
    if more:
        out.append(f"- … and {more} more finding(s), under *All findings* below.")
    return [*out, "", f"Exit code {r.exit_code}.", ""]


def _findings(r: Result) -> list[str]:
    lines = r.verdict()
    if len(lines) <= VERDICT_LINES and not r.notes:
        return []
    body = [f"- {prose(line)}" for line in lines]
    if r.notes:
        body += ["", "Notes:", "", *[f"- {prose(n)}" for n in r.notes]]
    return fold("All findings", f"{len(lines)} finding(s), {len(r.notes)} note(s)", [*body, ""])


def _summary(r: Result) -> list[str]:
    """One paragraph: what ran, what held, where the largest difference starts."""
    ok = [b for b in r.backends if b.ok]
    bad = [b for b in r.backends if not b.ok]
    parts = [
        f"{len(ok)} of {len(r.backends)} backends ran ({', '.join(b.name for b in ok) or 'none'})"
        + (f"; {', '.join(f'{b.name} {b.status}' for b in bad)}" if bad else "")
        + f", {r.options.runs} run(s) x {r.options.builds} build(s) each, on the same "
        f"{'inputs loaded from ' + r.feeds.source if r.feeds.source != 'generated' else 'generated inputs'}."
    ]
    nondet = r.nondeterministic
    parts.append(
        f"Nondeterministic: {', '.join(b.name for b in nondet)}."
        if nondet
        else "Every backend that ran was deterministic."
    )
    crosses = [c for c in r.cross_backend if c.status == "ok" and c.scaled_ulp is not None]
    if crosses:
        worst = max(crosses, key=lambda c: (c.scaled_ulp or 0.0, c.backend))
        if worst.bitwise_equal:
            parts.append(f"Every backend matches {r.reference_used} bit for bit at the outputs.")
        else:
            parts.append(
                f"Largest difference from {r.reference_used} at the outputs: {worst.backend}, "
                f"{_num(worst.scaled_ulp)} scaled ULP (raw max {_num(worst.max_ulp)}), first diverging at "
                f"{module_note(worst.first_divergence, r.model.modules())}."
            )
    if r.oracle_error:
        ranking = r.oracle_ranking()
        below = r.oracle_below_float64
        if ranking:
            name, ulp = ranking[0]
            rest = f", outputs other than {', '.join(below)}" if below else ""
            parts.append(f"Closest to the float64 oracle: {name} ({_num(ulp)} scaled ULP{rest}).")
        else:
            parts.append(f"Not ranked against the oracle: it computes {', '.join(below)} in float32.")
    warns = sum(len(p.warnings()) for p in r.probes)
    if r.probes_ran:
        parts.append(f"Probes run: {', '.join(r.probes_ran)}; {warns} warning(s).")
    if r.baseline:
        moved = [d.backend for d in r.baseline if d.drifted]
        compared = [d for d in r.baseline if d.status in ("identical", "drifted")]
        parts.append(
            f"Against the baseline: {', '.join(moved)} moved."
            if moved
            else f"Against the baseline: none of {len(compared)} backend(s) compared moved."
            if compared
            else "Against the baseline: no backend was compared (it holds none of these backends)."
        )
    env = dict(r.environment)
    host = env.get("cpu.model", "unknown CPU") + (f", {env['gpu.model']}" if env.get("gpu.model") else "")
    parts.append(f"Host: {host}.")
    return ["## Summary", "", " ".join(parts), ""]


def _figures(r: Result, stem: str | None) -> list[str]:
    if stem is None:
        return []
    figs = planned_figures(r)
    out = ["## Figures", ""]
    if not figs:
        return [*out, "No per-layer data to plot (graph outputs only, or nothing compared).", ""]
    for f in figs:
        out += [f"![{f.title}]({stem}.{f.slug}.png)", ""]
    return out


def _how_to_read(stem: str | None) -> list[str]:
    csv = f" The full per-layer table is [{stem}.layers.csv]({stem}.layers.csv)." if stem else ""
    return [
        "## How to read this",
        "",
        "- **ULP**: units in the last place; **scaled ULP** measures each tensor at its own scale, so a few "
        "units are normal when engines sum in another order, and hundreds are not.",
        "- **Deterministic** means identical bits in every run and every fresh build; **first divergence** "
        "is the first tensor, in model order, whose bits differ from the reference: look there first.",
        "- Output figures come from the model you ship; per-layer figures from a build with every "
        "intermediate exposed (see *Observer effect* when they differ).",
        f"- Sections below are folded: click to open.{csv} The JSON twin holds everything.",
        "",
    ]


def _backend_rows(r: Result) -> list[list[object]]:
    rows: list[list[object]] = []
    cross = {c.backend: c for c in r.cross_backend}
    for b in r.backends:
        c = cross.get(b.name)
        vs = (
            ["reference", "–", "–", "–", "–"]
            if b.name == r.reference_used
            else (
                [
                    _yes(c.bitwise_equal),
                    _num(c.max_ulp),
                    _num(c.scaled_ulp),
                    module_note(c.first_divergence, r.model.modules()),
                    c.first_violation or "–",
                ]
                if c is not None and c.status == "ok"
                else ["–"] * 5
            )
        )
        status = b.status if b.ok else f"**{b.status}**: {b.reason}"
        drift = _drift_cell(r, b.name)
        if b.loaded_from:
            status = f"{status} (capture {b.loaded_from})"
        det = _yes(b.deterministic)
        runs = f"{b.runs} x {b.builds}" if b.ok else "–"
        distinct = f"{b.distinct_outputs}" if b.ok else "–"
        notes = [f"precision {dict(b.info)['precision']}"] if "precision" in dict(b.info) else []
        notes += [f"promises {', '.join(b.promises)}"] if b.promises else []
        name = f"{b.name} ({'; '.join(notes)})" if notes else b.name
        lat = [b.latency.words() if b.latency else "–", _memory_cell(b)] if r.options.shows_times else []
        rows.append([name, status, det, runs, distinct, *lat, *vs, *([drift] if r.baseline else [])])
    return rows


def _memory_cell(b: BackendResult) -> str:
    """The measured peak beside the plan's (the engine's resident memory once loaded, measured,
    and what the memory plan says the model adds)."""
    if not b.peak_rss_bytes:
        return "–"
    if not b.planned_peak:
        return gib(b.peak_rss_bytes)
    ratio = b.peak_rss_bytes / b.planned_peak
    return f"{gib(b.peak_rss_bytes)} (planned {gib(b.planned_peak)}, {ratio:.2f}x)"


def _drift_cell(r: Result, name: str) -> str:
    d = next((x for x in r.baseline if x.backend == name), None)
    if d is None:
        return "–"
    if d.status == "identical":
        return "bit-identical"
    if d.status != "drifted":
        return d.status
    size = f"{_num(d.scaled_ulp)} scaled ULP, " if d.measured and d.outputs_moved else ""
    return f"moved: {size}from {module_note(d.first_moved, r.model.modules())}"


def _backends(r: Result) -> list[str]:
    header = [
        "backend",
        "status",
        "deterministic",
        "runs x builds",
        "distinct outputs",
        *(["latency (median)", "peak memory (planned)"] if r.options.shows_times else []),
        f"bitwise = {r.reference_used}",
        "max ULP (outputs)",
        "scaled ULP (outputs)",
        "first divergence",
        past_header(r),
        *(["baseline"] if r.baseline else []),
    ]
    hidden = (
        []
        if r.options.shows_times
        else [
            "Latency and peak memory are left out (they differ between identical runs): pass "
            "`--timed-runs N` or `--timings` for them.",
            "",
        ]
    )
    return ["## Backends", "", *_table(header, _backend_rows(r)), *hidden]


def _promises(r: Result) -> list[str]:
    """Runners that promise determinism (deterministic hardware): each promise, kept or not."""
    checks = r.promise_checks()
    if not checks:
        return []
    rows = [
        [
            c.backend,
            c.name,
            "**BROKEN**" if c.broken else c.status,
            c.evidence,
            module_note(c.first_layer or None, r.model.modules()),
        ]
        for c in checks
    ]
    return [
        "## Promises",
        "",
        "These runners promise determinism properties; a broken promise fails the run (exit 16).",
        "",
        *_table(["backend", "promise", "status", "evidence", "first layer that broke"], rows),
    ]


def _folded(lines: list[str], summary: str) -> list[str]:
    """Fold a section made as ["## Title", "", *body]."""
    if not lines:
        return []
    return fold(lines[0].removeprefix("## "), summary, lines[2:])


def _reproduce(r: Result) -> list[str]:
    return ["## Reproduce", "", *fenced(r.command, "sh"), ""]


def to_markdown(r: Result, stem: str | None = None) -> str:
    """The whole report as Markdown text; same Result, same bytes.

    Verdict, summary, backend table, figures and how to read it come first (about 60 lines
    whatever the model's size); every other section is folded. `stem` names the files beside the
    report (STEM.SLUG.png figures, STEM.layers.csv); None links none.
    """
    title = PurePath(r.model.path).name
    parts = [
        f"# xbackend report: {inert(title)}",
        "",
        *_verdict(r),
        *_summary(r),
        *_backends(r),
        *_promises(r),
        *cost_section(r),
        *decode_section(r),
        *decisions_section(r),
        *candidate_section(r),
        *explanation_section(r),
        *_figures(r, stem),
        *_how_to_read(stem),
        *_findings(r),
        *baseline_section(r),
        *_folded(matrix_section(r), "scaled ULP between every two backends"),
        *_folded(expected_section(r), "each backend against the golden outputs"),
        *_folded(oracle_section(r), "each backend against the float64 oracle"),
        *_folded(
            allowances_section(r),
            f"what rounding allows each of the {len(r.explanation.rules)} ops, and the smallest loss caught",
        ),
        *cross_section(r),
        *_folded(observer_section(r), "instrumented vs plain builds"),
        *_folded(runs_section(r), f"{len(r.nondeterministic)} nondeterministic backend(s)"),
        *_folded(probes_section(r), f"{len(r.probes_ran)} probe(s) run"),
        *_folded(timings_section(r), "wall seconds per build"),
        *_folded(exposure_section(r), "tensors some backend could not expose"),
        *_folded(model_section(r), r.model.sha256[:12]),
        *_folded(inputs_section(r), f"sha256 {r.feeds.sha256[:12]}"),
        *_folded(options_section(r), "options and what each engine reported"),
        *_folded(environment_section(r), f"{len(r.environment)} facts"),
        *_folded(metrics_section(), "what each column means"),
        *_reproduce(r),
    ]
    return only_our_html("\n".join(parts))
