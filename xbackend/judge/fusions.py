"""Where an engine fuses, found by exposure, and the plain run cut around each fusion.

Engines fuse only what nobody reads: a tensor whose exposure changes the plain run's outputs lies
inside a fusion (or a kernel choice that depends on it, the same thing to a judge). Where an
engine publishes no graph of its own (a plugin, an engine in another environment), those tensors
are found by group testing: the plain model run with a group of tensors exposed, each group that
moves the outputs split in two, until single tensors remain. All tests of a round run in one
worker process, one build each, against the plain run's own outputs in that process.

The plain run is then cut around each fusion: a fused tensor joins its maker to the readers
beside its first (a later reader is fed it from the reference, and it is never exposed), every
other tensor read elsewhere is exposed and fed to its readers from the reference, so each node
outside a fusion is judged alone and each fused region is one stretch, as small as the fusion,
however many tensors cross into it. The search is budgeted (MAX_BUILDS): the groups not yet split
when it runs out stay fused, whole.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import onnx

from xbackend.execution.executor import Executor, Job
from xbackend.execution.protocol import Phase
from xbackend.model.graphorder import NodeSets
from xbackend.planning.context import PlannedBackend, RunContext

__all__ = [
    "FIRST_GROUPS",
    "MAX_BUILDS",
    "NEAR",
    "Fusions",
    "build_budget",
    "find_fusions",
    "float_candidates",
    "fusion_stretches",
    "region_sizes",
]

FIRST_GROUPS = 16  # the first round's groups: later rounds halve the groups that moved the outputs
MAX_BUILDS = 160  # a search's builds: past them, the groups not yet split are taken as fused
NEAR = 3  # a fused tensor's readers this close to its first are in its kernel; later ones are fed it
_FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                     onnx.TensorProto.BFLOAT16})  # fmt: skip
_PLAIN = "fusion-plain"


@dataclass(frozen=True)
class Fusions:
    """What exposing each tensor does to a backend's plain outputs."""

    fused: tuple[str, ...]  # tensors whose exposure moves the outputs, model order
    searched: int  # tensors tested
    builds: int  # builds the search made
    why_not: str = ""  # why the search could not decide ('' when it did)
    untested: int = 0  # tensors taken as fused without a test of their own (the builds ran out)


def build_budget(weight_bytes: int) -> int:
    """The builds a search may make: MAX_BUILDS, fewer for a model whose every build loads
    gigabytes of weights (at least FIRST_GROUPS + 1: one round)."""
    scale = max(1.0, weight_bytes / (256 << 20))
    return max(FIRST_GROUPS + 1, int(MAX_BUILDS / scale))


def _groups(items: Sequence[str], k: int) -> list[tuple[str, ...]]:
    """`items` in at most `k` contiguous groups of near-equal size (model order kept: a fusion's
    tensors sit together, so few groups hold one)."""
    k = max(1, min(k, len(items)))
    size, extra = divmod(len(items), k)
    out, at = [], 0
    for i in range(k):
        n = size + (i < extra)
        out.append(tuple(items[at : at + n]))
        at += n
    return [g for g in out if g]


def find_fusions(
    ctx: RunContext,
    live: PlannedBackend,
    ex: Executor,
    candidates: Sequence[str],
    key: str,
) -> Fusions:
    """The `candidates` (float tensors, model order) whose exposure moves `live`'s plain outputs."""
    assert live.cls is not None
    outputs = ctx.spec.output_order()
    order = {t: index for index, t in enumerate(ctx.spec.tensor_order())}
    todo = _groups(list(candidates), FIRST_GROUPS)
    fused: list[str] = []
    builds, rounds = 0, 0
    budget = build_budget(ctx.spec.weight_bytes)
    while todo:
        if builds + len(todo) + 1 > budget:  # out of builds: what is left untested stays fused
            untested = [t for g in todo for t in g]
            done = sorted([*fused, *untested], key=lambda t: order.get(t, -1))
            return Fusions(tuple(done), len(candidates), builds, untested=len(untested))
        rounds += 1
        phases = [Phase.planned(_PLAIN, outputs, 2, spill=False)]
        phases += [
            Phase.planned(
                f"fusion-{index}", sorted({*outputs, *g}, key=lambda t: order.get(t, -1)), 1, spill=False
            )
            for index, g in enumerate(todo)
        ]
        job = Job(f"explain-fusions-{key}-{rounds}", live.name, live.cls, live.variant(), ctx.feeds_path,
                  tuple(phases))  # fmt: skip
        ex.bar.grow(job.steps)
        got = ex.run(job)
        builds += len(phases)
        try:
            plain = got.phase(_PLAIN) if got.ok else None
            if plain is None:
                return Fusions((), len(candidates), builds, got.reason or "its plain run did not run")
            if len(set(plain.output_hashes)) > 1:
                return Fusions((), len(candidates), builds, "its plain outputs vary from run to run")
            moved = []
            for k, g in enumerate(todo):
                p = got.phase(f"fusion-{k}")
                if p is None or not p.output_hashes:
                    return Fusions((), len(candidates), builds, f"a build exposing {g[0]} did not run")
                if p.output_hashes[0] != plain.output_hashes[0]:
                    moved.append(g)
        finally:
            got.drop_captures()
        todo = []
        for g in moved:
            if len(g) == 1:
                fused.append(g[0])
            else:
                todo += _groups(g, 2)
    return Fusions(tuple(sorted(fused, key=lambda t: order.get(t, -1))), len(candidates), builds)


def float_candidates(
    proto: onnx.ModelProto, available: Mapping[str, tuple[int, tuple[int, ...]]]
) -> list[str]:
    """Computed float tensors the reference holds, graph outputs aside, in model order."""
    outputs = {output_name.name for output_name in proto.graph.output}
    return [
        output_name
        for node in proto.graph.node
        for output_name in node.output
        if output_name
        and output_name not in outputs
        and output_name in available
        and available[output_name][0] in _FLOATS
    ]


def _regions(proto: onnx.ModelProto, fused: Collection[str], unheld: Collection[str]) -> list[int]:
    """Each node's region, numbered in model order: a fused tensor joins its maker to its readers
    within NEAR nodes of the first (the kernel it fuses into, a mask's Where beside it; a later
    reader, such as the next residual Add, is fed it from the reference), a tensor the reference
    does not hold joins its maker to every reader (it cannot be fed); the other nodes are alone."""
    nodes = proto.graph.node
    sets = NodeSets(len(nodes))
    made = {
        output_name: index for index, node in enumerate(nodes) for output_name in node.output if output_name
    }
    first: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for input_name in n.input:
            if input_name in made and (
                input_name in unheld or (input_name in fused and k - first.setdefault(input_name, k) <= NEAR)
            ):
                sets.join(made[input_name], k)
    ids: dict[int, int] = {}
    return [ids.setdefault(sets.root(k), len(ids)) for k in range(len(nodes))]


def fusion_stretches(
    proto: onnx.ModelProto, fused: Collection[str], available: Mapping[str, tuple[int, tuple[int, ...]]]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
    """The plain run cut around each fusion: the tensors to expose and feed (read in another
    region than their maker's), the fused ones read there too (fed, never exposed: exposing one
    would undo its fusion), and each node's region."""
    maker = {
        output_name: index
        for index, node in enumerate(proto.graph.node)
        for output_name in node.output
        if output_name
    }
    unheld = {t for t in maker if t not in available}
    region = _regions(proto, set(fused), unheld)
    crossing: dict[str, None] = {}
    for k, n in enumerate(proto.graph.node):
        for input_name in n.input:
            if input_name in maker and input_name not in unheld and region[maker[input_name]] != region[k]:
                crossing[input_name] = None
    cuts = tuple(t for t in crossing if t not in fused)
    return cuts, tuple(t for t in crossing if t in fused), tuple(region)


def region_sizes(proto: onnx.ModelProto, region: Sequence[int]) -> dict[int, int]:
    """Nodes per region, Constants not counted."""
    out: dict[int, int] = {}
    for index, node in enumerate(proto.graph.node):
        if node.op_type != "Constant":
            out[region[index]] = out.get(region[index], 0) + 1
    return out
