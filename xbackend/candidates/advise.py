"""`--advise`: the fewest of the nodes a converter changed to keep in float32 so a candidate's
tokens or decisions match its original's, confirmed by making the candidate again with the code
the advice prints and running it.

The search starts from the causes: the nodes the candidate's events name (NaN or inf made by a
node, an infinite or saturating scale, a clipped range, a quantized decision tensor). Then each
changed node is scored from the candidate's one instrumented pass: its value against the
original's op in float64 on the candidate's inputs, the noise the conversion adds there as a share
of its output's power. The causes, then the noisiest, are kept in growing prefixes: bisected
between a list that fails and one that holds, then nodes dropped one at a time while the answers
hold, each list re-converted and run, within `--advise-budget` re-conversions."""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
import onnx

from xbackend.candidates.convert import FP16, STATIC, Converter, command, requantize, rewrite, weight_bytes
from xbackend.candidates.match import Pair, constants_of
from xbackend.candidates.stretches import evaluate, value_of
from xbackend.files.storage import ValueFile
from xbackend.model.load import load_proto
from xbackend.numerics.metrics import float_info, is_float_dtype
from xbackend.results.candidates import SENTINEL, Advice, NumericalEvent, Sensitivity, Try

__all__ = ["BUDGET", "advise", "causes", "sensitivities"]

BUDGET = 8  # re-conversions confirmed by a run, by default (--advise-budget)
_SAVES = 0.01  # a list that saves less of the original's weight bytes than this ships nothing
_DROPS = 2  # of the budget, kept for dropping nodes one at a time once a list holds
_EVENT_ORDER = {"nan": 0, "overflow": 0, "coarse-scale": 1, "saturation": 2, "decision-tensor": 3}


def sensitivities(
    original: onnx.GraphProto,
    folder: Path,
    pairs: Sequence[Pair],
    values: ValueFile,
    theirs: ValueFile,
    feeds: Mapping[str, object],
    opset: int,
) -> list[Sensitivity]:
    """Each node of the original whose inputs and output the candidate holds: the noise the
    conversion adds there, as a share of its output's power, largest first. A constant (computed
    from weights alone) is read as the original holds it (`theirs`): its rounding is its
    readers' noise, where it matters, not its own."""
    found = {pair.original: pair.candidate for pair in pairs if pair.how != "dequantized"}
    weights = {initializer.name: initializer for initializer in original.initializer}
    fixed = constants_of(original)
    out = []
    for node in original.node:
        outs = [output_name for output_name in node.output if output_name]
        if not node.name or len(outs) != 1 or node.domain not in ("", "ai.onnx") or outs[0] in fixed:
            continue
        y = values.get(found[outs[0]]) if outs[0] in found and found[outs[0]] in values else None
        if not isinstance(y, np.ndarray) or not is_float_dtype(y.dtype):
            continue
        fed: dict[str, np.ndarray] = {}
        for input_name in node.input:
            if not input_name:
                continue
            x = (
                value_of(input_name, theirs, feeds, weights, folder)
                if input_name in fixed or input_name in weights
                else None
            )
            x = x if x is not None else value_of(found.get(input_name, input_name), values, feeds)
            if x is None:
                break
            fed[input_name] = x.astype(np.float64) if is_float_dtype(x.dtype) else x
        else:
            got = evaluate([node], fed, outs, opset)
            v = got[0] if got is not None else None
            if v is None or v.shape != y.shape:
                continue
            yf = y.astype(np.float64)
            ok = np.isfinite(v) & np.isfinite(yf)
            power = float(np.sum(np.square(v[ok])))
            noise = float(np.sum(np.square(yf[ok] - v[ok])))
            bad = int(np.count_nonzero(~ok & np.isfinite(v)))  # inf or NaN where float64 is finite
            bad += _past_range(theirs.get(outs[0]) if outs[0] in theirs else None, y.dtype)
            if noise > 0 or bad:
                share = noise / max(power, 1e-300)
                out.append(Sensitivity(node=node.name, op=node.op_type, share=share, nonfinite=bad))
    return sorted(out, key=lambda sensitivity: (-sensitivity.nonfinite, -sensitivity.share, sensitivity.node))


def _past_range(original: object, dtype: np.dtype[np.generic]) -> int:
    """Elements of the original's value past what the candidate's type holds (float16's 65504):
    the candidate overflows there wherever it rounds them to its type, fused or not."""
    if (
        not isinstance(original, np.ndarray)
        or original.dtype.kind != "f"
        or dtype.kind != "f"
        or not original.size
    ):
        return 0
    top = float(float_info(dtype).max) if dtype.itemsize < original.dtype.itemsize else math.inf
    size = np.abs(original[np.isfinite(original)])
    return int(np.count_nonzero((size > top) & (size < SENTINEL)))  # a mask's fill stands for inf


def causes(
    candidate: onnx.GraphProto,
    events: Sequence[NumericalEvent],
    scores: Sequence[Sensitivity],
    changed: Sequence[str],
    clipped: Sequence[str] = (),
) -> list[tuple[str, str]]:
    """The changed nodes the events name, most severe first, each with its event: a node that
    writes NaN or inf; the readers of a tensor whose Q/DQ pair clips it or whose scale is
    infinite, and downstream of them every reader of a tensor clipped again (`clipped`: the
    QuantizeLinear nodes that clip at all; a range calibrated on shorter prompts clips each
    tensor a position flows through, a few elements at the step measured, most of them later);
    the node computing a quantized decision tensor (its Q/DQ on the way out)."""
    ours = set(changed)
    made = {output_name: node for node in candidate.node for output_name in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in candidate.node:
        for input_name in n.input:
            readers.setdefault(input_name, []).append(n)
    outputs = {output_name.name for output_name in candidate.output}
    out: dict[str, str] = {}

    def add(name: str, why: str) -> None:
        if name in ours and name not in out:
            out[name] = why

    for f in sorted(events, key=lambda event: _EVENT_ORDER.get(event.kind, 4)):
        why = f"{f.kind} at {f.tensor}"
        node = next((node for node in candidate.node if node.name == f.node), None)
        add(f.node, why)
        if node is None or node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        dqs = (
            [node]
            if node.op_type == "DequantizeLinear"
            else [r for r in readers.get(node.output[0], []) if r.op_type == "DequantizeLinear"]
        )
        for d in dqs:
            for r in _downstream(d, readers, set(clipped)):
                add(r, why)
            if d.output[0] in outputs:  # quantized on its way out: the node that computes it
                q = made.get(d.input[0])
                src = made.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
                if src is not None:
                    add(src.name, why)
    for score in scores:
        if score.nonfinite:
            add(score.node, f"{score.nonfinite} element(s) inf or NaN where float64 is finite")
    return list(out.items())


def _downstream(
    dq: onnx.NodeProto, readers: Mapping[str, Sequence[onnx.NodeProto]], clipped: set[str]
) -> list[str]:
    """The readers of a dequantized tensor, and on through each reader's output that a clipping
    QuantizeLinear reads, to the readers of its DequantizeLinear (breadth first)."""
    out: list[str] = []
    todo, seen = [dq], {dq.name}
    while todo:
        d = todo.pop(0)
        for node in readers.get(d.output[0], []):
            if node.op_type in ("QuantizeLinear", "DequantizeLinear") or node.name in out:
                continue
            out.append(node.name)
            for output_name in node.output:
                for q in readers.get(output_name, []):
                    if q.op_type != "QuantizeLinear" or q.name not in clipped:
                        continue
                    for d2 in readers.get(q.output[0], []):
                        if d2.op_type == "DequantizeLinear" and d2.name not in seen:
                            seen.add(d2.name)
                            todo.append(d2)
    return out


def advise(
    conv: Converter | None,
    changed: Sequence[str],
    scores: Sequence[Sensitivity],
    found: Sequence[tuple[str, str]],
    paths: tuple[Path, Path],
    work: Path,
    confirm: Callable[[Path], tuple[bool, str, tuple[int, int]]],
    target: str,
    budget: int = BUDGET,
    ops: Mapping[str, str] | None = None,
    weighted: Sequence[str] = (),
) -> Advice:
    """The smallest list of changed nodes found, within `budget` re-conversions, whose candidate
    made again matches the original's `target` (tokens, decisions); or why none does."""
    start = time.perf_counter()
    original, candidate = paths
    if conv is None:
        why = "no converter known made this candidate (ONNX Runtime's float16 tool, its quantizers)"
        return Advice(status="unavailable", reason=why, target=target)
    if not changed:
        why = "the converter changed none of the original's nodes that could be named"
        return Advice(status="unavailable", reason=why, converter=conv.tool, target=target)
    share = {score.node: score.share for score in scores}
    first = [n for n, _ in found]
    ours, named = set(changed), set(first)
    rest = [score.node for score in scores if score.node in ours and score.node not in named]
    ranked = named | set(rest)
    order = [*first, *rest, *[n for n in changed if n not in ranked]]
    tried: list[Try] = []
    made: dict[tuple[str, ...], Path] = {}
    dest = candidate.with_name(candidate.stem + "_kept.onnx")

    pos = {n: index for index, n in enumerate(order)}
    held: dict[tuple[str, ...], bool] = {}  # each list run once: a list tried again is answered

    def attempt(keep: Sequence[str], step: str) -> bool | None:
        keep = tuple(sorted(keep, key=pos.__getitem__))
        if keep in held:
            return held[keep]
        if len(tried) >= budget:
            return None
        # a name of its own: onnx refuses to write external weights under a name the working
        # folder holds (it checks the name there, not beside the model)
        path = work / f"advise-{len(tried)}" / f"{candidate.stem}.{uuid.uuid4().hex[:12]}.onnx"
        answers = (0, 0)
        try:
            made[keep], _ = rewrite(conv, original, candidate, keep, path)
            ok, why, answers = confirm(path)
        except Exception as error:  # a converter or a run that fails: said, the search goes on
            ok, why = False, f"{type(error).__name__}: {error}"
        tried.append(Try(kept=len(keep), matched=ok, differed=why, step=step, answers=answers))
        held[keep] = ok
        return ok

    lo, hi = 0, None  # the longest prefix known to fail, the shortest known to hold
    if first:
        ok = attempt(order[: len(first)], "events")
        lo, hi = (0, len(first)) if ok else (len(first), None)
    space = order
    if hi is None:
        ok = attempt(order, "whole")
        if ok is not True:
            return _none(conv, target, order, found, share, tried, budget, start, whole=ok is False)
        hi = len(order)
        # what ships is the weights: every changed node that holds none kept, the weights converted
        heavy = set(weighted)
        light = [n for n in order if n not in heavy]
        if 0 < len(light) < len(order) and attempt(light, "weightless"):
            space, lo, hi = light, 0, len(light)
    while hi - lo > 1 and len(tried) < budget - (_DROPS if hi < len(space) or lo else 0):
        mid = min(max(round(math.sqrt(max(lo, 1) * hi)), lo + 1), hi - 1)
        ok = attempt(space[:mid], "bisect")
        if ok is None:
            break
        lo, hi = (lo, mid) if ok else (mid, hi)
    best = tuple(space[:hi])
    for node in reversed(best):
        if len(best) == 1 or len(tried) >= budget:
            break
        trial = tuple(n for n in best if n != node)
        if attempt(trial, "drop"):
            best = trial
    steps = Counter(t.step for t in tried)
    how = ", ".join(f"{_STEP[k]} ({steps[k]})" for k in _STEP if steps[k])
    base = Advice(
        status="ok",
        converter=conv.tool,
        target=target,
        scored=len(scores),
        tried=tuple(tried),
        budget=budget,
        confirmed=f"{how}: {len(tried)} of {budget} re-conversion(s), every list run",
        causes=tuple(found),
        converted=len(order),
        settings=_settings(conv),
        unread=conv.unread,
        seconds=time.perf_counter() - start,
    )
    kept = tuple(sorted(best, key=pos.__getitem__))
    sizes = (
        weight_bytes(load_proto(original, load_external=False).graph),
        weight_bytes(load_proto(candidate, load_external=False).graph),
        weight_bytes(load_proto(made[kept], load_external=False).graph) if kept in made else 0,
    )
    kinds = ops or {}
    kept_set = set(kept)
    still = Counter(kinds.get(n, "?") for n in order if n not in kept_set)
    every = Counter(kinds.get(n, "?") for n in order)
    per_op = tuple((op, still[op], every[op]) for op, _ in every.most_common())
    failed = max((t.kept for t in tried if not t.matched), default=0)
    if len(kept) == len(order) or (sizes[0] and sizes[2] >= (1 - _SAVES) * sizes[0]):
        matters = _matters(order, found, share)
        why = (
            f"no partial conversion keeps these {target} on these inputs: only keeping all {len(order)} "
            f"converted node(s) in float32 does (the longest list that failed kept {failed})"
            if len(kept) == len(order)
            else f"no partial conversion that saves weight keeps these {target} on these inputs: the "
            f"smallest list found keeps {len(kept)} of {len(order)} converted node(s), and with them the "
            f"weights take {sizes[2] / 1e6:.2f} MB against the original's {sizes[0] / 1e6:.2f} MB"
        )
        alone = base.causes_alone()
        why += f"; {alone}, the rest of the conversion's noise moves the others" if alone else ""
        return replace(base, status="none-holds", reason=why, matters=matters, still=per_op, weights=sizes)
    code_dest = str(dest)
    return replace(
        base,
        keep=kept,
        command=command(conv, kept, str(original), str(candidate), code_dest),
        requantize=requantize(conv, kept, str(original), code_dest),
        still=per_op,
        weights=sizes,
    )


_STEP = {
    "events": "the events' nodes",
    "whole": "every converted node",
    "weightless": "every converted node that holds no weight",
    "bisect": "bisected",
    "drop": "dropped one at a time",
}


def _matters(
    order: Sequence[str], found: Sequence[tuple[str, str]], share: Mapping[str, float]
) -> tuple[str, ...]:
    """The nodes that matter most: those the events name, then the noisiest (at most 8)."""
    named = [n for n, _ in found]
    seen = set(named)
    noisy = sorted((n for n in order if n not in seen and share.get(n)), key=lambda n: -share[n])
    return tuple([*named, *noisy][:8])


def _none(
    conv: Converter,
    target: str,
    order: Sequence[str],
    found: Sequence[tuple[str, str]],
    share: Mapping[str, float],
    tried: Sequence[Try],
    budget: int,
    start: float,
    whole: bool,
) -> Advice:
    """No list holds: even every converted node kept (`whole`), or the budget spent before one did."""
    last = tried[-1] if tried else None
    status: Literal["none-holds", "not-found"]
    if whole and last is not None and not last.answers[1]:  # it did not run: no conclusion drawn
        why = (
            f"the candidate could not be made again and run with all {len(order)} converted node(s) "
            f"kept in float32: {last.differed}"
        )
        status = "not-found"
    elif whole and last is not None:
        why = (
            f"no partial conversion keeps these {target} on these inputs: even with all {len(order)} "
            f"converted node(s) kept in float32 they differ ({last.differed}): the engine's float32 run "
            "leaves the original's reference, not the conversion"
        )
        status = "none-holds"
    else:
        why = f"the budget of {budget} re-conversion(s) was spent before a list held: raise --advise-budget"
        status = "not-found"
    return Advice(
        status=status,
        reason=why,
        converter=conv.tool,
        target=target,
        tried=tuple(tried),
        budget=budget,
        causes=tuple(found),
        matters=_matters(order, found, share),
        converted=len(order),
        settings=_settings(conv),
        unread=conv.unread,
        seconds=time.perf_counter() - start,
    )


def _settings(conv: Converter) -> tuple[tuple[str, str], ...]:
    """The converter's settings the advice's code reproduces, as read from the candidate."""
    if conv.tool == FP16:
        return (
            ("keep_io_types", str(conv.keep_io_types)),
            ("disable_shape_infer", str(conv.disable_shape_infer)),
        )
    out = [
        ("weight_type", conv.weight_type),
        ("per_channel", str(conv.per_channel)),
        ("reduce_range", str(conv.reduce_range)),
        ("op_types_to_quantize", ", ".join(conv.op_types)),
    ]
    if conv.tool == STATIC:
        out += [
            ("activation_type", conv.activation_type),
            ("ActivationSymmetric", str(conv.symmetric_activations)),
        ]
    return tuple(out)
