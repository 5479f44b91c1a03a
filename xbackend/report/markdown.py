"""The Markdown report: verdict first, then backends, layers, inputs, options, environment."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath

from xbackend.metrics import TensorDiff
from xbackend.probes.registry import PROBES
from xbackend.report.figures import planned_figures
from xbackend.report.text import METRIC_DEFINITIONS
from xbackend.results import BackendResult, CrossBackendResult, Result
from xbackend.textfmt import num as _num
from xbackend.textfmt import table as _table
from xbackend.textfmt import with_module
from xbackend.textfmt import yes as _yes
from xbackend.values import value_name

__all__ = ["to_markdown"]

WORST_LAYERS = 10
FULL_TABLE_LIMIT = 50  # rows of a folded per-layer table; the rest is in the CSV (and the JSON)
VERDICT_LINES = 10  # findings shown before the first fold; the rest are folded under "All findings"


def _verdict(r: Result) -> list[str]:
    lines = r.verdict()
    shown = lines[:VERDICT_LINES]
    more = len(lines) - len(shown)
    out = ["## Verdict", "", *[f"- {line}" for line in shown]]
    if more:
        out.append(f"- … and {more} more finding(s), under *All findings* below.")
    return [*out, "", f"Exit code {r.exit_code}.", ""]


def _findings(r: Result) -> list[str]:
    lines = r.verdict()
    if len(lines) <= VERDICT_LINES and not r.notes:
        return []
    body = [f"- {line}" for line in lines]
    if r.notes:
        body += ["", "Notes:", "", *[f"- {n}" for n in r.notes]]
    return _fold("All findings", f"{len(lines)} finding(s), {len(r.notes)} note(s)", [*body, ""])


def _fold(title: str, summary: str, body: list[str]) -> list[str]:
    """A section whose body is folded: the heading stays visible for navigation."""
    return [f"## {title}", "", f"<details><summary>{summary}</summary>", "", *body, "</details>", ""]


def _modules_note(r: Result, tensor: str | None) -> str:
    return with_module(tensor, r.model.modules()) if tensor else "–"


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
                f"{_modules_note(r, worst.first_divergence)}."
            )
    if r.oracle_error:
        best = min(r.oracle_error, key=lambda c: (c.scaled_ulp or 0.0, c.backend))
        parts.append(f"Closest to the float64 oracle: {best.backend} ({_num(best.scaled_ulp)} scaled ULP).")
    warns = sum(len(p.warnings()) for p in r.probes)
    if r.probes_ran:
        parts.append(f"Probes run: {', '.join(r.probes_ran)}; {warns} warning(s).")
    if r.baseline:
        moved = [d.backend for d in r.baseline if d.drifted]
        parts.append(
            f"Against the baseline: {', '.join(moved)} moved."
            if moved
            else "Against the baseline: no backend moved."
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
                    _modules_note(r, c.first_divergence),
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
        rows.append([name, status, det, runs, distinct, *vs, *([drift] if r.baseline else [])])
    return rows


def _drift_cell(r: Result, name: str) -> str:
    d = next((x for x in r.baseline if x.backend == name), None)
    if d is None:
        return "–"
    if d.status == "identical":
        return "bit-identical"
    if d.status != "drifted":
        return d.status
    size = f"{_num(d.scaled_ulp)} scaled ULP, " if d.measured and d.outputs_moved else ""
    return f"moved: {size}from {_modules_note(r, d.first_moved)}"


def _backends(r: Result) -> list[str]:
    header = [
        "backend",
        "status",
        "deterministic",
        "runs x builds",
        "distinct outputs",
        f"bitwise = {r.reference_used}",
        "max ULP (outputs)",
        "scaled ULP (outputs)",
        "first divergence",
        f"first past {r.options.max_ulp:g} scaled ULP",
        *(["baseline"] if r.baseline else []),
    ]
    return ["## Backends", "", *_table(header, _backend_rows(r))]


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
            _modules_note(r, c.first_layer or None),
        ]
        for c in checks
    ]
    return [
        "## Promises",
        "",
        "These runners promise determinism properties; a broken promise fails the run (exit 16).",
        "",
        *_table(["backend", "promise", "status", "evidence", "first layer that broke"], rows),
        "",
    ]


def _diff_row(d: TensorDiff, modules: Mapping[str, str], mark: str = "") -> list[object]:
    name = f"**{d.name}** {mark}".strip() if mark else d.name
    module = modules.get(value_name(d.name), "")
    special = f"{d.nan_mismatch}/{d.inf_mismatch}/{d.ftz_mismatch}"
    status = d.status if d.comparable else f"**{d.status}** ({d.detail})"
    if d.zero_ulp_reason():
        status = f"{status} (bits differ at 0 ULP: {d.zero_ulp_reason()})"
    return [
        name,
        *([module or "–"] if modules else []),
        d.op_type or "–",
        d.dtype,
        status,
        _yes(d.bitwise_equal),
        _num(d.mismatch_fraction),
        _num(d.max_ulp),
        _num(d.scaled_ulp),
        _num(d.max_abs),
        _num(d.max_rel),
        _num(d.v_ermv),
        special,
    ]


_DIFF_HEADER = [
    "tensor",
    "module",
    "op",
    "dtype",
    "status",
    "bitwise",
    "V_c",
    "max ULP",
    "scaled ULP",
    "max abs",
    "max rel",
    "V_ermv",
    "NaN/Inf/FTZ",
]


def _header(modules: Mapping[str, str]) -> list[str]:
    """The module column only for models that record source modules."""
    return _DIFF_HEADER if modules else [h for h in _DIFF_HEADER if h != "module"]


def _layer_tables(c: CrossBackendResult, modules: Mapping[str, str]) -> list[str]:
    out = [f"### {c.backend} vs {c.reference}", ""]
    if c.status != "ok":
        return [*out, f"Not compared: {c.reason}.", ""]
    first = c.first_divergence
    where = with_module(first, modules) if first else None
    outs = "bitwise equal" if c.bitwise_equal else f"{_num(c.scaled_ulp)} scaled ULP"
    summary = f"{len(c.tensors)} tensors; outputs {outs}; first divergence {where or 'none'}"
    return [*out, f"<details><summary>{summary}</summary>", "", *_layer_body(c, modules), "</details>", ""]


def _layer_body(c: CrossBackendResult, modules: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    out += [
        "Graph outputs (plain builds, the engine users ship):",
        "",
        *_table(_header(modules), [_diff_row(d, modules) for d in c.output_tensors]),
    ]
    if c.observer_differs:
        inst = c.instrumented_output_diffs()
        out += [
            "**The instrumented builds (every intermediate exposed) give other figures at the outputs; "
            "the per-layer tables below describe them:**",
            "",
            *_table(_header(modules), [_diff_row(d, modules) for d in inst]),
        ]
    if not c.tensors:
        return [*out, f"No per-layer table: {c.layers_note or 'nothing exposed'}.", ""]
    out.append(
        f"{len(c.tensors)} tensors compared per layer. First divergence: "
        f"**{c.first_divergence or 'none'}**; first past tolerance: "
        f"**{c.first_violation or 'none'}**."
    )
    out.append("")
    if c.only_in_backend or c.only_in_reference:
        out += [
            f"Exposed only by {c.backend}: {', '.join(c.only_in_backend) or 'none'}; "
            f"only by {c.reference}: {', '.join(c.only_in_reference) or 'none'}.",
            "",
        ]
    return out + _worst_layers(c, modules) + _full_table(c, modules)


def _worst_layers(c: CrossBackendResult, modules: Mapping[str, str]) -> list[str]:
    worst = sorted((d for d in c.tensors if not d.bitwise_equal), key=lambda d: d.severity(), reverse=True)
    if not worst:
        return ["Every compared tensor is bitwise equal.", ""] if c.tensors else []
    return [
        f"Worst {min(WORST_LAYERS, len(worst))} layers:",
        "",
        *_table(_header(modules), [_diff_row(d, modules) for d in worst[:WORST_LAYERS]]),
    ]


def _marks(c: CrossBackendResult) -> dict[str, str]:
    marks: dict[str, str] = {}
    if c.first_divergence:
        marks[c.first_divergence] = "⟵ first divergence"
    if c.first_violation:
        marks[c.first_violation] = (marks.get(c.first_violation, "") + " ⟵ first past tolerance").strip()
    return marks


def _full_table(c: CrossBackendResult, modules: Mapping[str, str]) -> list[str]:
    if not c.tensors:
        return []
    marks = _marks(c)
    rows = [_diff_row(d, modules, marks.get(d.name, "")) for d in c.tensors[:FULL_TABLE_LIMIT]]
    out = [
        f"<details><summary>All layers in topological order ({len(c.tensors)})</summary>",
        "",
        *_table(_header(modules), rows),
    ]
    if len(c.tensors) > FULL_TABLE_LIMIT:
        out += [
            f"({len(c.tensors) - FULL_TABLE_LIMIT} more tensors in the layer CSV and the JSON report.)",
            "",
        ]
    return [*out, "</details>", ""]


def _cross(r: Result) -> list[str]:
    if not r.cross_backend:
        return ["## Cross-backend", "", "Only one backend ran; nothing to compare across backends.", ""]
    out = ["## Cross-backend, per layer", ""]
    modules = r.model.modules()
    for c in r.cross_backend:
        out += _layer_tables(c, modules)
    return out


def _matrix(r: Result) -> list[str]:
    """Backend x backend: scaled ULP at the graph outputs ('=' where bitwise equal)."""
    names = [b.name for b in r.backends if b.ok]
    if len(names) < 2:
        return []
    cell = {}
    for p in r.pairs:
        text = "=" if p.bitwise_equal else _num(p.scaled_ulp)
        cell[(p.a, p.b)] = cell[(p.b, p.a)] = text
    rows = [[a, *["·" if a == b else cell.get((a, b), "–") for b in names]] for a in names]
    return [
        "## All pairs at the outputs",
        "",
        "Scaled ULP between every two backends at the graph outputs ('=' means bitwise equal).",
        "",
        *_table(["", *names], rows),
    ]


def _oracle(r: Result) -> list[str]:
    return _against(
        r,
        r.oracle_error,
        "Error against the float64 oracle",
        "Each backend against the model evaluated in float64 and rounded to each tensor's dtype; "
        "smaller is more accurate. Most accurate first.",
        "the oracle",
    )


def _expected(r: Result) -> list[str]:
    return _against(
        r,
        r.expected_error,
        "Against the expected outputs",
        "Each backend's graph outputs against the golden outputs (output_N.pb) that came with the "
        "inputs. Closest first.",
        "the expected outputs",
    )


def _against(
    r: Result, crosses: tuple[CrossBackendResult, ...], title: str, intro: str, what: str
) -> list[str]:
    if not crosses:
        return []
    modules = r.model.modules()
    rows = []
    for c in sorted(crosses, key=lambda c: (c.scaled_ulp or 0.0, c.backend)):
        outs = c.output_diffs()
        rows.append(
            [
                c.backend,
                _num(c.max_ulp),
                _num(c.scaled_ulp),
                _num(max((d.max_rel for d in outs), default=0.0)),
                c.first_violation or "–",
            ]
        )
    out = [
        f"## {title}",
        "",
        intro,
        "",
        *_table(
            [
                "backend",
                "max ULP (outputs)",
                "scaled ULP (outputs)",
                "max rel (outputs)",
                f"first past {r.options.max_ulp:g} scaled ULP",
            ],
            rows,
        ),
    ]
    for c in crosses:
        if c.tensors:
            out += [
                f"### {c.backend} against {what}",
                "",
                *_worst_layers(c, modules),
                *_full_table(c, modules),
            ]
    return out


def _baseline(r: Result) -> list[str]:
    if not r.baseline:
        return []
    modules = r.model.modules()
    rows = []
    for d in r.baseline:
        rows.append(
            [
                d.backend,
                d.status if not d.reason else f"{d.status}: {d.reason}",
                "values" if d.measured else "digests",
                _num(d.max_ulp) if d.measured else "–",
                _num(d.scaled_ulp) if d.measured else "–",
                _modules_note(r, d.first_moved),
                len(d.moved),
            ]
        )
    body = [
        f"Each backend against the same backend in the baseline ({r.options.baseline}): by values when the "
        "baseline kept captures, else by per-tensor digests (which say whether and where, not how much).",
        "",
        *_table(
            [
                "backend",
                "status",
                "compared by",
                "max ULP (outputs)",
                "scaled ULP (outputs)",
                "first moved",
                "tensors moved",
            ],
            rows,
        ),
    ]
    for d in r.baseline:
        if d.measured and d.drifted and d.tensors:
            worst = sorted(
                (x for x in d.tensors if not x.bitwise_equal), key=lambda x: x.severity(), reverse=True
            )
            body += [
                f"{d.backend}: worst {min(WORST_LAYERS, len(worst))} moved tensors:",
                "",
                *_table(_header(modules), [_diff_row(x, modules) for x in worst[:WORST_LAYERS]]),
            ]
    body += _env_changes(r)
    moved = sum(1 for d in r.baseline if d.drifted)
    return _fold("Against the baseline", f"{moved} of {len(r.baseline)} backend(s) moved", body)


def _env_changes(r: Result) -> list[str]:
    if not r.baseline_environment:
        return []
    old, new = dict(r.baseline_environment), dict(r.environment)
    rows = [[k, old.get(k, "–"), new.get(k, "–")] for k in sorted({*old, *new}) if old.get(k) != new.get(k)]
    if not rows:
        return ["The environment is the same as the baseline's.", ""]
    return ["Environment changes since the baseline:", "", *_table(["key", "baseline", "now"], rows)]


def _observer(r: Result) -> list[str]:
    rows = [
        [
            b.name,
            "**YES**" if b.observer.outputs_changed else "no",
            _num(b.observer.max_ulp),
            _num(b.observer.scaled_ulp),
        ]
        for b in r.backends
        if b.observer is not None
    ]
    if not rows:
        return []
    out = [
        "## Observer effect",
        "",
        "Graph outputs of the instrumented build (every intermediate exposed, for the per-layer tables) "
        "against the plain build (the engine users ship), same process and feeds. Verdicts and output "
        "figures always come from the plain build.",
        "",
        *_table(["backend", "outputs changed", "max ULP", "scaled ULP"], rows),
    ]
    changed = [b.name for b in r.backends if b.observer is not None and b.observer.outputs_changed]
    if changed:
        out += [
            f"**Exposing intermediates changed the outputs of {', '.join(changed)}: its per-layer numbers "
            "describe a differently optimized engine than the one you ship.**",
            "",
        ]
    return out


def _probes(r: Result) -> list[str]:
    body = [line for p in r.probes for line in p.markdown()]
    if not body and not r.probes_ran:
        return []
    ran = ", ".join(r.probes_ran) or "none"
    rest = [n for n in PROBES if n not in r.probes_ran]
    more = f" Not run: {', '.join(rest)} (add to `--probes`, or `--probes all`)." if rest else ""
    return ["## What moves the bits (probes)", "", f"Probes run: {ran}.{more}", "", *body]


def _run_to_run(b: BackendResult, modules: Mapping[str, str]) -> list[str]:
    out = [f"### {b.name}", ""]
    if not b.ok:
        return [*out, f"{b.status}: {b.reason}", ""]
    out.append(
        f"{b.runs} run(s) in each of {b.builds} build(s): {b.distinct_outputs} distinct "
        f"output(s) (within a session: {b.distinct_run_outputs}; across builds: "
        f"{b.distinct_build_outputs}). {b.exposed} tensors captured."
    )
    out.append("")
    varying = b.varying()
    if not varying:
        return [*out, "Every captured tensor was bitwise identical in every run and build.", ""]
    out += [f"{len(varying)} tensor(s) varied; first: **{varying[0].name}**.", ""]
    return out + _table(_header(modules), [_diff_row(d, modules) for d in varying[:FULL_TABLE_LIMIT]])


def _runs(r: Result) -> list[str]:
    out = ["## Run to run and build to build", ""]
    modules = r.model.modules()
    for b in r.backends:
        out += _run_to_run(b, modules)
    return out


def _exposure(r: Result) -> list[str]:
    rows = [[b.name, t, why] for b in r.backends for t, why in b.not_exposed]
    if not rows:
        return []
    return ["## Tensors a backend could not expose", "", *_table(["backend", "tensor", "reason"], rows)]


def _model(r: Result) -> list[str]:
    m = r.model
    rows: list[list[object]] = [
        ["path", m.path],
        ["sha256", f"`{m.sha256}`"],
        ["IR version", m.ir_version],
        ["opsets", ", ".join(f"{d} {v}" for d, v in m.opsets)],
        ["producer", m.producer or "–"],
        ["external data", "yes" if m.external_data else "no"],
        ["node outputs", len(m.tensors)],
    ]
    rows += [[f"metadata {k}", v] for k, v in m.metadata]
    return ["## Model", "", *_table(["", ""], rows)]


def _inputs(r: Result) -> list[str]:
    f = r.feeds
    src = f"generated with seed {f.seed}" if f.source == "generated" else f"loaded from {f.source}"
    ranges = dict(f.ranges)
    rows = [[n, d, s, ranges.get(n, "–")] for n, d, s in f.shapes]
    golden = (
        " Expected outputs came with them and join the comparison as the backend `expected`."
        if f.expected
        else ""
    )
    return [
        "## Inputs",
        "",
        f"{src}; sha256 `{f.sha256}`. The same bytes went to every backend and every run.{golden}",
        "",
        *_table(["input", "dtype", "shape", "generated from"], rows),
    ]


def _options(r: Result) -> list[str]:
    o = r.options
    out = [
        "## Options in force",
        "",
        f"Reference: {r.reference_used}"
        + (
            f" (instead of {o.reference_name}, which did not run)"
            if r.reference_used != o.reference_name
            else ""
        )
        + f". Runs per build: {o.runs}. Builds (fresh processes): "
        f"{o.builds}. Tolerance: {o.max_ulp:g} scaled ULP. Compared: "
        f"{'graph outputs only' if o.outputs_only else 'every node output'}. Timeout: {o.timeout:g} s "
        "per build.",
        "",
    ]
    rows: list[list[object]] = []
    for b in r.backends:
        rows += [[b.name, "option", k, v] for k, v in b.options]
        rows += [[b.name, "info", k, v] for k, v in b.info if (k, v) not in b.options]
    out += _table(["backend", "kind", "key", "value"], rows)
    return out


def _timings(r: Result) -> list[str]:
    if not r.options.timings:
        return []
    rows = [[b.name, i, f"{t:.1f}"] for b in r.backends for i, t in enumerate(b.build_s)]
    rows += [
        [what, i, f"{t:.1f}"] for p in r.probes for what, ts in p.build_times() for i, t in enumerate(ts)
    ]
    return [
        "## Build times",
        "",
        "Wall seconds of each build's worker process: imports, the engine build (for torch-compile "
        "backends, the compile and tuning in the first run), the runs and their captures (`--timings`).",
        "",
        *_table(["backend", "build", "seconds"], rows),
    ]


def _environment(r: Result) -> list[str]:
    return [
        "## Environment",
        "",
        "Determinism is only promised for an identical environment; diff this table between two reports.",
        "",
        *_table(["key", "value"], r.environment),
    ]


def _metrics() -> list[str]:
    return ["## Metrics", "", *[f"- **{k}**: {v}." for k, v in METRIC_DEFINITIONS], ""]


def _folded(lines: list[str], summary: str) -> list[str]:
    """Fold a section made as ["## Title", "", *body]."""
    if not lines:
        return []
    return _fold(lines[0].removeprefix("## "), summary, lines[2:])


def _reproduce(r: Result) -> list[str]:
    return ["## Reproduce", "", "```sh", r.command, "```", ""]


def to_markdown(r: Result, stem: str | None = None) -> str:
    """The whole report as Markdown text; same Result, same bytes.

    Verdict, summary, backend table, figures and how to read it come first (about 60 lines
    whatever the model's size); every other section is folded. `stem` names the files beside the
    report (STEM.SLUG.png figures, STEM.layers.csv); None links none.
    """
    title = PurePath(r.model.path).name
    parts = [
        f"# xbackend report: {title}",
        "",
        *_verdict(r),
        *_summary(r),
        *_backends(r),
        *_promises(r),
        *_figures(r, stem),
        *_how_to_read(stem),
        *_findings(r),
        *_baseline(r),
        *_folded(_matrix(r), "scaled ULP between every two backends"),
        *_folded(_expected(r), "each backend against the golden outputs"),
        *_folded(_oracle(r), "each backend against the float64 oracle"),
        *_cross(r),
        *_folded(_observer(r), "instrumented vs plain builds"),
        *_folded(_runs(r), f"{len(r.nondeterministic)} nondeterministic backend(s)"),
        *_folded(_probes(r), f"{len(r.probes_ran)} probe(s) run"),
        *_folded(_timings(r), "wall seconds per build"),
        *_folded(_exposure(r), "tensors some backend could not expose"),
        *_folded(_model(r), r.model.sha256[:12]),
        *_folded(_inputs(r), f"sha256 {r.feeds.sha256[:12]}"),
        *_folded(_options(r), "options and what each engine reported"),
        *_folded(_environment(r), f"{len(r.environment)} facts"),
        *_folded(_metrics(), "what each column means"),
        *_reproduce(r),
    ]
    return "\n".join(parts)
