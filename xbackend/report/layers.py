"""The report's per-layer sections: each backend against the reference, every pair, the oracle
and the golden outputs, with the worst layers first and the full table folded."""

from __future__ import annotations

from collections.abc import Mapping

from xbackend.files.textfmt import inert, strong, with_module
from xbackend.files.textfmt import num as _num
from xbackend.files.textfmt import table as _table
from xbackend.files.textfmt import yes as _yes
from xbackend.numerics.metrics import TensorDiff
from xbackend.numerics.values import value_name
from xbackend.results import CrossBackendResult, Result
from xbackend.results.explanation import times_floor

__all__ = [
    "FULL_TABLE_LIMIT",
    "WORST_LAYERS",
    "cross_section",
    "diff_header",
    "diff_row",
    "expected_section",
    "matrix_section",
    "oracle_section",
    "past_header",
]

WORST_LAYERS = 10
FULL_TABLE_LIMIT = 50  # rows of a folded per-layer table; the rest is in the CSV (and the JSON)


def diff_row(
    d: TensorDiff, modules: Mapping[str, str], mark: str = "", floors: Mapping[str, float] | None = None
) -> list[object]:
    name = strong(d.name, f" {mark}") if mark else inert(d.name)
    module = inert(modules.get(value_name(d.name), ""))
    special = f"{d.nan_mismatch}/{d.inf_mismatch}/{d.ftz_mismatch}/{d.fill_mismatch}"
    zero = f" (bits differ at 0 ULP: {d.zero_ulp_reason()})" if d.zero_ulp_reason() else ""
    status: object = f"{d.status}{zero}" if d.comparable else strong(d.status, f" ({d.detail}){zero}")
    return [
        name,
        *([module or "–"] if modules else []),
        inert(d.op_type) or "–",
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
        *([_times_floor(d, floors)] if floors is not None else []),
    ]


def _times_floor(d: TensorDiff, floors: Mapping[str, float]) -> str:
    """The difference in units of the tensor's noise floor (a floor under 1 ULP counts as 1)."""
    f = floors.get(value_name(d.name))
    if f is None or d.scaled_ulp is None:
        return "–"
    return f"{times_floor(d.scaled_ulp, f):.2g}"


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
    "NaN/Inf/FTZ/fill",
]


def diff_header(modules: Mapping[str, str], floors: bool = False) -> list[str]:
    """The module column only for models that record source modules; × floor where floors exist."""
    head = _DIFF_HEADER if modules else [h for h in _DIFF_HEADER if h != "module"]
    return [*head, "× floor"] if floors else head


def _layer_tables(
    c: CrossBackendResult, modules: Mapping[str, str], floors: Mapping[str, float] | None
) -> list[str]:
    out = [f"### {inert(c.backend)} vs {inert(c.reference)}", ""]
    if c.status != "ok":
        return [*out, f"Not compared: {c.reason}.", ""]
    first = c.first_divergence
    where = with_module(first, modules) if first else None
    outs = "bitwise equal" if c.bitwise_equal else f"{_num(c.scaled_ulp)} scaled ULP"
    after = (
        f"an intermediate first differs at {where}"
        if where and c.bitwise_equal
        else f"first divergence {where or 'none'}"
    )
    summary = f"{len(c.tensors)} tensors; outputs {outs}; {after}"
    body = _layer_body(c, modules, floors)
    return [*out, f"<details><summary>{summary}</summary>", "", *body, "</details>", ""]


def _layer_body(
    c: CrossBackendResult, modules: Mapping[str, str], floors: Mapping[str, float] | None
) -> list[str]:
    out: list[str] = []
    out += [
        "Graph outputs (plain builds, the engine users ship):",
        "",
        *_table(diff_header(modules), [diff_row(tensor, modules) for tensor in c.output_tensors]),
    ]
    if c.observer_differs:
        inst = c.instrumented_output_diffs()
        out += [
            "**The instrumented builds (every intermediate exposed) give other figures at the outputs; "
            "the per-layer tables below describe them:**",
            "",
            *_table(diff_header(modules), [diff_row(d, modules) for d in inst]),
        ]
    if not c.tensors:
        return [*out, f"No per-layer table: {c.layers_note or 'nothing exposed'}.", ""]
    out.append(
        f"{len(c.tensors)} tensors compared per layer. First divergence: "
        f"**{inert(c.first_divergence or 'none')}**; first past tolerance: "
        f"**{inert(c.first_violation or 'none')}**."
        + (f" Tolerances: {c.tolerance_by}." if c.tolerance_by else "")
    )
    out.append("")
    if c.only_in_backend or c.only_in_reference:
        out += [
            f"Exposed only by {c.backend}: {', '.join(map(inert, c.only_in_backend)) or 'none'}; "
            f"only by {c.reference}: {', '.join(map(inert, c.only_in_reference)) or 'none'}.",
            "",
        ]
    return out + _worst_layers(c, modules, floors) + _full_table(c, modules, floors)


def _worst_layers(
    c: CrossBackendResult, modules: Mapping[str, str], floors: Mapping[str, float] | None = None
) -> list[str]:
    worst = sorted(
        (tensor for tensor in c.tensors if not tensor.bitwise_equal), key=lambda d: d.severity(), reverse=True
    )
    if not worst:
        return ["Every compared tensor is bitwise equal.", ""] if c.tensors else []
    return [
        f"Worst {min(WORST_LAYERS, len(worst))} layers:",
        "",
        *_table(
            diff_header(modules, floors is not None),
            [diff_row(d, modules, "", floors) for d in worst[:WORST_LAYERS]],
        ),
    ]


def _marks(c: CrossBackendResult) -> dict[str, str]:
    marks: dict[str, str] = {}
    if c.first_divergence:
        marks[c.first_divergence] = "⟵ first divergence"
    if c.first_violation:
        marks[c.first_violation] = (marks.get(c.first_violation, "") + " ⟵ first past tolerance").strip()
    return marks


def _full_table(
    c: CrossBackendResult, modules: Mapping[str, str], floors: Mapping[str, float] | None = None
) -> list[str]:
    if not c.tensors:
        return []
    marks = _marks(c)
    rows = [diff_row(d, modules, marks.get(d.name, ""), floors) for d in c.tensors[:FULL_TABLE_LIMIT]]
    out = [
        f"<details><summary>All layers in topological order ({len(c.tensors)})</summary>",
        "",
        *_table(diff_header(modules, floors is not None), rows),
    ]
    if len(c.tensors) > FULL_TABLE_LIMIT:
        out += [
            f"({len(c.tensors) - FULL_TABLE_LIMIT} more tensors in the layer CSV and the JSON report.)",
            "",
        ]
    return [*out, "</details>", ""]


def cross_section(r: Result) -> list[str]:
    if not r.cross_backend:
        return ["## Cross-backend", "", "Only one backend ran; nothing to compare across backends.", ""]
    out = ["## Cross-backend, per layer", ""]
    modules = r.model.modules()
    floors = r.explanation.floor_map() if r.explanation.ok and r.explanation.floors else None
    if floors is not None:
        out += [
            "× floor: the difference in units of the tensor's noise floor (how far legitimate orders "
            "of every sum move it; a floor under 1 ULP counts as 1).",
            "",
        ]
    for c in r.cross_backend:
        out += _layer_tables(c, modules, floors)
    return out


def matrix_section(r: Result) -> list[str]:
    """Backend x backend: scaled ULP at the graph outputs ('=' where bitwise equal)."""
    names = [backend.name for backend in r.backends if backend.ok]
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


def oracle_section(r: Result) -> list[str]:
    return _against(
        r,
        r.oracle_error,
        "Error against the float64 oracle",
        "Each backend against the model evaluated in float64 and rounded to each tensor's dtype; "
        "smaller is more accurate. Most accurate first.",
        "the oracle",
    )


def expected_section(r: Result) -> list[str]:
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
                past_header(r),
            ],
            rows,
        ),
    ]
    for c in crosses:
        if c.tensors:
            out += [
                f"### {inert(c.backend)} against {inert(what)}",
                "",
                *_worst_layers(c, modules),
                *_full_table(c, modules),
            ]
    return out


def past_header(r: Result) -> str:
    """The column of the first tensor past its tolerance: under auto, a judged backend's first
    origin (its node past its allowance against float64), else past the floor's tolerance."""
    return (
        "first past its tolerance"
        if r.options.max_ulp is None
        else f"first past {r.options.max_ulp:g} scaled ULP"
    )
