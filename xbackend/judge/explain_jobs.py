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
from onnx import helper

from xbackend.bounds.element import DELTA
from xbackend.execution.executor import Executor, Job, JobOutcome
from xbackend.execution.progress import ProgressSink
from xbackend.execution.protocol import Phase
from xbackend.files.modelref import np_dtype
from xbackend.files.run_values import CaptureFile
from xbackend.judge.backend_judgment import Grounds, judgment_of
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
from xbackend.judge.judge_nodes import warm_compiled
from xbackend.judge.judge_plan import (
    LOCAL_PHASE,
    BackendJudgment,
    Early,
    Fed,
    Plan,
    judge_all,
    plan_rules,
    shapes_of,
)
from xbackend.judge.judges import JUDGE_ENGINE, judge_job
from xbackend.judge.plain_judge import Shipped, judge_plain_runs
from xbackend.judge.room import (
    explanation_room,
    judge_window_note,
    severed_plan,
    severed_window_note,
)
from xbackend.judge.shipped import runtime_plan, shared_nodes, shipped_job, shipped_plan, without
from xbackend.model.extdata import externalize, write_rewritten
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
    UNFUSED,
    Explanation,
)

__all__ = ["FLOOR_ENGINE", "explain"]


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
    others = [build for key, build in builds.items() if key not in (ref, EXPECTED) and build.ok]
    if not others and ctx.judge_alone and ref in builds and builds[ref].ok:
        others = [builds[ref]]  # a candidate on one engine: that engine is judged, as a reference is
    if not others:  # nothing is compared with the reference: silent unless a backend failed
        failed = sorted(key for key, build in builds.items() if key != EXPECTED and not build.ok)
        if not failed:
            return Explanation("unavailable")
        why = f"{', '.join(failed)} did not run: no backend was judged against float64, {ref} included"
        return Explanation("unavailable", why)
    disk = explanation_room(ctx, others)
    ctx = replace(ctx, judge_disk=disk.judge_disk)  # its notes stay the caller's list
    for fit in (memory, disk.fit):
        if not fit.fits:
            return Explanation("unavailable", f"no node was judged against float64: {fit.reason}")
    if all(other.loaded is not None for other in others):
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
        except Exception as error:  # an explanation that cannot be planned is reported, never fatal
            for f in started:
                f.result()
            return Explanation("unavailable", f"the rewrites failed: {type(error).__name__}: {error}")
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
    for planned_backend in planned:
        r = results.get(planned_backend.name)
        judged_alone = (
            planned_backend.name == ref and ctx.judge_alone
        )  # judged as it ships, as any other would be
        if planned_backend.name == EXPECTED or (planned_backend.name == ref and not judged_alone):
            continue
        if r is None or not r.ok or planned_backend.cls is None or planned_backend.interpreter is not None:
            continue
        if planned_backend.cls.executes_graph and planned_backend.cls.saves_optimized_graph:
            out[planned_backend.name] = shipped_job(
                planned_backend.name,
                planned_backend.cls,
                planned_backend.variant(),
                ctx.spec,
                ctx.feeds_path,
                folder,
            )
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
        [judge.job for judge in plan.judges.values() if judge.job is not None],
        *(
            [backend_judgment.local_job]
            for backend_judgment in plan.fed(Fed.SEVERED)
            if backend_judgment.local_job is not None and backend_judgment.optimized is None
        ),
    ]
    ex.bar.grow(sum(j.steps for batch in queue for j in batch))  # the lanes' shared bar
    state = {"plan": plan}
    lock = threading.Lock()
    shipping = {job.label: name for name, (job, _) in plan.optimized.items()}

    def then(job_outcome: JobOutcome) -> list[list[Job]]:
        if plan.floor_job is not None and job_outcome.job.label == plan.floor_job.label:
            job_outcome.drop_captures()  # its floors came back in its result: its captures are read no more
        name = shipping.get(job_outcome.job.label)
        if name is None:
            with lock:
                current = state["plan"]
            early.offer(current, job_outcome)
            return []
        with lock:
            try:
                state["plan"] = _ship(ctx, state["plan"], name, job_outcome, ref_capture)
            except Exception as error:  # judged unfused instead, and the report says why
                why = f"its graph could not be severed ({type(error).__name__}: {error})"
                state["plan"] = _unfused(state["plan"], name, why)
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
    for key, judge in sorted(plan.judges.items()):
        if judge.windows:
            graph = f"{key}'s graph" if key in plan.optimized else (key or "the reference's grain")
            windows = [window.phases[0].tensors for window in judge.windows]
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
    mine = plan.backends[name]
    old = mine.local_job
    if old is None or mine.optimized is None:  # not measured (its judgment says why)
        return plan
    path = mine.optimized[1]
    runtime = old.cls.optimized_format == "runtime"
    args = (plan.available, ctx.feeds.arrays, ref_capture, folder)
    got = (
        runtime_plan(name, written, path, ctx.spec, model, src.path, *args, label=old.cls.optimized_label)
        if runtime
        else shipped_plan(name, written, path, ctx.spec, model, *args)
    )
    if isinstance(got, str):
        return _unfused(plan, name, got)
    severed = severed_plan(ctx, old.cls.windowed, got.tensors, plan.shapes, plan.captured)
    if not severed.fit.fits:
        return _unfused(plan, name, severed.fit.reason)
    cut = severed.windows
    phase = Phase.planned(LOCAL_PHASE, got.tensors, 1, model=got.model, hashed=False, windows=cut)
    # ONNX Runtime runs its optimized graph as saved; OpenVINO fuses each piece as it ships it
    options = (
        old.raw_options
        if runtime
        else tuple(sorted({**dict(old.raw_options), "opt_level": "disable"}.items()))
    )
    local_job = replace(old, raw_options=options, feeds=got.feeds, phases=(phase,))
    computed = set(got.tensors)
    captured = {key: value for key, value in plan.captured.items() if key in computed}
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
    judges, judge = dict(plan.judges), mine.judge
    if rest.graph.node:
        judges[name] = judge_job(
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
        judge = name
    shipped = replace(
        mine,
        local_job=local_job,
        judge=judge,
        graph=got.described,
        unfused=False,
        covers=got.covers,
        shared=shared or mine.shared,
        graph_order=got.tensors,
    )
    return replace(plan, judges=judges).with_backend(shipped)


def _unfused(plan: Plan, name: str, why: str) -> Plan:
    """Backend `name` judged on the unfused severed model: its own graph could not be (why)."""
    return plan.with_backend(replace(plan.backends[name], graph=f"{UNFUSED}: {why}", unfused=True))


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
    shapes.update(
        {key: tuple(array.shape) for key, array in ctx.feeds.arrays.items() if isinstance(array, np.ndarray)}
    )
    tensors = spec.tensor_order()

    available = {
        n: (helper.np_dtype_to_tensor_dtype(np_dtype(d)), s)
        for n, (d, s) in held.items()
        if not n.startswith(SEVERED)
    }
    severed = sever(proto, available)
    spath = folder / "severed.onnx"
    write_rewritten(severed.proto, src.path, spath)
    smodel = model_ref(src, spath, tuple(SEVERED + input_name for input_name in severed.inputs))
    smodel = replace(smodel, outputs=tuple(output_name.name for output_name in severed.proto.graph.output))
    sfeeds = folder / "severed.xbv"
    save_severed_feeds(sfeeds, ctx.feeds.arrays, ref_capture, severed.inputs)
    captured = {n: d for n, (d, _) in held.items() if not n.startswith(SEVERED)}
    judges = {"": judge_job(ctx, severed.proto, shapes, captured, spath, sfeeds, "", src.path)}
    engine = floor_backend(ctx, planned)
    node_floor = (  # the allowances checked against K orders per node: asked for alone
        node_floor_job(ctx, src, engine, severed, shapes, ref_capture, folder)
        if engine is not None and opts.noise_samples
        else None
    )
    live = {planned_backend.name: planned_backend for planned_backend in planned}
    grounds = Grounds(ctx, proto, src, smodel, sfeeds, available, shapes, captured, ref_capture, tensors)
    backends: dict[str, BackendJudgment] = {}
    for name, result in results.items():
        if name in (ref, EXPECTED) or not result.ok:
            continue
        judgment, own = judgment_of(grounds, live.get(name), result, builds[name])
        backends[name] = replace(judgment, optimized=optimized.get(name))
        if own is not None:
            judges[name] = own
    unjudged = (
        any(backend.fed is Fed.NOT_MEASURED for backend in backends.values()) or judges[""].judged is None
    )
    floors, reordered, extra = floor_job(ctx, engine, src, proto, shapes, tensors, folder, unjudged)
    del proto
    return Plan(
        floors,
        backends,
        reordered,
        extra,
        tuple(results),
        ref,
        judges,
        available,
        captured,
        shapes,
        node_floor_job=node_floor,
        rewrites=src,
    )


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
            if ctx.opts.noise_samples or plan.fed(Fed.NOT_MEASURED)
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
