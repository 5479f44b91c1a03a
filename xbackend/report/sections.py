"""The report's folded sections after the layers: baseline drift, observer effect, probes, run-to-run
tables, exposure, model, inputs, options, build times, environment and metrics."""

from __future__ import annotations

from collections.abc import Mapping

from xbackend.files.textfmt import gib, inert, module_note
from xbackend.files.textfmt import num as _num
from xbackend.probes.registry import PROBES
from xbackend.report.layers import FULL_TABLE_LIMIT, WORST_LAYERS, diff_header, diff_row
from xbackend.report.markup import Ours, fold, render_section, strong
from xbackend.report.markup import table as _table
from xbackend.report.text import METRIC_DEFINITIONS
from xbackend.results import BackendResult, ModeRow, Result

__all__ = [
    "LATENCY_HIDDEN",
    "baseline_section",
    "cost_section",
    "environment_section",
    "exposure_section",
    "inputs_section",
    "metrics_section",
    "model_section",
    "observer_section",
    "options_section",
    "probes_section",
    "runs_section",
    "timings_section",
]


def baseline_section(result: Result) -> list[str]:
    """The drift section: each backend against the same backend in --baseline."""
    if not result.baseline:
        return []
    modules = result.model.modules()
    rows = []
    for d in result.baseline:
        rows.append(
            [
                d.backend,
                d.status if not d.reason else f"{d.status}: {d.reason}",
                "values" if d.measured else "digests",
                _num(d.max_ulp) if d.measured else "–",
                _num(d.scaled_ulp) if d.measured else "–",
                module_note(d.first_moved, result.model.modules()),
                len(d.moved),
            ]
        )
    body = [
        f"Each backend against the same backend in the baseline ({result.options.baseline}): by values when "
        "the "
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
    for d in result.baseline:
        if d.measured and d.drifted and d.tensors:
            worst = sorted(
                (tensor for tensor in d.tensors if not tensor.bitwise_equal),
                key=lambda tensor_diff: tensor_diff.severity(),
                reverse=True,
            )
            body += [
                f"{d.backend}: worst {min(WORST_LAYERS, len(worst))} moved tensors:",
                "",
                *_table(diff_header(modules), [diff_row(x, modules) for x in worst[:WORST_LAYERS]]),
            ]
    body += _env_changes(result)
    moved = sum(1 for d in result.baseline if d.drifted)
    return fold("Against the baseline", f"{moved} of {len(result.baseline)} backend(s) moved", body)


def _env_changes(result: Result) -> list[str]:
    if not result.baseline_environment:
        return []
    old, new = dict(result.baseline_environment), dict(result.environment)
    rows = [[k, old.get(k, "–"), new.get(k, "–")] for k in sorted({*old, *new}) if old.get(k) != new.get(k)]
    if not rows:
        return ["The environment is the same as the baseline's.", ""]
    return ["Environment changes since the baseline:", "", *_table(["key", "baseline", "now"], rows)]


def observer_section(result: Result) -> list[str]:
    """The observer effect section: where exposing every intermediate changed a backend's outputs."""
    rows = [
        [
            backend.name,
            strong("YES") if backend.observer.outputs_changed else "no",
            _num(backend.observer.max_ulp),
            _num(backend.observer.scaled_ulp),
        ]
        for backend in result.backends
        if backend.observer is not None
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
    changed = [
        backend.name
        for backend in result.backends
        if backend.observer is not None and backend.observer.outputs_changed
    ]
    if changed:
        out += [
            f"**Exposing intermediates changed the outputs of {', '.join(changed)}: its per-layer numbers "
            "describe a differently optimized engine than the one you ship.**",
            "",
        ]
    return out


def probes_section(result: Result) -> list[str]:
    """Each probe's own section, in the order they ran, and the probes not run."""
    modules = result.model.modules()
    body = [line for probe in result.probes for line in render_section(probe.section(modules), modules)]
    if not body and not result.probes_ran:
        return []
    ran = ", ".join(result.probes_ran) or "none"
    rest = [n for n in PROBES if n not in result.probes_ran]
    more = f" Not run: {', '.join(rest)} (add to `--probes`, or `--probes all`)." if rest else ""
    return ["## What moves the bits (probes)", "", f"Probes run: {ran}.{more}", "", *body]


def _run_to_run(backend: BackendResult, modules: Mapping[str, str]) -> list[str]:
    out = [f"### {inert(backend.name)}", ""]
    if not backend.ok:
        return [*out, f"{backend.status}: {backend.reason}", ""]
    out.append(
        f"{backend.runs} run(s) in each of {backend.builds} build(s): {backend.distinct_outputs} distinct "
        f"output(s) (within a session: {backend.distinct_run_outputs}; across builds: "
        f"{backend.distinct_build_outputs}). {backend.exposed} tensors captured."
    )
    out.append("")
    varying = backend.varying()
    if not varying:
        return [*out, "Every captured tensor was bitwise identical in every run and build.", ""]
    out += [f"{len(varying)} tensor(s) varied; first: **{varying[0].name}**.", ""]
    return out + _table(diff_header(modules), [diff_row(d, modules) for d in varying[:FULL_TABLE_LIMIT]])


def runs_section(result: Result) -> list[str]:
    """Run to run and build to build, backend by backend: what varied, and where."""
    out = ["## Run to run and build to build", ""]
    modules = result.model.modules()
    for backend in result.backends:
        out += _run_to_run(backend, modules)
    return out


def exposure_section(result: Result) -> list[str]:
    """The tensors a backend could not expose, with the reason (none: no section)."""
    rows = [[backend.name, inert(t), why] for backend in result.backends for t, why in backend.not_exposed]
    if not rows:
        return []
    return ["## Tensors a backend could not expose", "", *_table(["backend", "tensor", "reason"], rows)]


def model_section(result: Result) -> list[str]:
    """The model: its path, digest, IR, opsets, producer, weights, node outputs and metadata."""
    model = result.model
    rows: list[list[object]] = [
        ["path", model.path],
        ["sha256", f"`{model.sha256}`"],
        ["IR version", model.ir_version],
        ["opsets", ", ".join(f"{d} {v}" for d, v in model.opsets)],
        ["producer", model.producer or "–"],
        ["weights", gib(model.weight_bytes) + (", external data" if model.external_data else "")],
        ["node outputs", len(model.tensors)],
    ]
    rows += [[f"metadata {k}", v] for k, v in model.metadata]
    return ["## Model", "", *_table(["", ""], rows)]


def inputs_section(result: Result) -> list[str]:
    """What was fed: where the inputs came from, their digest, shapes and value ranges."""
    feeds = result.feeds
    src = (
        f"generated with seed {feeds.seed}" if feeds.source == "generated" else f"loaded from {feeds.source}"
    )
    how = {**dict(feeds.ranges), **dict(feeds.made)}
    rows = [[n, d, s, how.get(n, "–")] for n, d, s in feeds.shapes]
    golden = (
        " Expected outputs came with them and join the comparison as the backend `expected`."
        if feeds.expected
        else ""
    )
    return [
        "## Inputs",
        "",
        f"{src}; sha256 `{feeds.sha256}`. The same bytes went to every backend and every run.{golden}",
        "",
        *_table(["input", "dtype", "shape", "made as"], rows),
    ]


def options_section(result: Result) -> list[str]:
    """The options in force: the reference, runs, builds, tolerance, what was compared."""
    options = result.options
    out = [
        "## Options in force",
        "",
        f"Reference: {result.reference_used}"
        + (
            f" (instead of {options.reference_name}, which did not run)"
            if result.reference_used != options.reference_name
            else ""
        )
        + f". Runs per build: {options.runs}. Builds (fresh processes): "
        f"{options.builds}. Tolerance: {options.tolerance_text} scaled ULP. Compared: "
        f"{_compared(result)}. Timeout: {options.timeout:g} s "
        "per build.",
        "",
    ]
    rows: list[list[object]] = []
    for backend in result.backends:
        rows += [[backend.name, "option", k, v] for k, v in backend.options]
        rows += [[backend.name, "info", k, v] for k, v in backend.info if (k, v) not in backend.options]
    out += _table(["backend", "kind", "key", "value"], rows)
    return out


LATENCY_HIDDEN = (
    "Every run is timed, but reports leave times out unless asked for (they differ between identical "
    "comparisons, and reports are otherwise byte-reproducible): pass `--timed-runs N` or `--timings`."
)


def cost_section(result: Result) -> list[str]:
    """Each runner run under several modes: promises as observed, distinct outputs, latency."""
    fams = result.cost_of_determinism()
    if not fams:
        return []
    times = result.options.shows_times
    rows = []
    for fam in fams:
        for row in fam.rows:
            distinct = (
                f"{row.distinct_run_outputs} / {row.distinct_build_outputs}" if row.status == "ok" else "–"
            )
            lat = row.latency.words() if times and row.latency else ("–" if times else "not shown")
            ratio = f"{row.ratio:.2f}x" if times and row.ratio is not None else "–"
            mode = row.mode if row.status == "ok" else f"{row.mode} (**{row.status}**)"
            rows.append([fam.runner, f"{mode} ({row.backend})", _promises(row), distinct, lat, ratio])
    how = (
        "One inference's wall time over the runs whose bits were compared (the model users ship; "
        "each build's first run left out as warm-up), as a ratio of the default mode's median."
        if times
        else LATENCY_HIDDEN
    )
    return [
        "## Cost of determinism",
        "",
        "Each runner run here under several modes: what each mode promises and whether it held, its "
        f"distinct outputs within one session and over fresh builds, and its latency. {how}",
        "",
        *_table(
            [
                "runner",
                "mode (backend)",
                "promises",
                "distinct outputs (runs / builds)",
                "latency",
                "x default",
            ],
            rows,
        ),
    ]


def timings_section(result: Result) -> list[str]:
    """Each build's wall seconds, the backends' and the probes' (--timings)."""
    if not result.options.shows_times:
        return []
    rows = [
        [backend.name, index, f"{t:.1f}"]
        for backend in result.backends
        for index, t in enumerate(backend.build_s)
    ]
    rows += [
        [what, index, f"{t:.1f}"]
        for probe in result.probes
        for what, ts in probe.build_times()
        for index, t in enumerate(ts)
    ]
    return [
        "## Build times",
        "",
        "Wall seconds of each build's worker process: imports, the engine build (for torch-compile "
        "backends, the compile and tuning in the first run), the runs and their captures (`--timings`).",
        "",
        *_table(["backend", "build", "seconds"], rows),
    ]


def environment_section(result: Result) -> list[str]:
    """The environment the comparison ran in, key by key, to diff between two reports."""
    return [
        "## Environment",
        "",
        "Determinism is only promised for an identical environment; diff this table between two reports.",
        "",
        *_table(["key", "value"], result.environment),
    ]


def metrics_section() -> list[str]:
    """What each metric in the tables means."""
    return ["## Metrics", "", *[f"- **{k}**: {v}." for k, v in METRIC_DEFINITIONS], ""]


def _compared(result: Result) -> str:
    """What was exposed: every node output, graph outputs, or what --tensors selected."""
    if result.options.outputs_only:
        return "graph outputs only"
    if result.model.exposed is None:
        return "every node output"
    what = (
        "module boundaries"
        if result.model.selection == "modules"
        else f"tensors matching {result.model.selection}"
    )
    return (
        f"{what} (--tensors), {len(result.model.exposed)} of {len(result.model.all_tensors())} tensors, "
        "graph outputs among them"
    )


def _promises(row: ModeRow) -> str:
    """A mode's promises as a table cell: each with its state, a broken one in the report's bold."""
    if not row.promised:
        return "none"
    said = [
        f"**{inert(name)} {state}**" if state == "BROKEN" else f"{inert(name)} {state}"
        for name, state in row.promise_states()
    ]
    return Ours(", ".join(said))
