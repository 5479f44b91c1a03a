"""The Markdown report: three answers first, then the verdict, backends, layers, inputs, options,
environment.

The head (answers, verdict, backend table, promises, figures, the glossary) is here; the
per-layer sections are `xbackend.report.layers`', the folded rest `xbackend.report.sections`'.
"""

from __future__ import annotations

from collections import Counter
from pathlib import PurePath

from xbackend.files.textfmt import gib, inert, module_note, prose
from xbackend.files.textfmt import num as _num
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
from xbackend.report.markup import fenced, fold, only_our_html, strong
from xbackend.report.markup import table as _table
from xbackend.report.markup import yes as _yes
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


def _shown(result: Result) -> tuple[list[Finding], list[Finding]]:
    """(the findings the head shows, ranked; xbackend's own instrumentation notes, which go
    below the fold beside the tables they qualify)."""
    found = result.findings()
    mine = [f for f in found if instrumentation(result, f)]
    return ranked([f for f in found if f not in mine]), mine


def _verdict(lines: list[Finding], mine: list[Finding]) -> list[str]:
    shown = lines[:VERDICT_LINES]
    more = len(lines) - len(shown) + len(mine)
    out = ["## Verdict", "", *[f"- {prose(finding.line)}" for finding in shown]]
    if more:
        out.append(f"- … and {more} more line(s), under *All findings* below.")
    return [*out, ""]


def _findings(result: Result, lines: list[Finding], mine: list[Finding]) -> list[str]:
    if len(lines) <= VERDICT_LINES and not result.notes and not mine:
        return []
    body = [f"- {prose(line.line)}" for line in lines]
    if mine:
        body += ["", "About xbackend's own instruments (not the engines you ship):", ""]
        body += [f"- {prose(finding.line)}" for finding in mine]
    if result.notes:
        body += ["", "Notes:", "", *[f"- {prose(note)}" for note in result.notes]]
    kinds = Counter(finding.heading for finding in [*lines, *mine])
    counts = ", ".join(f"{kind} {key}" for key, kind in sorted(kinds.items()))
    notes = f"; {len(result.notes)} note(s) on the run" if result.notes else ""
    return fold("All findings", f"{len(lines) + len(mine)} line(s): {counts}{notes}", [*body, ""])


def _title(result: Result) -> str:
    """The model, with its folder where it has one (an export folder's model.onnx), and the
    candidates it was compared with."""
    pure_path = PurePath(result.model.path)
    # an exporter's generic name (optimum's model.onnx, decoder_model.onnx): its folder says which
    name = (
        f"{pure_path.parent.name}/{pure_path.name}"
        if pure_path.parent.name and "model" in pure_path.stem.lower()
        else pure_path.name
    )
    cands = [PurePath(candidate.path).name for candidate in result.candidates]
    vs = f", candidate{'s' if len(cands) > 1 else ''} {', '.join(cands)}" if cands else ""
    return f"# xbackend report: {inert(name)}{inert(vs)}"


def _head(result: Result, stem: str | None, figs: list[Figure]) -> list[str]:
    env = dict(result.environment)
    host = env.get("cpu.model", "unknown CPU") + (f", {env['gpu.model']}" if env.get("gpu.model") else "")
    ok = sum(backend.ok for backend in result.backends)
    version = env.get("package.xbackend", "")
    figure = any(fig.slug == "error-depth" for fig in figs)
    return [
        _title(result),
        "",
        f"xbackend {version}; {ok} of {len(result.backends)} backends ran on {inert(host)}; "
        f"exit code {result.exit_code} ({exit_words(result)})",
        "",
        "## Answer",
        "",
        *answers(result, stem, figure),
        "",
        TERMS,
        "",
    ]


def exit_words(result: Result) -> str:
    """The exit code in words, for the line under the title."""
    gates = result.gates()
    if gates:
        return f"--fail-on {gates[0].policy} fired"
    words = {0: "pass", 1: "findings below", 3: "every backend failed", 16: "a broken promise"}
    return words.get(result.exit_code, "see Verdict")


def _figures(result: Result, stem: str | None, figs: list[Figure]) -> list[str]:
    if stem is None:
        return []
    out = ["## Figures", ""]
    csv = f"The full per-layer table is [{inert(stem)}.layers.csv]({stem}.layers.csv)."
    if not figs:
        return [*out, f"No per-layer data to plot (graph outputs only, or nothing compared). {csv}", ""]
    for fig in figs:
        out += [f"![{inert(fig.title)}]({stem}.{fig.slug}.png)", "", f"*{prose(fig.caption)}*", ""]
    still = builds_unchanged(result)
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


def _backend_rows(result: Result) -> list[list[object]]:
    rows: list[list[object]] = []
    cross = {c.backend: c for c in result.cross_backend}
    for backend in result.backends:
        c = cross.get(backend.name)
        vs = (
            ["reference", "–", "–", "–", "–"]
            if backend.name == result.reference_used
            else (
                [
                    _yes(c.bitwise_equal),
                    _num(c.max_ulp),
                    _num(c.scaled_ulp),
                    module_note(c.first_divergence, result.model.modules()),
                    c.first_violation or "–",
                ]
                if c is not None and c.status == "ok"
                else ["–"] * 5
            )
        )
        status: object = backend.status if backend.ok else strong(backend.status, f": {backend.reason}")
        drift = _drift_cell(result, backend.name)
        if backend.loaded_from:
            status = f"{status} (capture {backend.loaded_from})"
        det = _yes(backend.deterministic)
        runs = f"{backend.runs} x {backend.builds}" if backend.ok else "–"
        distinct = f"{backend.distinct_outputs}" if backend.ok else "–"
        notes = [f"precision {dict(backend.info)['precision']}"] if "precision" in dict(backend.info) else []
        notes += [f"promises {', '.join(backend.promises)}"] if backend.promises else []
        name = f"{backend.name} ({'; '.join(notes)})" if notes else backend.name
        lat = (
            [backend.latency.words() if backend.latency else "–", _memory_cell(backend)]
            if result.options.shows_times
            else []
        )
        rows.append([name, status, det, runs, distinct, *lat, *vs, *([drift] if result.baseline else [])])
    return rows


def _memory_cell(backend: BackendResult) -> str:
    """The measured peak beside the plan's (the engine's resident memory once loaded, measured,
    and what the memory plan says the model adds)."""
    if not backend.peak_rss_bytes:
        return "–"
    if not backend.planned_peak:
        return gib(backend.peak_rss_bytes)
    ratio = backend.peak_rss_bytes / backend.planned_peak
    return f"{gib(backend.peak_rss_bytes)} (planned {gib(backend.planned_peak)}, {ratio:.2f}x)"


def _drift_cell(result: Result, name: str) -> str:
    drift = next((x for x in result.baseline if x.backend == name), None)
    if drift is None:
        return "–"
    if drift.status == "identical":
        return "bit-identical"
    if drift.status != "drifted":
        return drift.status
    size = f"{_num(drift.scaled_ulp)} scaled ULP, " if drift.measured and drift.outputs_moved else ""
    return f"moved: {size}from {module_note(drift.first_moved, result.model.modules())}"


def _backends(result: Result) -> list[str]:
    header = [
        "backend",
        "status",
        "deterministic",
        "runs x builds",
        "distinct outputs",
        *(["latency (median)", "peak memory (planned)"] if result.options.shows_times else []),
        f"bitwise = {result.reference_used}",
        "max ULP (outputs)",
        "scaled ULP (outputs)",
        "first divergence",
        past_header(result),
        *(["baseline"] if result.baseline else []),
    ]
    hidden = (
        []
        if result.options.shows_times
        else [
            "Latency and peak memory are left out (they differ between identical runs): pass "
            "`--timed-runs N` or `--timings` for them.",
            "",
        ]
    )
    return ["## Backends", "", *_table(header, _backend_rows(result)), *hidden]


def _promises(result: Result) -> list[str]:
    """Runners that promise determinism (deterministic hardware): each promise, kept or not."""
    checks = result.promise_checks()
    if not checks:
        return []
    rows = [
        [
            check.backend,
            check.name,
            strong("BROKEN") if check.broken else check.status,
            check.evidence,
            module_note(check.first_layer or None, result.model.modules()),
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


def _reproduce(result: Result) -> list[str]:
    return ["## Reproduce", "", *fenced(result.command, "sh"), ""]


def to_markdown(result: Result, stem: str | None = None) -> str:
    """The whole report as Markdown text; same Result, same bytes.

    The three answers, the verdict, the backend table and the figures come first (the answers and
    the verdict within 40 lines, whatever the model's size); every other section is folded.
    `stem` names the files beside the report (STEM.SLUG.png figures, STEM.layers.csv); None links
    none.
    """
    shown = _shown(result)  # the verdict once: the head shows it, All findings keeps the rest
    figs = planned_figures(result) if stem is not None else []
    parts = [
        *_head(result, stem, figs),
        *_verdict(*shown),
        *_backends(result),
        *_promises(result),
        *cost_section(result),
        *decode_section(result),
        *decisions_section(result),
        *candidate_section(result),
        *explanation_section(result),
        *_figures(result, stem, figs),
        *_findings(result, *shown),
        *baseline_section(result),
        *_folded(matrix_section(result), "scaled ULP between every two backends"),
        *_folded(expected_section(result), "each backend against the golden outputs"),
        *_folded(oracle_section(result), "each backend against the float64 oracle"),
        *_folded(
            allowances_section(result),
            f"what rounding allows each of the {len(result.explanation.rules)} ops, and the smallest loss "
            "caught",
        ),
        *cross_section(result),
        *_folded(observer_section(result), "instrumented vs plain builds"),
        *_folded(runs_section(result), f"{len(result.nondeterministic)} nondeterministic backend(s)"),
        *_folded(probes_section(result), f"{len(result.probes_ran)} probe(s) run"),
        *_folded(timings_section(result), "wall seconds per build"),
        *_folded(exposure_section(result), "tensors some backend could not expose"),
        *_folded(model_section(result), result.model.sha256[:12]),
        *_folded(inputs_section(result), f"sha256 {result.feeds.sha256[:12]}"),
        *_folded(options_section(result), "options and what each engine reported"),
        *_folded(environment_section(result), f"{len(result.environment)} facts"),
        *_folded(metrics_section(), "what each column means"),
        *_glossary(stem),
        *_reproduce(result),
    ]
    return only_our_html("\n".join(parts))
