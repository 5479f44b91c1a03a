"""The graph an engine really runs, judged: ONNX Runtime fuses the model it is given (at its
default level: SkipLayerNormalization, FusedMatMul, Gemm from MatMul and Add, FastGelu, ...),
and an unfused, severed graph never shows those kernels.

For a runner that can write its optimized graph (Runner.saves_optimized_graph), a first job
builds the plain model with option save_optimized=PATH; that graph is then severed at the
tensors the reference captured, run on the engine as saved (opt_level=disable: nothing is
fused again), and judged against its float64 value (xbackend.runners.contrib evaluates the
fused kernels from their definitions). A graph holding a kernel xbackend cannot evaluate in
float64 (ORT's NCHWc layout ops) is judged in its unfused form instead, and the report says why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto

from xbackend.compare.floors import save_severed_feeds
from xbackend.executor import Job, JobOutcome, PhaseSpec
from xbackend.extdata import write_rewritten
from xbackend.model import ModelRef, ModelSpec, load_proto
from xbackend.protocol import OUTPUTS
from xbackend.runners.contrib import CONTRIB_DOMAIN, CONTRIB_OPS
from xbackend.sever import SEVERED, sever
from xbackend.values import Value

__all__ = ["Shipped", "covered_nodes", "shipped_job", "shipped_plan"]

STANDARD = frozenset({"", "ai.onnx"})


@dataclass(frozen=True)
class Shipped:
    """A backend's optimized graph, severed: its local job, feeds and what it fuses."""

    severed: onnx.ModelProto
    path: Path
    feeds: Path
    model: ModelRef
    tensors: tuple[str, ...]  # node outputs, graph order
    covers: Mapping[str, tuple[str, ...]]  # fused node output -> the original node outputs it covers
    described: str  # e.g. "ONNX Runtime's optimized graph: 4 SkipLayerNormalization, 2 FusedMatMul"


def shipped_job(name: str, cls: type, variant: tuple[tuple[str, str], ...], spec: ModelSpec, feeds: Path,
                folder: Path) -> tuple[Job, Path]:  # fmt: skip
    """The plain model built once with save_optimized: the graph users' sessions run."""
    path = folder / f"optimized-{name}.onnx"
    options = tuple(sorted({**dict(variant), "save_optimized": str(path)}.items()))
    phase = PhaseSpec(OUTPUTS, spec.tensor_order(outputs_only=True), 1)
    return Job(f"explain-optimized-{name}", name, cls, options, feeds, (phase,)), path


def _unevaluable(proto: onnx.ModelProto) -> list[str]:
    """Kernels of the optimized graph that xbackend cannot evaluate in float64."""
    out = set()
    for n in proto.graph.node:
        if n.domain in STANDARD or (n.domain == CONTRIB_DOMAIN and n.op_type in CONTRIB_OPS):
            continue
        out.add(f"{n.domain}.{n.op_type}")
    return sorted(out)


def covered_nodes(original: onnx.ModelProto, optimized: onnx.ModelProto) -> dict[str, tuple[str, ...]]:
    """Each fused node's output -> the original nodes' outputs it computes: its own name's producer
    and every node above it whose output the optimized graph no longer holds."""
    producer = {o: n for n in original.graph.node for o in n.output if o}
    kept = {o for n in optimized.graph.node for o in n.output if o} | {i.name for i in optimized.graph.input}
    out: dict[str, tuple[str, ...]] = {}
    for node in optimized.graph.node:
        for t in node.output:
            if t not in producer:
                continue
            if node.domain in STANDARD and producer[t].op_type == node.op_type:
                continue  # the same op as before: not a fusion
            seen: list[str] = []
            stack = [t]
            while stack and len(seen) < 64:
                x = stack.pop()
                if x in seen or x not in producer:
                    continue
                seen.append(x)
                stack += [i for i in producer[x].input if i and i not in kept and i in producer]
            out[t] = tuple(reversed(seen))
    return out


def _describe(proto: onnx.ModelProto, original: onnx.ModelProto) -> str:
    before = Counter(n.op_type for n in original.graph.node)
    after = Counter(n.op_type for n in proto.graph.node)
    fused = [(op, k) for op, k in after.items() if k > before.get(op, 0)]
    parts = ", ".join(f"{k - before.get(op, 0)} {op}" for op, k in sorted(fused))
    return "ONNX Runtime's optimized graph" + (f" ({parts})" if parts else " (nothing fused)")


def shipped_plan(
    name: str,
    outcome: JobOutcome | None,
    path: Path,
    spec: ModelSpec,
    original: onnx.ModelProto,
    available: Mapping[str, tuple[int, tuple[int, ...]]],
    feeds: Mapping[str, Value],
    ref_capture: str,
    folder: Path,
) -> Shipped | str:
    """The severed optimized graph of `name`, or why it cannot be judged."""
    if outcome is None or not outcome.ok or not path.exists():
        why = outcome.reason if outcome is not None else "it did not run"
        return f"its optimized graph could not be written ({why})"
    proto = load_proto(str(path), load_external=False)
    odd = _unevaluable(proto)
    if odd:
        return f"its optimized graph holds {', '.join(odd)}, which xbackend cannot evaluate in float64"
    names = {o for n in proto.graph.node for o in n.output if o}
    grain = {n: available[n] for n in available if n in names}
    severed = sever(proto, grain)
    spath = folder / f"severed-optimized-{name}.onnx"
    write_rewritten(severed.proto, path, spath)
    sfeeds = spath.with_suffix(".xbv")
    save_severed_feeds(sfeeds, feeds, ref_capture, severed.inputs)
    inputs = (*(i.name for i in proto.graph.input), *(SEVERED + n for n in severed.inputs))
    declared = {x.name for x in severed.proto.graph.input}
    external = any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer)
    model = ModelRef(
        str(spath),
        spec.ir_version,
        tuple(i for i in inputs if i in declared),
        tuple(o.name for o in severed.proto.graph.output),
        external,
        spec.weight_bytes,
    )
    tensors = tuple(o for n in severed.proto.graph.node for o in n.output if o)
    return Shipped(severed.proto, spath, sfeeds, model, tensors, covered_nodes(original, proto),
                   _describe(proto, original))  # fmt: skip
