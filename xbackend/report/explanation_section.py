"""The report's explanation section: what each difference is (rounding, a backend's own error,
or the model's conditioning), where it was made, and the per-element allowances used."""

from __future__ import annotations

from collections.abc import Callable

from xbackend.files.textfmt import num, prose, with_module
from xbackend.report.markup import strong, table
from xbackend.results import Result
from xbackend.results.explanation import LocalErrors, ReorderCheck, conditioning_limit, share

__all__ = ["allowances_section", "explanation_section"]


def _row(name: str, le: LocalErrors | None, modules: dict[str, str]) -> list[str]:
    if le is None:
        return [name, "not judged", "–", "–", "–"]
    if le.status != "ok":
        return [name, "not judged", "–", le.reason, "–"]
    graph = le.graph or "–"
    if le.origins:
        o = le.origins[0]
        return [
            name,
            strong(f"{len(le.origins)} origin(s)"),
            graph,
            with_module(o.tensor, modules),
            num(o.ratio),
        ]
    where = with_module(le.largest_at, modules) if le.largest_at else "–"
    below = share(le.largest_ratio) if le.largest_ratio is not None else num(None)
    return [name, "explained", graph, where, below]  # never rounded up to the allowance


def _check_words(rc: ReorderCheck, modules: dict[str, str]) -> str:
    if rc.status != "ok":
        return f" The allowances against K orders per node: {rc.reason}." if rc.reason else ""
    at = f", at {with_module(rc.largest_at, modules)}" if rc.largest_at else ""
    past = f" **Past it at {', '.join(rc.over)}.**" if rc.over else ""
    return (
        f" Per node, fed the reference's values, those orders move it by at most {num(rc.largest_ratio)} "
        f"of its allowance{at} (the largest of {rc.samples} orders is above the {rc.quantile:.2f}-quantile "
        f"of one order's spread with probability 0.9).{past}"
    )


def _detection(names: list[str], local: Callable[[str], LocalErrors | None]) -> list[str]:
    """Per backend, the smallest loss its judgment catches, per op."""
    rows = []
    for name in names:
        le = local(name)
        found = le.detection() if le is not None and le.status == "ok" else ()
        if found:
            cells = [f"{op} {v:.2g} ({v / 2.0**-24:.3g} u, {k})" for op, v, k in found]
            rows.append([name, le.graph or "–" if le is not None else "–", "; ".join(cells)])
    if not rows:
        return []
    return [
        "",
        "Smallest loss caught: the relative error that, made on every element of one node, is past "
        "its allowance somewhere (u = 2^-24; per op, the median over its nodes, and how many). A loss "
        "below it passes as rounding; it grows with a sum's terms and shrinks with the tensor's size "
        "(docs/explanations.md, Detection thresholds).",
        "",
        *table(["backend", "judged on", "per op"], rows),
    ]


def explanation_section(result: Result) -> list[str]:
    """The report's section on what the differences are (each backend's judgment against float64)."""
    ex = result.explanation
    if not ex.ok:
        return (
            ["## What the differences are", "", f"Not measured: {prose(ex.reason)}.", ""] if ex.reason else []
        )
    modules = result.model.modules()
    out = [
        "## What the differences are",
        "",
        "Each node is run alone on each backend, fed the reference's values of its inputs, and "
        "compared with its float64 value on the same inputs. Each element may differ by what correct "
        "rounding of its own operands allows: its **allowance** (the rules per op are folded below). A "
        "node past its allowance anywhere is an **origin**; a backend without origins is **explained**: "
        "every difference it shows is rounding carried through the model. A sum is allowed what its "
        f"roundings reach with probability {ex.confidence:.6g} (Higham & Mary's bound), so a correct "
        "engine is called an origin less than once in a million nodes; an origin past the worst-case "
        "bound too is an error whatever the odds. The reference is judged like every backend.",
        "",
        "The last column is the node that came closest: the share of its allowance it used. A "
        "correctly rounded Add uses nearly all of it (0.999 is normal); past 1 is an origin.",
        "",
    ]
    names = [result.reference_used, *(c.backend for c in result.cross_backend if c.status == "ok")]
    rows = [_row(name, ex.local_for(name), modules) for name in names]
    head = ["backend", "verdict", "judged on", "first origin, or closest node", "own error / allowance"]
    out += table(head, rows)
    origins = [(le.backend, origin) for le in ex.local if le.status == "ok" for origin in le.origins]
    if origins:
        out += [
            "### Origins",
            "",
            "Nodes whose own error is past what rounding allows against their float64 value; everything "
            "downstream inherits it. Both figures are in ULP of the tensor's largest float64 magnitude, at "
            "the element where the error is largest against its allowance.",
            "",
            *table(
                [
                    "backend",
                    "tensor",
                    "module",
                    "op",
                    "element",
                    "local scaled ULP",
                    "allowed",
                    "rule",
                    "detail",
                ],
                [
                    [
                        b,
                        origin.tensor,
                        origin.module or "–",
                        origin.op_type,
                        ",".join(map(str, origin.element)) or "–",
                        num(origin.local_scaled_ulp),
                        num(origin.allowed_scaled_ulp),
                        origin.rule or "–",
                        origin.detail or ("past the deterministic bound too" if origin.certain else "–"),
                    ]
                    for b, origin in origins
                ],
            ),
        ]
    out += ["### Ill-conditioned", ""]
    if ex.ill_conditioned:
        out += [
            "Where the rounding of the nodes above a tensor, carried through each node's condition "
            "number (from the float64 judge's value and operand magnitude: Σ|a||b| / |Σab| for a sum), "
            f"passes {num(conditioning_limit('float32'))} scaled ULP (float32; 2^(p/2) for a p-bit "
            "significand) while its inputs' does not, or where every engine is that far from the float64 "
            "oracle while they agree with each other: the model, not the engines, decides its accuracy. "
            "Differences at and after these are the model's.",
            "",
            *table(
                ["tensor", "module", "composed rounding (scaled ULP)", "found by", "cause"],
                [
                    [
                        ill_conditioned.tensor,
                        ill_conditioned.module or "–",
                        num(ill_conditioned.scaled_ulp),
                        ill_conditioned.criterion,
                        ill_conditioned.cause,
                    ]
                    for ill_conditioned in ex.ill_conditioned
                ],
            ),
        ]
    elif ex.conditioning:
        out += [f"Not assessed: {ex.conditioning.removeprefix('not assessed: ')}.", ""]
    else:
        out += [
            "None: the rounding of every node, carried through the condition numbers above it, keeps every "
            "tensor within half its precision.",
            "",
        ]
    if ex.amplifiers:
        out += [
            "Amplifiers: math nodes where half an ULP of the input (the rounding it already carries) moves "
            "the output by more than 16 scaled ULP. Ill-conditioned in the model's dtype, not an error: a "
            "backend that keeps more of the input's digits differs there by up to that much.",
            "",
            *table(
                ["tensor", "module", "op", "inputs up to", "half an input ULP moves it by (scaled ULP)"],
                [
                    [
                        amplifier.tensor,
                        amplifier.module or "–",
                        amplifier.op_type,
                        f"{amplifier.input_max:.4g}",
                        num(amplifier.gain_scaled_ulp),
                    ]
                    for amplifier in ex.amplifiers
                ],
            ),
        ]
    if ex.skipped:
        out += [
            f"Reductions left in their order ({len(ex.skipped)}): "
            + "; ".join(f"{n} ({op}: {why})" for n, op, why in ex.skipped[:20])
            + ("; ..." if len(ex.skipped) > 20 else "")
            + ".",
            "",
        ]
    return out


def allowances_section(result: Result) -> list[str]:
    """Each op's per-element allowance, as the judged models used them, with its source."""
    ex = result.explanation
    if not ex.ok or not ex.rules:
        return []
    names = [result.reference_used, *(c.backend for c in result.cross_backend if c.status == "ok")]
    return [
        "## Allowances per element",
        "",
        (
            f"Noise floor: every reduction of the model ({ex.permuted} of them) summed in {ex.samples} "
            f"random orders on {ex.engine}; a tensor's floor is the largest scaled ULP an order moved it "
            "(an empirical figure beside the bounds; it decides only for backends that could not be "
            "judged)."
            if ex.floors
            else f"Noise floor: {ex.floor_note or 'not measured'}."
        )
        + _check_words(ex.reorder_check, result.model.modules()),
        "",
        "u: the unit roundoff of the output's dtype; v: the float64 value; M: the operands' magnitude "
        "(Σ|a||b| for a product); n: the terms summed (xbackend/bounds/rules.py).",
        "",
        *table(["op", "allowed", "source"], [list(rule) for rule in ex.rules]),
        *_detection(names, ex.local_for),
    ]
