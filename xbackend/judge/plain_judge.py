"""The run that ships, judged at its outputs.

Engines fuse only what is not exposed, so the instrumented and severed runs are not the plain
run. Where a backend's plain outputs differ from its instrumented ones (the observer effect) and
its own shipped graph was not judged kernel by kernel (ONNX Runtime's optimized graph, OpenVINO's
runtime graph are), its plain outputs are judged against the float64 model with every node's
allowance composed to them, first order (xbackend.bounds.propagation), as for OpenVINO's pieces
and torch's modules. Past that bound, the backend runs the model cut at its stretch boundaries
(where one float tensor alone crosses, as between residual blocks), each stretch fusing as it
ships, and the stretches past their composed bounds are the origin, naming their nodes.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from xbackend.bounds.element import AUX
from xbackend.bounds.propagation import PROP
from xbackend.execution.executor import Executor, Job
from xbackend.execution.protocol import Phase
from xbackend.judge.floors import save_severed_feeds
from xbackend.judge.fusions import Fusions, find_fusions, float_candidates, fusion_stretches, region_sizes
from xbackend.judge.judge_nodes import JUDGE_PHASE, judge_backend
from xbackend.judge.judge_plan import Plan
from xbackend.judge.judged_graph import Judged, judged_model
from xbackend.model.extdata import uses_external_data, write_rewritten
from xbackend.model.load import ModelRef, ModelSpec, load_proto
from xbackend.model.sever import SEVERED, Severed, sever
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.results import BackendResult
from xbackend.results.explanation import LocalErrors, Origin, PlainOutputs, PlainStatus

__all__ = [
    "PLAIN_PHASE",
    "Cutting",
    "Shipped",
    "judge_plain_runs",
    "stretch_cuts",
    "stretch_nodes",
]

PLAIN_PHASE = "plain"
MAX_STRETCHES = 16  # boundaries beyond this many would break the fusions the stretches must keep


@dataclass(frozen=True)
class Shipped:
    """What judging the plain runs reads."""

    oracle: PlannedBackend
    planned: Sequence[PlannedBackend]
    results: Mapping[str, BackendResult]


@dataclass(frozen=True)
class _Run:
    """One way of cutting the model into stretches: the backend's run and its float64 judge."""

    cutting: Cutting
    ends: tuple[str, ...]
    run: Job
    judge: Job
    judged: Judged


def _model_ref(spec: ModelSpec, path: Path, extra: tuple[str, ...], proto: onnx.ModelProto) -> ModelRef:
    return ModelRef(
        str(path),
        spec.ir_version,
        (*spec.input_names, *extra),
        tuple(output_name.name for output_name in proto.graph.output),
        uses_external_data(proto),
        spec.weight_bytes,
    )


def _crossing(proto: onnx.ModelProto) -> list[frozenset[str]]:
    """After each node but the last, the activations computed so far that a later node reads."""
    graph = proto.graph
    fixed = {initializer.name for initializer in graph.initializer} | {
        input_name.name for input_name in graph.input
    }
    last: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for i in node.input:
            last[i] = index
    live: set[str] = set()
    out = []
    for index, node in enumerate(graph.node[:-1]):
        live |= {output_name for output_name in node.output if output_name and output_name not in fixed}
        live = {t for t in live if last.get(t, -1) > index}
        out.append(frozenset(live))
    return out


@dataclass(frozen=True)
class Cutting:
    """One way of cutting the model into stretches.

    `cuts`: the stretch ends, exposed and fed to the stretches after them. `hidden`: tensors that
    cross a boundary but are read in their own stretch too (the residual stream, mid-block): fed
    to the later stretches, never exposed, so the fusions through them (Add + LayerNorm) happen.
    `stretch`: each node's stretch, in model order."""

    cuts: tuple[str, ...]
    hidden: tuple[str, ...]
    stretch: tuple[int, ...]


def _cutting(proto: onnx.ModelProto, ks: list[int], crossing: list[frozenset[str]]) -> Cutting:
    nodes = proto.graph.node
    stretch = tuple(bisect.bisect_left(ks, j) for j in range(len(nodes)))
    made = {
        output_name: index for index, node in enumerate(nodes) for output_name in node.output if output_name
    }
    same: set[str] = set()  # read in the stretch that computes it
    for k, n in enumerate(nodes):
        same |= {
            input_name
            for input_name in n.input
            if input_name in made and stretch[made[input_name]] == stretch[k]
        }
    outputs = {output_name.name for output_name in proto.graph.output}
    names = list(dict.fromkeys(t for k in ks for t in sorted(crossing[k])))
    hidden = tuple(name for name in names if name in same and name not in outputs)
    return Cutting(tuple(name for name in names if name not in hidden), hidden, stretch)


def stretch_cuts(proto: onnx.ModelProto) -> tuple[Cutting, Cutting] | tuple[()]:
    """Two staggered cuttings of the model into stretches: where the fewest activations cross
    (between residual blocks: one), at most MAX_STRETCHES of them spread evenly; and between each
    two of those, where the fewest cross nearest the middle (a fusion across a cut of the first is
    whole in a stretch of the second, the residual stream hidden there). None where nothing crosses."""
    crossing = _crossing(proto)
    usable = [index for index, a in enumerate(crossing) if a]
    if not usable:
        return ()
    fewest = min(len(crossing[k]) for k in usable)
    at = [k for k in usable if len(crossing[k]) == fewest]
    step = max(1, -(-len(at) // MAX_STRETCHES))
    first = at[step - 1 :: step] if len(at) > MAX_STRETCHES else at
    second = []
    for lo, hi in zip([-1, *first], [*first, len(crossing)], strict=True):
        inside = [k for k in usable if lo < k < hi]
        if inside:
            mid = (lo + hi) / 2
            second.append(min(inside, key=lambda k: (len(crossing[k]), abs(k - mid))))
    return _cutting(proto, first, crossing), _cutting(proto, second, crossing)


def _available(cutting: Cutting, available: Mapping[str, object]) -> Cutting:
    """`cutting` where the reference holds each tensor it feeds: one it does not hold stays connected."""
    return replace(
        cutting,
        cuts=tuple(cut for cut in cutting.cuts if cut in available),
        hidden=tuple(t for t in cutting.hidden if t in available),
    )


def stretch_nodes(proto: onnx.ModelProto, end: str, cutting: Cutting) -> tuple[str, ...]:
    """The node outputs of the stretch that ends at `end`: its producers within that stretch, in
    model order."""
    nodes = proto.graph.node
    made = {
        output_name: index for index, node in enumerate(nodes) for output_name in node.output if output_name
    }
    if end not in made:
        return ()
    mine = cutting.stretch[made[end]]
    seen: set[int] = set()
    todo = [end]
    while todo:
        k = made.get(todo.pop(), -1)
        if k < 0 or k in seen or cutting.stretch[k] != mine:
            continue
        seen.add(k)
        todo += [input_name for input_name in nodes[k].input if input_name]
    return tuple(nodes[k].output[0] for k in sorted(seen))


def _sever(
    proto: onnx.ModelProto, cutting: Cutting, available: Mapping[str, tuple[int, tuple[int, ...]]]
) -> Severed:
    """`proto` with each stretch reading what an earlier stretch computes from graph inputs (the
    reference's values), and exposing its cuts."""
    made = {
        output_name: index
        for index, node in enumerate(proto.graph.node)
        for output_name in node.output
        if output_name
    }
    crossing = {t: available[t] for t in (*cutting.cuts, *cutting.hidden)}

    def elsewhere(name: str, k: int) -> bool:  # read in another stretch than its own
        return cutting.stretch[made[name]] != cutting.stretch[k]

    return sever(proto, crossing, elsewhere, set(cutting.cuts))


def _planned_run(
    ctx: RunContext, plan: Plan, live: PlannedBackend, oracle: PlannedBackend, proto: onnx.ModelProto,
    cutting: Cutting, ref_capture: str, key: str,
) -> _Run:  # fmt: skip
    """`live` on the model cut into `cutting`'s stretches (fed the reference's values where one
    reads what another computes), exposing only the cuts and the graph outputs, and the float64
    judge of those with each stretch's nodes' allowances composed to its end."""
    assert live.cls is not None and oracle.cls is not None
    spec, folder = ctx.spec, ctx.work / "explain"
    source = (plan.rewrites or spec).path
    cuts = cutting.cuts
    pieces = _sever(proto, cutting, plan.available)
    ends = tuple(dict.fromkeys([*cuts, *(output_name.name for output_name in proto.graph.output)]))
    path = folder / f"stretches-{key}.onnx"
    write_rewritten(pieces.proto, source, path)
    feeds = path.with_suffix(".xbv")
    save_severed_feeds(feeds, ctx.feeds.arrays, ref_capture, pieces.inputs)
    extra = tuple(SEVERED + input_name for input_name in pieces.inputs)
    phase = Phase.planned(
        PLAIN_PHASE, ends, 1, model=_model_ref(spec, path, extra, pieces.proto), hashed=False
    )
    run = Job(f"explain-stretches-{key}", live.name, live.cls, live.variant(), feeds, (phase,))
    judged = judged_model(pieces.proto, plan.shapes, {cut: plan.captured.get(cut, "") for cut in cuts})
    jpath = folder / f"judged-stretches-{key}.onnx"
    write_rewritten(judged.proto, source, jpath)
    held = set(judged.tensors)
    tensors = tuple(x for end in ends for x in (end, AUX + end, PROP + end) if x in held)
    jphase = Phase.planned(
        JUDGE_PHASE, tensors, 1, model=_model_ref(spec, jpath, extra, judged.proto), hashed=False
    )
    variant = oracle.variant(narrow="false", threads="1", float32_prefix=AUX)
    judge = Job(f"explain-judge-stretches-{key}", oracle.name, oracle.cls, variant, feeds, (jphase,))
    return _Run(cutting, ends, run, judge, judged)


def _failing(
    run: _Run, ex: Executor, name: str, modules: Mapping[str, str]
) -> tuple[LocalErrors | None, str]:
    """The stretch ends of `run` judged (their origins), or why they could not be."""
    ro, jo = ex.run(run.run), ex.run(run.judge)
    try:
        rp = ro.phase(PLAIN_PHASE) if ro.ok else None
        jp = jo.phase(JUDGE_PHASE) if jo.ok else None
        if rp is None or jp is None:
            return None, (ro.reason if rp is None else jo.reason) or "it did not run"
        order = tuple(t for t in run.judged.order if t in set(run.ends))
        return judge_backend(name, rp.capture, jp.capture, run.judged, order, modules), ""
    finally:
        ro.drop_captures()
        jo.drop_captures()


def _plain_of(
    ctx: RunContext, plan: Plan, ref_capture: str, ex: Executor, shipped: Shipped, le: LocalErrors
) -> LocalErrors:
    """`le`'s backend run as it ships, stretch by stretch, in two staggered cuttings (a fusion
    across one cut is whole in the other); a stretch past its composed bound in both is an
    origin at the nodes the two share."""
    name = le.backend
    live = next(p for p in shipped.planned if p.name == name)
    proto = load_proto((plan.rewrites or ctx.spec).path, load_external=False)
    found = find_fusions(ctx, live, ex, float_candidates(proto, plan.available), name)
    how = Grain.of(found)
    if found.fused and not found.why_not:
        cuts, hidden, region = fusion_stretches(proto, found.fused, plan.available)
        cuttings = [Cutting(cuts, hidden, region)]
    else:  # no fusion found by exposure: two staggered cuttings where the fewest tensors cross
        cuttings = [
            cutting
            for cutting in (_available(cut, plan.available) for cut in stretch_cuts(proto))
            if cutting.cuts
        ]
        cuttings = cuttings or [Cutting((), (), (0,) * len(proto.graph.node))]
    runs = [_planned_run(ctx, plan, live, shipped.oracle, proto, cutting, ref_capture, f"{name}-{index}")
            for index, cutting in enumerate(cuttings)]  # fmt: skip
    ex.bar.grow(sum(run.run.steps + run.judge.steps for run in runs))
    modules = ctx.spec.modules()
    judged: list[tuple[_Run, LocalErrors]] = []
    for r in runs:
        got, why = _failing(r, ex, name, modules)
        if got is None:
            return replace(le, plain=PlainOutputs("not-judged", f"its stretches could not be run: {why}"))
        judged.append((r, got))
    worst = max((origin for _, j in judged for origin in j.origins), key=lambda o: o.ratio, default=None)
    finest = min(
        (run.cutting for run, _ in judged),
        key=lambda cutting: max(region_sizes(proto, cutting.stretch).values()),
    )
    if worst is None:
        ratio = max((j.largest_ratio or 0.0 for _, j in judged), default=0.0)
        at = max(judged, key=lambda x: x[1].largest_ratio or 0.0)[1].largest_at
        return replace(le, plain=how.outputs(finest, proto, "explained", ratio, at))
    # a stretch holding a node already found to be an origin is that origin's error carried on
    known = {t for origin in le.origins for t in (origin.tensor, *origin.covers)}
    new = _origins(proto, judged, known)
    plain = how.outputs(finest, proto, "unexplained", worst.ratio, worst.tensor)
    return replace(le, plain=plain, origins=(*le.origins, *new))


@dataclass(frozen=True)
class Grain:
    """How a plain run was cut: around the fusions found by exposure, or in staggered stretches."""

    fused: int  # tensors found inside fusions
    builds: int  # the search's builds
    why_not: str  # why no fusion was found by exposure ('' when some were)
    untested: int = 0  # tensors taken as fused untested (the search's builds ran out)

    @classmethod
    def of(cls, fusions: Fusions) -> Grain:
        """The grain a backend is judged at, from what its fusion search found (and why none, where none)."""
        why = fusions.why_not or ("" if fusions.fused else "no single tensor's exposure moves its outputs")
        return cls(len(fusions.fused), fusions.builds, why, fusions.untested)

    def _cut(self) -> str:
        if self.why_not:
            return f"staggered stretches ({self.why_not})"
        if self.untested:
            spent = f"the search's {self.builds} builds ran out"
            return f"fusions ({self.untested} tensor(s) kept fused untested: {spent})"
        return "fusions"

    def outputs(
        self, cutting: Cutting, proto: onnx.ModelProto, status: PlainStatus, ratio: float, at: str
    ) -> PlainOutputs:
        """The plain run's judgment on this grain: its largest stretch, the nodes judged alone."""
        sizes = region_sizes(proto, cutting.stretch)
        return PlainOutputs(
            status,
            ratio=ratio,
            at=at,
            largest=max(sizes.values(), default=0),
            alone=sum(1 for siz in sizes.values() if siz == 1),
            nodes=sum(sizes.values()),
            fused=self.fused,
            cut=self._cut(),
        )


def _origins(
    proto: onnx.ModelProto, judged: Sequence[tuple[_Run, LocalErrors]], known: set[str]
) -> tuple[Origin, ...]:
    """Each failing stretch of the first cutting that holds no `known` origin, narrowed to the
    nodes it shares with the failing stretches of the second."""
    spans = []
    for run, le in judged:
        stretches = [(origin, stretch_nodes(proto, origin.tensor, run.cutting)) for origin in le.origins]
        spans.append([(o, nodes) for o, nodes in stretches if not known & set(nodes)])
    other = {node for _, nodes in (spans[1] if len(spans) > 1 else []) for node in nodes}
    out = []
    for o, nodes in spans[0] or (spans[1] if len(spans) > 1 else []):
        shared = tuple(node for node in nodes if node in other) if other else nodes
        out.append(_stretch(o, shared or nodes))
    return tuple(out)


def _stretch(origin: Origin, nodes: tuple[str, ...]) -> Origin:
    if len(nodes) == 1:  # a node judged alone in the plain run: an origin at that node
        return origin
    detail = (
        "the plain run's stretch ending here is past the bound composed from its nodes' allowances, "
        f"as is the staggered cutting's stretch over its {len(nodes)} node(s) named: they compute "
        "there what the instrumented run exposes (a fusion)"
    )
    return replace(origin, op_type=f"stretch of {len(nodes)} node(s)", detail=detail, covers=nodes)


def _changed(results: Mapping[str, BackendResult], name: str) -> bool:
    backend = results.get(name)
    return backend is not None and backend.observer is not None and backend.observer.outputs_changed


def judge_plain_runs(
    ctx: RunContext, plan: Plan, ref_capture: str, ex: Executor, shipped: Shipped, local: list[LocalErrors]
) -> list[LocalErrors]:
    """Each judged backend with an observer effect: its plain run judged stretch by stretch, or
    the graph of its own whose kernels were judged."""
    out = []
    for le in local:
        name = le.backend
        if le.status != "ok" or not _changed(shipped.results, name) or name == plan.reference:
            out.append(le)
            continue
        mine = plan.backends.get(name)
        if mine is not None and mine.optimized is not None and not mine.unfused:
            out.append(replace(le, plain=PlainOutputs("shipped-graph", mine.graph)))
        elif shipped.oracle.cls is None:
            out.append(
                replace(
                    le,
                    plain=PlainOutputs("not-judged", f"no float64 evaluator: {shipped.oracle.unavailable}"),
                )
            )
        else:
            try:
                out.append(_plain_of(ctx, plan, ref_capture, ex, shipped, le))
            except Exception as error:  # said, never fatal
                why = f"its stretches could not be planned ({type(error).__name__}: {error})"
                out.append(replace(le, plain=PlainOutputs("not-judged", why)))
    return out
