"""The Markdown report: verdict first, then backends, layers, inputs, options, environment."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import PurePath

from xbackend.metrics import TensorDiff
from xbackend.probes import Probes
from xbackend.report.text import METRIC_DEFINITIONS
from xbackend.results import BackendResult, CrossBackendResult, Result

__all__ = ["to_markdown"]

WORST_LAYERS = 10
FULL_TABLE_LIMIT = 400


def _num(x: float | int | None) -> str:
    if x is None:
        return "–"
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    if math.isinf(x) or math.isnan(x):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.3g}"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def _yes(b: bool | None) -> str:
    return "–" if b is None else ("yes" if b else "**no**")


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
            if b.name == r.options.reference_name
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
        f"bitwise = {r.options.reference_name}",
        "max ULP (outputs)",
        "scaled ULP (outputs)",
        "first divergence",
        f"first past {r.options.max_ulp:g} scaled ULP",
    ]
    return ["## Backends", "", *_table(header, _backend_rows(r))]


def _diff_row(d: TensorDiff, mark: str = "") -> list[object]:
    name = f"**{d.name}** {mark}".strip() if mark else d.name
    special = f"{d.nan_mismatch}/{d.inf_mismatch}/{d.ftz_mismatch}"
    status = d.status if d.comparable else f"**{d.status}** ({d.detail})"
    return [
        name,
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


def _layer_tables(c: CrossBackendResult) -> list[str]:
    out = [f"### {c.backend} vs {c.reference}", ""]
    if c.status != "ok":
        return [*out, f"Not compared: {c.reason}.", ""]
    out.append(
        f"{len(c.tensors)} tensors compared. First divergence: "
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
    return out + _worst_layers(c) + _full_table(c)


def _worst_layers(c: CrossBackendResult) -> list[str]:
    worst = sorted((d for d in c.tensors if not d.bitwise_equal), key=lambda d: d.severity(), reverse=True)
    if not worst:
        return ["Every compared tensor is bitwise equal.", ""]
    return [
        f"Worst {min(WORST_LAYERS, len(worst))} layers:",
        "",
        *_table(_DIFF_HEADER, [_diff_row(d) for d in worst[:WORST_LAYERS]]),
    ]


def _marks(c: CrossBackendResult) -> dict[str, str]:
    marks: dict[str, str] = {}
    if c.first_divergence:
        marks[c.first_divergence] = "⟵ first divergence"
    if c.first_violation:
        marks[c.first_violation] = (marks.get(c.first_violation, "") + " ⟵ first past tolerance").strip()
    return marks


def _full_table(c: CrossBackendResult) -> list[str]:
    marks = _marks(c)
    rows = [_diff_row(d, marks.get(d.name, "")) for d in c.tensors[:FULL_TABLE_LIMIT]]
    out = ["<details><summary>All layers in topological order</summary>", "", *_table(_DIFF_HEADER, rows)]
    if len(c.tensors) > FULL_TABLE_LIMIT:
        out += [f"({len(c.tensors) - FULL_TABLE_LIMIT} more tensors in the JSON report.)", ""]
    return [*out, "</details>", ""]


def _cross(r: Result) -> list[str]:
    if not r.cross_backend:
        return ["## Cross-backend", "", "Only one backend ran; nothing to compare across backends.", ""]
    out = ["## Cross-backend, per layer", ""]
    for c in r.cross_backend:
        out += _layer_tables(c)
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
    if not r.oracle_error:
        return []
    rows = []
    for c in sorted(r.oracle_error, key=lambda c: (c.scaled_ulp or 0.0, c.backend)):
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
        "## Error against the float64 oracle",
        "",
        "Each backend against the model evaluated in float64 and rounded to each tensor's dtype; "
        "smaller is more accurate. Most accurate first.",
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
    for c in r.oracle_error:
        out += [f"### {c.backend} against the oracle", "", *_worst_layers(c), *_full_table(c)]
    return out


def _observer(p: Probes) -> list[str]:
    if not p.observer:
        return []
    rows = [
        [
            o.backend,
            o.status if o.status != "ok" else ("**YES**" if o.outputs_changed else "no"),
            _num(o.max_ulp),
            _num(o.scaled_ulp),
        ]
        for o in p.observer
    ]
    out = [
        "### Observer effect",
        "",
        "Graph outputs with every intermediate exposed vs the plain model.",
        "",
        *_table(["backend", "outputs changed", "max ULP", "scaled ULP"], rows),
    ]
    changed = [o.backend for o in p.observer if o.outputs_changed]
    if changed:
        out += [
            f"**Exposing intermediates changed the outputs of {', '.join(changed)}: the per-layer numbers "
            "above describe a differently optimized engine than the one you ship.**",
            "",
        ]
    return out


def _build_variance(p: Probes) -> list[str]:
    if not p.builds:
        return []
    rows = [
        [
            b.backend,
            b.builds,
            b.distinct_fingerprints,
            "**yes**" if b.builds_vary else "no",
            "**yes**" if b.outputs_differ else "no",
        ]
        for b in p.builds
    ]
    out = [
        "### Engine builds",
        "",
        "Each build in a fresh process; its fingerprint is what the engine decided "
        "(optimized graph and placement, per-layer kernels).",
        "",
        *_table(["backend", "builds", "distinct engines", "builds vary", "outputs differ"], rows),
    ]
    for b in p.builds:
        if b.varying_layers:
            out += [
                f"Layers of {b.backend} whose implementation differs between builds:",
                "",
                *_table(
                    ["layer", *[f"build {i}" for i in range(b.builds)]],
                    [[k, *v] for k, v in b.varying_layers[:FULL_TABLE_LIMIT]],
                ),
            ]
    return out


def _threads(p: Probes) -> list[str]:
    if not p.threads:
        return []
    rows = [
        [
            t.backend,
            t.threads,
            t.status if t.status != "ok" else _yes(t.invariant),
            _num(t.max_ulp),
            _num(t.scaled_ulp),
            t.first_divergence or t.reason or "–",
        ]
        for t in p.threads
    ]
    return [
        "### Thread invariance",
        "",
        "Each backend at other thread counts against itself at 1 thread.",
        "",
        *_table(
            ["backend", "threads", "same bits as 1 thread", "max ULP", "scaled ULP", "first divergence"], rows
        ),
    ]


def _opt_levels(p: Probes) -> list[str]:
    if not p.opt_levels:
        return []
    rows = [
        [
            o.backend,
            o.level,
            _yes(o.bitwise_equal),
            _num(o.max_ulp),
            _num(o.scaled_ulp),
            ", ".join(o.changed_by) or ("–" if o.bitwise_equal else "a combination"),
            ", ".join(o.modified_graph) or "–",
        ]
        for o in p.opt_levels
    ]
    return [
        "### Graph optimization levels",
        "",
        "Graph outputs of the plain model at each level against no "
        "optimization; 'changed by' is the optimizer whose removal alone restores the bits.",
        "",
        *_table(
            [
                "backend",
                "level",
                "same bits as none",
                "max ULP",
                "scaled ULP",
                "changed by",
                "optimizers that rewrote the graph",
            ],
            rows,
        ),
    ]


def _batch(p: Probes) -> list[str]:
    if not p.batch:
        return []
    rows = [
        [
            b.backend,
            b.batch,
            ",".join(map(str, b.positions)) or "–",
            b.status if b.status != "ok" else _yes(b.invariant),
            _num(b.max_ulp),
            _num(b.scaled_ulp),
            b.first_divergence or b.reason or "–",
        ]
        for b in p.batch
    ]
    out = [
        "### Batch invariance",
        "",
        "The first sample alone vs the same sample inside a batch (other rows "
        "random, seeded), at several positions.",
        "",
        *_table(
            ["backend", "batch", "positions", "same bits alone", "max ULP", "scaled ULP", "first divergence"],
            rows,
        ),
    ]
    for b in p.batch:
        if b.invariant is False:
            out += [
                f"Error by depth for {b.backend} (topological index):",
                "",
                *_table(
                    ["depth", "tensor", "max ULP", "scaled ULP"],
                    [[d, t, _num(u), _num(s)] for t, d, u, s in b.by_depth[:FULL_TABLE_LIMIT]],
                ),
            ]
    return out


def _probes(r: Result) -> list[str]:
    p = r.probes
    body = [*_observer(p), *_build_variance(p), *_threads(p), *_opt_levels(p), *_batch(p)]
    notes = [f"- {n}" for n in p.notes]
    if not body and not notes:
        return []
    ran = ", ".join(p.ran) or "none"
    return [
        "## What moves the bits (probes)",
        "",
        f"Probes run: {ran}.",
        "",
        *body,
        *([*notes, ""] if notes else []),
    ]


def _run_to_run(b: BackendResult) -> list[str]:
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
    return out + _table(_DIFF_HEADER, [_diff_row(d) for d in varying[:FULL_TABLE_LIMIT]])


def _runs(r: Result) -> list[str]:
    out = ["## Run to run and build to build", ""]
    for b in r.backends:
        out += _run_to_run(b)
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
    rows = [[n, d, "[" + ",".join(map(str, s)) + "]"] for n, d, s in f.shapes]
    return [
        "## Inputs",
        "",
        f"{src}; sha256 `{f.sha256}`. The same bytes went to every backend and every run.",
        "",
        *_table(["input", "dtype", "shape"], rows),
    ]


def _options(r: Result) -> list[str]:
    o = r.options
    out = [
        "## Options in force",
        "",
        f"Reference: {o.reference_name}. Runs per build: {o.runs}. Builds (fresh processes): "
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
        *_oracle(r),
        *_cross(r),
        *_runs(r),
        *_probes(r),
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
