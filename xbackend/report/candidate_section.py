"""The report's candidate section (`--candidate`): each release candidate beside its original:
coverage, how far each matched tensor moved, the first departure past its precision, its
origins and numerical events, and what they do to the answers."""

from __future__ import annotations

import math
from typing import Any

from xbackend.files.codec import encode
from xbackend.files.textfmt import code_span
from xbackend.report.decode_section import decode_json
from xbackend.report.markup import cell, fenced, render_section, table
from xbackend.results import Result
from xbackend.results.candidates import CandidateResult, TensorMatch
from xbackend.results.decode import near_tie

__all__ = ["candidate_json", "candidate_section"]

_SHOWN = 12  # matched tensors in the unfolded table (lowest SQNR first)


def _g(x: float | None, unit: str = "") -> str:
    return "—" if x is None else f"{x:.3g}{unit}"


def _row(tensor_match: TensorMatch) -> list[object]:
    how = {"name": "by name", "node": "same node", "dequantized": "after Q/DQ"}.get(
        tensor_match.how, tensor_match.how
    )
    if tensor_match.status != "ok":
        return [
            code_span(tensor_match.original),
            code_span(tensor_match.candidate),
            how,
            tensor_match.dtype or "—",
            tensor_match.reason,
            "",
            "",
            "",
        ]
    return [
        code_span(tensor_match.original),
        code_span(tensor_match.candidate),
        how,
        tensor_match.dtype,
        _g(tensor_match.sqnr_db, " dB") if tensor_match.sqnr_db is not None else "equal",
        _g(tensor_match.scaled_ulp),
        _g(tensor_match.max_abs),
        tensor_match.nonfinite or "",
    ]


_HEADER = ["original", "candidate", "matched", "dtype", "SQNR", "scaled ULP", "max abs", "inf/NaN"]


def _fold(title: str, summary: str, body: list[str]) -> list[str]:
    return [f"#### {title}", "", f"<details><summary>{summary}</summary>", "", *body, "</details>", ""]


def _one(candidate: CandidateResult, k: int, times: bool = False) -> list[str]:
    out = [f"### Candidate {k}: {code_span(candidate.path)}", ""]
    if not candidate.ok:
        return [*out, f"Not compared: {cell(candidate.reason)}", ""]
    matched, total = candidate.coverage
    out += [
        f"Declares {candidate.precision}; ran on "
        f"{', '.join(backend.name for backend in candidate.backends)}, "
        "fed the original's inputs; "
        f"{candidate.compared_on}'s tensors set beside the original's on {candidate.original_on}. "
        f"**{matched} of {total}** of the original's tensors matched.",
        "",
    ]
    if candidate.departure:
        out += [
            f"**First departure past its precision:** {code_span(candidate.departure)}: "
            f"{cell(candidate.departure_why)}.",
            "",
        ]
    origins = candidate.origins
    if origins:
        out += table(
            ["backend", "origin", "op", "local error (scaled ULP)", "allowed"],
            [
                [b, code_span(o.tensor), o.op_type, _g(o.local_scaled_ulp), _g(o.allowed_scaled_ulp)]
                for b, o in origins
            ],
        )
    elif candidate.explanation.status == "ok" and candidate.departure:
        carried = " and the events below" if candidate.events else ""
        out += [
            "No node of the candidate is past the precision it declares on its own: the departure above "
            f"is their errors carried through the model{carried}.",
            "",
        ]
    elif candidate.explanation.status == "ok":
        out += ["Every node of the candidate is within the precision it declares.", ""]
    else:
        out += [f"Its nodes were not judged at their precision: {cell(candidate.explanation.reason)}", ""]
    if candidate.findings:
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
                for finding in candidate.findings
            ],
        )
    worst = sorted(
        (match for match in candidate.matches if match.status == "ok" and match.sqnr_db is not None),
        key=lambda tensor_match: tensor_match.sqnr_db or 0,
    )
    if worst:
        out += ["Lowest SQNR (the candidate against the original, per matched tensor):", ""]
        out += table(_HEADER, [_row(m) for m in worst[:_SHOWN]])
    body = table(_HEADER, [_row(m) for m in sorted(candidate.matches, key=lambda m: (m.depth, m.how))])
    out += _fold(
        f"Every matched tensor of candidate {k}", f"{len(candidate.matches)} tensor(s), model order", body
    )
    if candidate.unmatched:
        rows = [[code_span(u.original), cell(u.reason)] for u in candidate.unmatched]
        out += _fold(
            f"Not matched in candidate {k}",
            f"{len(candidate.unmatched)} tensor(s)",
            table(["original", "why"], rows),
        )
    if candidate.decode is not None:
        out += _decode(candidate)
    for dec in candidate.decisions:
        if dec.status == "ok":
            out += [
                f"Decisions at {code_span(dec.output)} on {dec.backend}: {dec.flipped} of {dec.decisions} "
                "differ from the original's.",
                "",
            ]
    for probe in candidate.probes:  # its own section, its headings below the candidate's
        body = [("#" + line) if line.startswith("#") else line for line in render_section(probe.section())]
        if body:
            out += [f"The candidate's {probe.name} probe:", "", *body, ""]
    if candidate.advice is not None:
        out += _advice(candidate, times)
    out += [f"Note: {cell(note)}" for note in candidate.notes]
    return [*out, ""] if candidate.notes else out


def _decode(candidate: CandidateResult) -> list[str]:
    """Each prompt on each of the candidate's backends: where its tokens left the original's."""
    decode = candidate.decode
    assert decode is not None
    rows: list[list[object]] = []
    for backend in decode.backends:
        if not backend.ok:
            rows.append([backend.backend, "—", f"{backend.status}: {cell(backend.reason)}", "", "", ""])
            continue
        for prompt in backend.prompts:
            step = prompt.first_divergent_step
            rows.append(
                [
                    backend.backend,
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
        f"Greedy decoding, {decode.steps} steps per prompt, each of the candidate's backends against the "
        f"original's tokens on the original's reference (the same prompts):",
        "",
        *table(head, rows),
    ]


def _advice(candidate: CandidateResult, times: bool = False) -> list[str]:
    """--advise: the nodes to keep in float32, what stays converted, the code, how it was found."""
    advice = candidate.advice
    assert advice is not None
    if advice.status == "ok" and not advice.keep:
        out = [f"**Advice:** {cell(advice.reason)}.", ""]
    elif advice.status == "ok":
        out = [
            f"**Keep in float32** {len(advice.keep)} of the {advice.converted} node(s) "
            f"{cell(advice.converter)} converted: "
            f"with them the candidate made again matches the original's {advice.target}, confirmed by a run. "
            f"{cell(advice.shipped())}.",
            "",
            ", ".join(code_span(n) for n in advice.keep),
            "",
            "The code that makes it, run as printed to confirm the list:",
            "",
            *fenced(advice.command.rstrip("\n"), "python", lines=True),
            "",
        ]
        if advice.requantize:
            out += [
                "Or quantize the original again with the settings the candidate shows "
                f"({cell(', '.join(f'{k}={v}' for k, v in advice.settings))}); its calibration is not in the "
                f"graph ({cell(', '.join(advice.unread))}): give yours.",
                "",
                *fenced(advice.requantize.rstrip("\n"), "python", lines=True),
                "",
            ]
    else:
        named = ", ".join(code_span(matter) for matter in advice.matters)
        out = [f"**Advice:** {cell(advice.reason)}.", ""] + (
            [f"The nodes that matter most: {named}.", ""] if named else []
        )
    if advice.causes:
        out += table(
            ["node an event names", "event"], [[code_span(n), cell(why)] for n, why in advice.causes]
        )
        out.append("")
    if advice.tried:
        tries: list[list[object]] = [
            [
                t.step,
                t.kept,
                "yes" if t.matched else "no",
                f"{t.answers[0]} of {t.answers[1]}" if t.answers[1] else "—",
                cell(t.differed) or "—",
            ]
            for t in advice.tried
        ]
        unit = "prompts" if advice.target == "tokens" else "decisions"
        head = [
            "step",
            "nodes kept in float32",
            f"{advice.target} match",
            f"{unit} as the original's",
            "what differed",
        ]
        out += table(head, tries)
        out += [
            f"{advice.scored} node(s) scored; {cell(advice.confirmed)}"
            + (f"; the re-conversions and their runs took {advice.seconds:.1f} s." if times else "."),
            "",
        ]
    if candidate.sensitivities:
        rows = [
            [
                code_span(sensitivitie.node),
                sensitivitie.op,
                f"{sensitivitie.nonfinite} inf/NaN"
                if sensitivitie.nonfinite
                else f"{10 * math.log10(1 / sensitivitie.share):.1f} dB",
            ]
            for sensitivitie in candidate.sensitivities
        ]
        out += _fold(
            "The nodes the conversion costs most",
            f"{len(rows)} node(s): the noise each adds, as its local SQNR (lowest first)",
            table(["node", "op", "local SQNR"], rows),
        )
    return out


def candidate_section(result: Result) -> list[str]:
    """The report's section on the release candidates ([] without any)."""
    if not result.candidates:
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
    for index, candidate in enumerate(result.candidates, 1):
        out += _one(candidate, index, result.options.shows_times)
    return out


def candidate_json(result: Result) -> list[dict[str, Any]]:
    """Each candidate's part of the JSON report: its result, coverage and origins."""
    out = []
    for candidate in result.candidates:
        d: dict[str, Any] = encode(candidate, times=result.options.shows_times)
        matched, total = candidate.coverage
        d["coverage"] = {"matched": matched, "tensors": total}
        d["origins"] = [
            {"backend": b, "tensor": o.tensor, "op_type": o.op_type} for b, o in candidate.origins
        ]
        if candidate.decode is not None:
            d["decode"] = decode_json(candidate.decode)
        out.append(d)
    return out
