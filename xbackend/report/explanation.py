"""The report's explanation section: what each difference is (reordering and rounding, a
backend's own error, or the model's conditioning), where it was made, and the bounds used."""

from __future__ import annotations

from xbackend.results import Result
from xbackend.results.explanation import conditioning_limit
from xbackend.rounding import DEFAULT_BOUND, ROUNDING
from xbackend.textfmt import num, table, with_module

__all__ = ["explanation_section"]


def explanation_section(r: Result) -> list[str]:
    ex = r.explanation
    if not ex.ok:
        return ["## What the differences are", "", f"Not measured: {ex.reason}.", ""] if ex.reason else []
    modules = r.model.modules()
    out = [
        "## What the differences are",
        "",
        f"Noise floor: every reduction of the model ({ex.permuted} of them) summed in {ex.samples} random "
        f"orders on {ex.engine}; a tensor's floor is the largest scaled ULP an order moved it. Local "
        "error: each node run on the backend, fed the reference's values of its inputs (the severed "
        f"model), against the reference's output. A node is an **origin** when its local error exceeds "
        f"{ex.margin:g}x the larger of its floor and its op's rounding bound; a backend without origins "
        "is **explained**: all its differences come from reordering and rounding.",
        "",
    ]
    rows = []
    for c in r.cross_backend:
        le = ex.local_for(c.backend)
        if le is None or c.status != "ok":
            continue
        if le.status != "ok":
            rows.append([c.backend, "not measured", le.reason, "–"])
        elif le.origins:
            o = le.origins[0]
            rows.append([c.backend, f"**{len(le.origins)} origin(s)**", with_module(o.tensor, modules), "–"])
        else:
            where = with_module(le.largest_at, modules) if le.largest_at else "–"
            rows.append([c.backend, "explained", where, num(le.largest_ratio)])
    out += [
        *table(
            ["backend", "verdict", "first origin, or largest local error at", "largest local / allowed"], rows
        ),
    ]
    origins = [(c.backend, o) for c in r.cross_backend for o in c.origins]
    if origins:
        out += [
            "### Origins",
            "",
            "Nodes whose own error is beyond reordering and rounding; everything downstream inherits it.",
            "",
            *table(
                ["backend", "tensor", "module", "op", "local scaled ULP", "allowed", "detail"],
                [
                    [
                        b,
                        o.tensor,
                        o.module or "–",
                        o.op_type,
                        num(o.local_scaled_ulp),
                        num(o.allowed_scaled_ulp),
                        o.detail or "–",
                    ]
                    for b, o in origins
                ],
            ),
        ]
    out += ["### Ill-conditioned", ""]
    if ex.ill_conditioned:
        out += [
            "Where reorderings alone move a tensor past "
            f"{num(conditioning_limit('float32'))} scaled ULP (float32; 2^(p/2) for a p-bit significand), "
            "or where every engine is that far from the float64 oracle while they agree with each other: "
            "the model, not the engines, decides its accuracy. Differences at and after these are the "
            "model's.",
            "",
            *table(
                ["tensor", "module", "floor (scaled ULP)", "found by", "cause"],
                [
                    [t.tensor, t.module or "–", num(t.floor_scaled_ulp), t.criterion, t.cause]
                    for t in ex.ill_conditioned
                ],
            ),
        ]
    else:
        out += ["None: reorderings keep every tensor within half its precision.", ""]
    if ex.skipped:
        out += [
            f"Reductions left in their order ({len(ex.skipped)}): "
            + "; ".join(f"{n} ({op}: {why})" for n, op, why in ex.skipped[:20])
            + ("; ..." if len(ex.skipped) > 20 else "")
            + ".",
            "",
        ]
    bounds = "; ".join(f"{op} {b:g}" for op, (b, _) in sorted(ROUNDING.items()))
    out += [
        f"Rounding bounds (ULP): {bounds}; exact ops 0; any other op {DEFAULT_BOUND[0]:g}. Sources: "
        "xbackend/rounding.py (math functions measured by benchmarks/elementwise_bounds.py).",
        "",
    ]
    return out
