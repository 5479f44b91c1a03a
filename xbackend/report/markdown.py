"""The Markdown report: three answers first, then the verdict, backends, layers, inputs, options,
environment.

The head (answers, verdict, backend table, promises, figures, the glossary) is here; the
per-layer sections are `xbackend.report.layers`', the folded rest `xbackend.report.sections`'.
"""

from __future__ import annotations

from collections import Counter
from pathlib import PurePath

from xbackend.files.textfmt import fenced, fold, gib, inert, module_note, only_our_html, prose, strong
from xbackend.files.textfmt import num as _num
from xbackend.files.textfmt import table as _table
from xbackend.files.textfmt import yes as _yes
from xbackend.report.answer import GLOSSARY, TERMS, answers, instrumentation, ranked
from xbackend.report.candidate_section import candidate_section
from xbackend.report.decode_section import decisions_section, decode_section
from xbackend.report.explanation_section import allowances_section, explanation_section
from xbackend.report.figures import Figure, builds_unchanged, planned_figures
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
from xbackend.results.findings import Finding

__all__ = ["to_markdown"]

VERDICT_LINES = 10  # findings shown before the first fold; the rest are folded under "All findings"


def _shown(r: Result) -> tuple[list[Finding], list[Finding]]:
    """(the findings the head shows, ranked; xbackend's own instrumentation notes, which go
    below the fold beside the tables they qualify)."""
    found = r.findings()
    mine = [f for f in found if instrumentation(r, f)]
    return ranked([f for f in found if f not in mine]), mine


def _verdict(lines: list[Finding], mine: list[Finding]) -> list[str]:
    shown = lines[:VERDICT_LINES]
    more = len(lines) - len(shown) + len(mine)
    out = ["## Verdict", "", *[f"- {prose(f.line)}" for f in shown]]
    if more:
        out.append(f"- … and {more} more line(s), under *All findings* below.")
    return [*out, ""]


def _findings(r: Result, lines: list[Finding], mine: list[Finding]) -> list[str]:
    if len(lines) <= VERDICT_LINES and not r.notes and not mine:
        return []
    body = [f"- {prose(line.line)}" for line in lines]
    if mine:
        body += ["", "About xbackend's own instruments (not the engines you ship):", ""]
        body += [f"- {prose(f.line)}" for f in mine]
    if r.notes:
        body += ["", "Notes:", "", *[f"- {prose(note)}" for note in r.notes]]
    kinds = Counter(f.heading for f in [*lines, *mine])
    counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    notes = f"; {len(r.notes)} note(s) on the run" if r.notes else ""
    return fold("All findings", f"{len(lines) + len(mine)} line(s): {counts}{notes}", [*body, ""])


def _title(r: Result) -> str:
    """The model, with its folder where it has one (an export folder's model.onnx), and the
    candidates it was compared with."""
    p = PurePath(r.model.path)
    # an exporter's generic name (optimum's model.onnx, decoder_model.onnx): its folder says which
    name = f"{p.parent.name}/{p.name}" if p.parent.name and "model" in p.stem.lower() else p.name
    cands = [PurePath(candidate.path).name for candidate in r.candidates]
    vs = f", candidate{'s' if len(cands) > 1 else ''} {', '.join(cands)}" if cands else ""
    return f"# xbackend report: {inert(name)}{inert(vs)}"


def _head(r: Result, stem: str | None, figs: list[Figure]) -> list[str]:
    env = dict(r.environment)
    host = env.get("cpu.model", "unknown CPU") + (f", {env['gpu.model']}" if env.get("gpu.model") else "")
    ok = sum(backend.ok for backend in r.backends)
    version = env.get("package.xbackend", "")
    figure = any(fig.slug == "error-depth" for fig in figs)
    return [
        _title(r),
        "",
        f"xbackend {version}; {ok} of {len(r.backends)} backends ran on {inert(host)}; "
        f"exit code {r.exit_code} ({exit_words(r)})",
        "",
        "## Answer",
        "",
        *answers(r, stem, figure),
        "",
        TERMS,
        "",
    ]


def exit_words(r: Result) -> str:
    """The exit code in words, for the line under the title."""
    gates = r.gates()
    if gates:
        return f"--fail-on {gates[0].policy} fired"
    words = {0: "pass", 1: "findings below", 3: "every backend failed", 16: "a broken promise"}
    return words.get(r.exit_code, "see Verdict")


def _figures(r: Result, stem: str | None, figs: list[Figure]) -> list[str]:
    if stem is None:
        return []
    out = ["## Figures", ""]
    csv = f"The full per-layer table is [{inert(stem)}.layers.csv]({stem}.layers.csv)."
    if not figs:
        return [*out, f"No per-layer data to plot (graph outputs only, or nothing compared). {csv}", ""]
    for f in figs:
        out += [f"![{inert(f.title)}]({stem}.{f.slug}.png)", "", f"*{prose(f.caption)}*", ""]
    still = builds_unchanged(r)
    if still:
        out += [still, ""]
    return [*out, csv, ""]


def _glossary(stem: str | None) -> list[str]:
    body = [f"- **{term}**: {words}" for term, words in GLOSSARY]
    tail = " The JSON twin holds every figure of this report." if stem else ""
    return fold(
        "Glossary",
        "the words this report uses",
        [*body, "", f"Sections are folded: click to open.{tail}", ""],
    )


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
        status: object = b.status if b.ok else strong(b.status, f": {b.reason}")
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
            check.backend,
            check.name,
            strong("BROKEN") if check.broken else check.status,
            check.evidence,
            module_note(check.first_layer or None, r.model.modules()),
        ]
        for check in checks
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

    The three answers, the verdict, the backend table and the figures come first (the answers and
    the verdict within 40 lines, whatever the model's size); every other section is folded.
    `stem` names the files beside the report (STEM.SLUG.png figures, STEM.layers.csv); None links
    none.
    """
    shown = _shown(r)  # the verdict once: the head shows it, All findings keeps the rest
    figs = planned_figures(r) if stem is not None else []
    parts = [
        *_head(r, stem, figs),
        *_verdict(*shown),
        *_backends(r),
        *_promises(r),
        *cost_section(r),
        *decode_section(r),
        *decisions_section(r),
        *candidate_section(r),
        *explanation_section(r),
        *_figures(r, stem, figs),
        *_findings(r, *shown),
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
        *_glossary(stem),
        *_reproduce(r),
    ]
    return only_our_html("\n".join(parts))
