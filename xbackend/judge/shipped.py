"""The graph an engine really runs, judged: ONNX Runtime fuses the model it is given (at its
default level: SkipLayerNormalization, FusedMatMul, Gemm from MatMul and Add, FastGelu, ...),
and an unfused, severed graph never shows those kernels.

For a runner that can write its optimized graph (Runner.saves_optimized_graph), a first job
builds the plain model with option save_optimized=PATH; that graph is then severed at the
tensors the reference captured, run on the engine as saved (opt_level=disable: nothing is
fused again), and judged against its float64 value (xbackend.runners.contrib evaluates the
fused kernels from their definitions). A graph holding a kernel xbackend cannot evaluate in
float64 (ORT's NCHWc layout ops) is judged in its unfused form instead, and the report says why.

OpenVINO writes no model but its runtime graph (runtime_plan): the kernels the CPU plugin runs,
each with the ONNX nodes it computes. The ONNX graph is severed at the kernels' outputs only, so
each piece between them is one kernel's work (a FullyConnected with its bias and activation, a
normalization whose scale went into the next kernel's weights); OpenVINO runs the pieces, fusing
them as it ships them, and each piece is judged against its float64 value with its nodes' bounds
composed (xbackend.bounds.propagation).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from xbackend.execution.executor import Job, JobOutcome
from xbackend.execution.protocol import OUTPUTS, Phase
from xbackend.judge.floors import save_severed_feeds
from xbackend.model.extdata import weight_array, write_rewritten
from xbackend.model.load import ModelRef, ModelSpec, load_proto
from xbackend.model.ortdomain import ORT_IN_ONNX_DOMAIN
from xbackend.model.sever import SEVERED, sever
from xbackend.numerics.values import Value
from xbackend.runners.contrib import CONTRIB_DOMAIN, CONTRIB_OPS

__all__ = [
    "Shipped",
    "coinciding",
    "covered_nodes",
    "runtime_plan",
    "shared_nodes",
    "shipped_job",
    "shipped_plan",
    "without",
]

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
    # What the float64 judge evaluates, where not `severed` itself: the model severed at the same
    # tensors (its kernels cannot be evaluated in float64, or it is no model: OpenVINO's)
    judged_on: onnx.ModelProto | None = None


def shipped_job(name: str, cls: type, variant: tuple[tuple[str, str], ...], spec: ModelSpec, feeds: Path,
                folder: Path) -> tuple[Job, Path]:  # fmt: skip
    """The plain model built once with save_optimized: the graph users' sessions run."""
    path = folder / f"optimized-{name}.onnx"
    options = tuple(sorted({**dict(variant), "save_optimized": str(path)}.items()))
    phase = Phase.planned(OUTPUTS, spec.output_order(), 1)
    return Job(f"explain-optimized-{name}", name, cls, options, feeds, (phase,)), path


def _unevaluable(proto: onnx.ModelProto) -> list[str]:
    """Kernels of the optimized graph that xbackend cannot evaluate in float64."""
    out = set()
    for node in proto.graph.node:
        if node.domain in STANDARD:
            if node.op_type in ORT_IN_ONNX_DOMAIN or onnx.defs.has(node.op_type):
                continue
            out.add(f"{node.op_type} (ONNX Runtime's, in the ONNX domain, with no ONNX schema)")
        elif not (node.domain == CONTRIB_DOMAIN and node.op_type in CONTRIB_OPS):
            out.add(f"{node.domain}.{node.op_type}")
    return sorted(out)


def covered_nodes(original: onnx.ModelProto, optimized: onnx.ModelProto) -> dict[str, tuple[str, ...]]:
    """Each fused node's output -> the original nodes' outputs it computes: its own name's producer
    and every node above it whose output the optimized graph no longer holds."""
    producer = {
        output_name: node for node in original.graph.node for output_name in node.output if output_name
    }
    kept = {output_name for node in optimized.graph.node for output_name in node.output if output_name} | {
        input_name.name for input_name in optimized.graph.input
    }
    out: dict[str, tuple[str, ...]] = {}
    for node in optimized.graph.node:
        for output_name in node.output:
            if output_name not in producer:
                continue
            if node.domain in STANDARD and producer[output_name].op_type == node.op_type:
                continue  # the same op as before: not a fusion
            out[output_name] = tuple(reversed(_above(producer, output_name, kept, 64)))
    return out


def _above(producer: Mapping[str, onnx.NodeProto], t: str, stop: set[str], limit: int) -> list[str]:
    """`t` and the node outputs it is computed from, up to the tensors in `stop` and the graph's
    inputs (at most `limit`), nearest first."""
    seen: list[str] = []
    stack = [t]
    while stack and len(seen) < limit:
        x = stack.pop()
        if x in seen or x not in producer:
            continue
        seen.append(x)
        stack += [
            input_name
            for input_name in producer[x].input
            if input_name and input_name not in stop and input_name in producer
        ]
    return seen


def _describe(proto: onnx.ModelProto, original: onnx.ModelProto) -> str:
    before = Counter(node.op_type for node in original.graph.node)
    after = Counter(node.op_type for node in proto.graph.node)
    fused = [(op, value) for op, value in after.items() if value > before.get(op, 0)]
    parts = ", ".join(f"{position - before.get(op, 0)} {op}" for op, position in sorted(fused))
    return "ONNX Runtime's optimized graph" + (f" ({parts})" if parts else " (nothing fused)")


def _severed_run(
    proto: onnx.ModelProto,
    grain: Mapping[str, tuple[int, tuple[int, ...]]],
    source: str | Path,
    spath: Path,
    spec: ModelSpec,
    feeds: Mapping[str, Value],
    ref_capture: str,
    fed: Sequence[str],
) -> tuple[onnx.ModelProto, Path, ModelRef]:
    """`proto` (its weights beside `source`) severed at `grain`, written to `spath` with its feeds
    (the model's, named `fed`, and the reference's values of what it severs): the engine's local
    run."""
    severed = sever(proto, grain)
    write_rewritten(severed.proto, source, spath)
    sfeeds = spath.with_suffix(".xbv")
    save_severed_feeds(sfeeds, feeds, ref_capture, severed.inputs)
    inputs = (*fed, *(SEVERED + input_name for input_name in severed.inputs))
    declared = {input_name.name for input_name in severed.proto.graph.input}
    ref = ModelRef(
        str(spath),
        spec.ir_version,
        tuple(input_name for input_name in inputs if input_name in declared),
        tuple(output_name.name for output_name in severed.proto.graph.output),
        any(initializer.data_location == TensorProto.EXTERNAL for initializer in proto.graph.initializer),
        spec.weight_bytes,
    )
    return severed.proto, sfeeds, ref


def shipped_plan(
    name: str,
    outcome: JobOutcome | None,
    path: Path,
    spec: ModelSpec,
    model: onnx.ModelProto,
    available: Mapping[str, tuple[int, tuple[int, ...]]],
    feeds: Mapping[str, Value],
    ref_capture: str,
    folder: Path,
) -> Shipped | str:
    """The severed optimized graph of `name`, or why it cannot be judged (`model`: the model, its
    weights beside the rewrites). A graph holding kernels xbackend cannot evaluate in float64 is
    judged at its tensors of the model."""
    if outcome is None or not outcome.ok or not path.exists():
        why = outcome.reason if outcome is not None else "it did not run"
        return f"its optimized graph could not be written ({why})"
    proto = load_proto(str(path), load_external=False)
    odd = _unevaluable(proto)
    names = {output_name for node in proto.graph.node for output_name in node.output if output_name}
    grain = {n: available[n] for n in available if n in names}
    if odd:
        keep = coinciding(proto, model, set(grain))
        grain = {key: value for key, value in grain.items() if key in keep}
    spath = folder / f"severed-optimized-{name}.onnx"
    fed = [input_name.name for input_name in proto.graph.input]
    severed, sfeeds, ref = _severed_run(proto, grain, path, spath, spec, feeds, ref_capture, fed)
    if odd:
        # Its kernels (ONNX Runtime's NCHWc convolutions) are judged as the nodes they replace:
        # the model severed at the tensors this graph computes under the model's names, each
        # piece between them against its float64 value, its nodes' bounds composed.
        pieces = sever(model, grain).proto
        tensors = tuple(
            output_name for node in model.graph.node for output_name in node.output if output_name in grain
        )
        described = (
            f"{_describe(proto, model)}, judged at its {len(tensors)} tensors of the model's: "
            f"{', '.join(odd)} evaluated as the nodes they replace"
        )
        return Shipped(severed, spath, sfeeds, ref, tensors, _pieces(model, set(grain)), described, pieces)
    tensors = tuple(output_name for node in severed.graph.node for output_name in node.output if output_name)
    return Shipped(severed, spath, sfeeds, ref, tensors, covered_nodes(model, proto), _describe(proto, model))


def _upstream(proto: onnx.ModelProto, grain: set[str]) -> dict[str, set[str]]:
    """Each grain tensor -> the grain tensors and graph inputs its value is computed from, the
    graph severed at the grain (its piece's inputs)."""
    producer = {output_name: node for node in proto.graph.node for output_name in node.output if output_name}
    memo: dict[str, frozenset[str]] = {}

    def reads(t: str) -> frozenset[str]:  # what the producer of t reads, up to the grain
        if t in memo:
            return memo[t]
        memo[t] = frozenset()  # a cycle cannot be, but a guard costs nothing
        out: set[str] = set()
        for i in producer[t].input if t in producer else ():
            if not i:
                continue
            out |= {i} if i in grain or i not in producer else reads(i)
        memo[t] = frozenset(out)
        return memo[t]

    return {tensor: set(reads(tensor)) for tensor in grain if tensor in producer}


def coinciding(optimized: onnx.ModelProto, model: onnx.ModelProto, grain: set[str]) -> set[str]:
    """The largest part of `grain` at which both graphs' pieces read the same tensors: where the
    optimized graph computes a piece from further up (its kernels read a copy of a tensor in
    their own layout, not the tensor by its name), the model is not severed there either, so
    the engine's piece and the one judged are the same computation."""
    grain = set(grain)
    while True:
        mine, theirs = _upstream(optimized, grain), _upstream(model, grain)
        drop = {s for tensor in grain for s in theirs.get(tensor, set()) - mine.get(tensor, set())} & grain
        if not drop:
            return grain
        grain -= drop


def _kernels(path: Path, proto: onnx.ModelProto) -> list[tuple[str, tuple[int, ...]]]:
    """(kernel type, the positions in `proto` of the nodes it computes) for each runtime node the
    file lists, by name (TensorRT names a nameless node's layer node_of_<its output>; a range,
    TensorRT's Myelin region, is every node from its first to its last, the first given as a
    weight standing for its first reader); raises ValueError for anything else."""
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise ValueError("not a list of nodes")
    at: dict[str, int] = {}
    first_reader: dict[str, int] = {}
    for index, node in enumerate(proto.graph.node):
        at[node.name or (node.output[0] if node.output else "")] = index
        if node.output:
            at.setdefault(f"node_of_{node.output[0]}", index)
        for input_name in node.input:
            first_reader.setdefault(input_name, index)
    out = []
    for r in data:
        if not isinstance(r, dict) or not isinstance(r.get("original"), list):
            raise ValueError("a node without its original names")
        original = [str(x) for x in r["original"]]
        if r.get("range") is True and len(original) == 2:
            a, b = at.get(original[0], first_reader.get(original[0])), at.get(original[1])
            members = tuple(range(a, b + 1)) if a is not None and b is not None and a <= b else ()
        else:
            members = tuple(at[x] for x in original if x in at)
        out.append((str(r.get("type", "?")), members))
    return out


def _pieces(proto: onnx.ModelProto, grain: set[str]) -> dict[str, tuple[str, ...]]:
    """Each grain tensor -> the node outputs its piece computes (upstream of it, up to other grain
    tensors and the graph's inputs), where that is more than its own node."""
    producer = {output_name: node for node in proto.graph.node for output_name in node.output if output_name}
    order = {o: index for index, o in enumerate(producer)}
    out = {}
    for t in grain:
        seen = _above(producer, t, grain, 256)
        if len(seen) > 1:
            out[t] = tuple(sorted(seen, key=order.__getitem__))
    return out


def runtime_plan(
    name: str,
    outcome: JobOutcome | None,
    path: Path,
    spec: ModelSpec,
    proto: onnx.ModelProto,
    source: str,
    available: Mapping[str, tuple[int, tuple[int, ...]]],
    feeds: Mapping[str, Value],
    ref_capture: str,
    folder: Path,
    label: str = "OpenVINO's runtime graph",
) -> Shipped | str:
    """`proto` (the model, its weights beside `source`) severed at the outputs of the kernels the
    runtime graph at `path` runs (`label`: OpenVINO's, or TensorRT's engine layers), or why it
    cannot be."""
    if outcome is None or not outcome.ok or not path.exists():
        why = outcome.reason if outcome is not None else "it did not run"
        return f"its runtime graph could not be read ({why})"
    try:
        kernels = _kernels(path, proto)
    except (OSError, ValueError) as error:
        return f"its runtime graph could not be read ({type(error).__name__}: {error})"
    grain: set[str] = {
        output_name.name for output_name in proto.graph.output if output_name.name in available
    }
    fusing: Counter[str] = Counter()
    for kind, positions in kernels:
        members = [proto.graph.node[position] for position in positions]
        reads = {input_name for member in members for input_name in member.input}
        grain |= {
            output_name
            for member in members
            for output_name in member.output
            if output_name and output_name not in reads and output_name in available
        }
        if len(members) > 1:
            fusing[kind] += 1
    if not grain:
        return "no kernel of its runtime graph names a node of the model"
    spath = folder / f"severed-runtime-{name}.onnx"
    cut = {n: available[n] for n in grain}
    severed, sfeeds, ref = _severed_run(proto, cut, source, spath, spec, feeds, ref_capture, spec.input_names)
    tensors = tuple(
        output_name for node in proto.graph.node for output_name in node.output if output_name in grain
    )
    parts = ", ".join(f"{value} {kind}" for kind, value in sorted(fusing.items()))
    described = (
        f"{label}: {len(kernels)} kernels"
        + (f" ({parts} fusing several nodes)" if parts else "")
        + f", judged at {len(tensors)} kernel outputs"
    )
    return Shipped(severed, spath, sfeeds, ref, tensors, _pieces(proto, grain), described)


def _attrs(node: onnx.NodeProto, opset: int) -> dict[str, bytes]:
    """A node's attributes, those its schema defaults filled in (ONNX Runtime writes them out)."""
    out = {attribute.name: attribute.SerializeToString() for attribute in node.attribute}
    if node.domain not in STANDARD:
        return out
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return out
    for name, spec in schema.attributes.items():
        default_value = spec.default_value
        if name not in out and default_value.type != onnx.AttributeProto.UNDEFINED:
            filled = onnx.AttributeProto()
            filled.CopyFrom(default_value)
            filled.name = name
            out[name] = filled.SerializeToString()
    return out


def shared_nodes(
    severed: onnx.ModelProto, weights: onnx.ModelProto, weights_at: Path, model: onnx.ModelProto,
    model_at: Path, available: Collection[str], reference: Callable[[str], object],
) -> frozenset[str]:  # fmt: skip
    """The node outputs of `severed` (an optimized graph severed at the reference's tensors, its
    weights those of `weights`, in folder `weights_at`) whose float64 values the reference grain's
    judge computes too: nodes the optimizer left as they were (op, attributes, inputs), each
    output one the reference holds, each input read severed in both graphs (the reference's
    values), a graph input of both, or a weight of the same values in both, or a weight equal to
    the reference's value of the tensor it stands for (a transpose the optimizer folded). One
    evaluation of those nodes serves both judgments. `reference(name)`: the reference's value."""
    available = set(available)
    producer = {output_name: node for node in model.graph.node for output_name in node.output if output_name}
    inits = {initializer.name: initializer for initializer in model.graph.initializer}
    theirs = {initializer.name: initializer for initializer in weights.graph.initializer}
    fed = {input_name.name for input_name in model.graph.input} - set(inits)
    opset = next((opset.version for opset in model.opset_import if opset.domain in STANDARD), 1)
    same: dict[str, bool] = {}

    def same_weight(x: str) -> bool:
        if x not in same:
            a = weight_array(theirs[x], weights_at) if x in theirs else None
            # the model's weight, or the reference's value where the model computes it
            b = weight_array(inits[x], model_at) if x in inits else None
            if x not in inits and x in available and x in producer:
                got = reference(x)
                b = got if isinstance(got, np.ndarray) else None
            same[x] = (
                a is not None and b is not None and a.dtype == b.dtype and a.shape == b.shape
                and bool(np.array_equal(a, b))
            )  # fmt: skip
        return same[x]

    def same_input(a: str, b: str) -> bool:
        if a.startswith(SEVERED):  # fed the reference's value in both graphs
            return a[len(SEVERED) :] == b and b in available and b in producer
        return a == b and (not a or (a in fed and a not in theirs) or same_weight(a))

    out: set[str] = set()
    for n in severed.graph.node:
        outs = [output_name for output_name in n.output if output_name]
        node = producer.get(outs[0]) if outs else None
        if (
            node is None
            or list(node.output) != list(n.output)
            or not all(out in available for out in outs)
            or node.op_type != n.op_type
            or (node.domain or "ai.onnx") != (n.domain or "ai.onnx")
            or any(
                attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for attribute in n.attribute
            )
            or _attrs(node, opset) != _attrs(n, opset)
            or len(node.input) != len(n.input)
        ):
            continue
        if all(same_input(input_name, b) for input_name, b in zip(n.input, node.input, strict=True)):
            out.update(outs)
    return frozenset(out)


def without(proto: onnx.ModelProto, outputs: Collection[str]) -> onnx.ModelProto:
    """`proto` without the nodes whose outputs are all in `outputs` (their readers read them
    severed) and without those graph outputs. Its inputs and weights stay: it is fed the graph's
    feeds, and the evaluator keeps only the weights its nodes read (runners.reference.prune)."""
    if not outputs:
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    keep = [
        node
        for node in graph.node
        if not all(output_name in outputs for output_name in node.output if output_name)
    ]
    outs = [output_name for output_name in graph.output if output_name.name not in outputs]
    del graph.node[:], graph.output[:]
    graph.node.extend(keep)
    graph.output.extend(outs)
    return out
