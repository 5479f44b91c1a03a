"""The Markdown report: verdict first, then backends, layers, inputs, options, environment."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath

from xbackend.metrics import TensorDiff
from xbackend.probes import PROBES
from xbackend.report.text import METRIC_DEFINITIONS
from xbackend.results import BackendResult, CrossBackendResult, Result
from xbackend.textfmt import num as _num
from xbackend.textfmt import table as _table
from xbackend.textfmt import yes as _yes
from xbackend.values import value_name

__all__ = ["to_markdown"]

WORST_LAYERS = 10
FULL_TABLE_LIMIT = 400


def _verdict(r: Result) -> list[str]:
    out = ["## Verdict", "", *[f"- {line}" for line in r.verdict()], "", f"Exit code {r.exit_code}.", ""]
    if r.notes:
        out += ["Notes:", "", *[f"- {n}" for n in r.notes], ""]
    return out


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
                    c.first_divergence or "–",
                    c.first_violation or "–",
                ]
                if c is not None and c.status == "ok"
                else ["–"] * 5
            )
        )
        status = b.status if b.ok else f"**{b.status}**: {b.reason}"
        det = _yes(b.deterministic)
        runs = f"{b.runs} x {b.builds}" if b.ok else "–"
        distinct = f"{b.distinct_outputs}" if b.ok else "–"
        rows.append([b.name, status, det, runs, distinct, *vs])
    return rows


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
    ]
    return ["## Backends", "", *_table(header, _backend_rows(r))]


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
    out = ["<details><summary>All layers in topological order</summary>", "", *_table(_header(modules), rows)]
    if len(c.tensors) > FULL_TABLE_LIMIT:
        out += [f"({len(c.tensors) - FULL_TABLE_LIMIT} more tensors in the JSON report.)", ""]
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


def to_markdown(r: Result) -> str:
    """The whole report as Markdown text; same Result, same bytes."""
    title = PurePath(r.model.path).name
    parts = [
        f"# xbackend report: {title}",
        "",
        *_verdict(r),
        *_backends(r),
        *_matrix(r),
        *_expected(r),
        *_oracle(r),
        *_cross(r),
        *_observer(r),
        *_runs(r),
        *_probes(r),
        *_timings(r),
        *_exposure(r),
        *_model(r),
        *_inputs(r),
        *_options(r),
        *_environment(r),
        *_metrics(),
        "## Reproduce",
        "",
        "```sh",
        r.command,
        "```",
        "",
    ]
    return "\n".join(parts)
