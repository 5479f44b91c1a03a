"""The report's decoding section (`--decode N`): does a difference change the answer?"""

from __future__ import annotations

from xbackend.files.codec import encode
from xbackend.files.textfmt import Ours, inert, table
from xbackend.results import Result
from xbackend.results.decode import BackendDecode, DecodeResult

__all__ = ["decisions_json", "decisions_section", "decode_json", "decode_section"]

_SHOWN_TOKENS = 32  # per prompt in the folded token table


def _g(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def _row(d: DecodeResult, b: BackendDecode) -> list[object]:
    if not b.ok:
        return [b.backend, f"{b.status}: {b.reason}", "", "", "", "", "", ""]
    first = b.first_divergence
    same = len(b.prompts) - b.flipped_prompts
    batch = (
        f"{b.distinct_completions} (moves logits by "
        f"{_g(max(prompt.batch_logit_difference for prompt in b.prompts))})"
        if d.batch
        else "—"
    )
    return [
        b.backend + (" (reference)" if b.backend == d.reference != "reference" else ""),
        f"{same} of {len(b.prompts)}",
        "none" if first is None else f"{first.first_divergent_step} (prompt {first.prompt})",
        _g(first.margin_at_divergence) if first else "—",
        _g(first.logit_difference) if first else "—",
        batch,
        _g(b.step_ms),
        _g(min((margin for prompt in b.prompts for margin in prompt.margins), default=None)),
    ]


def decode_section(r: Result) -> list[str]:
    d = r.decode
    if d is None:
        return []
    lengths = sorted(set(d.prompt_lengths))
    span = f"{lengths[0]}" if len(lengths) == 1 else f"{lengths[0]}-{lengths[-1]}"
    how = (
        "a KV cache (past_key_values.N.* in, present.N.* out)"
        if d.cached
        else "no cache (each step runs the whole sequence)"
    )
    batch = (
        f", alone and in batches of {d.batch} (every prompt at every batch position, beside others)"
        if d.batch
        else ", each alone"
    )
    out = [
        f"## Does it change the answer? Greedy decoding, {d.steps} steps",
        "",
        f"{len(d.prompt_lengths)} prompt(s) of {span} tokens, decoded with {how}{batch}; every backend's "
        f"tokens against {d.reference}'s.",
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
            [_row(d, backend) for backend in d.backends],
        ),
        "The margin there is the reference's top-1 minus top-2 logit at that step; the logit difference is "
        "the largest difference between the backend's logits and the reference's at that step, the tokens "
        "before it being the same. A difference at most twice the margin flipped a near tie; one far above "
        "it is a real difference, and the per-layer tables and origins below say whether it is rounding. The "
        "smallest margin is each backend's own top-1 minus top-2 logit, smallest over its steps and prompts: "
        "how close its own closest call came.",
        "",
    ]
    out += [f"- WARN: {warning}" for warning in d.warnings] + ([""] if d.warnings else [])
    if d.layers_step is not None:
        who, prompt, step = d.layers_step
        what = (
            f"the step where {who} first left the reference's tokens"
            if who != d.reference
            else "the reference's closest call (no backend left its tokens)"
        )
        out += [
            f"The per-layer comparison in this report is of step {step} of prompt {prompt}: {what}, fed as "
            "the prompt and the tokens before it in one sequence.",
            "",
        ]
    out += ["<details><summary>tokens per prompt</summary>", "", *_tokens(d), "</details>", ""]
    return out


def _tokens(d: DecodeResult) -> list[str]:
    rows: list[list[object]] = []
    for b in d.backends:
        if not b.ok:
            continue
        for p in b.prompts:
            shown = [inert(t) for t in p.tokens[:_SHOWN_TOKENS]]
            if p.first_divergent_step is not None and p.first_divergent_step < len(shown):
                shown[p.first_divergent_step] = f"**{shown[p.first_divergent_step]}**"
            more = " …" if len(p.tokens) > _SHOWN_TOKENS else ""
            rows.append([p.prompt, b.backend, Ours(" ".join(shown) + more)])
    rows.sort(key=lambda row: (row[0], str(row[1])))
    return [
        "Bold: the first token that differs from the reference's.",
        "",
        *table(["prompt", "backend", "tokens"], rows),
    ]


def decode_json(d: DecodeResult) -> dict[str, object]:
    """The JSON twin's `decode` section: per backend, its tokens, first divergent step, margin
    there and distinct completions."""
    return {
        "steps": d.steps,
        "cached": d.cached,
        "reference": d.reference,
        "batch": d.batch,
        "prompt_lengths": list(d.prompt_lengths),
        "prompts": [list(prompt) for prompt in d.prompts],
        "warnings": list(d.warnings),
        "layers_step": (
            None
            if d.layers_step is None
            else {"backend": d.layers_step[0], "prompt": d.layers_step[1], "step": d.layers_step[2]}
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
                    {k: v for k, v in encode(prompt).items() if k != "tokens"} for prompt in backend.prompts
                ],
            }
            for backend in d.backends
        },
    }


def decisions_section(r: Result) -> list[str]:
    """`--decisions`: each backend's top-1 choices against the reference's, output by output."""
    if not r.decisions:
        return []
    rows: list[list[object]] = []
    for d in r.decisions:
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
        f"Each backend's top-1 choice along each output's class axis against {r.reference_used}'s. The "
        "margin is the reference's top-1 minus top-2 score; a flip with a score difference about that size "
        "was a near tie.",
        "",
        *table(
            ["output", "backend", "same choice", "reference's smallest margin", "flips", "closest flip"],
            rows,
        ),
    ]
    flips = [(decision, flip) for decision in r.decisions for flip in decision.flips]
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
                        ",".join(map(str, f.index)),
                        f.reference_class,
                        f.backend_class,
                        _g(f.reference_margin),
                        _g(f.score_difference),
                    ]
                    for d, f in flips
                ],
            ),
            "</details>",
            "",
        ]
    return out


def decisions_json(r: Result) -> list[dict[str, object]]:
    """The JSON twin's `decisions` section: each backend and output as the codec writes it, with
    the number of choices that flipped."""
    return [{**encode(decision), "flipped": decision.flipped} for decision in r.decisions]
