"""The report's per-layer sections: each backend against the reference, every pair, the oracle
and the golden outputs, with the worst layers first and the full table folded."""

from __future__ import annotations

from collections.abc import Mapping

from xbackend.files.textfmt import inert, with_module
from xbackend.files.textfmt import num as _num
from xbackend.numerics.metrics import TensorDiff
from xbackend.numerics.values import value_name
from xbackend.report.markup import strong
from xbackend.report.markup import table as _table
from xbackend.report.markup import yes as _yes
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
    tensor_diff: TensorDiff,
    modules: Mapping[str, str],
    mark: str = "",
    floors: Mapping[str, float] | None = None,
) -> list[object]:
    """A row of a per-layer table: the tensor (marked), its module, its figures."""
    name = strong(tensor_diff.name, f" {mark}") if mark else inert(tensor_diff.name)
    module = inert(modules.get(value_name(tensor_diff.name), ""))
    mismatches = (
        tensor_diff.nan_mismatch,
        tensor_diff.inf_mismatch,
        tensor_diff.ftz_mismatch,
        tensor_diff.fill_mismatch,
    )
    special = "/".join(str(count) for count in mismatches)
    zero = (
        f" (bits differ at 0 ULP: {tensor_diff.zero_ulp_reason()})" if tensor_diff.zero_ulp_reason() else ""
    )
    status: object = (
        f"{tensor_diff.status}{zero}"
        if tensor_diff.comparable
        else strong(tensor_diff.status, f" ({tensor_diff.detail}){zero}")
    )
    return [
        name,
        *([module or "–"] if modules else []),
        inert(tensor_diff.op_type) or "–",
        tensor_diff.dtype,
        status,
        _yes(tensor_diff.bitwise_equal),
        _num(tensor_diff.mismatch_fraction),
        _num(tensor_diff.max_ulp),
        _num(tensor_diff.scaled_ulp),
        _num(tensor_diff.max_abs),
        _num(tensor_diff.max_rel),
        _num(tensor_diff.v_ermv),
        special,
        *([_times_floor(tensor_diff, floors)] if floors is not None else []),
    ]


def _times_floor(tensor_diff: TensorDiff, floors: Mapping[str, float]) -> str:
    """The difference in units of the tensor's noise floor (a floor under 1 ULP counts as 1)."""
    f = floors.get(value_name(tensor_diff.name))
    if f is None or tensor_diff.scaled_ulp is None:
        return "–"
    return f"{times_floor(tensor_diff.scaled_ulp, f):.2g}"


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
    cross: CrossBackendResult, modules: Mapping[str, str], floors: Mapping[str, float] | None
) -> list[str]:
    out = [f"### {inert(cross.backend)} vs {inert(cross.reference)}", ""]
    if cross.status != "ok":
        return [*out, f"Not compared: {cross.reason}.", ""]
    first = cross.first_divergence
    where = with_module(first, modules) if first else None
    outs = "bitwise equal" if cross.bitwise_equal else f"{_num(cross.scaled_ulp)} scaled ULP"
    after = (
        f"an intermediate first differs at {where}"
        if where and cross.bitwise_equal
        else f"first divergence {where or 'none'}"
    )
    summary = f"{len(cross.tensors)} tensors; outputs {outs}; {after}"
    body = _layer_body(cross, modules, floors)
    return [*out, f"<details><summary>{summary}</summary>", "", *body, "</details>", ""]


def _layer_body(
    cross: CrossBackendResult, modules: Mapping[str, str], floors: Mapping[str, float] | None
) -> list[str]:
    out: list[str] = []
    out += [
        "Graph outputs (plain builds, the engine users ship):",
        "",
        *_table(diff_header(modules), [diff_row(tensor, modules) for tensor in cross.output_tensors]),
    ]
    if cross.observer_differs:
        inst = cross.instrumented_output_diffs()
        out += [
            "**The instrumented builds (every intermediate exposed) give other figures at the outputs; "
            "the per-layer tables below describe them:**",
            "",
            *_table(diff_header(modules), [diff_row(d, modules) for d in inst]),
        ]
    if not cross.tensors:
        return [*out, f"No per-layer table: {cross.layers_note or 'nothing exposed'}.", ""]
    out.append(
        f"{len(cross.tensors)} tensors compared per layer. First divergence: "
        f"**{inert(cross.first_divergence or 'none')}**; first past tolerance: "
        f"**{inert(cross.first_violation or 'none')}**."
        + (f" Tolerances: {cross.tolerance_by}." if cross.tolerance_by else "")
    )
    out.append("")
    if cross.only_in_backend or cross.only_in_reference:
        out += [
            f"Exposed only by {cross.backend}: {', '.join(map(inert, cross.only_in_backend)) or 'none'}; "
            f"only by {cross.reference}: {', '.join(map(inert, cross.only_in_reference)) or 'none'}.",
            "",
        ]
    return out + _worst_layers(cross, modules, floors) + _full_table(cross, modules, floors)


def _worst_layers(
    cross: CrossBackendResult, modules: Mapping[str, str], floors: Mapping[str, float] | None = None
) -> list[str]:
    worst = sorted(
        (tensor for tensor in cross.tensors if not tensor.bitwise_equal),
        key=lambda tensor_diff: tensor_diff.severity(),
        reverse=True,
    )
    if not worst:
        return ["Every compared tensor is bitwise equal.", ""] if cross.tensors else []
    return [
        f"Worst {min(WORST_LAYERS, len(worst))} layers:",
        "",
        *_table(
            diff_header(modules, floors is not None),
            [diff_row(d, modules, "", floors) for d in worst[:WORST_LAYERS]],
        ),
    ]


def _marks(cross: CrossBackendResult) -> dict[str, str]:
    marks: dict[str, str] = {}
    if cross.first_divergence:
        marks[cross.first_divergence] = "⟵ first divergence"
    if cross.first_violation:
        marks[cross.first_violation] = (
            marks.get(cross.first_violation, "") + " ⟵ first past tolerance"
        ).strip()
    return marks


def _full_table(
    cross: CrossBackendResult, modules: Mapping[str, str], floors: Mapping[str, float] | None = None
) -> list[str]:
    if not cross.tensors:
        return []
    marks = _marks(cross)
    rows = [
        diff_row(tensor, modules, marks.get(tensor.name, ""), floors)
        for tensor in cross.tensors[:FULL_TABLE_LIMIT]
    ]
    out = [
        f"<details><summary>All layers in topological order ({len(cross.tensors)})</summary>",
        "",
        *_table(diff_header(modules, floors is not None), rows),
    ]
    if len(cross.tensors) > FULL_TABLE_LIMIT:
        out += [
            f"({len(cross.tensors) - FULL_TABLE_LIMIT} more tensors in the layer CSV and the JSON report.)",
            "",
        ]
    return [*out, "</details>", ""]


def cross_section(result: Result) -> list[str]:
    """The report's cross-backend section: each backend against the reference, per layer."""
    if not result.cross_backend:
        return ["## Cross-backend", "", "Only one backend ran; nothing to compare across backends.", ""]
    out = ["## Cross-backend, per layer", ""]
    modules = result.model.modules()
    floors = result.explanation.floor_map() if result.explanation.ok and result.explanation.floors else None
    if floors is not None:
        out += [
            "× floor: the difference in units of the tensor's noise floor (how far legitimate orders "
            "of every sum move it; a floor under 1 ULP counts as 1).",
            "",
        ]
    for c in result.cross_backend:
        out += _layer_tables(c, modules, floors)
    return out


def matrix_section(result: Result) -> list[str]:
    """Backend x backend: scaled ULP at the graph outputs ('=' where bitwise equal)."""
    names = [backend.name for backend in result.backends if backend.ok]
    if len(names) < 2:
        return []
    cell = {}
    for pair in result.pairs:
        text = "=" if pair.bitwise_equal else _num(pair.scaled_ulp)
        cell[(pair.a, pair.b)] = cell[(pair.b, pair.a)] = text
    rows = [[name, *["·" if name == b else cell.get((name, b), "–") for b in names]] for name in names]
    return [
        "## All pairs at the outputs",
        "",
        "Scaled ULP between every two backends at the graph outputs ('=' means bitwise equal).",
        "",
        *_table(["", *names], rows),
    ]


def oracle_section(result: Result) -> list[str]:
    """The report's section on each backend against the float64 oracle."""
    return _against(
        result,
        result.oracle_error,
        "Error against the float64 oracle",
        "Each backend against the model evaluated in float64 and rounded to each tensor's dtype; "
        "smaller is more accurate. Most accurate first.",
        "the oracle",
    )


def expected_section(result: Result) -> list[str]:
    """The report's section on each backend against the golden outputs."""
    return _against(
        result,
        result.expected_error,
        "Against the expected outputs",
        "Each backend's graph outputs against the golden outputs (output_N.pb) that came with the "
        "inputs. Closest first.",
        "the expected outputs",
    )


def _against(
    result: Result, crosses: tuple[CrossBackendResult, ...], title: str, intro: str, what: str
) -> list[str]:
    if not crosses:
        return []
    modules = result.model.modules()
    rows = []
    for cross_backend_result in sorted(crosses, key=lambda cross: (cross.scaled_ulp or 0.0, cross.backend)):
        outs = cross_backend_result.output_diffs()
        rows.append(
            [
                cross_backend_result.backend,
                _num(cross_backend_result.max_ulp),
                _num(cross_backend_result.scaled_ulp),
                _num(max((out.max_rel for out in outs), default=0.0)),
                cross_backend_result.first_violation or "–",
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
                past_header(result),
            ],
            rows,
        ),
    ]
    for cross_backend_result in crosses:
        if cross_backend_result.tensors:
            out += [
                f"### {inert(cross_backend_result.backend)} against {inert(what)}",
                "",
                *_worst_layers(cross_backend_result, modules),
                *_full_table(cross_backend_result, modules),
            ]
    return out


def past_header(result: Result) -> str:
    """The column of the first tensor past its tolerance: under auto, a judged backend's first
    origin (its node past its allowance against float64), else past the floor's tolerance."""
    return (
        "first past its tolerance"
        if result.options.max_ulp is None
        else f"first past {result.options.max_ulp:g} scaled ULP"
    )
