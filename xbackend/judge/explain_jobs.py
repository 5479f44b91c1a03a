"""Explanations: the noise floor, each backend's local errors, and ill-conditioned tensors.

Both measurements rewrite the model and run it on real engines, so they cost engine runs,
never a float evaluator of our own:
- the floor: the model with every reduction gathered through a permutation (xbackend.model.reorder)
  is built once on the floor engine (ort-cpu) and run with the identity and K random orders;
- local errors: the severed model (xbackend.model.sever) is built once per backend and run once,
  fed the reference's values of every tensor a node reads, and judged element by element
  against the float64 value of each node on those same inputs (xbackend.judge.judge_nodes: the
  severed model evaluated in float64 by the oracle, with each node's operand magnitudes).
Captures stay on disk and are compared one tensor at a time, as the comparator's are.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from xbackend.bounds.element import AUX, DELTA
from xbackend.bounds.propagation import PROP
from xbackend.errors import UsageError
from xbackend.execution.executor import Executor, Job, JobOutcome
from xbackend.execution.progress import ProgressSink
from xbackend.execution.protocol import Phase
from xbackend.files.modelref import np_dtype
from xbackend.files.run_values import CaptureFile
from xbackend.judge.conditioning import amplifiers, composed_rounding, ill_conditioned
from xbackend.judge.floors import (
    FLOOR_ENGINE,
    FLOOR_PHASE,
    floor_backend,
    floor_job,
    model_ref,
    node_floor_job,
    save_severed_feeds,
)
from xbackend.judge.judge_nodes import JUDGE_PHASE, warm_compiled
from xbackend.judge.judge_plan import (
    LOCAL_PHASE,
    OWN_JUDGE,
    OWN_VALUES,
    Early,
    Judge,
    Plan,
    grain_of,
    judge_all,
    plan_rules,
    shapes_of,
)
from xbackend.judge.judged_graph import judged_model
from xbackend.judge.plain_judge import Shipped, judge_plain_runs
from xbackend.judge.room import (
    explanation_room,
    judge_window_note,
    judge_windows,
    severed_plan,
    severed_window_note,
)
from xbackend.judge.shipped import runtime_plan, shared_nodes, shipped_job, shipped_plan, without
from xbackend.model.extdata import externalize, uses_external_data, write_rewritten
from xbackend.model.load import load_proto
from xbackend.model.ortdomain import as_contrib
from xbackend.model.sever import SEVERED, sever
from xbackend.planning.builds import Builds
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.planning.memory import FITS, Fit, side_by_side
from xbackend.planning.plan import plan_backend
from xbackend.results import EXPECTED, BackendResult
from xbackend.results.explanation import (
    ALL_LOADED,
    DECLINED,
    LOADED,
    UNFUSED,
    Explanation,
)
from xbackend.runners.base import RECOMPUTED

__all__ = ["FLOOR_ENGINE", "explain"]

JUDGE_ENGINE = "oracle"


def explain(
    ex: Executor,
    ctx: RunContext,
    planned: Sequence[PlannedBackend],
    builds: Mapping[str, Builds],
    results: Mapping[str, BackendResult],
    ref: str,
    bar: ProgressSink,
    memory: Fit = FITS,
) -> Explanation:
    """The floor and every backend's local errors against `ref`; never raises: a step that
    cannot run makes the explanation unavailable, with the reason (`memory`: whether its builds
    fit the memory budget)."""
    opts = ctx.opts
    if opts.noise_samples == 0:
        return Explanation("unavailable", DECLINED)
    others = [b for n, b in builds.items() if n not in (ref, EXPECTED) and b.ok]
    if not others and ctx.judge_alone and ref in builds and builds[ref].ok:
        others = [builds[ref]]  # a candidate on one engine: that engine is judged, as a reference is
    if not others:  # nothing is compared with the reference: silent unless a backend failed
        failed = sorted(n for n, b in builds.items() if n != EXPECTED and not b.ok)
        if not failed:
            return Explanation("unavailable")
        why = f"{', '.join(failed)} did not run: no backend was judged against float64, {ref} included"
        return Explanation("unavailable", why)
    disk = explanation_room(ctx, others)
    ctx = replace(ctx, judge_disk=disk.judge_disk)  # its notes stay the caller's list
    for fit in (memory, disk.fit):
        if not fit.fits:
            return Explanation("unavailable", f"no node was judged against float64: {fit.reason}")
    if all(b.loaded is not None for b in others):
        return Explanation("unavailable", f"{ALL_LOADED}; --max-ulp auto stands at {opts.fixed_ulp:g}")
    rb = builds.get(ref)
    if rb is None or not rb.ok:
        return Explanation("unavailable", f"the reference ({ref}) did not run")
    layers = rb.first.layers
    if layers is None:
        if ctx.spec.outputs_only:
            why = (
                "--tensors outputs captures no tensor a node reads, so no node can be fed its inputs; "
                "pass --tensors modules or all to judge them"
            )
            return Explanation("unavailable", f"not judged: {why}")
        return Explanation(
            "unavailable", f"the float64 judge needs the reference's tensors ({ref} has no per-layer capture)"
        )
    lanes = 2 if side_by_side(ctx, 2) else 1
    # Each optimized graph is written while the rest is planned: its severed run and float64
    # judge join the queue's front the moment it is written; the floors and the judge meanwhile,
    # in one queue, two lanes where cores and memory allow.
    optimized = _optimized(ctx, planned, results, ref)
    bar.grow(sum(j.steps for j, _ in optimized.values()))
    with ex.shared(), ThreadPoolExecutor(lanes, thread_name_prefix="xbackend-ship") as pre:
        started = [pre.submit(ex.run, job) for job, _ in optimized.values()]
        try:
            plan = _plan(ctx, planned, builds, results, ref, layers.capture, optimized)
        except Exception as e:  # an explanation that cannot be planned is reported, never fatal
            for f in started:
                f.result()
            return Explanation("unavailable", f"the rewrites failed: {type(e).__name__}: {e}")
        early = Early(ctx.spec, ref, layers.capture)
        try:
            done = _run(ctx, ex, plan, lanes, layers.capture, started, early)
            ctx.notes.extend(_window_notes(ctx, done[1]))
            oracle = plan_backend(JUDGE_ENGINE, replace(ctx.opts, runner_options=()), ctx.work, None)
            shipped = Shipped(oracle, planned, results)
            return _analyze(ctx, done[1], done[0], layers.capture, ex, shipped, early)
        finally:
            early.close()


def _optimized(
    ctx: RunContext, planned: Sequence[PlannedBackend], results: Mapping[str, BackendResult], ref: str
) -> dict[str, tuple[Job, Path]]:
    """Each backend whose engine saves the graph it optimized: the job that writes it."""
    folder = ctx.work / "explain"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for b in planned:
        r = results.get(b.name)
        judged_alone = b.name == ref and ctx.judge_alone  # judged as it ships, as any other would be
        if b.name == EXPECTED or (b.name == ref and not judged_alone):
            continue
        if r is None or not r.ok or b.cls is None or b.interpreter is not None:
            continue
        if b.cls.executes_graph and b.cls.saves_optimized_graph:
            out[b.name] = shipped_job(b.name, b.cls, b.variant(), ctx.spec, ctx.feeds_path, folder)
    return out


def _run(
    ctx: RunContext,
    ex: Executor,
    plan: Plan,
    lanes: int,
    ref_capture: str,
    started: Sequence[Future[JobOutcome]],
    early: Early,
) -> tuple[dict[str, JobOutcome], Plan]:
    """The explanation's queue (the optimized graphs' jobs already `started`), and the plan as
    the written graphs left it."""
    queue = [
        *([j] for j in (plan.floor_job, plan.node_floor_job) if j is not None),
        [j.job for j in plan.judges.values() if j.job is not None],
        *([j] for n, j in plan.local_jobs.items() if n not in plan.optimized),
    ]
    ex.bar.grow(sum(j.steps for batch in queue for j in batch))  # the lanes' shared bar
    state = {"plan": plan}
    lock = threading.Lock()
    shipping = {job.label: name for name, (job, _) in plan.optimized.items()}

    def then(o: JobOutcome) -> list[list[Job]]:
        if plan.floor_job is not None and o.job.label == plan.floor_job.label:
            o.drop_captures()  # its floors came back in its result: its captures are read no more
        name = shipping.get(o.job.label)
        if name is None:
            with lock:
                current = state["plan"]
            early.offer(current, o)
            return []
        with lock:
            try:
                state["plan"] = _ship(ctx, state["plan"], name, o, ref_capture)
            except Exception as e:  # judged unfused instead, and the report says why
                why = f"{UNFUSED}: its graph could not be severed ({type(e).__name__}: {e})"
                state["plan"] = replace(state["plan"], graphs={**state["plan"].graphs, name: why})
            p = state["plan"]
        judge = p.judges[name].job if name in p.judges else None
        # the judge first: the longer of the two takes the lane the optimized graph freed
        return [
            *([[judge]] if judge is not None else []),
            *([[p.local_jobs[name]]] if name in p.local_jobs else []),
        ]

    warm_compiled()  # numba's import and cache load, while the main process waits on workers
    return ex.run_queue(queue, lanes, then, started), state["plan"]


def _window_notes(ctx: RunContext, plan: Plan) -> list[str]:
    """What the report says of each float64 judge cut into windows to fit the budget."""
    out = []
    for key, j in sorted(plan.judges.items()):
        if j.windows:
            graph = f"{key}'s graph" if key in plan.optimized else (key or "the reference's grain")
            windows = [w.phases[0].tensors for w in j.windows]
            out.append(judge_window_note(graph, windows, ctx.budget or 0, ctx.judge_disk))
    for name, job in sorted(plan.local_jobs.items()):
        cut = job.phases[0].windows
        if cut:
            out.append(severed_window_note(name, cut, ctx.budget or 0))
    return out


def _ship(ctx: RunContext, plan: Plan, name: str, written: JobOutcome, ref_capture: str) -> Plan:
    """Backend `name`'s optimized graph, `written`: severed at the reference's tensors, its local
    job and judge; where it cannot be judged, the unfused severed model's local job stands, and why."""
    folder = ctx.work / "explain"
    src = plan.rewrites or ctx.spec
    # the model's nodes (its weights beside the rewrites: covers and pieces need no weight)
    model = load_proto(src.path, load_external=False)
    path = plan.optimized[name][1]
    old = plan.local_jobs.get(name)
    if old is None:  # not measured (plan.not_measured says why)
        return plan
    runtime = old.cls.optimized_format == "runtime"
    args = (plan.available, ctx.feeds.arrays, ref_capture, folder)
    got = (
        runtime_plan(name, written, path, ctx.spec, model, src.path, *args, label=old.cls.optimized_label)
        if runtime
        else shipped_plan(name, written, path, ctx.spec, model, *args)
    )
    if isinstance(got, str):
        return replace(plan, graphs={**plan.graphs, name: f"{UNFUSED}: {got}"})
    severed = severed_plan(ctx, old.cls.windowed, got.tensors, plan.shapes, plan.captured)
    if not severed.fit.fits:
        return replace(plan, graphs={**plan.graphs, name: f"{UNFUSED}: {severed.fit.reason}"})
    cut = severed.windows
    phase = Phase.planned(LOCAL_PHASE, got.tensors, 1, model=got.model, hashed=False, windows=cut)
    # ONNX Runtime runs its optimized graph as saved; OpenVINO fuses each piece as it ships it
    options = (
        old.raw_options
        if runtime
        else tuple(sorted({**dict(old.raw_options), "opt_level": "disable"}.items()))
    )
    mine = replace(old, raw_options=options, feeds=got.feeds, phases=(phase,))
    computed = set(got.tensors)
    captured = {n: d for n, d in plan.captured.items() if n in computed}
    # the model's own pieces (OpenVINO; ORT's kernels it cannot evaluate), else the graph as saved
    pieces = runtime or got.judged_on is not None
    base = plan.judges.get("")
    shared: frozenset[str] = frozenset()
    if not pieces and base is not None and base.judged is not None:
        # the nodes its optimizer left as they were are the reference grain's: judged there
        saved = load_proto(str(path), load_external=False)
        with CaptureFile(ref_capture) as cap:
            graphs = (got.severed, saved, path.parent, model, Path(src.path).parent)
            shared = shared_nodes(*graphs, plan.available, cap.get)
    rest = without(got.severed, shared)
    judges, judge_of = dict(plan.judges), dict(plan.judge_of)
    if rest.graph.node:
        judges[name] = _judge_job(
            ctx,
            got.judged_on if got.judged_on is not None else as_contrib(rest),
            plan.shapes,
            captured,
            got.path,
            got.feeds,
            name,
            src.path if pieces else got.path,
            not pieces,
        )
        judge_of[name] = name
    return replace(
        plan,
        local_jobs={**plan.local_jobs, name: mine},
        judges=judges,
        judge_of=judge_of,
        graphs={**plan.graphs, name: got.described},
        covers={**plan.covers, name: got.covers},
        shared={**plan.shared, name: shared} if shared else plan.shared,
        graph_order={**plan.graph_order, name: got.tensors},
    )


def _plan(
    ctx: RunContext,
    planned: Sequence[PlannedBackend],
    builds: Mapping[str, Builds],
    results: Mapping[str, BackendResult],
    ref: str,
    ref_capture: str,
    optimized: Mapping[str, tuple[Job, Path]],
) -> Plan:
    spec, opts = ctx.spec, ctx.opts
    folder = ctx.work / "explain"
    folder.mkdir(parents=True, exist_ok=True)
    proto = load_proto(spec.path, load_external=False)
    # Inline weights are written once, beside the rewrites, which then point at them: five
    # rewrites otherwise serialize (and their workers parse) five copies.
    src = spec
    if externalize(proto, folder):
        src = replace(spec, path=str(folder / "model.onnx"), external_data=True)
        write_rewritten(proto, src.path, Path(src.path))
    with CaptureFile(ref_capture) as cap:
        held = cap.tensors()
    shapes = shapes_of(builds, held)
    shapes.update({n: tuple(v.shape) for n, v in ctx.feeds.arrays.items() if isinstance(v, np.ndarray)})
    tensors = spec.tensor_order()

    available = {
        n: (helper.np_dtype_to_tensor_dtype(np_dtype(d)), s)
        for n, (d, s) in held.items()
        if not n.startswith(SEVERED)
    }
    severed = sever(proto, available)
    spath = folder / "severed.onnx"
    write_rewritten(severed.proto, src.path, spath)
    smodel = model_ref(src, spath, tuple(SEVERED + n for n in severed.inputs))
    smodel = replace(smodel, outputs=tuple(o.name for o in severed.proto.graph.output))
    sfeeds = folder / "severed.xbv"
    save_severed_feeds(sfeeds, ctx.feeds.arrays, ref_capture, severed.inputs)
    captured = {n: d for n, (d, _) in held.items() if not n.startswith(SEVERED)}
    judges = {"": _judge_job(ctx, severed.proto, shapes, captured, spath, sfeeds, "", src.path)}
    judge_of: dict[str, str] = {}
    engine = floor_backend(ctx, planned)
    node_floor = (  # the allowances checked against K orders per node: asked for alone
        node_floor_job(ctx, src, engine, severed, shapes, ref_capture, folder)
        if engine is not None and opts.noise_samples
        else None
    )
    local_jobs: dict[str, Job] = {}
    not_measured: dict[str, str] = {}
    graphs: dict[str, str] = {}
    by_judge: set[str] = set()
    own_runs: dict[str, str] = {}
    live = {b.name: b for b in planned}
    for name, r in results.items():
        b = live.get(name)
        if name in (ref, EXPECTED) or not r.ok:
            continue
        if b is None or b.cls is None:
            not_measured[name] = LOADED
            continue
        if not b.cls.executes_graph and not b.cls.severs_by_feeds:
            # not fed the reference's values: judged as the reference is, on its own values
            mine = builds[name].first.layers if builds[name].ok else None
            if mine is None:
                not_measured[name] = f"{b.cls.name} cannot be fed the reference's values, and exposed none"
                continue
            folded = dict(r.info).get(RECOMPUTED, "").split(",")
            args = (
                ctx,
                proto,
                builds[name],
                available,
                shapes,
                captured,
                mine.capture,
                name,
                src.path,
                folded,
            )
            judges[name], judge_of[name], own_runs[name] = _own_grain(*args), name, mine.capture
            graphs[name] = OWN_VALUES
            continue
        if _judges_evaluation(b):
            by_judge.add(name)
            graphs[name] = OWN_JUDGE
            continue
        severed_run = severed_plan(ctx, b.cls.windowed, tensors, shapes, captured)
        if not severed_run.fit.fits:
            not_measured[name] = severed_run.fit.reason
            continue
        cut = severed_run.windows
        # A runner of its own source keeps its model and takes the reference's values as feeds:
        # it computes each part it exposes from the part's inputs, so it is judged at that grain.
        if not b.cls.executes_graph:
            folded = dict(r.info).get(RECOMPUTED, "").split(",")
            judges[name] = _own_grain(
                ctx, proto, builds[name], available, shapes, captured, ref_capture, name, src.path, folded
            )
            judge_of[name] = name
            graphs[name] = grain_of(r)
        own = replace(spec.ref(), inputs=smodel.inputs)
        model = smodel if b.cls.executes_graph else own
        phase = Phase.planned(LOCAL_PHASE, tensors, 1, model=model, hashed=False, windows=cut)
        local_jobs[name] = Job(f"explain-local-{name}", name, b.cls, _same_grain(b, r), sfeeds, (phase,))
    unjudged = bool(not_measured) or judges[""].judged is None
    floors, reordered, extra = floor_job(ctx, engine, src, proto, shapes, tensors, folder, unjudged)
    del proto
    return Plan(
        floors,
        local_jobs,
        not_measured,
        reordered,
        extra,
        tuple(results),
        ref,
        judges,
        judge_of,
        dict(optimized),
        available,
        captured,
        shapes,
        graphs=graphs,
        node_floor_job=node_floor,
        rewrites=src,
        own_judge=frozenset(by_judge),
        own_runs=own_runs,
    )


def _judges_evaluation(b: PlannedBackend) -> bool:
    """Whether `b`'s severed run would be the float64 judge's own evaluation rounded to the
    model's dtypes: the judge's engine at one BLAS thread (the same sums in the same order)."""
    if b.cls is None or b.cls.name != JUDGE_ENGINE:
        return False
    rest = {k: v for k, v in b.raw_options.items() if k != "narrow"}
    return rest in ({}, {"threads": "1"})


def _same_grain(b: PlannedBackend, r: BackendResult) -> tuple[tuple[str, str], ...]:
    """`b`'s options, at the grain its per-layer build exposed (torch decides op or module grain
    per process, from a bitwise check threads can tip): the local run is fed and judged at the
    tensors that build captured, so it must expose the same ones."""
    if b.cls is None or not any(o.name == "grain" for o in b.cls.option_specs):
        return b.variant()
    used = dict(r.info).get("grain", "")
    return b.variant(grain="op" if used.startswith("op") else "module") if used else b.variant()


def _judge_job(
    ctx: RunContext,
    severed: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]],
    captured: Mapping[str, str],
    spath: Path,
    sfeeds: Path,
    key: str,
    source: str | Path,
    fill_shapes: bool = False,
    folded: Sequence[str] = (),
) -> Judge:
    """The severed model with each node's operand magnitudes, evaluated in float64 without
    rounding back (the oracle, narrow=false); or why it cannot run."""
    oracle = plan_backend(JUDGE_ENGINE, replace(ctx.opts, runner_options=()), ctx.work, None)
    cls = oracle.cls
    if cls is None:
        return Judge(
            None, None, f"the float64 evaluator ({JUDGE_ENGINE}) cannot run here: {oracle.unavailable}"
        )
    judged = judged_model(severed, shapes, captured, fill_shapes, folded)
    jpath = spath.with_name(f"judged{'-' + key if key else ''}.onnx")
    write_rewritten(judged.proto, source, jpath)
    inputs = tuple(i.name for i in severed.graph.input if i.name.startswith(SEVERED))
    model = replace(
        model_ref(ctx.spec, jpath, inputs, uses_external_data(judged.proto)),
        outputs=tuple(o.name for o in judged.proto.graph.output),
    )
    try:
        windows = judge_windows(
            judged.groups,
            shapes,
            (AUX, PROP),
            ctx.run_bytes,
            ctx.spec.weight_bytes,
            ctx.budget,
            ctx.judge_disk,
        )
    except UsageError as e:  # not even one node fits: said, never killed
        return Judge(None, None, f"the float64 judge does not fit: {e}")
    label = f"explain-judge{'-' + key if key else ''}"
    # one BLAS thread: the explanation's jobs run side by side, a core each (its products are
    # a small part of an evaluation that is mostly numpy's elementwise work)
    variant = oracle.variant(narrow="false", threads="1", float32_prefix=AUX)

    def job(suffix: str, tensors: tuple[str, ...]) -> Job:
        phase = Phase.planned(JUDGE_PHASE, tensors, 1, model=model, hashed=False)
        return Job(label + suffix, JUDGE_ENGINE, cls, variant, sfeeds, (phase,))

    if windows:  # each its own job, judged and deleted in turn (xbackend.judge.judge_plan)
        cut = tuple(job(f"-w{k + 1}", w) for k, w in enumerate(windows))
        return Judge(None, judged, windows=cut)
    return Judge(job("", judged.tensors), judged)


def _own_grain(
    ctx: RunContext,
    proto: onnx.ModelProto,
    b: Builds,
    available: Mapping[str, tuple[int, tuple[int, ...]]],
    shapes: Mapping[str, tuple[int, ...]],
    captured: Mapping[str, str],
    fed: str,
    name: str,
    source: str,
    folded: Sequence[str],
) -> Judge:
    """A backend that computes each tensor it exposes from the tensors it exposes above it (torch:
    module outputs): the model severed at those, judged in float64 on the values of capture
    `fed` (the reference's, or its own) (`folded`: the constants it computes again at run time)."""
    layers = b.first.layers if b.ok else None
    mine: set[str] = set()
    if layers is not None:
        with CaptureFile(layers.capture) as cap:
            mine = set(cap.names)
    grain = {n: available[n] for n in available if n in mine}
    severed = sever(proto, grain)
    spath = ctx.work / "explain" / f"severed-{name}.onnx"
    sfeeds = spath.with_suffix(".xbv")
    save_severed_feeds(sfeeds, ctx.feeds.arrays, fed, severed.inputs)
    own = {n: d for n, d in captured.items() if n in grain}
    return _judge_job(ctx, severed.proto, shapes, own, spath, sfeeds, name, source, folded=folded)


def _analyze(
    ctx: RunContext,
    plan: Plan,
    done: Mapping[str, JobOutcome],
    ref_capture: str,
    ex: Executor,
    shipped: Shipped,
    early: Early | None = None,
) -> Explanation:
    spec = ctx.spec
    floors: dict[str, float] = {}
    floor_note = ""
    if plan.floor_job is None or plan.reordered is None:
        floor_note = (
            f"{FLOOR_ENGINE} cannot run here, and it measures the floor"
            if ctx.opts.noise_samples or plan.not_measured
            else "not measured: every backend was judged against float64 (--noise-samples K measures it)"
        )
    else:
        fo = done.get(plan.floor_job.label)
        phase = fo.phase(FLOOR_PHASE) if fo is not None and fo.ok else None
        if phase is None:
            why = fo.reason if fo is not None else "it did not run"
            floor_note = f"the permuted model failed on {FLOOR_ENGINE}: {why}"
        else:
            floors = dict(phase.floors)
    local, check, stats = judge_all(spec, plan, done, ref_capture, ex, early)
    local = judge_plain_runs(ctx, plan, ref_capture, ex, shipped, local)
    local.sort(key=lambda x: plan.order.index(x.backend) if x.backend in plan.order else -1)
    if not floors and not stats and all(le.status != "ok" for le in local):
        why = next((le.reason for le in local if le.reason), "the float64 judge did not run")
        return Explanation("unavailable", f"no node was judged: {why}")
    composed = composed_rounding(spec, stats, ref_capture) if stats else {}
    conditioning = "" if stats else "not assessed: the float64 judge of the reference's grain did not run"
    return Explanation(
        "ok",
        rules=plan_rules(plan),
        confidence=1 - DELTA,
        reorder_check=check,
        amplifiers=amplifiers(spec, ref_capture),
        engine=plan.floor_job.backend if floors and plan.floor_job is not None else "",
        samples=len(plan.extra) if floors else 0,
        floors=tuple((t, floors[t]) for t in spec.tensor_order() if t in floors),
        permuted=len(plan.reordered.sites) if floors and plan.reordered is not None else 0,
        skipped=plan.reordered.skipped if floors and plan.reordered is not None else (),
        local=tuple(local),
        ill_conditioned=ill_conditioned(spec, composed, ref_capture),
        floor_note=floor_note,
        conditioning=conditioning,
        composed=tuple((t, composed[t]) for t in spec.tensor_order() if t in composed),
    )
