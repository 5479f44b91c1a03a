"""`--advise`: the nodes to keep in float32 so a candidate's tokens or decisions match its
original's, in the lists its converter takes, confirmed by re-converting and running.

Each of the original's computing nodes is scored from the candidate's one instrumented pass: the
candidate's value of its output against the original's op evaluated in float64 on the candidate's
values of its inputs and the original's weights: the noise the conversion adds at that node
(its own rounding, its weights' and its quantized inputs'), as a share of its output's power.
The nodes that add most are kept first; each guess is re-converted by the candidate's converter
(ONNX Runtime's float16 tool with `node_block_list`, its dynamic quantizer with
`nodes_to_exclude`; a static QDQ model has the Q/DQ pairs before each kept node removed, as
`nodes_to_exclude` would with the same calibration) and run, at most three times."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from xbackend.candidates.match import Pair, constants_of
from xbackend.candidates.stretches import evaluate, value_of
from xbackend.files.storage import ValueFile
from xbackend.model.load import load_proto
from xbackend.numerics.metrics import float_info, is_float_dtype
from xbackend.results.candidates import SENTINEL, Advice, Sensitivity

__all__ = ["Converter", "advise", "converter_of", "sensitivities"]

FP16 = "onnxruntime.transformers.float16"
DYNAMIC = "onnxruntime.quantization.quantize_dynamic"
STATIC = "onnxruntime.quantization.quantize_static"
MAX_TRIES = 3  # re-conversions confirmed by a run, at most
# the shares of the conversion's noise a guess keeps in float32: the search starts at START and
# steps down two after a match, up two after a miss
SHARES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
START = 3


@dataclass(frozen=True)
class Converter:
    """What made the candidate, as far as its graph tells: the tool, and the options it shows."""

    tool: str  # FP16 | DYNAMIC | STATIC
    keep_io_types: bool = True  # float16: the graph's inputs stayed float32
    weight_type: str = "QInt8"  # quantizers: int8 (QInt8) or uint8 (QUInt8) weights


def converter_of(candidate: onnx.GraphProto) -> Converter | None:
    """The converter whose output the candidate's graph looks like (None: none known)."""
    ops = {n.op_type for n in candidate.node}
    weights = {t.data_type for t in candidate.initializer}
    if "DynamicQuantizeLinear" in ops:
        return Converter(DYNAMIC, weight_type="QInt8" if TensorProto.INT8 in weights else "QUInt8")
    if "QuantizeLinear" in ops and "DequantizeLinear" in ops:
        return Converter(STATIC, weight_type="QInt8" if TensorProto.INT8 in weights else "QUInt8")
    if TensorProto.FLOAT16 in weights or any(
        vi.type.tensor_type.elem_type == TensorProto.FLOAT16 for vi in candidate.value_info
    ):
        io = all(i.type.tensor_type.elem_type != TensorProto.FLOAT16 for i in candidate.input)
        return Converter(FP16, keep_io_types=io)
    return None


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
    found = {p.original: p.candidate for p in pairs if p.how != "dequantized"}
    weights = {t.name: t for t in original.initializer}
    fixed = constants_of(original)
    out = []
    for node in original.node:
        outs = [o for o in node.output if o]
        if not node.name or len(outs) != 1 or node.domain not in ("", "ai.onnx") or outs[0] in fixed:
            continue
        y = values.get(found[outs[0]]) if outs[0] in found and found[outs[0]] in values else None
        if not isinstance(y, np.ndarray) or not is_float_dtype(y.dtype):
            continue
        fed: dict[str, np.ndarray] = {}
        for i in node.input:
            if not i:
                continue
            x = value_of(i, theirs, feeds, weights, folder) if i in fixed or i in weights else None
            x = x if x is not None else value_of(found.get(i, i), values, feeds)
            if x is None:
                break
            fed[i] = x.astype(np.float64) if is_float_dtype(x.dtype) else x
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
    return sorted(out, key=lambda s: (-s.nonfinite, -s.share, s.node))


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


def touched(conv: Converter, original: onnx.GraphProto, candidate: onnx.GraphProto) -> tuple[str, ...]:
    """The original's nodes the converter changed (what the last guess keeps, whatever their
    noise on the inputs measured): for float16 every named node; for a quantizer those that read
    a dequantized value or were replaced by an integer kernel."""
    names = [n.name for n in original.node if n.name]
    if conv.tool == FP16:
        return tuple(names)
    dq = {o for n in candidate.node if n.op_type == "DequantizeLinear" for o in n.output}
    theirs = {n.name for n in candidate.node}
    reading = {n.name for n in candidate.node if any(i in dq for i in n.input)}
    return tuple(n for n in names if n in reading or n not in theirs)


def keeping(scores: Sequence[Sensitivity], share: float, every: Sequence[str] = ()) -> tuple[str, ...]:
    """Every node that turns finite values inf or NaN, and the fewest of the costliest others
    whose noise makes `share` of theirs; at a share of 1, every node in `every` too."""
    kept = [s.node for s in scores if s.nonfinite]
    rest = [s for s in scores if not s.nonfinite]
    total = sum(s.share for s in rest)
    run = 0.0
    for s in rest:
        if run >= share * total and kept:
            break
        kept.append(s.node)
        run += s.share
    if share >= 1.0:
        kept += [n for n in every if n not in kept]
    return tuple(kept)


def rewrite(conv: Converter, original: Path, candidate: Path, keep: Sequence[str], dest: Path) -> Path:
    """The candidate made again with `keep` in float32, by its converter (a QDQ model: its Q/DQ
    pairs before each kept node removed, the original's weights read there)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if conv.tool == FP16:
        from onnxruntime.transformers.float16 import convert_float_to_float16  # engine: onnxruntime

        model = load_proto(original)
        from onnxruntime.transformers.onnx_model import OnnxModel  # engine: onnxruntime

        made = convert_float_to_float16(model, keep_io_types=conv.keep_io_types, node_block_list=list(keep))
        tidy = OnnxModel(_one_cast_each(made))
        tidy.remove_cascaded_cast_nodes()  # two kept nodes in a row talk in float32, not through float16
        onnx.save(tidy.model, dest)
    elif conv.tool == DYNAMIC:
        from onnxruntime.quantization import QuantType, quantize_dynamic  # engine: onnxruntime

        kind = QuantType.QInt8 if conv.weight_type == "QInt8" else QuantType.QUInt8
        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process, on the root logger
        try:
            quantize_dynamic(str(original), str(dest), weight_type=kind, nodes_to_exclude=list(keep))
        finally:
            logging.getLogger().setLevel(quiet)
    else:
        onnx.save(_unquantized(load_proto(original), load_proto(candidate), set(keep)), dest)
    return dest


def _one_cast_each(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX Runtime's float16 tool names the cast it inserts for each blocked reader of a tensor
    alike: two blocked readers give two casts of one name (the same cast twice); one is kept.
    The command the advice gives does the same (_DEDUPE)."""
    seen: set[str] = set()
    nodes = []
    for n in model.graph.node:
        if n.op_type == "Cast" and n.output[0] in seen:
            continue
        seen.update(n.output)
        nodes.append(n)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


_DEDUPE = """# the tool names the cast it inserts for each blocked reader of a tensor alike: keep one
seen, nodes = set(), []
for n in model.graph.node:
    if not (n.op_type == "Cast" and n.output[0] in seen):
        seen.update(n.output)
        nodes.append(n)
del model.graph.node[:]
model.graph.node.extend(nodes)
# two blocked nodes in a row talk through float32, not float16 (ONNX Runtime's own remedy)
tidy = OnnxModel(model)
tidy.remove_cascaded_cast_nodes()
model = tidy.model
"""


def _unquantized(original: onnx.ModelProto, candidate: onnx.ModelProto, keep: set[str]) -> onnx.ModelProto:
    """The QDQ candidate with each kept node reading the original's inputs: its activations before
    their QuantizeLinear, the original's float weights."""
    made = {o: n for n in candidate.graph.node for o in n.output}
    theirs = {n.name: n for n in original.graph.node if n.name}
    owned = {t.name for t in candidate.graph.initializer}
    wanted: dict[str, onnx.TensorProto] = {}
    weights = {t.name: t for t in original.graph.initializer}
    for node in candidate.graph.node:
        if node.name not in keep or node.name not in theirs:
            continue
        src = theirs[node.name]
        for k, i in enumerate(list(node.input)):
            d = made.get(i)
            if d is None or d.op_type != "DequantizeLinear" or k >= len(src.input):
                continue
            name = src.input[k]
            if name in weights:  # the original's float weight, under a name of its own
                fresh = f"{name}_float32"
                if fresh not in owned:
                    wanted[fresh] = onnx.TensorProto()
                    wanted[fresh].CopyFrom(weights[name])
                    wanted[fresh].name = fresh
                name = fresh
            node.input[k] = name
    # a kept node's output quantized on its way out of the graph: handed out as computed
    outputs = {o.name for o in candidate.graph.output}
    readers = {i: n for n in candidate.graph.node for i in n.input}
    for node in candidate.graph.node:
        if node.name not in keep:
            continue
        for o in node.output:
            q = readers.get(o)
            d = readers.get(q.output[0]) if q is not None and q.op_type == "QuantizeLinear" else None
            if d is not None and d.op_type == "DequantizeLinear" and d.output[0] in outputs:
                d.op_type, d.domain = "Identity", ""
                del d.input[:]
                del d.attribute[:]
                d.input.append(o)
    candidate.graph.initializer.extend(wanted.values())
    return candidate


def command(conv: Converter, keep: Sequence[str], original: str, candidate: str) -> str:
    """The Python that re-converts the original with `keep` in float32 (a static quantizer's
    calibration reader is the user's own)."""
    nodes = repr(list(keep))
    src, dest = original, candidate
    if conv.tool == FP16:
        return (
            "import onnx\nfrom onnxruntime.transformers.float16 import convert_float_to_float16\n"
            "from onnxruntime.transformers.onnx_model import OnnxModel\n"
            f"model = convert_float_to_float16(onnx.load({src!r}), keep_io_types={conv.keep_io_types}, "
            f"node_block_list={nodes})\n"
            f"{_DEDUPE}"
            f"onnx.save(model, {dest!r})\n"
            "# onnxconverter-common's float16.convert_float_to_float16 takes the same "
            f"keep_io_types={conv.keep_io_types} and node_block_list"
        )
    if conv.tool == DYNAMIC:
        return (
            "from onnxruntime.quantization import QuantType, quantize_dynamic\n"
            f"quantize_dynamic({src!r}, {dest!r}, weight_type=QuantType.{conv.weight_type}, "
            f"nodes_to_exclude={nodes})"
        )
    return (
        "from onnxruntime.quantization import QuantFormat, QuantType, quantize_static\n"
        f"quantize_static({src!r}, {dest!r}, calibration_data_reader=YOUR_READER, "
        f"quant_format=QuantFormat.QDQ, weight_type=QuantType.{conv.weight_type}, nodes_to_exclude={nodes})"
    )


def advise(
    conv: Converter | None,
    every: Sequence[str],
    scores: Sequence[Sensitivity],
    original: Path,
    candidate: Path,
    work: Path,
    confirm: Callable[[Path], tuple[bool, str]],
    target: str,
) -> Advice:
    """The smallest guess whose re-converted candidate matches the original's `target` (tokens,
    decisions), each confirmed by `confirm`; what was tried, and how long it took."""
    start = time.perf_counter()
    if conv is None:
        why = "no converter known made this candidate (ONNX Runtime's float16 tool, its quantizers)"
        return Advice(status="unavailable", reason=why, target=target)
    if not scores:
        why = "no node of the original could be scored on the candidate"
        return Advice(status="unavailable", reason=why, converter=conv.tool, target=target)
    tried: list[tuple[int, bool, str]] = []
    best: tuple[str, ...] | None = None
    at, seen = START, set()
    for k in range(MAX_TRIES):
        keep = keeping(scores, SHARES[at], every)
        if keep in seen:
            break
        seen.add(keep)
        try:
            path = rewrite(conv, original, candidate, keep, work / f"advise-{k}" / candidate.name)
            ok, why = confirm(path)
        except Exception as e:  # a converter or a run that fails: said, the next guess tried
            ok, why = False, f"{type(e).__name__}: {e}"
        tried.append((len(keep), ok, why))
        if ok and (best is None or len(keep) < len(best)):
            best = keep
        nxt = min(max(at + (-2 if ok else 2), 0), len(SHARES) - 1)
        if nxt == at or (best is not None and len(best) == 1):
            break
        at = nxt
    seconds = time.perf_counter() - start
    base = Advice(
        status="not-found",
        reason=f"no guess matched the original's {target}",
        converter=conv.tool,
        scored=len(scores),
        tried=tuple(tried),
        seconds=seconds,
        target=target,
    )
    if best is None:
        return base
    dest = str(candidate.with_name(candidate.stem + "_kept.onnx"))
    return replace(base, status="ok", reason="", keep=best, command=command(conv, best, str(original), dest))
