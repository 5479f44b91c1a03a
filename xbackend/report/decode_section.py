"""The report's decoding section (`--decode N`): does a difference change the answer?"""

from __future__ import annotations

from xbackend.files.codec import encode
from xbackend.files.textfmt import inert
from xbackend.report.markup import Ours, table
from xbackend.results import Result
from xbackend.results.decode import BackendDecode, DecodeResult

__all__ = ["decisions_json", "decisions_section", "decode_json", "decode_section"]

_SHOWN_TOKENS = 32  # per prompt in the folded token table


def _g(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def _row(decode_result: DecodeResult, backend_decode: BackendDecode) -> list[object]:
    if not backend_decode.ok:
        return [
            backend_decode.backend,
            f"{backend_decode.status}: {backend_decode.reason}",
            "",
            "",
            "",
            "",
            "",
            "",
        ]
    first = backend_decode.first_divergence
    same = len(backend_decode.prompts) - backend_decode.flipped_prompts
    batch = (
        f"{backend_decode.distinct_completions} (moves logits by "
        f"{_g(max(prompt.batch_logit_difference for prompt in backend_decode.prompts))})"
        if decode_result.batch
        else "—"
    )
    return [
        backend_decode.backend
        + (" (reference)" if backend_decode.backend == decode_result.reference != "reference" else ""),
        f"{same} of {len(backend_decode.prompts)}",
        "none" if first is None else f"{first.first_divergent_step} (prompt {first.prompt})",
        _g(first.margin_at_divergence) if first else "—",
        _g(first.logit_difference) if first else "—",
        batch,
        _g(backend_decode.step_ms),
        _g(min((margin for prompt in backend_decode.prompts for margin in prompt.margins), default=None)),
    ]


def decode_section(result: Result) -> list[str]:
    """The report's section on the decoding ([] where none ran)."""
    decode = result.decode
    if decode is None:
        return []
    lengths = sorted(set(decode.prompt_lengths))
    span = f"{lengths[0]}" if len(lengths) == 1 else f"{lengths[0]}-{lengths[-1]}"
    how = (
        "a KV cache (past_key_values.N.* in, present.N.* out)"
        if decode.cached
        else "no cache (each step runs the whole sequence)"
    )
    batch = (
        f", alone and in batches of {decode.batch} (every prompt at every batch position, beside others)"
        if decode.batch
        else ", each alone"
    )
    out = [
        f"## Does it change the answer? Greedy decoding, {decode.steps} steps",
        "",
        f"{len(decode.prompt_lengths)} prompt(s) of {span} tokens, decoded with {how}{batch}; every "
        "backend's "
        f"tokens against {decode.reference}'s.",
        "",
        *table(
            [
                "backend",
                "prompts decoded like the reference",
                "first divergent step",
                "reference's margin there",
                "logit difference there",
                "distinct completions over batches",
                "ms per step",
                "smallest margin",
            ],
            [_row(decode, backend) for backend in decode.backends],
        ),
        "The margin there is the reference's top-1 minus top-2 logit at that step; the logit difference is "
        "the largest difference between the backend's logits and the reference's at that step, the tokens "
        "before it being the same. A difference at most twice the margin flipped a near tie; one far above "
        "it is a real difference, and the per-layer tables and origins below say whether it is rounding. The "
        "smallest margin is each backend's own top-1 minus top-2 logit, smallest over its steps and prompts: "
        "how close its own closest call came.",
        "",
    ]
    out += [f"- WARN: {warning}" for warning in decode.warnings] + ([""] if decode.warnings else [])
    if decode.layers_step is not None:
        who, prompt, step = decode.layers_step
        what = (
            f"the step where {who} first left the reference's tokens"
            if who != decode.reference
            else "the reference's closest call (no backend left its tokens)"
        )
        out += [
            f"The per-layer comparison in this report is of step {step} of prompt {prompt}: {what}, fed as "
            "the prompt and the tokens before it in one sequence.",
            "",
        ]
    out += ["<details><summary>tokens per prompt</summary>", "", *_tokens(decode), "</details>", ""]
    return out


def _tokens(decode_result: DecodeResult) -> list[str]:
    rows: list[list[object]] = []
    for backend in decode_result.backends:
        if not backend.ok:
            continue
        for prompt in backend.prompts:
            shown = [inert(token) for token in prompt.tokens[:_SHOWN_TOKENS]]
            if prompt.first_divergent_step is not None and prompt.first_divergent_step < len(shown):
                shown[prompt.first_divergent_step] = f"**{shown[prompt.first_divergent_step]}**"
            more = " …" if len(prompt.tokens) > _SHOWN_TOKENS else ""
            rows.append([prompt.prompt, backend.backend, Ours(" ".join(shown) + more)])
    rows.sort(key=lambda row: (row[0], str(row[1])))
    return [
        "Bold: the first token that differs from the reference's.",
        "",
        *table(["prompt", "backend", "tokens"], rows),
    ]


def decode_json(decode_result: DecodeResult) -> dict[str, object]:
    """The JSON twin's `decode` section: per backend, its tokens, first divergent step, margin
    there and distinct completions."""
    return {
        "steps": decode_result.steps,
        "cached": decode_result.cached,
        "reference": decode_result.reference,
        "batch": decode_result.batch,
        "prompt_lengths": list(decode_result.prompt_lengths),
        "prompts": [list(prompt) for prompt in decode_result.prompts],
        "warnings": list(decode_result.warnings),
        "layers_step": (
            None
            if decode_result.layers_step is None
            else {
                "backend": decode_result.layers_step[0],
                "prompt": decode_result.layers_step[1],
                "step": decode_result.layers_step[2],
            }
        ),
        "backends": {
            backend.backend: {
                "status": backend.status,
                "reason": backend.reason,
                "tokens": [list(prompt.tokens) for prompt in backend.prompts],
                "first_divergent_step": backend.first_divergent_step,
                "first_divergent_steps": [prompt.first_divergent_step for prompt in backend.prompts],
                "margin_at_divergence": backend.margin_at_divergence,
                "distinct_completions": backend.distinct_completions,
                # each prompt's figures as the codec writes them; its tokens are listed above
                "prompts": [
                    {key: value for key, value in encode(prompt).items() if key != "tokens"}
                    for prompt in backend.prompts
                ],
            }
            for backend in decode_result.backends
        },
    }


def decisions_section(result: Result) -> list[str]:
    """`--decisions`: each backend's top-1 choices against the reference's, output by output."""
    if not result.decisions:
        return []
    rows: list[list[object]] = []
    for d in result.decisions:
        if d.status != "ok":
            rows.append([d.output, d.backend, f"not compared: {d.reason}", "", "", ""])
            continue
        first = d.flips[0] if d.flips else None
        rows.append(
            [
                d.output,
                d.backend,
                f"{d.agree} of {d.decisions}",
                _g(d.smallest_margin),
                d.flipped,
                "—"
                if first is None
                else f"[{','.join(map(str, first.index))}]: {first.reference_class} → {first.backend_class} "
                f"(margin {_g(first.reference_margin)}, score difference {_g(first.score_difference)})",
            ]
        )
    out = [
        "## Does it change the answer? Top-1 decisions",
        "",
        f"Each backend's top-1 choice along each output's class axis against {result.reference_used}'s. The "
        "margin is the reference's top-1 minus top-2 score; a flip with a score difference about that size "
        "was a near tie.",
        "",
        *table(
            ["output", "backend", "same choice", "reference's smallest margin", "flips", "closest flip"],
            rows,
        ),
    ]
    flips = [(decision, flip) for decision in result.decisions for flip in decision.flips]
    if flips:
        out += [
            "<details><summary>every flip kept (the closest calls first)</summary>",
            "",
            *table(
                [
                    "output",
                    "backend",
                    "index",
                    "reference's class",
                    "backend's class",
                    "margin",
                    "score difference",
                ],
                [
                    [
                        d.output,
                        d.backend,
                        ",".join(map(str, flip.index)),
                        flip.reference_class,
                        flip.backend_class,
                        _g(flip.reference_margin),
                        _g(flip.score_difference),
                    ]
                    for d, flip in flips
                ],
            ),
            "</details>",
            "",
        ]
    return out


def decisions_json(result: Result) -> list[dict[str, object]]:
    """The JSON twin's `decisions` section: each backend and output as the codec writes it, with
    the number of choices that flipped."""
    return [{**encode(decision), "flipped": decision.flipped} for decision in result.decisions]
