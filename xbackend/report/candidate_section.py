"""The report's candidate section (`--candidate`): each release candidate beside its original:
coverage, how far each matched tensor moved, the first departure past its precision, its
origins and numerical events, and what they do to the answers."""

from __future__ import annotations

import math
from typing import Any

from xbackend.files.codec import encode
from xbackend.files.textfmt import cell, code_span, fenced, table
from xbackend.report.decode_section import decode_json
from xbackend.results import Result
from xbackend.results.candidates import CandidateResult, TensorMatch
from xbackend.results.decode import near_tie

__all__ = ["candidate_json", "candidate_section"]

_SHOWN = 12  # matched tensors in the unfolded table (lowest SQNR first)


def _g(x: float | None, unit: str = "") -> str:
    return "—" if x is None else f"{x:.3g}{unit}"


def _row(m: TensorMatch) -> list[object]:
    how = {"name": "by name", "node": "same node", "dequantized": "after Q/DQ"}.get(m.how, m.how)
    if m.status != "ok":
        return [code_span(m.original), code_span(m.candidate), how, m.dtype or "—", m.reason, "", "", ""]
    return [
        code_span(m.original),
        code_span(m.candidate),
        how,
        m.dtype,
        _g(m.sqnr_db, " dB") if m.sqnr_db is not None else "equal",
        _g(m.scaled_ulp),
        _g(m.max_abs),
        m.nonfinite or "",
    ]


_HEADER = ["original", "candidate", "matched", "dtype", "SQNR", "scaled ULP", "max abs", "inf/NaN"]


def _fold(title: str, summary: str, body: list[str]) -> list[str]:
    return [f"#### {title}", "", f"<details><summary>{summary}</summary>", "", *body, "</details>", ""]


def _one(c: CandidateResult, k: int, times: bool = False) -> list[str]:
    out = [f"### Candidate {k}: {code_span(c.path)}", ""]
    if not c.ok:
        return [*out, f"Not compared: {cell(c.reason)}", ""]
    matched, total = c.coverage
    out += [
        f"Declares {c.precision}; ran on {', '.join(backend.name for backend in c.backends)}, "
        "fed the original's inputs; "
        f"{c.compared_on}'s tensors set beside the original's on {c.original_on}. "
        f"**{matched} of {total}** of the original's tensors matched.",
        "",
    ]
    if c.departure:
        out += [
            f"**First departure past its precision:** {code_span(c.departure)}: {cell(c.departure_why)}.",
            "",
        ]
    origins = c.origins
    if origins:
        out += table(
            ["backend", "origin", "op", "local error (scaled ULP)", "allowed"],
            [
                [b, code_span(o.tensor), o.op_type, _g(o.local_scaled_ulp), _g(o.allowed_scaled_ulp)]
                for b, o in origins
            ],
        )
    elif c.explanation.status == "ok" and c.departure:
        carried = " and the events below" if c.events else ""
        out += [
            "No node of the candidate is past the precision it declares on its own: the departure above "
            f"is their errors carried through the model{carried}.",
            "",
        ]
    elif c.explanation.status == "ok":
        out += ["Every node of the candidate is within the precision it declares.", ""]
    else:
        out += [f"Its nodes were not judged at their precision: {cell(c.explanation.reason)}", ""]
    if c.findings:
        out += table(
            ["event", "tensor", "node", "elements", "detail"],
            [
                [
                    finding.kind,
                    code_span(finding.tensor),
                    code_span(finding.node),
                    f"{finding.count} of {finding.of}",
                    cell(finding.detail),
                ]
                for finding in c.findings
            ],
        )
    worst = sorted(
        (match for match in c.matches if match.status == "ok" and match.sqnr_db is not None),
        key=lambda m: m.sqnr_db or 0,
    )
    if worst:
        out += ["Lowest SQNR (the candidate against the original, per matched tensor):", ""]
        out += table(_HEADER, [_row(m) for m in worst[:_SHOWN]])
    body = table(_HEADER, [_row(m) for m in sorted(c.matches, key=lambda m: (m.depth, m.how))])
    out += _fold(f"Every matched tensor of candidate {k}", f"{len(c.matches)} tensor(s), model order", body)
    if c.unmatched:
        rows = [[code_span(u.original), cell(u.reason)] for u in c.unmatched]
        out += _fold(
            f"Not matched in candidate {k}", f"{len(c.unmatched)} tensor(s)", table(["original", "why"], rows)
        )
    if c.decode is not None:
        out += _decode(c)
    for dec in c.decisions:
        if dec.status == "ok":
            out += [
                f"Decisions at {code_span(dec.output)} on {dec.backend}: {dec.flipped} of {dec.decisions} "
                "differ from the original's.",
                "",
            ]
    for p in c.probes:  # its own section, its headings below the candidate's
        body = [("#" + line) if line.startswith("#") else line for line in p.markdown()]
        if body:
            out += [f"The candidate's {p.name} probe:", "", *body, ""]
    if c.advice is not None:
        out += _advice(c, times)
    out += [f"Note: {cell(note)}" for note in c.notes]
    return [*out, ""] if c.notes else out


def _decode(c: CandidateResult) -> list[str]:
    """Each prompt on each of the candidate's backends: where its tokens left the original's."""
    d = c.decode
    assert d is not None
    rows: list[list[object]] = []
    for b in d.backends:
        if not b.ok:
            rows.append([b.backend, "—", f"{b.status}: {cell(b.reason)}", "", "", ""])
            continue
        for prompt in b.prompts:
            step = prompt.first_divergent_step
            rows.append(
                [
                    b.backend,
                    prompt.prompt,
                    "none" if step is None else step,
                    _g(prompt.margin_at_divergence),
                    _g(prompt.logit_difference),
                    "—"
                    if step is None
                    else ("yes" if near_tie(prompt.margin_at_divergence, prompt.logit_difference) else "no"),
                ]
            )
    head = [
        "backend",
        "prompt",
        "first divergent step",
        "original's margin there",
        "logit difference there",
        "near tie",
    ]
    return [
        f"Greedy decoding, {d.steps} steps per prompt, each of the candidate's backends against the "
        f"original's tokens on the original's reference (the same prompts):",
        "",
        *table(head, rows),
    ]


def _advice(c: CandidateResult, times: bool = False) -> list[str]:
    """--advise: the nodes to keep in float32, what stays converted, the code, how it was found."""
    a = c.advice
    assert a is not None
    if a.status == "ok" and not a.keep:
        out = [f"**Advice:** {cell(a.reason)}.", ""]
    elif a.status == "ok":
        out = [
            f"**Keep in float32** {len(a.keep)} of the {a.converted} node(s) {cell(a.converter)} converted: "
            f"with them the candidate made again matches the original's {a.target}, confirmed by a run. "
            f"{cell(a.shipped())}.",
            "",
            ", ".join(code_span(n) for n in a.keep),
            "",
            "The code that makes it, run as printed to confirm the list:",
            "",
            *fenced(a.command.rstrip("\n"), "python", lines=True),
            "",
        ]
        if a.requantize:
            out += [
                "Or quantize the original again with the settings the candidate shows "
                f"({cell(', '.join(f'{k}={v}' for k, v in a.settings))}); its calibration is not in the "
                f"graph ({cell(', '.join(a.unread))}): give yours.",
                "",
                *fenced(a.requantize.rstrip("\n"), "python", lines=True),
                "",
            ]
    else:
        named = ", ".join(code_span(matter) for matter in a.matters)
        out = [f"**Advice:** {cell(a.reason)}.", ""] + (
            [f"The nodes that matter most: {named}.", ""] if named else []
        )
    if a.causes:
        out += table(["node an event names", "event"], [[code_span(n), cell(why)] for n, why in a.causes])
        out.append("")
    if a.tried:
        tries: list[list[object]] = [
            [
                t.step,
                t.kept,
                "yes" if t.matched else "no",
                f"{t.answers[0]} of {t.answers[1]}" if t.answers[1] else "—",
                cell(t.differed) or "—",
            ]
            for t in a.tried
        ]
        unit = "prompts" if a.target == "tokens" else "decisions"
        head = [
            "step",
            "nodes kept in float32",
            f"{a.target} match",
            f"{unit} as the original's",
            "what differed",
        ]
        out += table(head, tries)
        out += [
            f"{a.scored} node(s) scored; {cell(a.confirmed)}"
            + (f"; the re-conversions and their runs took {a.seconds:.1f} s." if times else "."),
            "",
        ]
    if c.sensitivities:
        rows = [
            [
                code_span(sensitivitie.node),
                sensitivitie.op,
                f"{sensitivitie.nonfinite} inf/NaN"
                if sensitivitie.nonfinite
                else f"{10 * math.log10(1 / sensitivitie.share):.1f} dB",
            ]
            for sensitivitie in c.sensitivities
        ]
        out += _fold(
            "The nodes the conversion costs most",
            f"{len(rows)} node(s): the noise each adds, as its local SQNR (lowest first)",
            table(["node", "op", "local SQNR"], rows),
        )
    return out


def candidate_section(r: Result) -> list[str]:
    if not r.candidates:
        return []
    out = [
        "## Release candidates against the original",
        "",
        "Each candidate ran on its own backends, fed the original's inputs (cast to its input types). "
        "Its tensors are matched to the original's by name, as the same node's output, and after a "
        "QuantizeLinear/DequantizeLinear pair; SQNR is 10·log10(Σ original² / Σ (candidate − original)²), "
        "the figure ONNX Runtime's qdq_loss_debug gives; scaled ULP is the largest difference in ULPs of "
        "the candidate's dtype at the original's largest element. Its nodes are judged against their own "
        "float64 values at the precision each declares (float16 at 2^-11, bfloat16 at 2^-8); a node past "
        "it is an origin, and the first matched tensor below an origin is the first departure.",
        "",
    ]
    for k, c in enumerate(r.candidates, 1):
        out += _one(c, k, r.options.shows_times)
    return out


def candidate_json(r: Result) -> list[dict[str, Any]]:
    out = []
    for c in r.candidates:
        d: dict[str, Any] = encode(c, times=r.options.shows_times)
        matched, total = c.coverage
        d["coverage"] = {"matched": matched, "tensors": total}
        d["origins"] = [{"backend": b, "tensor": o.tensor, "op_type": o.op_type} for b, o in c.origins]
        if c.decode is not None:
            d["decode"] = decode_json(c.decode)
        out.append(d)
    return out
